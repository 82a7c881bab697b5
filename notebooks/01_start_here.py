# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Start here: where does a CUDA graph pool's memory go?
#
# **The claim (vLLM PR 63155).** Every `CudaGraphManager.capture()` in vLLM 0.33 enters
# `graph_capture()`, which makes a new CUDA stream, and PyTorch's caching allocator hands a
# free block only to a request on the stream that freed it. So DeepSeek-V4.1's decoder
# replay graphs, captured after the model graphs into the same graph pool, cannot reuse the
# model graphs' free blocks and reserve a second pool's worth (5.18 GiB on DeepSeek-V4.1-Flash).
# The fix captures the replay graphs on the model graphs' stream.
#
# This notebook shows the effect on real allocator state, grouped the way the allocator
# itself divides memory: by `(segment_pool_id, stream)`.

# %% [markdown]
# ## Where the numbers come from
#
# Every table and figure names its source:
# - **live GPU**: this process's own allocator, when CUDA is available;
# - **recorded**: snapshots recorded on an H200 and shipped with the kit in `kit/recordings`
#   (GPU, torch version, date and command are in each file's provenance).
#
# To force the recordings on a GPU machine, set `SOURCE = "recorded"` below.

# %%
import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio
from IPython.display import display

import kit
from kit.experiments.two_captures import two_captures
from kit.recordings import default_source

pio.renderers.default = "plotly_mimetype"  # JupyterLab's renderer; `make walkthrough` inlines plotly.js
SOURCE = default_source()
print(f"data source: {SOURCE}")

# %% [markdown]
# ## The experiment
#
# A model-like graph (four layers of bf16 matmuls, intermediates freed as it goes) is
# captured into a `torch.cuda.graph_pool_handle()` pool. Then a smaller "replay" graph is
# captured into the *same* pool, once on a **new** stream (vLLM 0.33) and once on the
# **same** stream (the PR).

# %%
new_stream = two_captures(shared_stream=False, source=SOURCE)
shared_stream = two_captures(shared_stream=True, source=SOURCE)
print(new_stream.source_label)
kit.style_table(kit.segment_table(new_stream))

# %% [markdown]
# Read the rows of the graph pool. With the replay capture on its own stream, the pool has
# **two** groups: the model graphs' stream, and the replay graphs' stream, whose segments
# are mostly free. The free blocks the model capture left behind were there, on the other
# stream, and could not be used. The same, as bars:

# %%
kit.group_bar_figure(new_stream).show()

# %%
kit.style_table(kit.segment_table(shared_stream))

# %% [markdown]
# On the shared stream the pool has **one** group: the replay capture fit into blocks the
# model capture had freed. What did sharing save? The diff below goes from the new-stream
# run to the shared-stream run, group by group. The two runs are separate processes whose
# stream ids differ, so groups are matched by stream name (`by="label"`).

# %%
diff = kit.diff_tables(kit.segment_table(new_stream), kit.segment_table(shared_stream), by="label")
graph_pool = tuple(new_stream.kit["pools"]["global graph pool"])
in_pool = diff[diff["pool"] == graph_pool]
saved = -in_pool["reserved"].sum()
print(
    f"graph pool reserved: {kit.format_bytes(in_pool['reserved_before'].sum())} on two streams, "
    f"{kit.format_bytes(in_pool['reserved_after'].sum())} on one; sharing saves {kit.format_bytes(saved)}"
)
kit.style_table(diff[["pool_label", "stream_label", "status", "segments", "reserved", "allocated", "free"]])

# %% [markdown]
# The graph pool is not the only cost. The default pool has a group on the replay graphs'
# stream too: the cuBLAS workspace the warm-up's first matmul allocated on that new stream
# (cuBLAS keeps one per stream). A stream of its own costs the replay capture its own
# workspace as well as its own pool segments.

# %% [markdown]
# ## Look for yourself
#
# Pick a run; the bars split each group's reserved bytes into allocated and free.

# %%
choice = widgets.ToggleButtons(options=["new stream (vLLM 0.33)", "shared stream (PR 63155)"])
choice.add_class("kit-main-control")  # the control tests/test_browser.py moves
figures = {kit.group_bar_figure: go.FigureWidget(), kit.segment_map_figure: go.FigureWidget()}


def show(change=None):
    snap = shared_stream if choice.value.startswith("shared") else new_stream
    for make, widget in figures.items():
        kit.show_in(widget, make(snap))


choice.observe(show, names="value")
show()
display(widgets.VBox([choice, *figures.values()]))

# %% [markdown]
# **What it shows.** A second stream in one graph pool is a second set of segments: its
# capture allocates fresh memory while the pool's other stream holds enough free bytes.
#
# **Next question.** Why exactly does the allocator refuse those free blocks, one request at
# a time, and is it safe for the replay graphs to share the model graphs' stream?
# The same tables work on your own snapshot: `python -m kit table my_snapshot.pickle`, or
# `python -m kit report my_snapshot.pickle -o report.html`.

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
# `graph_capture()`, which makes a new CUDA stream. PyTorch's caching allocator hands a free
# block only to a request on the stream its segment belongs to: every block of a segment
# carries the stream of the allocation that made the segment, whichever stream later frees
# it. (`record_stream` does not change that; it only delays a block's free until the other
# stream's work on it is done.) So DeepSeek-V4.1's decoder replay graphs, captured after the
# model graphs into the same graph pool, cannot reuse the model graphs' free blocks and
# reserve a second pool's worth (5.18 GiB on DeepSeek-V4.1-Flash, per the PR). The fix
# captures the replay graphs on the model graphs' stream.
#
# This notebook shows the effect on real allocator state, grouped the way the allocator
# itself divides memory: by `(segment_pool_id, stream)`.

# %% [markdown]
# ## Primer: the words this kit uses
#
# ```text
#  CUDA graph capture: record the kernels of one forward pass once, replay them later
#  without Python. Every tensor the captured kernels use comes from one GRAPH POOL,
#  memory the caching allocator keeps for those graphs alone.
#
#  graph pool (one per vLLM process: the "global graph pool")
#  +-- segment A: one cudaMalloc, made on stream s1 -----------------------------+
#  |  [ block: allocated ][ block: free ][ block: allocated ][ block: free     ] |
#  +-----------------------------------------------------------------------------+
#  +-- segment B: one cudaMalloc, made on stream s2 ----------------+
#  |  [ block: allocated      ][ block: free                      ] |
#  +----------------------------------------------------------------+
#
#  model graphs  (captured on stream s1):  ===[graph]===|eager break|===[graph]===
#  replay graphs (captured on stream s2):                                          ===[graph]===
#    a request from s2 may take only s2's free blocks: s1's free blocks in A are
#    refused ("other stream"), so the allocator adds segment B. That is the stranded memory.
# ```
#
# - **segment**: one `cudaMalloc` the allocator made; it belongs to one pool and to the
#   **stream** of the request that made it, for as long as it lives.
# - **block**: a piece of a segment handed to one tensor (allocated) or waiting for the next
#   request (free); a free block goes only to a request on its segment's stream.
# - **stream**: a CUDA queue of work; a capture runs on one, and vLLM 0.33 makes a new one
#   for every `graph_capture()`.
# - **eager break**: a stretch of a model graph's forward run eagerly between two captured
#   pieces (a breakable CUDA graph); blocks still held across it belong to the graph.
# - **replay graph**: DeepSeek-V4.1's decoder replay layers' own CUDA graphs, captured after
#   the model graphs into the same pool: the captures PR 63155 moves onto the model graphs'
#   stream.
# - **`record_stream`**: marks a block as used by another stream, so that its free waits for
#   that stream's work; it never moves the block to that stream.

# %%
# Any cell still running after two seconds shows a bar with its time so far.
from kit.progress import watch_cells

watch_cells()

# %% [markdown]
# ## A map: where the numbers come from
#
# Three data sources; every table and figure names its own:
# - **live GPU**: this process's own allocator (the replica: a fresh process per run), by
#   default where CUDA is available;
# - **recorded**: snapshots recorded on an NVIDIA H200 and shipped in `kit/recordings`
#   (GPU, torch version, date and command in each file's provenance), by default without
#   CUDA, or on a GPU with `SOURCE = "recorded"` below;
# - **simulator**: the kit's model of the caching allocator replaying a live or recorded
#   trace: 02's step-through and 03's what-if prediction.
#
# Four headline figures, each from a different place:
# - **42 MiB**: the graph-pool segments the replay capture adds on a stream of its own, and
#   what sharing the stream saves, in the kit's **model-and-replay experiment**
#   (`kit.experiments.model_and_replay`: two plain `torch.cuda.graph` captures into one pool;
#   this notebook and 02);
# - **24 MiB**: the replay graphs' graph-pool segments, saved by the patch (48 MiB to
#   24 MiB), in the kit's **replica** of vLLM 0.33's capture path at its `small` preset
#   (hidden 1024; notebook 03);
# - **1.42 GiB**: the same saving in the replica's `large` preset (hidden 7168, vLLM's default
#   replay sizes: 2.96 GiB to 1.53 GiB; notebook 03);
# - **5.18 GiB**: what the replay graphs reserve on DeepSeek-V4.1-Flash, **stated in the
#   PR**; the kit does not run that model and does not measure it.
#
# The first three, read from the shipped recordings (so that they are the same on every
# machine; the experiments below and in 02 and 03 measure them again on `SOURCE`):

# %%
import ipywidgets as widgets
import plotly.io as pio
from IPython.display import display

import kit
from kit.experiments.model_and_replay import model_and_replay
from kit.experiments.scenarios import replica_runs
from kit.experiments.summary import graph_pool_saved
from kit.markup import html_text
from kit.recordings import RECORDED, default_source
from kit.show.before_after import change_figure, replay_segment_bytes
from kit.show.pictures import FigureWidget

pio.renderers.default = "plotly_mimetype"  # JupyterLab's renderer; `make walkthrough` inlines plotly.js


two_streams, one_stream = (model_and_replay(shared_stream=shared, source=RECORDED) for shared in (False, True))
replica = {preset: replica_runs(preset, ("unpatched", "patched"), source=RECORDED) for preset in ("small", "large")}
headline = [
    ("model-and-replay experiment: the replay capture's new graph-pool segments", replay_segment_bytes(two_streams)),
    ("model-and-replay experiment: what sharing the stream saves", graph_pool_saved(two_streams, one_stream)),
]
for preset, runs in replica.items():
    added = replay_segment_bytes(runs["unpatched"])
    headline.append((f"replica, {preset} preset: the replay captures' new graph-pool segments, unpatched", added))
    saved = graph_pool_saved(runs["unpatched"], runs["patched"])
    headline.append((f"replica, {preset} preset: graph pool saved by the patch", saved))
print(f"data source: {RECORDED}: the shipped H200 recordings two_streams, shared_stream and replica/*")
for what, n in headline:
    print(f"{kit.format_bytes(n):>10} = {n / 2**30:.3f} GiB ({n:,} bytes): {what}")
print("  5.18 GiB on DeepSeek-V4.1-Flash: stated in PR 63155, not measured by the kit")

# %% [markdown]
# To force the recordings on a GPU machine for the rest of this notebook, set
# `SOURCE = "recorded"` below.

# %%
SOURCE = default_source()
print(f"data source: {SOURCE}")

# %% [markdown]
# ## The experiment
#
# The kit's model-and-replay experiment: a model-like graph (four layers of bf16 matmuls,
# intermediates freed as it goes) is captured into a `torch.cuda.graph_pool_handle()` pool.
# Then a smaller "replay" graph is captured into the *same* pool, once on a **new** stream
# (as every `graph_capture()` of vLLM 0.33 makes one) and once on the **same** stream (as
# the PR does for the replay graphs). These are two plain torch captures, not vLLM.

# %%
new_stream = model_and_replay(shared_stream=False, source=SOURCE)
shared_stream = model_and_replay(shared_stream=True, source=SOURCE)
print(new_stream.source_label)
kit.style_table(kit.segment_table(new_stream))

# %% [markdown]
# Read the rows of the graph pool. With the replay capture on its own stream, the pool has
# **two** groups: the model graph's stream, and the replay graph's stream, whose segments
# are mostly free. The free blocks the model capture left behind were there, on the other
# stream, and could not be used. The same, as bars:

# %%
kit.group_bar_figure(new_stream).show()

# %%
kit.style_table(kit.segment_table(shared_stream))

# %% [markdown]
# On the shared stream the pool has **one** group: the replay capture fit into blocks the
# model capture had freed.
#
# ## What changes between the two runs?
#
# The capture table says what each capture added to its pool; the diff goes from the
# new-stream run to the shared-stream run, group by group. The two runs are separate
# processes whose stream ids differ, so groups are matched by stream name (`by="label"`).

# %%
diff = kit.diff_tables(kit.segment_table(new_stream), kit.segment_table(shared_stream), by="label")
print(f"data source: {SOURCE}: {diff.attrs['source']}")
for name, snap in (("new stream", new_stream), ("shared stream", shared_stream)):
    added = replay_segment_bytes(snap)
    print(f"{name}: the replay capture added {kit.format_bytes(added)} ({added:,} bytes) of graph-pool segments")
for line in kit.diff_summary(diff):
    print(line)

# %% [markdown]
# Where did sharing the stream save memory: in the graph pool only, or elsewhere too? Pick a
# pool. The bars show each of its (pool, stream) groups in both runs, allocated and free;
# the table below them is the change (`kit.diff_tables`), one row per group.

# %%
pool_choice = widgets.ToggleButtons(options=sorted(set(diff["pool_label"]), reverse=True), description="pool")
pool_choice.add_class("kit-main-control")  # the control tests/test_browser.py moves
summary, rows, bars = widgets.HTML(), widgets.HTML(), FigureWidget()
CHANGE = ["stream_label", "status", "segments", "reserved_before", "reserved_after", "reserved", "free"]


def show(change=None):
    in_pool = diff[diff["pool_label"] == pool_choice.value]
    summary.value = "".join(f"<p><b>{html_text(line)}</b></p>" for line in kit.diff_summary(in_pool))
    rows.value = kit.style_table(in_pool[CHANGE]).to_html()
    kit.show_in(bars, change_figure(in_pool, "new stream", "shared stream"))


pool_choice.observe(show, names="value")
show()
display(widgets.VBox([pool_choice, summary, bars, rows]))

# %% [markdown]
# In the graph pool the replay stream's whole group is gone and the model stream's group
# kept its segments: the replay graph's blocks now sit in them. The default pool has a group
# on the replay stream too, gone when it shares: the cuBLAS workspace the warm-up's first
# matmul allocated on that new stream (cuBLAS keeps one per stream). A stream of its own
# costs the replay capture its own workspace as well as its own pool segments.
#
# **What it shows.** A second stream in one graph pool is a second set of segments: its
# capture allocates fresh memory while the pool's other stream holds enough free bytes.
#
# **Next question.** Why exactly does the allocator refuse those free blocks, one request at
# a time, and is it safe for the replay graphs to share the model graphs' stream?
# The same tables work on your own snapshot: `python -m kit table my_snapshot.pickle`, or
# `python -m kit report my_snapshot.pickle -o report.html`.

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
# # The fix: the replay graphs on the model graphs' stream
#
# **The question.** 02 showed the replay graphs' requests refusing the model graphs' free
# blocks because they belong to another stream, and `graph_capture()` making that stream.
# PR 63155 hands the model graphs' stream to the replay-graph capture. What does that change
# in the graph pool, how many bytes does it save, and could the kit have predicted it from
# the unpatched recording alone?

# %%
# Any cell still running after two seconds shows a bar with its time so far.
from kit.progress import watch_cells

watch_cells()

# %%
import pandas as pd
import plotly.io as pio
from IPython.display import display

import kit
import kit.patch.replica
from kit.analysis.added_segments import added_segments_lines
from kit.analysis.attribution import is_replay_capture
from kit.analysis.names import GRAPH_POOL_LABEL
from kit.analysis.whatif import PREDICTION_BYTES, prediction_table
from kit.experiments.scenarios import replica_runs
from kit.experiments.summary import summarize
from kit.experiments.vllm.recordings import recording_path
from kit.recordings import default_source
from kit.replica import parallel_state
from kit.show.before_after import (
    SCENARIO_OF,
    BeforeAfterView,
    replay_segment_bytes,
    replay_segments_line,
)

pio.renderers.default = "plotly_mimetype"  # JupyterLab's renderer; `make walkthrough` inlines plotly.js
SOURCE = default_source()
print(f"data source: {SOURCE}")

# %% [markdown]
# ## The patch, in-process
#
# `kit.patch.replica` applies the PR to the replica in this process the way `kit.patch.vllm`
# applies it to vLLM: it edits the PR's lines in each function's own source and installs the
# results. `graph_capture()` takes an optional stream, `CudaGraphManager.capture()` records the
# one it used, the runner hands the model graphs' stream to `capture_inner_cudagraphs()`, which
# passes it to the replay graphs (unless aux hidden states come before the replay layers:
# notebook 04). Patching needs no GPU, so here it is applied, read, and reverted.

# %%
original = parallel_state.graph_capture
patch = kit.patch.replica.apply(policy="pr")
print(f"{patch}; it replaces:")
for target in patch.targets():
    print("  ", target)
kit.patch.replica.revert()
print(f"{patch}; the replica's graph_capture is unpatched again: {parallel_state.graph_capture is original}")
print(patch.diff())

# %% [markdown]
# ## The same capture, unpatched and patched
#
# The replica is captured twice, each time in a fresh process so that its allocator starts
# empty: unpatched, its mirror of vLLM 0.33's capture path (scenario `unpatched`), and under
# the PR (`kit.patch.replica.patched("pr")`, scenario `patched`), at two sizes: `small`
# (hidden 1024, sizes 128 to 512) and `large` (hidden 7168, sizes 512 to 8192, bf16).
# `kit.experiments.scenarios.replica_runs` runs them live on a GPU, or loads their H200
# recordings.

# %%
PRESETS = ("small", "large")
runs = {
    (preset, name): snap
    for preset in PRESETS
    for name, snap in replica_runs(preset, tuple(SCENARIO_OF.values()), source=SOURCE).items()
}
for (preset, name), snap in runs.items():
    print(f"data source: {SOURCE}: {preset} {name}: {snap.source_label}")

# %% [markdown]
# ## Before and after, side by side
#
# Left, the replica unpatched; right, the replica patched (PR 63155's policy `pr`), at the
# preset you pick: does the saving grow with the model? Below them, the bytes the graph pool
# saves, the graph-pool segments each run's replay captures added, and the change per group,
# matched by stream name since the runs are separate processes
# (`kit.diff_tables(..., by="label")`); the bars show each group in both runs
# (`kit.show.before_after`).

# %%
display(BeforeAfterView(runs, PRESETS).widget)

# %% [markdown]
# Under the PR the graph pool has one group: the replay graphs' captures fit into the model
# graphs' free blocks, and the model graphs' group did not grow. The replay graphs' stream is
# gone from the default pool too (its warm-up activations and its own cuBLAS workspace).
#
# ## Under the patch the replay capture adds no graph-pool segment, on the replica
#
# The PR says so; here it is read from the data: per capture, the segments it added to its pool
# (`kit.capture_table`, `new_segment_bytes`). On the replica, unpatched, the replay captures add
# exactly what the patch saves; patched, they add nothing.

# %%
replay_rows = []
for (preset, name), snap in runs.items():
    captures = kit.capture_table(snap)
    replay = captures[captures["manager"].map(is_replay_capture) & (captures["pool_label"] == GRAPH_POOL_LABEL)]
    replay_rows.append(replay.assign(preset=preset, run=name))
replay_captures = pd.concat(replay_rows, ignore_index=True)
replay_captures.attrs.update(source=f"{SOURCE} runs of the replica", byte_columns=["new_segment_bytes"])
print(f"data source: {SOURCE}")
for (preset, name), snap in runs.items():
    print(replay_segments_line(f"{preset} {name}", snap))
patched_added = sum(replay_segment_bytes(runs[preset, "patched"]) for preset in PRESETS)
print(f"under the patch the replay captures add no graph-pool segment: {patched_added == 0} ({patched_added:,} bytes)")
shown = ["preset", "run", "manager", "size", "stream_label", "pool_label", "new_segments", "new_segment_bytes"]
kit.style_table(replay_captures[shown])

# %% [markdown]
# ## On vLLM's own path the patched replay captures add 2 MiB: which request, and why
#
# vLLM 0.33's own capture code, recorded on the H200 (`python -m kit demo --vllm`, notebook 06),
# is not so clean: under the patch its replay captures add one segment. `kit.analysis.added_segments`
# names each segment the replay captures added, the allocator request that made it, and why no free
# block served it, from the pool's free blocks at that request (the trace replayed as recorded on
# the simulator): too small on its own stream and size class, of the other size class (a request of
# up to 1 MiB is served from the small pool only, a larger one from the large pool only), or on
# another stream.

# %%
for name in ("unpatched", "patched"):
    figures = summarize(recording_path(name), segments=True)
    causes = figures["replay_added_by_cause"]
    print(f"data source: {figures['source']}")
    print(
        f"vLLM's path, {name}: the replay captures added {kit.format_bytes(figures['replay_added_bytes'])}; "
        f"for the stream's sake (a fitting free block on another stream): {kit.format_bytes(causes['another_stream'])}"
    )
    print("\n".join(added_segments_lines(figures["replay_added_segments"], indent="  ")))

# %% [markdown]
# **What this means for the PR's sentence.** The patched 2 MiB is replay graph 512's 1 MiB
# hidden state (512 rows x 1024, bf16), a small-pool request: the model graphs' three small
# segments held 5 MiB + 8 KiB of that graph's own live tensors, the two free 8 MiB blocks are
# large-pool ones, and no free block sat on another stream. So "the replay capture adds no graph
# pool segment" holds for the segments the stream made (none under the patch, 28 MiB without it);
# a replay graph that needs more in a size class than the model graphs left free there adds
# segments on any stream. The saving on vLLM's path is 26 MiB of those 28 (docs/vllm.md).

# %% [markdown]
# ## Predicted from the unpatched trace
#
# `kit.what_if(unpatched, {"replay graphs stream": "model graphs stream"})` turns the
# unpatched recording's trace back into allocator operations, moves the replay stream's
# onto the model graphs' stream and runs them on the simulator. Its prediction, next to what
# the patched run measured:

# %%
tables, corrections = [], {}
for name in PRESETS:
    unpatched, patched = runs[name, "unpatched"], runs[name, "patched"]
    whatif = kit.what_if(unpatched, {"replay graphs stream": "model graphs stream"})
    corrections[name] = whatif.corrections
    tables.append(prediction_table(unpatched, patched, whatif).assign(preset=name))
comparison = pd.concat(tables, ignore_index=True)[["preset", "pool_label", *PREDICTION_BYTES]]
comparison.attrs["source"] = f"predicted: simulator (what-if on the unpatched traces); measured: {SOURCE} runs"
print(f"data source: simulator (prediction) and {SOURCE} (measured)")
for row in comparison[comparison["pool_label"] == "global graph pool"].itertuples():
    print(
        f"{row.preset}: graph pool predicted {kit.format_bytes(row.predicted)}, measured "
        f"{kit.format_bytes(row.patched)}; saved: predicted {row.saved_predicted:,} bytes, measured "
        f"{row.saved_measured:,} bytes"
    )
kit.style_table(comparison).format(kit.format_bytes, subset=PREDICTION_BYTES)

# %% [markdown]
# On these runs the graph pool's prediction is the measurement. Where the prediction misses, in the
# default pool, the what-if says why: the trace cannot know which per-stream caches a
# shared-stream run would reuse instead of allocating again.

# %%
for name, notes in corrections.items():
    for note in notes or ["none"]:
        print(f"{name}: {note}")

# %% [markdown]
# ## Do the patched graphs still compute the same thing?
#
# Each run checked its graphs against eager execution of the same weights on fresh inputs,
# every capture size and output compared bit for bit (`kit.check_equivalence`, stored in the
# run's `kit["equivalence"]`):

# %%
print(f"data source: {SOURCE}")
for (name, scenario), snap in runs.items():
    print(f"{name} {scenario}: {kit.Equivalence.recorded_in(snap).summary()}")

# %% [markdown]
# **What it shows.** On the model graphs' stream the replay graphs reuse the model graphs'
# free blocks: under the patch the replica's replay capture adds no graph-pool segment, so the
# graph pool loses the replay stream's whole group (24 MiB at the small preset, 1.42 GiB at the
# large one, on the H200 recordings); the what-if predicted exactly that from the unpatched
# trace, and every output is still bit-exact. On vLLM's own path the patched replay captures
# still add 2 MiB, for want of a large enough small-pool block on any stream, not for the stream.
#
# **Next question.** Bit-exact here, but is sharing always safe? A replay graph now writes
# into blocks the model graph freed. If the model graph still needs one of them across the
# eager break (aux hidden states produced before the replay layers), sharing would corrupt
# it. Notebook 04 looks at that exception, and at why the PR keeps a separate stream there.

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
# # Root cause: why the replay graphs cannot use the model graphs' free blocks
#
# **The question.** In 01 the replay capture, on a new stream, added segments to the graph
# pool while the model capture's free blocks sat in the same pool. Why did the allocator not
# hand it those blocks?
#
# **The rule (PyTorch's `CUDACachingAllocator.cpp`).** Free blocks are kept sorted by
# `(stream, size, address)`. A request looks up the smallest free block of *its own stream*
# that fits, lowest address first. A block of another stream is never handed out, however
# large, and every block of a segment carries the stream of the segment's first allocation.
# This notebook watches that rule decide, one request at a time, and then finds where vLLM
# makes the second stream.

# %%
# Any cell still running after two seconds shows a bar with its time so far.
from kit.progress import watch_cells

watch_cells()

# %%
import inspect
import sys
from pathlib import Path

import plotly.io as pio
from IPython.display import display

import kit
from kit.experiments.model_and_replay import model_and_replay
from kit.experiments.scenarios import replica_runs
from kit.patch.vllm import quiet_import
from kit.recordings import default_source
from kit.replica import cudagraph_utils, parallel_state
from kit.show.stepthrough import GROUP_COLUMNS, StepThrough, StepView

pio.renderers.default = "plotly_mimetype"  # JupyterLab's renderer; `make walkthrough` inlines plotly.js
SOURCE = default_source()
print(f"data source: {SOURCE}")

# %% [markdown]
# ## The two captures, replayed on the simulator
#
# The experiment of 01: a model-like graph captured into a `graph_pool_handle()` pool, then
# a smaller replay graph into the same pool on a **new** stream, recorded with the
# allocator's memory history. The step-through below (`kit.show.stepthrough`) is the kit's
# simulator (`kit/allocator/simulator.py`) replaying that recorded trace op by op, with the
# recording's own segment addresses, so every decision can be shown with its reasons. The
# simulator matches PyTorch's allocator block for block on all 70 workloads of the kit's
# H200 corpus (`kit/recordings/corpus`); on this trace the check is that its final state
# equals the recorded snapshot.

# %%
snap = model_and_replay(shared_stream=False, source=SOURCE)
steps = StepThrough(snap)
mismatches = steps.mismatches()
print(f"data source: simulator, replaying the trace from: {snap.source_label}")
print(f"{len(steps.ops)} allocator operations, {len(steps.steps)} of them allocations in the graph pool")
print(f"simulated final state equals the recording, segment by segment and block by block: {not mismatches}")
for line in mismatches:
    print("  differs:", line)

# %% [markdown]
# ## One request at a time
#
# Move the slider through the graph pool's allocations. For each request: what it asked
# for and on which stream; the free blocks of its pool just before it, each with the
# allocator's verdict (`taken`, or refused: `other stream`, `too small`, `other size class`
# for a small block offered to a large request or the reverse); then the pool's segment map
# and the segment-by-stream table just after it. On the map the block the request got is
# outlined in black, the blocks it may not take because they belong to another stream in
# red. The slider starts at the replay capture's first request; drag it left to watch the
# model capture fill the pool and reuse its own freed blocks.

# %%
first_replay = steps.first_step_on("replay graphs stream")
display(StepView(steps, start=first_replay).widget)

# %% [markdown]
# At the replay capture's first request, its pool holds free blocks large enough, all on the
# model graphs' stream: each is refused as `other stream`, and the request gets a new
# segment. From then on the replay capture reuses only what it allocated itself. In numbers:

# %%
replay = [s.decision for s in steps.steps if s.decision.stream == "replay graphs stream"]
made = [d for d in replay if d.outcome == "new_segment"]
blocks = steps.free_blocks(first_replay)
refused = blocks[blocks["verdict"] == "refused: other stream"]
print(f"data source: simulator, replaying the trace from: {snap.source_label}")
print(
    f"replay capture: {len(replay)} requests in the graph pool, {len(made)} new segments, "
    f"{kit.format_bytes(sum(d.segment_size for d in made))} of new graph-pool memory"
)
print(
    f"free on the model graphs' stream when it began: {len(refused)} blocks, {kit.format_bytes(refused['free'].sum())},"
    f" the largest {kit.format_bytes(refused['free'].max())}; its largest request: "
    f"{kit.format_bytes(max(d.rounded for d in replay))}"
)

# %% [markdown]
# ## Where vLLM makes the second stream
#
# The kit's replica rebuilds vLLM 0.33's capture path with vLLM's names: the model graphs'
# `CudaGraphManager.capture()` and then the decoder replay graphs'
# `DecoderReplayCudaGraphManager`, both capturing into the one global graph pool. The
# capture recorder labels every capture with its manager, size and stream. (Live, the
# replica runs in a fresh process, so that its allocator starts empty:
# `kit.experiments.scenarios.replica_runs`.)

# %%
replica = replica_runs("small", ("unpatched",), source=SOURCE)["unpatched"]
print(f"data source: {SOURCE}: the replica, unpatched: {replica.source_label}")
captures = kit.capture_table(replica)
shown = ["manager", "size", "stream_label", "pool", "graphs", "eager_breaks", "new_segments", "new_segment_bytes"]
kit.style_table(captures[shown]).format({"new_segment_bytes": kit.format_bytes})

# %% [markdown]
# Every model graph was captured on one stream and every replay graph on another, into the
# same pool `(0, 1)`. The replay graphs' first capture added segments of its own although
# the model graphs had finished and freed their activations. The graph pool's groups:

# %%
table = kit.segment_table(replica)
kit.style_table(table[table["pool_label"] == "global graph pool"][GROUP_COLUMNS])

# %% [markdown]
# Two groups of the same pool. Once capture ends every graph-pool byte is free in both (the
# graphs own their blocks only while they replay), so "free" is not the symptom; the second
# group's existence is: its segments were reserved while the model graphs' free blocks, large
# enough, sat on the other stream (stranding, as `python -m kit check` counts it). The second stream
# comes from `graph_capture()`, which every `CudaGraphManager.capture()` enters. Here is
# vLLM's own code where vLLM is importable (it is installed with the kit), else the
# replica's mirror of it (`kit.replica`); the first line says which was printed. Of
# `capture()` only the lines up to its `graph_capture()` call are shown.


# %%
def capture_path():
    """(which code, graph_capture, CudaGraphManager.capture): the installed vLLM's, else the replica's."""
    try:
        with quiet_import():
            import vllm
            from vllm.distributed import parallel_state as vllm_parallel_state
            from vllm.v1.worker.gpu import cudagraph_utils as vllm_cudagraph_utils
    except (ImportError, OSError, RuntimeError) as e:  # not installed, or broken on this machine
        return f"the replica's mirror (vLLM not importable: {e})", parallel_state, cudagraph_utils
    return f"the installed vLLM {vllm.__version__}", vllm_parallel_state, vllm_cudagraph_utils


def print_source(function, stop_after: str | None = None) -> None:
    """A function's source with its module and first line; up to the first line holding `stop_after`."""
    function = inspect.unwrap(function)  # past @contextmanager and @torch.inference_mode()
    lines, first = inspect.getsourcelines(function)
    package = Path(sys.modules[function.__module__.partition(".")[0]].__file__).parent
    where = Path(inspect.getsourcefile(function)).relative_to(package.parent)
    print(f"# {function.__module__}.{function.__qualname__}, {where}:{first}")
    for line in lines:
        print(line.rstrip() + ("    # <-- a new stream on every call" if "torch.cuda.Stream(" in line else ""))
        if stop_after and stop_after in line:
            print("        ...")
            break
    print()


which, graph_capture_module, manager_module = capture_path()
print(f"printed: {which}")
print_source(graph_capture_module.graph_capture)
print_source(manager_module.CudaGraphManager.capture, stop_after="graph_capture(")

# %% [markdown]
# **What it shows.** The allocator did what its rule says: the replay capture's requests
# looked only at free blocks of their own, new stream, found none, and made new segments,
# while enough free memory sat in the same pool on the model graphs' stream. The stream is
# new because `graph_capture()` makes one for every manager's `capture()`.
#
# **Next question.** If the replay graphs were captured on the model graphs' stream, as
# PR 63155 does, how much would the pool shrink, and can the kit predict it from the
# unpatched trace alone? Notebook 03 applies the patch.

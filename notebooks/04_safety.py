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
# # Is sharing safe? The proof obligation, on every pairing
#
# **The question.** PR 63155 lets the decoder replay graphs take the graph-pool blocks the
# model graphs freed, so at run time those blocks belong to both. A replay graph runs only
# inside a model graph's eager break. Sharing is safe when what it writes there never
# overwrites a value the model graph still reads after the break. The first cell prints that
# as the obligation the kit checks (`kit.analysis.readwrite.OBLIGATION`).
#
# **What the argument relies on.** Only the values carried *across* the break count, not
# what a segment did with the blocks it freed. A segment ends with `CUDAGraph.capture_end`,
# and CUDA fails a capture unless every stream forked into it has joined back to the capture
# stream. The break's eager work and the replay graph are queued on that stream after the
# segment. So a block the segment freed is idle when the replay graph writes it, even if its
# free was pending (`record_stream`) or made on another stream. `kit/analysis/readwrite.py`
# cites the PyTorch and CUDA sources.
#
# **Three checks** on the replica (vLLM's capture path in miniature, `kit.replica`):
# 1. *outputs*: every replay graph replayed inside every model graph's break, against eager;
# 2. *bytes*: the obligation itself, from the bytes each op reads and writes during capture;
# 3. *lifetimes*: the analysis a plain allocator trace allows, beside check 2.

# %%
import inspect

import plotly.io as pio
from IPython.display import display

import kit
import kit.patch.replica
from kit.analysis.readwrite import OBLIGATION
from kit.experiments.pairings import pair_verdicts
from kit.experiments.scenarios import replica_runs
from kit.recordings import default_source
from kit.replica.model import replay_rows
from kit.show.safety import (
    SafetyView,
    agreement_table,
    disagreement_lines,
    load_safety,
    overview_table,
    pairings_table,
)

pio.renderers.default = "plotly_mimetype"  # JupyterLab's renderer; `make walkthrough` inlines plotly.js
SOURCE = default_source()  # live on a GPU (some minutes); set to "recorded" for the H200 recordings
PRESET = "small"
print(f"data source: {SOURCE}")
print(f"the obligation: {OBLIGATION}")

# %% [markdown]
# ## The PR's rule
#
# The patch hands the model graphs' stream to the replay graphs unless an aux hidden state is
# made before the replay layers: the forward returns it, so it is carried across the break.
# `policy="share"` drops that exception, which is the experiment the exception exists for.
# The comparison is strict (`<`): the docstring says why aux id `decoder_replay_start` is made
# inside the break.

# %%
print(inspect.getsource(kit.patch.replica.replay_stream))
print(inspect.getsource(kit.patch.replica.has_early_aux))

# %% [markdown]
# ## 1. Every replay graph in every break, against eager
#
# `kit.experiments.pairings` captures the replica once per policy, each in a fresh process:
# `pr` (PR 63155), `unpatched` (vLLM 0.33) and `early_aux_shared` (an aux hidden state at
# layer 1, the replay graphs forced onto the shared stream anyway). The break gets V4.1's
# several inputs: the hidden states and the hyper-connection state `residual`, `post_mix` and
# `res_mix`. Then, for every model graph N and replay graph R, N runs on fresh token ids, R is
# replayed on random inputs inside N's break before N's own replay graph, and N's outputs are
# compared bit for bit with eager. A pairing vLLM's dispatch can produce is *dispatchable*
# (R is at most N/2 here); the others (`*`) are stress only.

# %%
records = load_safety(PRESET, SOURCE)
print(f"data source: {SOURCE}: {records.pairs.attrs['source']}")
for line in pair_verdicts(records.pairs):
    print(line)
pairings_table(records.pairs)

# %% [markdown]
# Under the PR and unpatched every pairing is bit-exact. Unpatched that proves little: there no
# replay graph allocates over a block a model graph holds, and equal outputs cannot say which
# bytes were at risk. That is check 2's question. With early aux forced to share, some
# pairings differ, and in the H200 recording model graph 256 differs even with only its own
# replay graph (the last column).
#
# ## 2. The obligation, from what is read and written
#
# `kit.experiments.readwrite_run` captures the same three policies under a
# `kit.ReadWriteRecorder`, a `TorchDispatchMode` that logs the device bytes every aten op reads
# and writes, by phase: N's segments, N's break, N's outputs (read by the caller), replay graph
# R. A graph replays the kernels and addresses it captured, so capture shows what replay does.
# Per pairing, `kit.readwrite_table` intersects what R writes with what N *carries*: bytes
# read after the break whose last write came before it.

# %%
print(f"data source: {SOURCE}: {records.readwrite['source']}")
for policy, run in records.readwrite["policies"].items():
    print(f"obligation under {policy}: {run['obligation'].removeprefix(OBLIGATION).strip()}")
for line in records.readwrite["policies"]["early_aux_shared"]["verdicts"]:
    if "VIOLATED" in line:
        print(f"  {line}")

# %% [markdown]
# Where it fails, the bytes carried across the break are the aux hidden state at layer 1:
# written before the break, read after the forward by its caller, and written by the replay
# graph's kernels in the break. The break's own inputs are not carried: the break reads them
# before any replay graph runs, and nothing reads them after it.
#
# ## 3. The lifetime analysis beside it
#
# A plain allocator trace shows when each block is allocated and freed, never who reads it.
# `kit.liveness_table` lists every graph-pool block a model graph holds across its break,
# and the replay graphs allocated over it, in three classes:
# - **released by the break**: freed as the break returns (an input the forward drops);
# - **break input**: one the break read (`kit["break_reads"]`, attached from the read/write
#   recording), which the forward keeps bound;
# - **held after the break**: any other. Without the breaks' reads nothing is a break input:
#   every held block not released counts as held after the break, which is the safe side.
#
# A conflict is a block held after the break under a replay graph that may run in it. Per
# policy, the pairings each check flags (`kit.show.safety.agreement_table`):

# %%
display(kit.style_table(agreement_table(records)))
for line in disagreement_lines(records):
    print(line)

# %% [markdown]
# With the breaks' reads the lifetime analysis flags exactly the pairings that fail the
# obligation, and those are exactly the pairings whose outputs differ. From the trace alone it
# also flags PR pairings. Each such flag is over `residual`, `post_mix` and `res_mix`. The
# forward keeps them bound to its end, as an aux hidden state is kept, but nothing reads them
# after the break. A trace cannot tell the two apart, and the analysis errs on the safe side.
# On a plain snapshot of real vLLM, where V4.1 keeps the same three tensors, expect the same
# false positives.
#
# ## The exception under the PR's rule
#
# The pairing experiments force early aux to share; the PR itself keeps it off the shared
# stream. The replica's four scenario captures (`kit.experiments.scenarios.replica_runs`,
# each in a fresh process, without the hyper-connection state) show all four cases, each row
# with the trace's checks. *breaks allocate outside the pool* asks whether every eager break
# allocated its outputs outside the graph pool, where no replay graph can write.

# %%
snapshots = replica_runs(PRESET, source=SOURCE)
print(f"data source: {SOURCE}: {snapshots['patched'].source_label}")
kit.style_table(overview_table(snapshots))

# %% [markdown]
# Under the PR's rule (`early_aux_pr`) the aux hidden state is held after the break, but no
# replay graph is captured over it, and the graphs equal eager.
#
# ## Look for yourself: the blocks across the break
#
# Pick the stream policy and whether an aux hidden state comes before the replay layers. The
# PR's rule picks the replay graphs' stream, and with it the capture shown
# (`kit.show.safety.SafetyView`, drawing `kit.show.timeline.timeline_figure`). Each row is a
# block, named by its role: the *break input* the forward drops as the break returns, the
# *aux hidden state* it returns, and the replay graphs' *outputs* and *activations* over them.
# A bar runs from allocation to free in capture order: the model graphs first, then the
# replay graphs, so a replay graph's mark sits right of the block it lands on. A cross marks
# a replay graph that runs in that block's break, a circle one that runs in another's.

# %%
display(SafetyView(snapshots, replay_size_for=replay_rows).widget)

# %% [markdown]
# These captures carry no breaks' reads, so a block the forward kept bound would count as
# held after the break. Here the only break input is freed right after the break returns,
# because `kit.CaptureRecorder` drops the forward's locals it read while walking the stack
# (`kit/record/recorder.py`). On Python 3.12 and older, reading a frame's locals keeps them
# alive until the forward returns.
#
# **What it shows.** The obligation holds on every pairing under the PR. It fails only where
# early aux is forced to share, on exactly the pairings whose outputs differ from eager, and
# those are the ones the lifetime analysis flags when it knows what the breaks read. From the
# trace alone, the lifetime analysis also flags the break's kept-bound inputs, which nothing
# reads after the break. The PR's `has_early_aux()` rule keeps the one unsafe case off the
# shared stream.
#
# **Next question.** The PR names two alternatives. One is a single `graph_capture()` for
# every capture, which would put the speculator on the shared stream too. The other is fewer
# replay capture sizes. `05_alternatives` measures what each saves, whether the first is
# safe, and what the saved bytes buy in KV cache. `06_your_snapshot` runs the lifetime
# analysis on your own `_dump_snapshot` pickle.

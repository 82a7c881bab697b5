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
# **Three checks** on the replica (vLLM's capture path in miniature, `kit/replica`):
# 1. *outputs*: every replay graph replayed inside every model graph's break, against eager;
# 2. *bytes*: the obligation itself, from the bytes each op reads and writes during capture;
# 3. *lifetimes*: the analysis a plain allocator trace allows, beside check 2.
#
# **Where it is shown.** Every check in this notebook runs on the **replica**, not on vLLM's
# own code, except the early-aux verdict at the end, read from vLLM's own path's recordings.
# **vLLM's own code** (`kit.experiments.vllm.capture`: vLLM 0.33's
# `GPUModelRunner.capture_model`, `DecoderReplayLayers` and `DecoderReplayCudaGraphManager`
# around a stand-in model, on the H200) is notebook 06's: there it shows which stream the
# replay graphs capture on, the graph pool, graphs against eager, and the early-aux case,
# unpatched and under the PR. The pairings, the obligation and the lifetime analysis shown
# here are the replica's. What is taken from vLLM's code here is the rule for which replay
# graph can run in which break (section 1), cited by file and function.

# %%
# Any cell still running after two seconds shows a bar with its time so far.
from kit.progress import watch_cells

watch_cells()

# %%
import inspect
import re

import plotly.io as pio
from IPython.display import display

import kit
import kit.patch.replica
from kit.analysis.readwrite import OBLIGATION
from kit.experiments.dispatch import RULE as DISPATCH_RULE
from kit.experiments.dispatch import default_step_replay_graph
from kit.experiments.early_aux import early_aux_lines, replica_shape_lines
from kit.experiments.safety_run.result import pair_verdicts
from kit.experiments.scenarios import replica_runs
from kit.experiments.vllm.recordings import recorded_early_aux_verdict
from kit.recordings import default_source
from kit.replica.model import PRESETS
from kit.show.safety import (
    SafetyView,
    agreement_lines,
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
# `kit.experiments.safety_run` captures the replica once per policy, each in a fresh process:
# `pr` (PR 63155), `unpatched` (vLLM 0.33) and `early_aux_shared` (an aux hidden state at
# layer 1, the replay graphs forced onto the shared stream anyway). The break gets V4.1's
# several inputs: the hidden states and the hyper-connection state `residual`, `post_mix` and
# `res_mix`. How the early aux leaves each capture matters (the last section): here it is
# handed out weak, the hypothetical flat return (`early_aux_shared_flat`), so its block is free
# for a replay capture, the case these checks exist to catch. The cell below says, from each
# recording's config, which shape its rows ran.
#
# **Which replay graph can run in which break** is vLLM 0.33's rule (`kit.experiments.dispatch`
# prints it below). `_prepare_replay_batch` (`vllm/models/deepseek_v41/nvidia/model_state.py`)
# breaks a PIECEWISE model graph of N tokens out to a replay batch only when
# `graph_uses_replay_batch` (`vllm/models/deepseek_v41/decoder_replay_layers.py`) finds N at or
# above `decoder_replay_trim_threshold`. The batch holds each request's kept rows: all of them
# for a request that keeps every row (prompt logprobs), else its last min(T, `window`), so a
# step padded to N tokens (more than P, the next smaller model graph) holds from
# min(P + 1, window) to N rows. Under **prefill context parallelism** (`pcp_size` ranks) N is
# the rank's local size but the rows are counted over the global batch
# (`num_padded = pcp.global_num_tokens - num_dropped_tokens`), up to pcp_size x N: with
# pcp_size 2, 64 untrimmed 64-token prefills make local N = 2048 and 4096 rows. An idle
# data-parallel rank's dummy batch keeps one row but runs the replay graph of the largest
# rank's rows. The replay manager's `dispatch` (`CudaGraphManager.dispatch`,
# `vllm/v1/worker/gpu/cudagraph_utils.py`) pads the rows to the smallest replay capture size
# that fits, eagerly above the largest. So a pairing (N, R) is *dispatchable* when R is a
# replay size between the ones the fewest and the most rows pad to: R = N included, R > N when
# N is not itself a replay size, and under PCP R up to the size pcp_size x N rows pad to.
# vLLM's default replay sizes (`DecoderReplayCudaGraphManager.__init__` in
# `vllm/models/deepseek_v41/nvidia/decoder_replay_cudagraph.py`) step by the window up to
# 16 windows, then by an eighth of the power-of-two interval (window 96: ..., 1536, 1664, ...),
# up to min(max capture size, `max_num_seqs` x window).
#
# For every pairing vLLM can dispatch without PCP, and, in recordings made since, every one it
# dispatches with some pcp_size, N runs on fresh token ids with a replay row count that vLLM's
# dispatch pads to R, as a vLLM step would (more rows than N stand for PCP's global count:
# N's own rows padded to R), and N's outputs are compared bit for bit with eager. A pairing
# not dispatched without PCP is marked `*k`, k the smallest pcp_size that dispatches it; `*`
# alone marks one no pcp_size up to 8 dispatches (stress only): in older recordings and for
# those, N's rows are forced into replay graph R (older recordings replayed R on random inputs
# before N's own replay graph), so R is the one replay graph in the break either way. Each
# verdict then says how many pairings have power: rerun with every graph-pool byte but R's
# outputs poisoned right after R, N's outputs must change; a pairing marked `†` could not have
# failed and is not counted as shown.
#
# **vLLM's defaults** are presets too (`h200-default`, `gb200-default`, computed by vLLM 0.33's
# own config code in `scripts/vllm_presets.py`): on an H200 the largest model graph is 512,
# below the trim threshold of 768, so no model graph breaks out and replay graphs run only in
# eager steps; on a GB200 (the Blackwell family's ceiling of 1024) model graphs 768 to 1024 in
# steps of 16 break out, 14 of the 17 to a replay graph larger than themselves.

# %%
records = load_safety(PRESET, SOURCE)
print(f"dispatchable: {DISPATCH_RULE}")
print(f"data source: {SOURCE}: {records.pairs.attrs['source']}")
for line in pair_verdicts(records.pairs):
    print(line)
for line in replica_shape_lines(records.readwrite["scenarios"]):
    print(line)
pairings_table(records.pairs)

# %% [markdown]
# The lines above say, per scenario, which pairings equal eager. Unpatched, equal outputs prove
# little: there no replay graph allocates over a block a model graph holds, and equal outputs
# cannot say which bytes were at risk. That is check 2's question.
#
# **Replay graphs in eager forwards.** vLLM also dispatches replay graphs inside eager
# (NONE-mode) forwards: `_prepare_replay_batch` gives an eager step that trims a prefill a
# replay batch, and `dispatch` may run it in a replay graph. That is safe for the reason the
# shared pool already relies on: in an eager forward no model graph is running, so no
# graph-pool value of a model graph is live across the replay graph, except the outputs of an
# earlier step, which the runner consumes before the next forward (the same assumption every
# model graph already makes of the others in the shared pool). The eager forward's own tensors
# are allocated outside the graph pool, where no replay graph writes.
#
# ## 2. The obligation, from what is read and written
#
# `kit.experiments.readwrite_run` captures the same three scenarios under a
# `kit.ReadWriteRecorder`, a `TorchDispatchMode` that logs the device bytes every aten op reads
# and writes, by phase: N's segments and breaks (each layer's stand-in attention is a break of
# its own, as V4.1 breaks at every attention, and the break where the replay layers run is split
# where they start), N's outputs (read by the caller), replay graph R. A graph replays the
# kernels and addresses it captured, so capture shows what replay does. Per pairing,
# `kit.readwrite_table` intersects what R writes with what is *carried* across R: bytes read
# after R starts (by the rest of the break, N's later segments and breaks, or the caller
# reading N's outputs) whose last write came before R started.

# %%
print(f"data source: {SOURCE}: {records.readwrite['source']}")
stated = set()
for scenario, run in records.readwrite["scenarios"].items():
    verdict = re.search(r"\s(Holds|Violated)\b", run["obligation"])  # the obligation as recorded, then its verdict
    cut = verdict.start() if verdict else len(run["obligation"])
    stated.add(run["obligation"][:cut].strip())
    print(f"obligation under {scenario}: {run['obligation'][cut:].strip()}")
for wording in stated - {OBLIGATION}:
    print(f"  (recorded against an earlier wording of the obligation: {wording})")
for scenario, run in records.readwrite["scenarios"].items():
    for line in run["verdicts"]:
        if "VIOLATED" in line:
            print(f"  {scenario}: {line}")

# %% [markdown]
# Where it fails, the lines name the bytes and who reads them. The value at stake with early
# aux forced to share is the aux hidden state at layer 1: written before the break, read after
# the forward by its caller, so a replay graph whose kernels write its bytes changes what the
# caller reads. A break input counts only where something reads it after R starts; read only
# before R (the gather of the replay layers' inputs), it is not carried.
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
# The table says, per policy, which pairings each check flags, and the lines under it where the
# lifetime analysis and the obligation disagree. From the trace alone the lifetime analysis
# can flag pairings the obligation clears, over `residual`, `post_mix` and `res_mix`: the
# forward keeps them bound to its end, as an aux hidden state is kept, but nothing reads them
# after the break. A trace cannot tell the two apart, and the analysis errs on the safe side.
# On a plain snapshot of real vLLM, where V4.1 keeps the same three tensors, expect the same
# false positives.
#
# ## The exception under the PR's rule
#
# The pairing experiments force early aux to share; the PR itself keeps it off the shared
# stream. The replica's scenario captures (`kit.experiments.scenarios.replica_runs`, each in a
# fresh process, without the hyper-connection state) show every case, each row with the trace's
# checks: early aux forced to share twice, with the aux returned as V4.1 returns it
# (`(hidden_states, aux_list)`, which vLLM's wrapper keeps allocated) and flat (the hypothetical
# whose aux blocks a later capture may take). *breaks allocate outside the pool* asks whether every eager break
# allocated its outputs outside the graph pool, where no replay graph can write.

# %%
snapshots = replica_runs(PRESET, source=SOURCE)
print(f"data source: {SOURCE}: {snapshots['patched'].source_label}")
kit.style_table(overview_table(snapshots))

# %% [markdown]
# Under the PR's rule (`early_aux_pr`) the aux hidden state is held after the break; its row
# says whether a replay graph was captured over it and whether the graphs equal eager.
#
# ## Look for yourself: the blocks across the break
#
# Pick the stream policy, whether an aux hidden state comes before the replay layers, and how
# the model returns it. The PR's rule picks the replay graphs' stream, and with it the capture
# shown; forced to share, only the flat return puts a replay graph over the aux block
# (`kit.show.safety.SafetyView`, drawing `kit.show.timeline.timeline_figure`). Each row is a
# block, named by its role: the *break input* the forward drops as the break returns, the
# *aux hidden state* it returns, and the replay graphs' *outputs* and *activations* over them.
# A bar runs from allocation to free in capture order: the model graphs first, then the
# replay graphs, so a replay graph's mark sits right of the block it lands on. A cross marks
# the replay graph the replica's default step runs in that block's break (its last N/2 rows,
# `replay_rows`, padded to vLLM's replay sizes), a circle one that runs in another's; vLLM's
# dispatch can run others there too (section 1).

# %%
display(SafetyView(snapshots, replay_size_for=default_step_replay_graph(PRESETS["small"])).widget)

# %% [markdown]
# These captures carry no breaks' reads, so a block the forward kept bound would count as
# held after the break. Here the only break input is freed right after the break returns,
# because `kit.CaptureRecorder` drops the forward's locals it read while walking the stack
# (`kit/record/recorder.py`). On Python 3.12 and older, reading a frame's locals keeps them
# alive until the forward returns.
#
# **What it shows**, computed from the recordings:

# %%
print(f"data source: {SOURCE}")
print("\n".join(agreement_lines(records)))

# %% [markdown]
# ## 4. The invariant, and a check that can fail
#
# Checks 1 and 2 can only fail if something after the break reads a graph-pool value from
# before it: under the PR nothing does, so every pairing passes whatever R wrote (the `†`
# marks above: no power). The PR's safety argument is that structural fact, so the kit states
# it as an invariant and lists, per model graph, the graph-pool bytes read after the replay
# break that were written before it (early aux told apart, the PR's exception). A planted bug
# shows the list is not vacuous: `planted_cross_break_read` keeps a float32 copy of the
# pre-break hidden states in the graph pool and reads it after the break. It must violate the
# invariant by exactly that block and differ from eager (its rows in the tables above).

# %%
from kit.experiments.readwrite_run.result import invariant_lines
from kit.experiments.vllm.recordings import shipped_invariants
from kit.experiments.vllm.safety import vllm_invariant_lines

print(f"data source: {SOURCE}: {records.readwrite['source']}")
for line in invariant_lines(records.readwrite):
    print(line)
print("\ndata source: recorded, vLLM 0.33's own capture path (kit/recordings/vllm)")
for line in vllm_invariant_lines(shipped_invariants()):
    if not line.startswith("  "):  # the verdicts, without each model graph's line
        print(line)

# %% [markdown]
# As recorded (H100, 2026-12-05): the invariant holds under the PR and unpatched on every
# pairing, on the replica and on vLLM's path; with early aux the only bytes carried are the
# early aux (the exception); the planted bug violates it (2, 4 and 8 MiB for model graphs 128,
# 256 and 512 on vLLM's path) and differs from eager on 8 of the 11 dispatchable pairings, on
# both. So the pairing check has power exactly where something crosses the break.
#
# The PR's `has_early_aux()` (printed at the top) keeps an aux hidden state made before the
# replay layers, the case `early_aux_shared` forces onto the shared stream, off it. From the
# trace alone, the lifetime analysis can also flag the break's kept-bound inputs, which nothing
# reads after the break (section 3). All of it on the replica; notebook 06 runs vLLM 0.33's own
# capture code (the replay graphs' stream, the graph pool, graphs against eager, early aux).
#
# ## Early aux on vLLM's semantics: is the exception needed?
#
# Where the early aux block can go depends on how it leaves the model graph's capture. vLLM
# 0.33's `BreakableCUDAGraphWrapper._capture` (`vllm/compilation/breakable_cudagraph.py`) hands
# its caller `weak_ref_tensors(output)`, and `weak_ref_tensors` (`vllm/utils/torch_utils.py`)
# weak-references top-level tensors only. DeepSeek-V4.1 returns `(hidden_states, aux_list)`, so
# the wrapper keeps the early aux block allocated and no replay capture can take it. The
# failures above, where the replica's early aux rows ran flat, are the hypothetical case in
# which vLLM handed the early aux out weak.
#
# The verdict below is computed from vLLM's own capture path's recordings
# (`kit/recordings/vllm`, `kit.experiments.early_aux`), forced to share in both return shapes.
# As recorded (H100, 2026-12-05): with V4.1's nested aux list (`early_aux_shared`) graphs
# equal eager bit for bit and the obligation holds on 11 of 11 dispatchable pairings, in a
# 30 MiB graph pool against 56 MiB under the PR (`early_aux_pr`, the same return shape), so on
# vLLM 0.33 the exception is defensive and costs 26 MiB there. With the aux handed out flat
# (`early_aux_shared_flat`) graphs differ from eager (largest difference 7.89) and the
# obligation fails on 10 of 11: the exception becomes necessary if a model returned its aux
# flattened or `weak_ref_tensors` recursed. The replica, whose weak references follow vLLM's,
# agrees (`kit demo`): nested and shared bit-exact in 28 MiB against 50 MiB under the PR, flat
# and shared 6.64 in 26 MiB.

# %%
for line in early_aux_lines(recorded_early_aux_verdict()):
    print(line)

# %% [markdown]
#
# **Next question.** The PR names two alternatives. One is a single `graph_capture()` for
# every capture, which would put the speculator on the shared stream too. The other is fewer
# replay capture sizes. `05_alternatives` measures what each saves, whether the first is
# safe, and what the saved bytes buy in KV cache. `07_your_snapshot` runs the lifetime
# analysis on your own `_dump_snapshot` pickle.

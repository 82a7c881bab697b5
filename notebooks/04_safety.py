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
# # Is sharing safe? What is live across the eager break
#
# **The question.** PR 63155 lets the decoder replay graphs take the graph-pool blocks the
# model graphs freed. At run time those blocks belong to both graphs at once. The PR says
# that is safe: a replay graph runs inside an eager break of a model graph, after the break
# gathered its inputs into static buffers, and after the break the model graph reads only
# the break's output buffers, which live outside the pool. So no pool block the model graph
# still needs is live while the replay graph runs. The exception is aux hidden states
# produced before the replay layers: the forward holds them across the break.
#
# This notebook checks the argument three ways on the replica (vLLM's capture path in
# miniature, `kit.replica`): which pool blocks the trace shows live across each break, where
# the break's own allocations land, and whether graph outputs equal eager ones bit for bit.

# %%
import inspect

import plotly.io as pio
from IPython.display import display

import kit
import kit.patch.replica
from kit.experiments.scenarios import replica_runs
from kit.recordings import default_source
from kit.replica.model import replay_rows
from kit.show.safety import SafetyView, equivalence_view, liveness_view, overview_table

pio.renderers.default = "plotly_mimetype"  # JupyterLab's renderer; `make walkthrough` inlines plotly.js
SOURCE = default_source()  # set to "recorded" to use the H200 recordings on a GPU machine
PRESET = "small"
print(f"data source: {SOURCE}")

# %% [markdown]
# ## The PR's rule
#
# The patch hands the model graphs' stream to the replay graphs unless an aux hidden state
# comes before the replay layers. `policy="share"` drops the exception: the experiment the
# exception exists for.

# %%
print(inspect.getsource(kit.patch.replica.replay_stream))
print(inspect.getsource(kit.patch.replica.has_early_aux))

# %% [markdown]
# ## Four captures of the replica
#
# The replica (hidden 1024, 6 layers, replay layers from layer 3, sizes 128-512) is captured
# four ways. Each capture needs an empty allocator, so on a GPU each runs in a fresh process
# (`kit.experiments.scenarios.replica_runs`); without one, the H200 recordings of the same
# runs load. One row per run (`kit.show.safety.overview_table`):

# %%
snapshots = replica_runs(PRESET, source=SOURCE)
print(f"data source: {SOURCE}: {snapshots['patched'].source_label}")
kit.style_table(overview_table(snapshots))

# %% [markdown]
# The last three columns are the three checks. The rest of the notebook takes them one at
# a time, on the PR's own case first (`patched`: no early aux, replay graphs on the model
# graphs' stream).
#
# ## 1. Which pool blocks are live across the break
#
# The capture recorder logs one trace window per graph: a breakable capture's consecutive
# graphs are its segments, and the gaps between them are its eager breaks. Trace entries
# carry no pool, so `kit.liveness_table` maps each allocation to its segment (as
# `kit.replay_trace` does) and lists, per model capture and break, every block of the graph
# pool allocated before the break and not freed before it began. Each gets a class:
# - **released by the break**: freed after the break began and before the next graph
#   segment's first allocation: the forward dropped it as the break returned;
# - **break input**: where a break released nothing, the newest block held across it, the
#   tensor the break was called with (see the note below);
# - **held after the break**: freed later or never: the model graph may still read it.
#
# Then it looks for replay-graph allocations over each block's bytes.

# %%
patched = snapshots["patched"]
patched_liveness = kit.liveness_table(patched, replay_size_for=replay_rows)
liveness_view(patched_liveness, patched.source_label)

# %%
for line in patched_liveness.verdicts():
    print(line)

# %% [markdown]
# One block per break, the size of the hidden states (tokens x 1024 x 2 bytes): the input
# of the replay layers. `replay_size_for=replay_rows` tells the analysis which replay graph
# runs in which break (the replica's replay batch is half the rows: model graph 256 runs
# replay graph 128); without it, any replay graph is assumed to run in any break, as in
# vLLM, where the step's replay rows pick it.
#
# Replay graph 128 *is* captured over model graph 256's break input, and runs in that
# break. It is harmless because nothing reads that block after the break, which the
# equivalence check below confirms.
#
# **A note on the trace.** The break input reads as *released by the break*: it is freed in
# the first allocator event after the break returns. That holds only because the recorder
# does not keep it alive: on Python 3.12 and older, reading a frame's locals (the recorder's
# stack walk does, to find the graph manager) keeps every local of the forward alive until
# the forward returns, so `kit.CaptureRecorder` clears what it read
# (`kit/record/recorder.py`). A recording made without that frees the break input only at
# the end of the capture; the analysis then takes the newest block held across a break that
# released nothing as the break's input (class *break input*).
#
# ## 2. The break's outputs live outside the pool
#
# The break runs eagerly, between two graph segments, outside any capture, so what it
# allocates should land in the default pool: its gather, the replay layers' activations (at capture time they run
# eagerly), and the output buffers the next segment reads. `kit.break_allocations` checks
# every allocation in every break window.

# %%
breaks = kit.break_allocations(patched)
breaks.attrs["source"] = patched.source_label
kit.style_table(breaks).format({"bytes": kit.format_bytes, "pool_bytes": kit.format_bytes})

# %% [markdown]
# ## 3. Graphs against eager
#
# `kit.check_equivalence` ran right after each capture: fresh token ids through the graphs
# and through the same weights eagerly, every capture size, every output, compared bit for
# bit. On the GPU it ran in the live capture's process; the recordings carry its rows.

# %%
print(f"patched: {kit.Equivalence.recorded_in(patched).summary()}")
equivalence_view(patched)

# %% [markdown]
# ## The exception: aux hidden states before the replay layers
#
# Now add an aux hidden state at layer 1 (the input of layer 1, for an EAGLE-style
# speculator): the forward keeps it from layer 1 to its return, across the break.
# `early_aux_shared` forces the replay graphs onto the model graphs' stream anyway.

# %%
forced = snapshots["early_aux_shared"]
forced_liveness = kit.liveness_table(forced, replay_size_for=replay_rows)
for line in forced_liveness.verdicts():
    print(line)
liveness_view(forced_liveness, forced.source_label)

# %% [markdown]
# Each break now holds two blocks: the break input, released by the break as before, and
# the aux hidden state, *held after the break* (freed when the capture drops the forward's
# outputs). The replay graphs were captured over some of them. Over the break input that is
# harmless, as before; over the aux hidden state it is a conflict when the replay graph that
# does so runs in that break. Which sizes does the trace predict will differ from eager, and
# which do?

# %%
predicted = sorted({int(s) for s in forced_liveness.rows[forced_liveness.rows["conflict"]]["capture_size"]})
rows = kit.Equivalence.recorded_in(forced).rows
measured = sorted({int(s) for s in rows[~rows["bit_exact"]]["size"]})
print(f"early_aux_shared: {kit.Equivalence.recorded_in(forced).summary()}")
print(f"sizes the liveness analysis flags: {predicted}; sizes whose graph outputs differ from eager: {measured}")
print("conservatively (any replay graph in any break):")
for line in kit.liveness_table(forced).verdicts():
    print(f"  {line}")
equivalence_view(forced)

# %% [markdown]
# The trace alone finds the tensor that goes wrong: the aux hidden state, and only where
# the replay graph running in the break was captured over it. Model graphs 512 and 128 hold
# an aux hidden state over which *another* replay graph was captured; in vLLM, where any
# replay graph may run in any break, they would be at risk too.
#
# Under the PR's own rule (`early_aux_pr`) `has_early_aux()` is true, the replay graphs keep
# a stream of their own, and nothing is captured over the held block:

# %%
aux_pr = snapshots["early_aux_pr"]
for line in kit.liveness_table(aux_pr, replay_size_for=replay_rows).verdicts():
    print(line)
print(f"early_aux_pr: {kit.Equivalence.recorded_in(aux_pr).summary()}")

# %% [markdown]
# ## Look for yourself
#
# Pick the stream policy and whether an aux hidden state comes before the replay layers. The
# PR's rule picks the replay graphs' stream, and with it the capture shown. Each bar is a
# block held across a break, from its allocation to its free (trace index); grey bands are
# the eager breaks, orange ones the replay captures; a cross marks a replay allocation over
# the block by the replay graph that runs in that break, a circle one by another replay
# graph (`kit.show.safety.SafetyView`, drawing `kit.show.timeline.timeline_figure`).

# %%
display(SafetyView(snapshots, replay_size_for=replay_rows).widget)

# %% [markdown]
# **What it shows.** Across each eager break the model graph holds the break's input, which
# nothing reads afterwards, and, with an early aux layer, the aux hidden state, which the
# forward returns. The break's own allocations all land outside the pool. Sharing the stream
# lets the replay graphs take both blocks; only the aux hidden state makes that a conflict,
# and the trace finds it, down to the capture size whose outputs then differ from eager. The
# PR's `has_early_aux()` rule keeps exactly that case off the shared stream.
#
# **Next question.** These are the replica's captures. What does your own snapshot show?
# `05_your_snapshot` runs the same tables and figures on any `_dump_snapshot` pickle.

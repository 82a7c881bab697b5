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
# # The alternatives: one stream for every capture, or fewer replay graphs
#
# **The question.** PR 63155 moves one capture, the decoder replay graphs', onto the model
# graphs' stream. Its description weighs two other ways out and leaves both aside:
#
# - **(a)** enter one `graph_capture()` for every capture. That would also move the
#   speculator's capture onto the model graphs' stream, and the speculator runs after the
#   target forward and reads what it produced: that needs a lifetime argument of its own;
# - **(b)** capture fewer decoder replay graphs (`decoder_replay_cudagraph_capture_sizes`):
#   the replay stream's group shrinks, but replay batches above the largest captured size
#   run eagerly.
#
# What would each save, is (a) safe, and what does a saving buy once vLLM sizes its KV cache?
# Measured on the replica with its speculator (`kit.experiments.alternatives`), each variant
# captured in a fresh process.

# %%
import inspect

from IPython.display import display

import kit
from kit.experiments.alternatives import SHARE_ALL, recording_path
from kit.experiments.drafter_run import load_alternatives, run_alternatives_live
from kit.recordings import LIVE, default_source
from kit.replica.model import replay_rows
from kit.replica.speculator import DSparkSpeculator
from kit.show.alternatives import (
    AlternativesView,
    cap_line,
    deepseek_table,
    drafter_table,
    estimate_table,
    extra_diff,
    kv_line,
    saving_line,
    shown_table,
    variant_table,
)

SOURCE = default_source()  # live on a GPU (five fresh processes, a few minutes), else the H200 recording
PRESET = "small"  # the only preset recorded; `python -m kit alternatives --live --preset large` on a GPU
data = run_alternatives_live(PRESET) if SOURCE == LIVE else load_alternatives(PRESET)
table = variant_table(data)
print(f"data source: {SOURCE}: {data['source']}")
for preset in ("small", "large"):
    print(f"  preset {preset}: {'recorded' if recording_path(preset).is_file() else 'not recorded'}")

# %% [markdown]
# ## The speculator the replica captures last
#
# vLLM 0.33 gives DeepSeek-V4.1 a DSpark drafter. Its runner captures the drafter's FULL
# graphs last, after the model and replay graphs, into the same global graph pool, through
# the base `CudaGraphManager.capture`, which enters `graph_capture()`: a stream of its own,
# before and after the PR. The replica does the same (`kit/replica/speculator.py`). A decode
# step runs the target forward (after a graph step its outputs are still graph-pool blocks),
# lets the sampler read them, then calls `propose`:

# %%
spec, config = data["speculator"], data["config"]
print(f"data source: {SOURCE}: the replica's config in the recording")
print(
    f"replica {PRESET}: hidden {config['hidden_size']}, {config['num_layers']} layers, model graphs of "
    f"{config['cudagraph_capture_sizes']} tokens; speculator: {spec['kind']}, {spec['draft_layers']} layers, "
    f"graphs of {spec['capture_sizes']} tokens, reading {', '.join(spec['reads'])}"
)
print(inspect.getsource(DSparkSpeculator.propose))

# %% [markdown]
# `stage_target_outputs` copies what the drafter reads of the target's outputs into the
# drafter's own buffers, eagerly; only then does the drafter's graph replay, and it reads
# nothing but those buffers (vLLM's DFlash speculator stages the same way, into
# `_aux_staging` or its `hidden_states`). Keep that order in mind for (a).
#
# ## Alternative (a): every capture on the model graphs' stream
#
# `share_all` is the PR plus the speculator's capture handed the model graphs' stream too.
# The lines it changes beyond the PR (`capture_model`'s first changed line is the PR's own):

# %%
print(extra_diff(SHARE_ALL.diff()))

# %% [markdown]
# The graph pool after each capture, and what it saves against vLLM 0.33 (`unpatched`). The
# table also names the replay batches each variant leaves to eager (none here) and what the
# saving buys, explained further down:

# %%
print(f"data source: {SOURCE}")
for variant in ("pr", "share_all"):
    print(saving_line(table, variant))
beyond = data["pr"]["graph_pool_bytes"] - data["share_all"]["graph_pool_bytes"]
print(f"share_all over the PR: {kit.format_bytes(beyond)} more ({beyond:,} bytes)")
shown_table(table[table["variant"].isin(["unpatched", "pr", "share_all"])])

# %% [markdown]
# Over the PR, (a) saves the speculator's own group: on the model graphs' stream its graphs
# fit in the blocks the model graphs left free.
#
# ### Is (a) safe?
#
# Those free blocks include the ones holding the target's outputs of the last graph step. So
# the drafter's graph may write over them, and the evidence says it does. Each variant ran
# every capture size after a graph step of every size, as vLLM orders a step (forward, the
# sampler's read, `propose`), and compared the target's outputs and the draft bit for bit with
# an eager step; each step also says whether the drafter's graph overwrote the target's outputs
# in the pool:

# %%
print(f"data source: {SOURCE}")
for variant in ("unpatched", "pr", "share_all"):
    print(f"{variant}: {data[variant]['evidence']}")
checks = data["share_all"]["checks"]
overwritten = sum(bool(c["target_outputs_overwritten"]) for c in checks)
exact = all(c["bit_exact"] for c in checks)
print(
    f"share_all: the drafter's graph overwrote the target's outputs in {overwritten} of {len(checks)} steps; "
    f"every step bit-exact, target outputs and drafts: {exact}"
)

# %% [markdown]
# Bit-exact steps are a demonstration, not a proof: they show the runs that were tried. The
# speculator's own lifetime argument, made the way notebook 04 makes the replay graphs', is a
# proof obligation: for every model graph N and every drafter graph D that can follow it in a
# step, the bytes D writes are not read after D with a value N wrote. It is checked by two
# analyses (`kit.experiments.drafter_run`, each variant in a fresh process):
#
# - **reads and writes**: every aten op's device bytes recorded during capture (which graph
#   wrote what) and on a real step of every size (what the sampler and `propose` read before
#   the drafter's graph, what the step reads after it);
# - **lifetimes**: the blocks each model capture leaves when its forward ends (its outputs) and
#   the drafter captures that allocate over them, with the step's reads and from the trace
#   alone.

# %%
drafter = data["share_all"].get("drafter_analyses")
print(f"data source: {drafter['source'] if drafter else 'no drafter analyses recorded'}")
if drafter:
    print(drafter["obligation"])
    print(f"share_all: {drafter['evidence']}")
    print(f"share_all safe by graphs vs eager and both analyses: {data['share_all']['safe']}")
    display(kit.style_table(drafter_table(data)))

# %% [markdown]
# Safe, and why: under share_all the drafter's graphs do overwrite the target's outputs (under
# the PR, on a stream of their own, they never do), but every read of those outputs, the
# sampler's and `propose`'s staging copies, comes before the drafter's graph replays, and
# nothing in the step reads them after it. From the trace alone the lifetime analysis cannot
# see that order: it flags every overwritten output (the capture drops its outputs for weak
# references, so the trace shows them freed, not read); the step's reads clear them. The
# argument rests on that order of a step: a consumer that read the target's pool outputs after
# the drafter's graph would read the drafter's writes.
#
# ## Alternative (b): cap the replay capture sizes
#
# vLLM 0.33 as it is, with `decoder_replay_cudagraph_capture_sizes` capped. The replay
# stream keeps a group of its own, only smaller; a replay batch above the cap finds no graph
# and runs eagerly (in the replica a step of N tokens replays N/2 rows, `replay_rows`):

# %%
print(f"data source: {SOURCE}")
caps = [name for name in table["variant"] if name.startswith("cap ")]
for variant in caps:
    print(cap_line(table, variant, config["cudagraph_capture_sizes"], replay_rows))
by_variant = table.set_index("variant")
less = all(by_variant.loc[c, "saved_bytes"] < by_variant.loc["pr", "saved_bytes"] for c in caps)
print(f"every cap saves less than the PR: {less}")
shown_table(table[table["variant"].isin(["unpatched", *caps])])

# %% [markdown]
# A cap saves less than the PR at every size here and gives up graphs for the larger replay
# batches; capturing every size costs the replay stream a whole group again.
#
# ## Look for yourself
#
# Pick a variant: every variant's graph pool, split by the stream that captured into it, the
# one you pick drawn solid (the dashed line is `unpatched`); below, where it captured, what
# runs eagerly, what it buys and its graphs-vs-eager steps (`kit.show.alternatives`).

# %%
display(AlternativesView(data).widget)

# %% [markdown]
# ## What the saving buys
#
# vLLM sizes the KV cache from what is left after a profile run and after
# `profile_cudagraph_memory()`'s estimate of the captures: everything captured once into a
# throwaway pool by `capture_model(profile_only=True)`, which returns the drop in free device
# memory. A variant's estimate, lower than unpatched's, is KV budget, cut into blocks of
# `block_size` tokens (the replica, which has no attention, is given a full-attention cache
# per layer: the layout and its source are printed):

# %%
print(f"data source: {SOURCE}")
for variant in ("pr", "share_all", *caps):
    print(kv_line(table, variant))
for row in table.itertuples():
    fall = by_variant.loc["unpatched", "profile_estimate_bytes"] - row.profile_estimate_bytes
    print(
        f"  {row.variant}: estimate falls {kit.format_bytes(fall)}, graph pool {kit.format_bytes(row.saved_bytes)}, "
        f"outside it {kit.format_bytes(fall - row.saved_bytes)}"
    )
layout = data["kv_cache"]["replica"]["layout"]
print(f"replica layout: {layout['bytes_per_token']:,} B/token, blocks of {layout['block_size']}: {layout['source']}")
kit.style_table(estimate_table(data))

# %% [markdown]
# The estimate falls by more than the graph pool under (a) and the PR: it is a drop in free
# memory, so it also counts the default-pool blocks each capture stream keeps cached (its
# warm-up's activations, notebook 03). The part outside the graph pool shrinks with every
# capture stream that goes; under a cap the replay stream stays, and the estimate falls by the
# graph pool's saving alone.
#
# ### On DeepSeek-V4.1-Flash
#
# The PR states 5.18 GiB per GPU on DeepSeek-V4.1-Flash (GB200); the kit did not measure it.
# What it buys depends on the KV layout, and no V4.1-Flash config ships with vLLM 0.33, so the
# layout is an assumption, stated with where each part comes from (`kit.analysis.kv_cache`);
# DeepSeek-V3's classic MLA is the cross-check:

# %%
print("data source: PR 63155's stated figure, priced with the layouts below (no GPU run)")
flash = data["kv_cache"]["deepseek_v41_flash"]
print(
    f"{flash['layout']['name']}: {flash['blocks']:,} blocks of {flash['layout']['block_size']}, "
    f"{flash['tokens']:,} tokens, or the sliding windows of {flash['or_swa_requests']:,} more requests"
)
kit.style_table(deepseek_table(data)).format("{:,}".format, subset=["bytes per token", "blocks", "tokens"])

# %% [markdown]
# **What it shows.** On the H200 recording, (a) saves the speculator's group on top of the
# PR's saving (24 MiB more, 48 MiB in all) and stays bit-exact: the drafter's graph does overwrite the
# target's outputs in the pool, but only after `propose` has copied them out. (b) saves less
# than the PR and runs the larger replay batches eagerly. Each saving is KV cache: 112 blocks
# (1,792 tokens) in the replica under the PR; the PR's 5.18 GiB is about 2.1 million tokens
# under the assumed V4.1-Flash layout, 79,104 under DeepSeek-V3's MLA.
#
# **Next question.** These are the replica's captures. What does your own snapshot show?
# `06_your_snapshot` runs the kit's tables and figures on any `_dump_snapshot` pickle.

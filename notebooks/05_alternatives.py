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
# - **(b)** capture fewer decoder replay graphs (`decoder_replay_cudagraph_capture_sizes`),
#   which the PR says saves memory "proportionally". Two ways to have fewer: cap the sizes
#   (replay batches above the cap run eagerly), or drop the sizes between the smallest and
#   the largest (a replay batch then runs in the next kept size, padded further).
#
# What would each save, is (a) safe, and what does a saving buy once vLLM sizes its KV cache?
#
# **Where it is shown.** Everything measured here runs on the **replica** (`kit/replica`,
# vLLM's capture path in miniature, here with a DSpark speculator:
# `kit.experiments.alternatives`), each scenario captured in a fresh process. None of it runs
# on **vLLM's own code**: `kit.experiments.vllm.capture` (notebook 06) runs vLLM 0.33's
# capture code with a stand-in model and no speculator, unpatched, under the PR and with
# early aux; neither alternative.

# %%
# Any cell still running after two seconds shows a bar with its time so far.
from kit.progress import watch_cells

watch_cells()

# %%
import inspect

from IPython.display import display

import kit
from kit.experiments.alternatives.result import fewer_sizes_lines, recording_path, replay_group_lines
from kit.experiments.alternatives.run import SHARE_ALL
from kit.experiments.alternatives.scenarios import SAFE_IN_THE_REPLICAS_STEP, steps_with_eager_replay
from kit.experiments.drafter_run import load_alternatives, run_alternatives_live
from kit.recordings import LIVE, default_source
from kit.replica.speculator import DSparkSpeculator
from kit.show.alternatives import (
    AlternativesView,
    cap_name,
    deepseek_table,
    drafter_analyses_table,
    estimate_table,
    extra_diff,
    kv_line,
    saving_line,
    scenario_table,
    shown_table,
)

SOURCE = default_source()  # live on a GPU (a fresh process per scenario, some minutes), else the H200 recording
PRESET = "small"  # or "large": both recorded on the H200 (`python -m kit alternatives --preset large`)
data = run_alternatives_live(PRESET) if SOURCE == LIVE else load_alternatives(PRESET)
table = scenario_table(data)
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
# table also names the replay batches each scenario leaves to eager (none here) and what the
# saving buys, explained further down:

# %%
print(f"data source: {SOURCE}")
for scenario in ("pr", "share_all"):
    print(saving_line(table, scenario))
beyond = data["pr"]["graph_pool_bytes"] - data["share_all"]["graph_pool_bytes"]
print(f"share_all over the PR: {kit.format_bytes(beyond)} more ({beyond:,} bytes)")
shown_table(table[table["scenario"].isin(["unpatched", "pr", "share_all"])])

# %% [markdown]
# What (a) saves over the PR (the line above) is the speculator's own group: on the model
# graphs' stream its graphs can take the blocks the model graphs left free.
#
# ### Is (a) safe?
#
# Those free blocks include the ones holding the target's outputs of the last graph step. So
# the drafter's graph may write over them; the evidence says whether it does. Each scenario ran
# every capture size after a graph step of every size, as vLLM orders a step (forward, the
# sampler's read, `propose`), and compared the target's outputs and the draft bit for bit with
# an eager step; each step also says whether the drafter's graph overwrote the target's outputs
# in the pool:

# %%
print(f"data source: {SOURCE}")
for scenario in ("unpatched", "pr", "share_all"):
    print(f"{scenario}: {data[scenario]['evidence']}")
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
# analyses (`kit.experiments.drafter_run`, each scenario in a fresh process):
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
    display(kit.style_table(drafter_analyses_table(data)))
print(SAFE_IN_THE_REPLICAS_STEP)

# %% [markdown]
# What the verdict covers, and why: under share_all the drafter's graphs may overwrite the
# target's outputs (under the PR, on a stream of their own, they never do; the lines above
# count how often they did), and the argument is that every read of those outputs, the
# sampler's and `propose`'s staging copies, comes before the drafter's graph replays, and
# nothing in the step reads them after it. From the trace alone the lifetime analysis cannot
# see that order: it flags every overwritten output (the capture drops its outputs for weak
# references, so the trace shows them freed, not read); the step's reads clear them. The
# argument rests on that order of a step: a consumer that read the target's pool outputs after
# the drafter's graph would read the drafter's writes.
#
# So (a) is at most **safe in the replica's step**, the step the replica models: forward, the
# sampler's read, `propose`. vLLM's step has one more consumer it does not model:
# `sample_tokens` (`vllm/v1/worker/gpu/model_runner.py`) starts asynchronous output copies on
# a side stream (`AsyncOutput` on `output_copy_stream`) before `propose`, to overlap with it.
# Whether those copies read anything the drafter's graphs write under (a) is not shown here.
#
# ## Alternative (b): fewer replay capture sizes
#
# vLLM 0.33 as it is (the replay graphs on a stream of their own), capturing fewer replay
# sizes. First, capped: `decoder_replay_cudagraph_capture_sizes` up to a cap. A replay batch
# above the cap finds no graph and runs eagerly. Which steps can make one follows vLLM's rule
# (`_prepare_replay_batch` in `vllm/models/deepseek_v41/nvidia/model_state.py`): a PIECEWISE
# step padded to N tokens at or above `decoder_replay_trim_threshold` breaks out to a replay
# batch of each request's rows (decode rows kept, prefill rows trimmed to the last `window`),
# so it can hold any count from 1 to N rows. The sweep is a handful of caps, not every replay
# size (`kit.experiments.alternatives.scenarios.cap_sweep` says which):

# %%
print(f"data source: {SOURCE}")
caps = [name for name in table["scenario"] if name.startswith("cap ")]
for row in data["cap_replay_sizes"]:
    cap, dropped = row["max_replay_size"], row["eager_replay_sizes"]
    if cap is None or not dropped:
        continue
    steps = ", ".join(map(str, steps_with_eager_replay(config, cap))) or "none"
    sizes = f"size{'s' if len(dropped) > 1 else ''} {', '.join(map(str, dropped))}"
    print(
        f"{saving_line(table, cap_name(cap))}; replay batches of more than {cap} rows run eagerly ({sizes} not "
        f"captured), possible in steps padded to {steps} tokens"
    )
by_scenario = table.set_index("scenario")
less = all(by_scenario.loc[c, "saved_bytes"] < by_scenario.loc["pr", "saved_bytes"] for c in caps)
print(f"every cap saves less than the PR: {less}")
shown_table(table[table["scenario"].isin(["unpatched", *caps])])

# %% [markdown]
# Whether a cap saves as much as the PR is the line above; every cap gives up graphs for the
# larger replay batches. Second, the PR's "proportionally": keep the largest replay size (or
# the smallest and the largest) and drop the sizes in between. No replay batch runs eagerly
# then: each runs in the smallest kept size that fits it, padded further. If the replay
# graphs' group shrank in proportion to the sizes dropped, this would save about as much as
# the proportional figure printed beside each row. The last line is computed from the
# figures: whether dropping intermediate sizes shrank the graph pool, or only capping the
# largest did.

# %%
print(f"data source: {SOURCE}")
print("\n".join(fewer_sizes_lines(data)))

# %% [markdown]
# Why the largest size could decide it: the replay graphs are captured largest first, one
# after another on their stream, and each smaller capture can take the blocks the larger ones
# freed on that same stream. What the group needs is then about what the largest capture needs,
# however many smaller sizes follow it; capping the largest is what removes that.
#
# ## Look for yourself
#
# Pick a scenario: every scenario's graph pool, split by the stream that captured into it, the
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
# memory. A scenario's estimate, lower than unpatched's, is KV budget, cut into blocks of
# `block_size` tokens (the replica, which has no attention, is given a full-attention cache
# per layer: the layout and its source are printed):

# %%
print(f"data source: {SOURCE}")
for scenario in ("pr", "share_all", *caps):
    print(kv_line(table, scenario))
for row in table.itertuples():
    fall = by_scenario.loc["unpatched", "profile_estimate_bytes"] - row.profile_estimate_bytes
    print(
        f"  {row.scenario}: estimate falls {kit.format_bytes(fall)}, graph pool {kit.format_bytes(row.saved_bytes)}, "
        f"outside it {kit.format_bytes(fall - row.saved_bytes)}"
    )
layout = data["kv_cache"]["replica"]["layout"]
print(f"replica layout: {layout['bytes_per_token']:,} B/token, blocks of {layout['block_size']}: {layout['source']}")
kit.style_table(estimate_table(data))

# %% [markdown]
# The estimate is a drop in free memory, so besides the graph pool it counts the default-pool
# blocks each capture stream keeps cached (its warm-up's activations, notebook 03): the
# "outside it" figures above. That part can shrink only where a capture stream goes, under (a)
# and the PR; under a cap the replay stream stays.
#
# ### On DeepSeek-V4.1-Flash
#
# The PR states 5.18 GiB per GPU on DeepSeek-V4.1-Flash (GB200); the kit did not measure it.
# What it buys depends on the KV layout, and no V4.1-Flash config ships with vLLM 0.33, so the
# layout is an assumption, stated with where each part comes from (`kit.analysis.kv_cache`);
# DeepSeek-V3's classic MLA is the cross-check:

# %%
print("data source: PR 63155's stated figure, priced with the layouts below (no GPU run)")
flash, v3 = data["kv_cache"]["deepseek_v41_flash"], data["kv_cache"]["deepseek_v3_mla"]
print(
    f"{flash['layout']['name']}: {flash['blocks']:,} blocks of {flash['layout']['block_size']}, "
    f"{flash['tokens']:,} tokens, or the sliding windows of {flash['or_swa_requests']:,} more requests"
)
for entry in (flash, v3):
    lay = entry["layout"]
    print(
        f"  {lay['name']} assumes: the PR's {entry['saved_bytes'] / 2**30:.2f} GiB per GPU all goes to KV blocks; "
        f"{lay['num_layers']} layers owning a cache x {lay['bytes_per_token_per_layer']:,} B per token = "
        f"{lay['bytes_per_token']:,} B per token, blocks of {lay['block_size']} tokens; {lay['source']}"
    )
kit.style_table(deepseek_table(data)).format("{:,}".format, subset=["bytes per token", "blocks", "tokens"])

# %%
print(f"data source: {SOURCE}: {data['source']}")
best_cap = max(caps, key=lambda c: by_scenario.loc[c, "saved_bytes"], default=None)
pr_kv = data["kv_cache"]["replica"]["freed"]["pr"]
verdict = replay_group_lines(data)
print(
    f"(a) saves {kit.format_bytes(beyond)} over the PR, {kit.format_bytes(data['share_all']['saved_bytes'])} "
    f"in all; safe in the replica's step: {data['share_all']['safe']}"
)
if best_cap is not None:
    print(
        f"(b) capped: the most a cap saves is {kit.format_bytes(by_scenario.loc[best_cap, 'saved_bytes'])} "
        f"({best_cap}), the PR {kit.format_bytes(data['pr']['saved_bytes'])}"
    )
print(f"(b) fewer sizes: {verdict[-1].strip() if verdict else 'not measured in this recording'}")
print(f"the replica's KV cache under the PR: {pr_kv['blocks']:,} more blocks, {pr_kv['tokens']:,} tokens")
print(
    f"the PR's 5.18 GiB: {flash['tokens'] / 1e6:.1f} million tokens under the assumed V4.1-Flash layout "
    f"({flash['layout']['bytes_per_token']:,} B/token, sliding-window caches left out), {v3['tokens']:,} under "
    f"DeepSeek-V3's MLA ({v3['layout']['bytes_per_token']:,} B/token)"
)

# %% [markdown]
# **What it shows**, in the lines above, printed from the recording: (a) saves the speculator's
# group on top of the PR's saving, and its safety verdict covers the replica's step only:
# the drafter's graph may overwrite the target's outputs in the pool, after `propose` has
# copied them out, and vLLM's side-stream output copies are not modelled. (b): the second and
# third lines say what a cap saves beside the PR, and whether dropping intermediate sizes
# saved anything or the replay graphs' group follows the largest captured size. Each saving
# is KV cache, in the replica and, for the PR's stated 5.18 GiB, on DeepSeek under the
# layouts and assumptions printed with the figures.
#
# **Next question.** These are the replica's captures. Does the PR apply to the installed vLLM
# itself, and does vLLM 0.33's own capture code strand and save what the replica does?
# `06_vllm_in_process` patches vLLM in this process and reads its own captures recorded on the H200.

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
# # vLLM in-process: PR 63155 on the vLLM you have installed
#
# **The question.** The replica notebooks show the effect on a miniature. Does the PR's
# change apply to the vLLM installed here, what exactly does it change, and which stream
# does each of vLLM's own captures get once it is applied?
#
# `kit.patch.vllm` makes the PR's edits to the installed functions in this process: it
# reads each function's source, changes the lines the PR changes, and keeps every other
# line as installed. Nothing is rebuilt and nothing on disk changes; `revert()` puts the
# originals back.
#
# **Where it is shown.** Everything here is **vLLM's own code**, not the replica
# (`kit/replica`, the miniature notebooks 02 to 05 run): sections 1 to 3 patch the installed
# vLLM's functions in this process (no GPU needed); section 4 captures with vLLM's own capture
# path, live where a GPU, vLLM and a DeepSeek-V4.1 checkpoint are at hand, else from the H200
# recording of `kit.experiments.vllm.capture` (vLLM 0.33's `GPUModelRunner.capture_model`,
# `DecoderReplayLayers`, `DecoderReplayCudaGraphManager` and the rest of its capture path,
# around a stand-in model: section 4b says what was stood in). What it shows on vLLM's code:
# which stream each capture got, the graph pool, graphs against eager, and the early-aux case.
# Section 6 is vLLM's estimate of graph memory and the kit as a vLLM plugin in a deployment,
# from the plugin's recording of vLLM's own `profile_cudagraph_memory` and `capture_model()`.
# The safety checks on every pairing and the alternatives are the replica's (notebooks 04, 05).

# %%
# Any cell still running after two seconds shows a bar with its time so far.
from kit.progress import watch_cells

watch_cells()

# %%
import importlib.util
import inspect
import logging
import os

import ipywidgets as widgets
import pandas as pd
import torch
from IPython.display import Code, display

import kit
from kit.experiments.summary import summarize
from kit.experiments.vllm.recordings import demo_lines, load_recordings
from kit.recordings import recording

logging.getLogger("torch").setLevel(logging.ERROR)  # torch's import-time deprecation notices under vLLM
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # e.g. "no vllm._C" on a machine without CUDA
HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_CUDA = torch.cuda.is_available()
MODEL = os.environ.get("KIT_VLLM_MODEL", "")  # a DeepSeek-V4.1 checkpoint, for the capture part
print(f"vLLM installed: {HAS_VLLM}; CUDA: {HAS_CUDA}; model: {MODEL or '(KIT_VLLM_MODEL not set)'}")

# %% [markdown]
# ## 1. Apply the patch
#
# `apply()` checks every function it edits before it touches any: each must exist, have
# vLLM 0.33.0's parameters, and contain the lines the PR edits. If one does not, it says
# which in one line and patches nothing.

# %%
# applying the PR to the installed vLLM (its import takes a while)
if HAS_VLLM:
    import kit.patch.vllm

    with kit.patch.vllm.quiet_import():  # without CUDA vLLM logs that vllm._C is missing: expected here, harmless
        patch = kit.patch.vllm.apply()
    print(patch)
    display(patch.table())
else:
    patch = None
    print("vLLM is not installed in this environment (`make venv` installs it): nothing to patch here")

# %% [markdown]
# ## 2. What it changed, function by function
#
# Each function is the installed one with the PR's lines: `graph_capture()` takes a
# stream, `CudaGraphManager.capture()` records the one it used, the runner hands the
# model graphs' stream to `capture_inner_cudagraphs()`, and DeepSeek-V4.1's model states
# pass it on to the replay graphs unless aux hidden states come before the replay layers.

# %%
if patch is not None:
    functions = [rw.where for rw in patch.rewrites]
    pick = widgets.Dropdown(options=functions, description="function", layout={"width": "95%"})
    pick.add_class("kit-main-control")
    shown = widgets.Output()

    def show_diff(change=None):
        rw = patch.rewrites[functions.index(pick.value)]
        with shown:
            shown.clear_output(wait=True)
            display(Code(rw.diff(), language="diff"))

    pick.observe(show_diff, names="value")
    show_diff()
    display(widgets.VBox([pick, shown]))

# %% [markdown]
# ## 3. It is live, and it comes off again
#
# The patched `graph_capture` is installed in `parallel_state` and in every loaded module
# that imported it by name, so `CudaGraphManager.capture()` calls the new one.

# %%
if patch is not None:
    from vllm.distributed import parallel_state
    from vllm.v1.worker.gpu import cudagraph_utils

    print("patched:  graph_capture", inspect.signature(parallel_state.graph_capture))
    print("          installed in", patch.installed[f"{parallel_state.__name__}.graph_capture"])
    print("          CudaGraphManager.capture", inspect.signature(cudagraph_utils.CudaGraphManager.capture))
    patch.revert()
    print("reverted: graph_capture", inspect.signature(parallel_state.graph_capture))
    print("          CudaGraphManager.capture", inspect.signature(cudagraph_utils.CudaGraphManager.capture))
    print("          patch applied:", kit.patch.vllm.is_applied())

# %% [markdown]
# ## 4. vLLM's own captures, on a GPU
#
# With a GPU, vLLM and a DeepSeek-V4.1 checkpoint (`KIT_VLLM_MODEL`), the next cell starts
# `LLM(...)` in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the V2 model runner,
# breakable PIECEWISE graphs with decoder replay graphs) inside a `CaptureRecorder`, with the
# stream policy picked here applied during its capture:
# - **installed**: vLLM as it is (every capture on a new stream);
# - **pr**: the PR (replay graphs on the model graphs' stream, unless early aux);
# - **share** / **separate**: the replay graphs always on the model graphs' stream, or never.
#
# Each policy needs a fresh kernel: the graph pool of a first `LLM` stays in the process.
# Without all three, the cell says what is missing and shows the H200 recording of vLLM 0.33's
# own capture code around a stand-in model (section 4b), the same captures this cell would make.

# %%
policy = widgets.ToggleButtons(options=["installed", "pr", "share", "separate"], value="pr", description="policy")
plan = widgets.HTML()
missing = [name for name, ok in (("a GPU", HAS_CUDA), ("vLLM", HAS_VLLM), ("KIT_VLLM_MODEL", bool(MODEL))) if not ok]


def recorded_for(choice: str) -> str:
    """The H200 recording shown for a policy where this machine cannot capture."""
    return "unpatched" if choice in ("installed", "separate") else "patched"


def show_plan(change=None):
    if missing:
        what = f"shows the recording <code>vllm/{recorded_for(policy.value)}.pickle</code> (this machine lacks "
        what += f"{', '.join(missing)})"
    else:
        what = f"starts <code>LLM(...)</code> with policy <b>{policy.value}</b> applied during its capture"
    plan.value = f"<p>policy <b>{policy.value}</b>: run the next cell; it {what}.</p>"


policy.observe(show_plan, names="value")
show_plan()
display(widgets.VBox([policy, plan]))

# %%
llm = None
if not missing:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
    os.environ.setdefault("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")
    from vllm import LLM

    with kit.CaptureRecorder() as recorder:
        if policy.value == "installed":
            llm = LLM(MODEL, compilation_config={"cudagraph_decoder_replay": True})
        else:
            with kit.patch.vllm.patched(policy.value) as live_patch:
                llm = LLM(MODEL, compilation_config={"cudagraph_decoder_replay": True})
            print("replay stream decisions:", [d.reason for d in live_patch.decisions])
    snapshot = recorder.snapshot
else:
    print(f"The capture part needs {', '.join(missing)}, which this machine lacks.")
    name = recorded_for(policy.value)
    snapshot = kit.load_snapshot(recording(f"vllm/{name}.pickle"))
    print(
        f"Showing vLLM 0.33's own capture code recorded on the H200, vllm/{name}.pickle, instead: "
        "vLLM's capture path, real CUDA graphs, a stand-in model (section 4b says what was stood in)."
    )
print(f"data source: {snapshot.data_source} ({snapshot.source_label})")

# %% [markdown]
# ## 4b. vLLM's own capture code on the H200, unpatched and under the PR
#
# The kit's H200 has no vLLM and cannot install one, so the kit carried vLLM 0.33.0's Python
# sources there (every file checked against the wheel's RECORD hashes) with the few wheels
# their imports need, and ran vLLM's capture path with real CUDA graphs around a stand-in
# model, once as installed and once with `kit.patch.vllm`, each in a fresh process.
#
# **What was real:** vLLM 0.33.0's own code for every step that picks a stream or a pool:
# `GPUModelRunner.capture_model`, `ModelCudaGraphManager.capture` and `CudaGraphManager.capture`,
# `graph_capture()` and `GroupCoordinator.graph_capture()`, the breakable PIECEWISE wrapper and
# its eager break, `DecoderReplayLayers`, `DeepseekV41ModelState.capture_inner_cudagraphs`,
# `DecoderReplayCudaGraphManager`, and vLLM's global graph pool; the CUDA graphs, the H200 and
# PyTorch's caching allocator (torch 2.11); the patch, `kit.patch.vllm`, editing those functions.
#
# **What was stood in:** the model (a DeepSeek-V4.1-shaped stand-in: 6 MLP layers, replay start 3,
# V4.1's seven break inputs and its outputs, no attention, hidden size 1024); the model config
# (hidden size, `hc_mult`, dtype); the attention metadata, the replay batch's row selection
# (vLLM's Triton kernels: here the last rows of the step, as many as each pairing asks for, any
# of the 1 to N row counts vLLM's rule allows a step of N tokens, notebook 04), the KV writes and block tables (no KV
# cache); process groups (one GPU); `vllm._C`'s `weak_ref_tensor` op (the same op, from Python);
# and stub modules for packages the imports touch but this path never calls (servers, grammars,
# tokenizers' helpers, CUTLASS kernels), listed in each recording's provenance.

# %%
vllm_runs = load_recordings()
vllm_figures = {name: summarize(snap) for name, snap in vllm_runs.items()}
provenance = vllm_runs["unpatched"].kit["provenance"]
print(
    f"recorded on {provenance['gpu']}, torch {provenance['torch']}, Python {provenance['python']}, "
    f"vLLM {provenance['vllm']['version']} from its sources ({provenance['vllm']['bundle']['checked']} files "
    f"checked against the wheel), {provenance['date']}"
)
print("stubs loaded:", ", ".join(s["module"] for s in provenance["stubs"]) or "none")
print("\n".join(demo_lines(vllm_figures)))

# %%
scenarios = pd.DataFrame(
    [
        {
            "scenario": name,
            "replay graphs captured on": ", ".join(f["replay_stream_names"]),
            "stream made by graph_capture()": f["replay_streams_from_graph_capture"],
            "graph-pool bytes the replay captures added": f["replay_added_bytes"],
            "global graph pool": f["graph_pool_bytes"],
            "graphs vs eager": "bit-exact" if f["bit_exact"] else f"differs ({f['max_abs_diff']:.3g})",
        }
        for name, f in vllm_figures.items()
    ]
)
scenarios.attrs["byte_columns"] = ["graph-pool bytes the replay captures added", "global graph pool"]
display(kit.style_table(scenarios))

# %% [markdown]
# Unpatched, vLLM's `graph_capture()` makes the replay graphs a stream of their own, and their
# captures add graph-pool segments there while the model graphs' free blocks sit on the other
# stream. Under the PR they capture on the model graphs' stream and reuse its free blocks (what
# they still add is printed above). With an aux hidden state made before the replay layers the
# PR keeps them on their own stream. Forced to share with the aux returned as V4.1 returns it
# (`early_aux_shared`: inside the output's list, which vLLM's `weak_ref_tensors` does not
# weak-reference), its block stays allocated, nothing lands on it, and graphs equal eager: on
# vLLM 0.33 the exception is defensive. In the hypothetical `early_aux_shared_flat` (the aux
# handed out weak, as a model returning it flattened would) the replay graphs write over it, and
# the read/write obligation and the pairings above say so on vLLM's own code. The verdict with
# its figures closes `kit demo --vllm` and notebook 04 (docs/vllm.md). The same checks as for the
# replica:

# %%
unpatched, patched = vllm_runs["unpatched"], vllm_runs["patched"]
prediction = kit.what_if(unpatched, {"decoder replay graphs stream": "model graphs stream"})
print("\n".join(prediction.summary()))
print("measured under the PR:", vllm_figures["patched"]["graph_pool_bytes"], "bytes of global graph pool")
for name, snap in (("unpatched", unpatched), ("patched", patched)):
    print(f"kit check {name}: {kit.check_snapshot(snap).summary()}")

# %% [markdown]
# ## 5. Which stream each capture got, and the memory it added
#
# One row per capture: its manager, size, stream and the segments it added to its pool.
# Under the PR the decoder replay graphs are on the model graphs' stream and add no graph
# pool segment for the stream's sake (only where they need more than the model graphs left free
# in a size class: 2 MiB on the H200 recording, `python -m kit demo --vllm` says which request);
# on vLLM as installed they have a stream and segments of their own.

# %%
captures = kit.capture_table(snapshot)
columns = ["manager", "size", "stream_label", "graphs", "eager_breaks", "new_segments", "new_segment_bytes"]
shown_captures = captures[columns]
shown_captures.attrs = captures.attrs
display(kit.style_table(shown_captures))
kit.style_table(kit.segment_table(snapshot))

# %% [markdown]
# With several GPUs, each worker holds its own allocator: `kit.record.vllm_ranks.snapshot_all_ranks(llm)`
# collects one snapshot per rank through `collective_rpc`, to compare rank by rank.

# %%
if llm is not None:
    import kit.record.vllm_ranks

    for rank_snapshot in kit.record.vllm_ranks.snapshot_all_ranks(llm):
        print(rank_snapshot.source_label)
        display(kit.style_table(kit.segment_table(rank_snapshot)))

# %% [markdown]
# ## 6. In a deployment: every worker recorded, and vLLM's estimate
#
# **The question.** A served model runs one worker process per rank, where nothing above can
# reach in. And before it sizes the KV cache, vLLM estimates the graphs' memory
# (`GPUModelRunner.profile_cudagraph_memory`, which `Worker.determine_available_memory` takes
# off the KV cache): does that estimate count the replay graphs' second pool, unpatched and
# under the PR?
#
# The kit is also a vLLM general plugin (`kit.vllm_plugin`): installed into vLLM's environment,
# it does nothing until an environment variable asks. `KIT_CAPTURE_DIR=DIR` has every worker
# write `DIR/rank{R}.pickle` (from the estimate's first capture to the end of `capture_model()`)
# and `DIR/rank{R}.json` (vLLM's estimate, the graph pool reserved, the parallel sizes and
# ranks); `KIT_VLLM_PATCH=pr` applies the PR in every worker. Then `kit ranks DIR`:
#
# ```bash
# pip install <the kit>                        # into vLLM's environment
# KIT_CAPTURE_DIR=/tmp/caps KIT_VLLM_PATCH=pr vllm serve <model> --tensor-parallel-size 8
# kit ranks /tmp/caps                          # or kit.compare_ranks("/tmp/caps") here
# ```
#
# Below, the plugin's own recording: vLLM 0.33's `profile_cudagraph_memory` and
# `capture_model()` around the stand-in of section 4b, once unpatched and once with
# `KIT_VLLM_PATCH=pr`, the plugin turned on by the two variables alone. Stood in besides the
# model (each arm's `run.json` lists them): the minimal KV cache of the estimate (there is
# none), the runner's new graph manager after it, expert load balancing.

# %%
from kit.record.provenance import read_manifest

plugin_runs = {
    arm: kit.compare_ranks(recording(f"vllm_plugin/{arm}/rank0.json").parent) for arm in ("unpatched", "patched")
}
plugin_source = read_manifest(recording("vllm_plugin/PROVENANCE.json").parent)
print(
    f"data source: recorded, the kit's vLLM plugin on {plugin_source['gpu']}, torch {plugin_source['torch']}, "
    f"vLLM {plugin_source['vllm']}, {plugin_source['date']} (kit/recordings/vllm_plugin)"
)
for arm, found in plugin_runs.items():
    print(f"\n{arm}:")
    display(kit.style_table(found.summary))
    print("\n".join(found.estimates))
display(kit.style_table(plugin_runs["unpatched"].groups))

# %% [markdown]
# Each rank's table is the same segment-by-stream table as everywhere in the kit, with the
# real capture's streams named plainly and the estimate's throwaway captures prefixed
# "estimate's". The estimate question is a difference between the arms:

# %%
figures = {}
for arm, found in plugin_runs.items():
    row = found.summary.iloc[0]
    manifest = found.snapshots[0].kit["vllm_worker"]
    figures[arm] = {
        "estimate": row["estimate"],
        "graph pool": row["graph_pool"],
        "capture_model()": manifest.get("capture_model_bytes"),
    }
estimate_gap = figures["unpatched"]["estimate"] - figures["patched"]["estimate"]
capture_gap = figures["unpatched"]["capture_model()"] - figures["patched"]["capture_model()"]
pool_gap = figures["unpatched"]["graph pool"] - figures["patched"]["graph pool"]
groups = plugin_runs["unpatched"].groups
on_replay = groups[
    (groups["stream_label"] == "decoder replay graphs stream") & (groups["pool_label"] == "default pool")
]
replay_default = int(on_replay["rank 0"].sum())
print(f"vLLM's estimate, unpatched minus under the PR:      {kit.format_bytes(estimate_gap)}")
print(f"capture_model()'s own figure, unpatched minus PR:   {kit.format_bytes(capture_gap)}")
print(f"  graph pool reserved, unpatched minus PR:          {kit.format_bytes(pool_gap)}")
print(f"  default-pool segments on the replay graphs' own stream (unpatched only): {kit.format_bytes(replay_default)}")
if estimate_gap == capture_gap == pool_gap + replay_default:
    print("the estimate counts what the replay graphs' own stream holds: its graph pool and its default-pool segments")
else:
    print("the estimate does not move by what the replay graphs' own stream holds")

# %% [markdown]
# **What it shows.** vLLM's estimate is larger unpatched by as much as `capture_model()`'s own
# figure is, and both by exactly what the replay graphs' own stream holds: the second pool's
# graph-pool segments and the default-pool segments made on that stream. An unpatched vLLM takes
# that memory off the KV cache before the graphs are captured; under the PR the KV cache gets it
# back.
# The caveat: on the stand-in the estimate is far above the graph pool (a free-memory delta over
# the whole estimate, its throwaway pool, eager work and cuBLAS workspaces included), so how many
# KV blocks a real model gains needs the real model. `kit ranks` prints, per rank, the estimate
# against the reserved pool and, where the manifest knows the KV cache's bytes per block, the
# blocks the difference is worth. On several ranks it names a rank whose figures differ from the
# others'.

# %% [markdown]
# **What it shows.** The PR's change is a handful of lines in seven functions, and it
# applies to the installed vLLM without a rebuild: the stream the model graphs captured on
# is handed down to the replay graphs, and to nothing else. On the H200, vLLM 0.33's own
# capture code with real CUDA graphs gives the figures section 4b prints from the recording:
# the graph-pool segments the replay graphs add unpatched, on a stream `graph_capture()` made
# for them while the model graphs' free blocks sit on another (what `kit check` calls
# stranding), and under the PR; the global graph pool both ways; whether graphs equal eager;
# and which stream the early-aux case keeps. The model there was a stand-in; a real
# DeepSeek-V4.1 checkpoint is the one thing not run.
#
# **Where this leaves the walkthrough.** 01 to 03 showed the stranded memory and what the PR
# saves, 04 and 05 whether sharing the stream is safe and what else could be shared, and this
# notebook that the PR applies to vLLM 0.33's own code with the saving and the safety check
# (section 4b's read/write line) the replica predicted. What is left is a real DeepSeek-V4.1
# checkpoint on a GPU: set `KIT_VLLM_MODEL`, pick a policy in section 4 and run this notebook
# again, once per policy in a fresh kernel.
#
# **Next question.** Does your own process, or a snapshot from a debugging session, strand
# graph-pool memory the same way? `07_your_snapshot` runs the kit's tables, verdicts and
# figures on any `_dump_snapshot` pickle.

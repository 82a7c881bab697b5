"""vLLM 0.33's own capture path with real CUDA graphs: a stand-in DeepSeek-V4.1, unpatched and under PR 63155.

The replica (`kit.replica`) copies vLLM's capture path; this runs vLLM's.
Everything that decides streams, pools and capture order is vLLM 0.33.0's
own code, imported from its sources (on the kit's GPU machine, from the
bundle `scripts/vllm_bundle.py` builds): `GPUModelRunner.capture_model`,
`ModelCudaGraphManager.capture` and the base `CudaGraphManager.capture`,
`parallel_state.graph_capture` and `GroupCoordinator.graph_capture`, the
breakable PIECEWISE wrapper (`BreakableCUDAGraphWrapper`) and its eager
breaks (`eager_break_during_capture`), `DecoderReplayLayers`,
`DeepseekV41ModelState.capture_inner_cudagraphs`,
`DecoderReplayCudaGraphManager` and the global graph pool of vLLM's CUDA
platform. `kit.patch.vllm` patches those functions in the variants that ask
for it, and `kit.CaptureRecorder` records every graph.

What is stood in, and why (each is also in every recording's provenance:
`stood_in`, `bypassed`, `constructed`, `not_modelled`):

- the model: `StandInDeepseekV41` is shaped like DeepSeek-V4.1 where the
  capture path looks: a backbone (`.model`) with `layers`,
  `decoder_replay_start`, `aux_hidden_state_layers` (aux id `i` is layer
  `i`'s input, made while layer `i` runs) and vLLM's own
  `DecoderReplayLayers`, which it calls with V4.1's seven break inputs
  (`hidden_states, positions, input_ids, pre_mix, post_mix, res_mix,
  residual`, at V4.1's shapes and dtypes) and which return
  `hidden_states, pre_mix, *late_aux`; its layers are MLPs, not attention.
  Its early aux states leave a captured forward as weak references, as
  vLLM's wrapper hands out its top-level outputs (V4.1's nested aux list
  would keep their blocks allocated: `_define_model` says why), except in
  `early_aux_shared_pinned`;
- what needs a checkpoint or kernels: the model config
  (`model_config.hf_config`'s `hidden_size`, `hc_mult`, and the dtype: a
  namespace), the model state's attention metadata (`prepare_attn`) and its
  replay batch (`replay_batch`: a step's last r rows, half by default, padded
  by vLLM's own `dispatch` to the replay graph that fits; vLLM gathers them
  with Triton kernels), the KV writes (`write_batch_kv`: there is no KV
  cache) and the block tables;
- constructors bypassed (`BYPASSED`): `GPUModelRunner`,
  `DeepseekV41ModelState` and the `GroupCoordinator`s (tp, pp, dp, ep, world:
  one rank, no device communicator; their `graph_capture` runs as installed)
  are made with `object.__new__` and given the attributes the capture path
  reads; the model config is set past pydantic's validation. The graph
  managers, the replay layers, the wrappers and the config are made by their
  own constructors (`CONSTRUCTED`);
- `vllm._C`'s `weak_ref_tensor` op: the compiled extension is not carried;
  `install_weak_ref_op` registers the same op (a tensor viewing the same
  memory that does not keep it alive) where it is missing;
- on the GPU machine, the stub modules of `scripts/vllm_stubs/` for
  packages it lacks that the imports touch but the path never calls.

Not modelled (`NOT_MODELLED`): the speculator (DSpark drafter), FULL and
microbatch (ubatch) graphs, attention (so V4.1's per-layer attention breaks),
the KV cache writes, parallelism of any kind.

The replay capture sizes are vLLM's default (`DecoderReplayCudaGraphManager.__init__`
makes them from the window, 96 here: 96, 192, ..., 480, 512), read back from
the manager. Variants, each in a fresh process (the graph pool and the patch
are per process): `unpatched` (vLLM 0.33), `patched` (PR 63155),
`early_aux_pr` (an aux id before the replay layers, under the PR: the replay
graphs keep their own stream), `early_aux_shared` (the same forced to share),
`early_aux_shared_pinned` (forced to share, the early aux handed out as V4.1
does). Each writes a snapshot (`<variant>.pickle`) whose `kit` key holds the
variant, the path that ran, the streams `graph_capture` made, the
graphs-versus-eager check, the read/write obligation over the dispatchable
pairings (`readwrite`, recorded during the capture by vLLM's phases), the
pairings against eager (`pairings`), what each break read (`break_reads`) and
the provenance (`kit.experiments.vllm_safety`); `record` writes them with
`PROVENANCE.json`.

    python -m kit.experiments.vllm_capture --out DIR          # every variant (needs CUDA)
    python -m kit.experiments.vllm_capture --probe            # which capture modules import here
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import importlib
import importlib.util
import json
import os
import pickle
import subprocess
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

from kit.errors import KitError
from kit.fileio import atomic_write

MODULE = "kit.experiments.vllm_capture"
ROOT = Path(__file__).resolve().parents[2]
STUBS = ROOT / "scripts" / "vllm_stubs"


class Variant(NamedTuple):
    """A variant: the patch policy (None: unpatched), whether an aux id comes before the replay layers, what it
    shows, and whether that early aux is handed out as V4.1 does (`pinned`: vLLM's wrapper then keeps it)."""

    policy: str | None
    early_aux: bool
    description: str
    pinned: bool = False


VARIANTS = {
    "unpatched": Variant(None, False, "vLLM 0.33: replay graphs on a stream graph_capture() makes for them"),
    "patched": Variant("pr", False, "PR 63155: replay graphs on the model graphs' stream"),
    "early_aux_pr": Variant("pr", True, "early aux under PR 63155: the replay graphs keep their own stream"),
    "early_aux_shared": Variant("share", True, "early aux forced onto the model graphs' stream"),
    "early_aux_shared_pinned": Variant(
        "share", True, "early aux forced to share, handed out as V4.1 does: vLLM's wrapper keeps its block", True
    ),
}
PATHS = ("runner", "managers")  # GPUModelRunner.capture_model, else the two managers' captures called by hand
EARLY_AUX_LAYER = 1
STAND_IN_STEP = "kit: vLLM's platform, and stand-ins for its compiled parts"
PROBE_MARK = "KIT_PROBE "
PROBE_BUDGET_S = 150.0
VARIANT_TIMEOUT_S = 240.0  # capture with both recorders, the check, 11 pairings
STAGE_MARK = "KIT_STAGE "

# The modules of the capture path, in import order: the probe imports each and says what stopped it.
CAPTURE_MODULES = (
    "vllm",
    "vllm.platforms",
    "vllm.config",
    "vllm.distributed.parallel_state",
    "vllm.forward_context",
    "vllm.compilation.breakable_cudagraph",
    "vllm.v1.worker.gpu.cudagraph_utils",
    "vllm.models.deepseek_v41.decoder_replay_layers",
    "vllm.models.deepseek_v41.nvidia.decoder_replay_cudagraph",
    "vllm.models.deepseek_v41.nvidia.model_state",
    "vllm.models.deepseek_v41.nvidia.specialized_decode.runtime.model_state",
    "vllm.v1.worker.gpu.model_runner",
    "vllm.v1.worker.workspace",
    "kit.patch.vllm",
)

# What this experiment stands in for, beside the stub modules (provenance of every recording).
STOOD_IN = {
    "model": "StandInDeepseekV41: V4.1's backbone attributes, break inputs and outputs; MLP layers, no attention",
    "model_config": "hf_config.hidden_size, hc_mult and the dtype, as a namespace (no checkpoint)",
    "DeepseekV41ModelState.prepare_attn": "no attention metadata; sets the replay batch (the last half of the rows)",
    "DeepseekV41ModelState._prepare_replay_batch": "the replay batch at capture: rows 0..n-1 of a replay graph",
    "DeepseekV41ModelState.replay_batch": (
        "a step's replay batch: its last r rows (half by default), padded by vLLM's own "
        "DecoderReplayCudaGraphManager.dispatch to the replay graph that fits; vLLM gathers them with Triton kernels"
    ),
    "DeepseekV41ModelState.prepare_dummy_inputs": "no engram inputs",
    "DecoderReplayLayers.write_batch_kv": "no KV cache to write",
    "block_tables": "dummy block tables and slot mappings (no KV cache)",
    "process groups": "tp, pp, dp, ep, world: vLLM's GroupCoordinator of one rank with no device communicator",
    "kv_connector": "a namespace whose reset_capture_state does nothing",
    "vllm._C.weak_ref_tensor": "the same op registered from Python where vllm._C is missing",
}
# Objects made with object.__new__ (or set past validation): their constructors need a checkpoint, a KV cache
# or process groups. Every other vLLM object on the path is made by its own constructor (CONSTRUCTED).
BYPASSED = {
    "GPUModelRunner.__init__": (
        "object.__new__(GPUModelRunner), given only what capture_model reads (vllm_config, model, model_state, "
        "cudagraph_manager, input_buffers, block_tables, attn_groups, kv_cache_config, speculator=None, ...); "
        "the constructor would build the input batch, sampler, attention backends, KV cache and speculator"
    ),
    "DeepseekV41ModelState.__init__": (
        "object.__new__(DeepseekV41ModelState), given the model, its DecoderReplayLayers, _replay_start and the "
        "replay graph manager; the constructor would build the replay kernels' buffers (_kept_rows, "
        "_kept_slot_mappings, the staging buffers), attention groups and the Triton gather of the replay batch"
    ),
    "GroupCoordinator.__init__": (
        "object.__new__(GroupCoordinator) for _TP, _PP, _DP, _EP and _WORLD: one rank, no torch.distributed "
        "process group, no device communicator"
    ),
    "VllmConfig.model_config": (
        "a namespace set with object.__setattr__, past pydantic's validation (no checkpoint to build a ModelConfig "
        "from); cudagraph_mode and the capture sizes are set after VllmConfig's __post_init__ turned graphs off"
    ),
}
CONSTRUCTED = (
    "VllmConfig", "CompilationConfig", "DeviceConfig", "ModelCudaGraphManager", "DecoderReplayCudaGraphManager",
    "DecoderReplayLayers", "BreakableCUDAGraphWrapper", "InputBuffers", "KVCacheConfig", "the workspace manager",
)  # fmt: skip
# What a real DeepSeek-V4.1 step has that this experiment does not model.
NOT_MODELLED = {
    "speculator": (
        "the DSpark drafter and its SpeculatorCudaGraphManager capture (runner.speculator is None): its graphs, "
        "captured after the target's on a stream of their own, are not made (the replica models them)"
    ),
    "FULL graphs": (
        "only PIECEWISE model graphs: no FULL decode graphs, which keep the replay layers inside the graph on the "
        "whole batch (no break, no replay graph)"
    ),
    "microbatch (ubatch) graphs": "no UBatchRunner (DBO): no microbatched FULL graphs and no capture stream of theirs",
    "attention": (
        "the stand-in's layers are MLPs: none of V4.1's attention, sparse MLA or compressor kernels, so none of its "
        "per-layer attention breaks (a model graph here is two segments around the replay break) and no attention "
        "metadata"
    ),
    "KV cache": "no KV cache: write_batch_kv, the slot mappings and the first replay layer's KV writes do nothing",
    "parallelism": (
        "one rank: no tensor, pipeline, data, expert or context parallelism (no all-gathers, no sequence "
        "parallelism, no _agree_across_dp)"
    ),
    "the replay batch's rows": (
        "vLLM's _prepare_replay_batch (kept_lens per request, Triton gathers) is stood in: a step's replay rows are "
        "its last r rows, for any r in 1..N"
    ),
    "MoE, engram, quantized kernels": "the stand-in runs dense bf16 MLPs only",
}


@dataclasses.dataclass(frozen=True)
class StandInConfig:
    """The stand-in's sizes: the replica's small preset, with V4.1's hyper-connection width.

    The replay capture sizes are left empty, so vLLM's own
    `DecoderReplayCudaGraphManager.__init__` makes them (its default: multiples
    of the window up to min(largest capture size, max_num_seqs * window), and
    that bound): with window 96 and model sizes 128, 256, 512 that is 96, 192,
    288, 384, 480, 512, the replica's small preset. Every model size is at the
    trim threshold or above, so each model graph breaks out to its replay batch.
    """

    hidden_size: int = 1024
    hc_mult: int = 4
    num_layers: int = 6
    decoder_replay_start: int = 3
    aux_hidden_state_layers: tuple[int, ...] = (4,)
    cudagraph_capture_sizes: tuple[int, ...] = (128, 256, 512)
    decoder_replay_cudagraph_capture_sizes: tuple[int, ...] = ()  # empty: vLLM's default sizing
    window: int = 96  # V4.1's sliding window: the replay layers' unit
    trim_threshold: int = 128  # PIECEWISE model graphs this large break out to the replay batch
    vocab_size: int = 4096
    dtype: str = "bfloat16"
    seed: int = 0
    # How the early aux states leave the forward under capture (see _define_model): False hands them out as
    # weak references, as vLLM's wrapper does its top-level outputs; True as V4.1 does (vLLM then keeps them).
    early_aux_pinned: bool = False

    def with_early_aux(self, pinned: bool = False) -> StandInConfig:
        return dataclasses.replace(
            self, aux_hidden_state_layers=(EARLY_AUX_LAYER, *self.aux_hidden_state_layers), early_aux_pinned=pinned
        )


# --- importing vLLM ----------------------------------------------------------------------------


def probe(modules: tuple[str, ...] = CAPTURE_MODULES) -> list[dict]:
    """Import each capture module in order, in this process, until one fails; per module: ok and seconds, or why not.

    After `vllm.platforms`, vLLM's platform is resolved and the compiled parts
    it lacks are stood in (`stand_in_compiled`: the step `STAND_IN_STEP`, its
    result under `stood_in`). A failed import leaves half-made state behind
    (torch refuses to register an opaque type twice), so nothing is imported
    after a failure: `probe_all` goes on in a fresh process.
    """
    stub_missing_extensions()
    steps = []
    for name in modules:
        if name.startswith(("vllm.", "kit.patch.vllm")) and name != "vllm.platforms" and not steps_have(steps):
            steps.append((STAND_IN_STEP, stand_in_compiled))
        steps.append((name, lambda name=name: importlib.import_module(name) and None))
    results = []
    for name, step in steps:
        start = time.perf_counter()
        try:
            done = step()
            results.append({"module": name, "ok": True, "seconds": round(time.perf_counter() - start, 2)})
            if done:
                results[-1]["stood_in"] = done
        except BaseException as e:  # noqa: BLE001 - the probe reports every failure, SystemExit included
            lines = traceback.format_exc().strip().splitlines()
            results.append(
                {"module": name, "ok": False, "error": f"{type(e).__name__}: {e}"[:500], "where": lines[-8:]}
            )
            break
    return results


def probe_all(modules: tuple[str, ...] = CAPTURE_MODULES, budget_s: float = PROBE_BUDGET_S) -> list[dict]:
    """`probe` in a fresh process, and after each failure again from the next module, in another.

    Each module is tried once, after every module before it imported or was
    tried in an earlier process; a process that dies without answering costs
    its first module. What the time budget leaves untried is listed as such.
    """
    deadline, results, left = time.monotonic() + budget_s, [], list(modules)
    while left:
        if time.monotonic() > deadline:
            results += [{"module": name, "ok": False, "error": "not tried: the probe's time ran out"} for name in left]
            break
        done = subprocess.run(
            [sys.executable, "-m", MODULE, "--probe-modules", ",".join(left)],
            capture_output=True, text=True, timeout=max(deadline - time.monotonic(), 1) + 60,
        )  # fmt: skip
        answers = [line[len(PROBE_MARK) :] for line in done.stdout.splitlines() if line.startswith(PROBE_MARK)]
        tried = json.loads(answers[-1]) if answers else []
        if not tried:
            tail = (done.stderr or done.stdout).strip().splitlines()[-8:]
            tried = [
                {
                    "module": left[0],
                    "ok": False,
                    "error": f"the probe's process exited {done.returncode}",
                    "where": tail,
                }
            ]
        results += tried
        names = [r["module"] for r in tried if r["module"] != STAND_IN_STEP]
        left = left[max(len(names), 1) :]
    return results


def steps_have(steps: list) -> bool:
    return any(name == STAND_IN_STEP for name, _ in steps)


def stubs_in_use() -> list[dict]:
    """The stub packages and stood-in compiled extensions imported in this process, each with why; what bodies made."""
    stub = sys.modules.get("_vllm_stub")
    roots = dict(getattr(stub, "_ROOTS", {}))
    made = list(getattr(stub, "IMPORT_TIME_VALUES", []))
    packages = [
        {"module": name, "why": why, "import_time_values": [m for m in made if m.split(".")[0] == name]}
        for name, why in sorted(roots.items())
    ]
    extensions = getattr(stub, "_EXTENSIONS", {})
    loaded = getattr(stub, "EXTENSIONS_LOADED", [])
    return packages + [{"module": name, "why": extensions[name], "compiled_extension": True} for name in loaded]


def vllm_source() -> dict:
    """Which vLLM this process imported: its version, its folder, and its bundle's manifest entry if any."""
    import vllm

    source = {"version": vllm.__version__, "path": str(Path(vllm.__file__).parent)}
    manifest = os.environ.get("KIT_VLLM_BUNDLE")
    if manifest and Path(manifest, "MANIFEST.json").is_file():
        found = json.loads(Path(manifest, "MANIFEST.json").read_text())
        tarball = f"vllm-{found['vllm']}-py.tar.gz"
        source["bundle"] = {
            "sources": tarball,
            **found["files"].get(tarball, {}),
            "checked": found["source_files_checked"],
        }
    return source


def stub_support():
    """`_vllm_stub` (scripts/vllm_stubs): from the import path where the stubs are on it, else from the kit's copy."""
    with contextlib.suppress(ImportError):
        import _vllm_stub

        return _vllm_stub
    if "_vllm_stub" not in sys.modules:
        spec = importlib.util.spec_from_file_location("_vllm_stub", STUBS / "_vllm_stub.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["_vllm_stub"] = module
        spec.loader.exec_module(module)
    return sys.modules["_vllm_stub"]


def bundle_extensions() -> list[str]:
    """The compiled extension modules of the vLLM wheel the bundle was made from (its MANIFEST.json), if any."""
    bundle = os.environ.get("KIT_VLLM_BUNDLE")
    manifest = Path(bundle, "MANIFEST.json") if bundle else None
    if manifest is None or not manifest.is_file():
        return []
    return list(json.loads(manifest.read_text()).get("extensions", []))


def stub_missing_extensions(names: list[str] | None = None) -> list[str]:
    """Stand in, with empty modules, the compiled extensions (the bundle's, or `names`) this Python cannot find.

    `vllm.platforms.cuda` imports `vllm._C_stable_libtorch` for its side effect
    (registering the kernels' ops); the stand-in registers none, and anything
    taken from one raises `StubCalled` when called. Must run before vLLM imports.
    """
    names = bundle_extensions() if names is None else names
    if names:
        stub_support().stub_extensions(names)
    return names


def install_capability_ops() -> list[str]:
    """`torch.ops._C`'s CUTLASS capability queries, answering "not supported", where no extension registered them.

    vLLM asks them at import, under the CUDA platform, to pick quantized GEMM
    paths (`vllm.model_executor.layers.quantization.utils.w8a8_utils`, and a
    class body in `...quantization.online.fp8`); the capture path runs no GEMM
    of vLLM's, so the answer only picks which unused path is named.
    """
    import torch

    made = []
    for name in CAPABILITY_OPS:
        with contextlib.suppress(AttributeError, RuntimeError):
            getattr(torch.ops._C, name)
            continue
        library = torch.library.Library("_C", "FRAGMENT")
        library.define(f"{name}(int cuda_device_capability) -> bool")
        library.impl(name, lambda cuda_device_capability: False, "CompositeExplicitAutograd")
        _CAPABILITY_LIBRARIES.append(library)  # a Library unregisters its ops when collected
        made.append(name)
    return made


CAPABILITY_OPS = ("cutlass_scaled_mm_supports_fp8", "cutlass_scaled_mm_supports_block_fp8")


class PlaceholderTritonConfig:
    """`triton.Config` where vLLM found no usable Triton: keeps what a config says (vLLM reads it at import)."""

    def __init__(self, kwargs, num_warps=4, num_stages=3, num_ctas=1, maxnreg=None, pre_hook=None, **extra):
        self.kwargs, self.num_warps, self.num_stages, self.num_ctas = kwargs, num_warps, num_stages, num_ctas
        self.maxnreg, self.pre_hook, self.extra = maxnreg, pre_hook, extra

    def all_kwargs(self) -> dict:
        return {**self.kwargs, "num_warps": self.num_warps, "num_stages": self.num_stages}

    def __repr__(self) -> str:
        return f"PlaceholderTritonConfig({self.kwargs}, num_warps={self.num_warps}, num_stages={self.num_stages})"


def fix_triton_placeholder() -> str:
    """Which Triton vLLM uses; where it is vLLM's placeholder, its `Config` made a `PlaceholderTritonConfig`.

    Without a usable Triton (`HAS_TRITON` false: no active driver, or
    `triton.backends` fails to import) vLLM stands in a placeholder whose
    `triton.Config(...)` returns a decorator, and on an sm90 CUDA platform
    `vllm.model_executor.layers.mamba.ops.ssd_chunk_scan` filters its configs
    by `num_stages` at import. The capture path launches none of those kernels.
    """
    import vllm.triton_utils as triton_utils

    if triton_utils.HAS_TRITON:
        return f"triton {triton_utils.triton.__version__}"
    triton_utils.triton.Config = PlaceholderTritonConfig
    return "vLLM's placeholder (HAS_TRITON is false); its Config stood in by kit's PlaceholderTritonConfig"


def stand_in_compiled() -> dict:
    """vLLM's platform resolved, then what its imports call of the compiled parts stood in; what was done, never raises.

    Each part that fails is listed with its error (the probe shows it; the
    import that needed it fails after, and says why).
    """
    done: dict[str, Any] = {"extensions": stub_missing_extensions()}
    parts = (
        ("platform", lambda: type(importlib.import_module("vllm.platforms").current_platform).__qualname__),
        ("capability_ops", install_capability_ops),
        ("triton", fix_triton_placeholder),
        ("weak_ref_tensor", install_weak_ref_op),
    )
    for name, part in parts:
        try:
            done[name] = part()
        except Exception as e:  # noqa: BLE001 - recorded; the import that needed it says the rest
            done[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
    return done


def install_weak_ref_op() -> str:
    """`torch.ops._C.weak_ref_tensor`, registered from Python where `vllm._C` is missing; which one is in use.

    vLLM's op (csrc) returns a tensor over the same memory with no deleter: it
    does not keep the memory alive, so the graph pool can hand it out again.
    torch's `_construct_storage_from_data_pointer` makes such a storage (torch's
    cudagraph trees use it for the same purpose).
    """
    import torch

    if _LIBRARIES:
        return _KIT_OP  # registered by an earlier call
    with contextlib.suppress(AttributeError, RuntimeError):
        torch.ops._C.weak_ref_tensor  # noqa: B018 - resolving it says whether vllm._C registered it
        return "vllm._C"
    library = torch.library.Library("_C", "FRAGMENT")
    library.define("weak_ref_tensor(Tensor input) -> Tensor")

    def weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
        storage = torch._C._construct_storage_from_data_pointer(
            tensor.untyped_storage().data_ptr(), tensor.device, tensor.untyped_storage().nbytes()
        )
        out = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
        return out.set_(storage, tensor.storage_offset(), tensor.size(), tensor.stride())

    for key in ("CPU", "CUDA"):
        library.impl("weak_ref_tensor", weak_ref_tensor, key)
    _LIBRARIES.append(library)  # a Library unregisters its ops when collected
    return _KIT_OP


_LIBRARIES: list = []  # the weak_ref_tensor op's, once registered
_CAPABILITY_LIBRARIES: list = []
_KIT_OP = "kit (vllm._C missing)"


def import_vllm() -> dict:
    """Import the capture path quietly, with breakable CUDA graphs on (V4.1's replay graphs need them); the stand-ins.

    The stand-ins for vLLM's compiled parts (`stand_in_compiled`) go in once
    the platform module can be imported, before anything that calls them.
    """
    global _STOOD_IN
    set_vllm_env()
    stub_missing_extensions()
    importlib.import_module("vllm.platforms")
    from kit.patch.vllm import quiet_import

    with quiet_import():
        if _STOOD_IN is None:
            _STOOD_IN = stand_in_compiled()
        for name in CAPTURE_MODULES[:-1]:
            importlib.import_module(name)
    install_weak_ref_op()
    return _STOOD_IN


_STOOD_IN: dict | None = None


def set_vllm_env() -> None:
    """Breakable CUDA graphs (V4.1's replay graphs need them) and Model Runner V2 (vLLM falls back to V1 without
    a usable Triton), unless the environment says otherwise."""
    os.environ.setdefault("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")


# --- the stand-in model and vLLM's objects around it -------------------------------------------


def vllm_config(cfg: StandInConfig, device: str = "cuda"):
    """The smallest real `VllmConfig` the capture path reads, and its stood-in `model_config`."""
    import torch
    from vllm.config import CompilationConfig, CUDAGraphMode, DeviceConfig, VllmConfig

    config = VllmConfig(
        device_config=DeviceConfig(device=device),
        compilation_config=CompilationConfig(
            cudagraph_capture_sizes=list(cfg.cudagraph_capture_sizes),
            max_cudagraph_capture_size=max(cfg.cudagraph_capture_sizes),
            decoder_replay_cudagraph_capture_sizes=list(cfg.decoder_replay_cudagraph_capture_sizes),
            decoder_replay_trim_threshold=cfg.trim_threshold,
        ),
    )
    # Without a model, VllmConfig turns CUDA graphs off (under the CUDA platform it also empties the
    # capture sizes); the runner would not.
    config.compilation_config.cudagraph_mode = CUDAGraphMode.PIECEWISE
    config.compilation_config.cudagraph_capture_sizes = sorted(cfg.cudagraph_capture_sizes)
    config.compilation_config.max_cudagraph_capture_size = max(cfg.cudagraph_capture_sizes)
    hf_config = SimpleNamespace(hidden_size=cfg.hidden_size, hc_mult=cfg.hc_mult, num_hidden_layers=cfg.num_layers)
    model_config = SimpleNamespace(
        hf_config=hf_config, dtype=getattr(torch, cfg.dtype),
        enable_sleep_mode=False, sleep_mode_offload_cudagraph=False, sleep_mode_backend="cumem",
    )  # fmt: skip
    object.__setattr__(config, "model_config", model_config)
    return config


def build_model(cfg: StandInConfig, device: str = "cuda"):
    """The stand-in DeepSeek-V4.1 on `device`, in eval mode (vLLM's `DecoderReplayLayers` inside)."""
    import torch

    torch.manual_seed(cfg.seed)
    model = _model_class()(cfg)
    return model.to(device, getattr(torch, cfg.dtype)).eval()


def _model_class():
    """`StandInDeepseekV41`, defined once torch is imported (this module imports without torch)."""
    global _MODEL
    if _MODEL is None:
        _MODEL = _define_model()
    return _MODEL


_MODEL = None


def _define_model():
    """`StandInDeepseekV41`, with vLLM's own `DecoderReplayLayers` inside.

    How its early aux states leave the forward under capture, and why
    (`StandInConfig.early_aux_pinned`). vLLM's `BreakableCUDAGraphWrapper._capture`
    hands the caller `weak_ref_tensors(output)`, so that "the cudagraph pool
    [can] reclaim/reuse that memory immediately for the next batch descriptor's
    capture" (its comment): the caller reads the graph's outputs at their pool
    addresses, and later captures may allocate over them. But
    `weak_ref_tensors` weak-refs only a tensor, or the tensors of a flat list or
    tuple; V4.1 returns `(hidden_states, [aux, ...])`, so the aux list passes
    through as it is and the wrapper's `entry.output` keeps every aux tensor,
    and with it its graph-pool block, allocated for the life of the graph. An
    early aux state is then never a free block that a replay capture could take,
    whatever the stream: on the H200 (before issue 28) early aux forced to share
    was bit-exact for that reason alone. So by default the stand-in hands its
    early aux states out under capture as vLLM's own `weak_ref_tensor`, what the
    wrapper does to its top-level outputs: their blocks go back to the pool
    when the capture ends, as the final hidden state's do, and a replay graph
    captured on the same stream may take them, the case PR 63155's early-aux
    exception is for. `early_aux_pinned=True` hands them out as V4.1 does
    (variant `early_aux_shared_pinned`). Late aux states are views of the
    replay layers' break buffers, outside the graph pool, either way; eager
    forwards (no capture) always return the tensors themselves.
    """
    import torch
    import torch.nn.functional as F
    from torch import nn
    from vllm.models.deepseek_v41.decoder_replay_layers import DecoderReplayLayers

    class Layer(nn.Module):
        """An MLP layer that also updates V4.1's hyper-connection state (pre_mix, residual)."""

        def __init__(self, cfg: StandInConfig) -> None:
            super().__init__()
            self.norm = nn.RMSNorm(cfg.hidden_size, eps=1e-6)
            self.up_proj = nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False)
            self.down_proj = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)
            self.mix_proj = nn.Linear(cfg.hidden_size, cfg.hc_mult, bias=False)

        def forward(self, hidden_states, residual):
            hidden_states = hidden_states + self.down_proj(F.silu(self.up_proj(self.norm(hidden_states))))
            pre_mix = torch.sigmoid(self.mix_proj(hidden_states).float())
            residual = residual + hidden_states.unsqueeze(1) * pre_mix.unsqueeze(-1).to(hidden_states.dtype)
            return hidden_states, residual, pre_mix

    class Backbone(nn.Module):
        """V4.1's `DeepseekV4Model` where the capture path looks: layers, the replay start, the aux ids."""

        def __init__(self, cfg: StandInConfig) -> None:
            super().__init__()
            self.cfg = cfg
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))
            self.norm = nn.RMSNorm(cfg.hidden_size, eps=1e-6)
            self.start_layer, self.end_layer = 0, cfg.num_layers
            self.decoder_replay_start = cfg.decoder_replay_start
            self.aux_hidden_state_layers = tuple(sorted(set(cfg.aux_hidden_state_layers)))
            self.decoder_replay_layers = DecoderReplayLayers(
                cfg.window, self._run_replay_layers, self._write_batch_kv, set(), "swa"
            )

        @staticmethod
        def _write_batch_kv(*inputs) -> None:
            """Stood in: there is no KV cache (V4.1 writes the first replay layer's KV for every row here)."""

        def _run_layers(self, layer_ids, hidden_states, residual, pre_mix, aux: dict):
            for i in layer_ids:
                if i in self.aux_hidden_state_layers and i > 0:
                    aux[i] = hidden_states  # aux id i: layer i's input, made while layer i runs
                hidden_states, residual, pre_mix = self.layers[i](hidden_states, residual)
            return hidden_states, residual, pre_mix

        def _run_replay_layers(self, hidden_states, positions, input_ids, pre_mix, post_mix, res_mix, residual):
            """V4.1's replay layers: the seven break inputs in, `hidden_states, pre_mix, *late_aux` out."""
            mixed = (residual * post_mix.to(residual.dtype)).sum(1) + (res_mix.sum(-1) * pre_mix).sum(
                -1, keepdim=True
            ).to(hidden_states.dtype)
            hidden_states = hidden_states + mixed * 1e-3
            aux: dict[int, Any] = {}
            layer_ids = range(self.decoder_replay_start, self.end_layer)
            hidden_states, residual, pre_mix = self._run_layers(layer_ids, hidden_states, residual, pre_mix, aux)
            return (hidden_states, pre_mix, *(aux[i] for i in sorted(aux)))

        def forward(self, input_ids, positions):
            hidden_states = self.embed_tokens(input_ids)
            n, hc = hidden_states.shape[0], self.cfg.hc_mult
            residual = hidden_states.unsqueeze(1).expand(n, hc, -1).contiguous()
            pre_mix = torch.zeros(n, hc, dtype=torch.float32, device=hidden_states.device)
            early: dict[int, Any] = {}
            hidden_states, residual, pre_mix = self._run_layers(
                range(self.start_layer, self.decoder_replay_start), hidden_states, residual, pre_mix, early
            )
            post_mix = pre_mix.unsqueeze(-1) * 0.5
            res_mix = torch.softmax(pre_mix.unsqueeze(-1) * pre_mix.unsqueeze(1), dim=-1)
            # V4.1's break: these seven in (residual, post_mix, res_mix stay bound, unread, until the forward returns).
            hidden_states, pre_mix, *late_aux = self.decoder_replay_layers(
                hidden_states, positions, input_ids, pre_mix, post_mix, res_mix, residual
            )
            hidden_states = self.norm(hidden_states) * (1 + pre_mix.mean(-1, keepdim=True)).to(hidden_states.dtype)
            early_aux = [early[i] for i in self.aux_hidden_state_layers if i in early]
            return hidden_states, handed_out(early_aux, self.cfg.early_aux_pinned) + late_aux

    class StandInDeepseekV41(nn.Module):
        """`DeepseekV41ForCausalLM` as the runner sees it: `.model` is the backbone; returns hidden and aux states."""

        def __init__(self, cfg: StandInConfig) -> None:
            super().__init__()
            self.model = Backbone(cfg)

        @property
        def decoder_replay_layers(self):
            return self.model.decoder_replay_layers

        def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
            return self.model(input_ids, positions)

    return StandInDeepseekV41


def handed_out(early_aux: list, pinned: bool) -> list:
    """The stand-in's early aux states as its forward returns them (`_define_model` says why).

    Under vLLM's breakable capture (`BreakableCUDAGraphCapture.current()`),
    unless `pinned`: each as vLLM's own `weak_ref_tensor`, what
    `BreakableCUDAGraphWrapper._capture` does to a top-level output, so its
    block goes back to the graph pool when the capture ends. Otherwise (eager,
    warm-up, pinned) the tensors themselves. CPU tensors (the kit's tests,
    where CUDA is stood in and nothing is captured) are never weak: their
    memory would go back to the system.
    """
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture
    from vllm.utils.torch_utils import weak_ref_tensor

    if pinned or BreakableCUDAGraphCapture.current() is None:
        return list(early_aux)
    return [a if a.device.type == "cpu" else weak_ref_tensor(a) for a in early_aux]


class StandInBlockTables:
    """Block tables with no KV cache: the dummy tables and slot mappings the capture asks for."""

    cp_size = 1

    def __init__(self, device) -> None:
        import torch

        self.device = device
        self._slots = torch.full((1 << 14,), -1, dtype=torch.int64, device=device)

    def get_dummy_block_tables(self, num_reqs: int) -> tuple:
        return ()

    def get_dummy_slot_mappings(self, num_tokens: int):
        return self._slots[:num_tokens].unsqueeze(0)


def require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise KitError(
            "capturing vLLM's graphs needs CUDA, and this process has none; read kit/recordings/vllm instead"
        )


def install_groups() -> None:
    """tp, pp and dp as vLLM's `GroupCoordinator`s of one rank with no device communicator."""
    from vllm.distributed import parallel_state

    for name in ("_TP", "_PP", "_DP", "_EP", "_WORLD"):
        group = object.__new__(parallel_state.GroupCoordinator)
        group.__dict__.update(
            unique_name=name.strip("_").lower(), device_communicator=None, ranks=[0], rank=0, rank_in_group=0,
            world_size=1, local_rank=0, use_device_communicator=False,
        )  # fmt: skip
        setattr(parallel_state, name, group)


def build_runner(cfg: StandInConfig, device=None):
    """vLLM's V2 `GPUModelRunner` around the stand-in: real graph managers, model state and wrappers; needs CUDA.

    `device` is for tests that stand CUDA in (tests/test_vllm_recording.py); the default is this GPU.
    """
    import torch
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor, create_forward_context
    from vllm.models.deepseek_v41.decoder_replay_layers import ReplayBatch
    from vllm.models.deepseek_v41.nvidia.decoder_replay_cudagraph import DecoderReplayCudaGraphManager
    from vllm.models.deepseek_v41.nvidia.model_state import DeepseekV41ModelState
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.worker import workspace
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager
    from vllm.v1.worker.gpu.input_batch import InputBuffers
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    if device is None:
        require_cuda()
        device = torch.device("cuda", torch.cuda.current_device())
    config = vllm_config(cfg, device.type)
    install_groups()
    if workspace._manager is None:
        workspace.init_workspace_manager(device, num_lanes=2)
    model = build_model(cfg, device)
    layers = model.decoder_replay_layers
    layers.trim_threshold = cfg.trim_threshold
    max_tokens = max(cfg.cudagraph_capture_sizes)
    kept_rows = torch.arange(max_tokens, dtype=torch.int64, device=device)  # persistent, as vLLM's _kept_rows

    state = object.__new__(DeepseekV41ModelState)
    state.__dict__.update(
        vllm_config=config, model=model, device=device, decoder_replay_layers=layers, supports_mm_inputs=False,
        max_num_reqs=config.scheduler_config.max_num_seqs, pcp_size=1, _replay_attn_groups=None,
        _replay_start=torch.zeros(config.scheduler_config.max_num_seqs, dtype=torch.int32, device=device),
        replay_cudagraphs=DecoderReplayCudaGraphManager(config, device, layers),
    )  # fmt: skip

    def replay_batch(num_tokens: int, run_graph: bool, rows: int | None = None, pad: bool = False) -> ReplayBatch:
        """A step's replay batch: its last `rows` rows (half of them by default), in the replay graph vLLM's own
        `dispatch` pads them to (with `run_graph`), else eagerly: on the rows alone, or with `pad` on the rows
        padded with zeros to that graph's size (vLLM's `num_padded` path), so eager runs the same shapes."""
        count = num_tokens // 2 if rows is None else int(rows)
        if not 0 < count <= num_tokens:
            raise KitError(f"a step of {num_tokens} tokens cannot hold a replay batch of {count} rows")
        kept = kept_rows[num_tokens - count : num_tokens]
        cudagraphs = state.replay_cudagraphs
        desc = cudagraphs.dispatch(count, count, None, 0)  # NONE (eager) before the replay graphs are captured
        fits = desc.cg_mode == CUDAGraphMode.PIECEWISE
        graph = run_graph and fits
        padded = desc.num_tokens if fits and (graph or pad) else count
        context = create_forward_context(
            None, config, cudagraph_runtime_mode=CUDAGraphMode.PIECEWISE if graph else CUDAGraphMode.NONE,
            batch_descriptor=BatchDescriptor(num_tokens=padded),
        )  # fmt: skip
        num_padded = padded if pad and not graph and padded != count else None
        return ReplayBatch(kept, context, cudagraphs.run if graph else None, num_padded)

    def prepare_attn(input_batch, cg_mode, *args, **kwargs):
        layers.replay_batch = replay_batch(input_batch.num_tokens, run_graph=False)
        return None

    def prepare_replay_batch(input_batch, cg_mode, block_tables, slot_mappings, *args, capture_desc=None, **kwargs):
        rows = kept_rows[: capture_desc.num_tokens]
        context = create_forward_context(
            None, config, cudagraph_runtime_mode=capture_desc.cg_mode,
            batch_descriptor=BatchDescriptor(num_tokens=capture_desc.num_tokens),
        )  # fmt: skip
        layers.replay_batch = ReplayBatch(rows, context, state.replay_cudagraphs.run)

    state.prepare_attn = prepare_attn
    state._prepare_replay_batch = prepare_replay_batch
    state.prepare_dummy_inputs = lambda num_reqs, num_tokens: {}
    state.replay_batch = replay_batch

    runner = object.__new__(GPUModelRunner)
    runner.__dict__.update(
        vllm_config=config, device=device, model=model, model_state=state,
        cudagraph_manager=ModelCudaGraphManager(config, device, CUDAGraphMode.PIECEWISE, 1),
        input_buffers=InputBuffers(config.scheduler_config.max_num_seqs, max_tokens, device),
        block_tables=StandInBlockTables(device), attn_groups=[], kv_cache_config=KVCacheConfig(0, [], []),
        intermediate_tensors=None, pcp_manager=None, lora_config=None, use_aux_hidden_state_outputs=True,
        speculator=None, adaptive_verification=None, _draft_workspace_lane=1,
        kv_connector=SimpleNamespace(reset_capture_state=lambda: None), stand_in=cfg,
    )  # fmt: skip
    return runner


# --- capturing and checking --------------------------------------------------------------------


@contextlib.contextmanager
def graph_capture_streams():
    """The stream of every `GroupCoordinator.graph_capture()` entered (tp's), in order; the real one runs."""
    from vllm.distributed.parallel_state import GroupCoordinator

    seen: list[int] = []
    original = GroupCoordinator.graph_capture

    @contextlib.contextmanager
    def graph_capture(self, graph_capture_context=None):
        with original(self, graph_capture_context) as context:
            if self.unique_name == "tp":
                seen.append(int(context.stream.cuda_stream))
            yield context

    GroupCoordinator.graph_capture = graph_capture
    try:
        yield seen
    finally:
        GroupCoordinator.graph_capture = original


def capture(runner, path: str) -> None:
    """Every graph: through `GPUModelRunner.capture_model` (`runner`), or the two managers' captures (`managers`)."""
    import torch

    if path == "runner":
        runner.capture_model()
        return
    manager, state = runner.cudagraph_manager, runner.model_state
    with torch.inference_mode():
        manager.capture(
            runner.model, state, runner.input_buffers, None, runner.block_tables, runner.attn_groups,
            runner.kv_cache_config, use_aux_hidden_state_outputs=True,
        )  # fmt: skip
        stream = getattr(manager, "capture_stream", None)  # set by the patch only
        args = (runner.input_buffers, runner.block_tables, runner.attn_groups, runner.kv_cache_config)
        state.capture_inner_cudagraphs(*args, **({"stream": stream} if stream is not None else {}))


def run_forward(runner, input_ids, use_cudagraph: bool, rows: int | None = None, pad: bool = False):
    """One forward of `input_ids` as the runner runs a step: graphs (PIECEWISE) or eager; copies of the outputs.

    The step's replay batch holds its last `rows` rows (half of them by
    default); with graphs vLLM's dispatch runs them in the replay graph that
    fits, eagerly they run as they are, or with `pad` padded with zeros to that
    graph's size (`DeepseekV41ModelState.replay_batch` of the stand-in).
    """
    import torch
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor, set_forward_context

    n = input_ids.shape[0]
    buffers = runner.input_buffers
    buffers.input_ids[:n].copy_(input_ids)
    torch.arange(n, out=buffers.positions[:n])
    inputs = {"input_ids": buffers.input_ids[:n], "positions": buffers.positions[:n], "intermediate_tensors": None}
    runner.model.decoder_replay_layers.replay_batch = runner.model_state.replay_batch(
        n, run_graph=use_cudagraph, rows=rows, pad=pad
    )
    mode = CUDAGraphMode.PIECEWISE if use_cudagraph else CUDAGraphMode.NONE
    with (
        torch.inference_mode(),
        set_forward_context(
            None,
            runner.vllm_config,
            num_tokens=n,
            cudagraph_runtime_mode=mode,
            batch_descriptor=BatchDescriptor(num_tokens=n),
        ),
    ):
        if use_cudagraph:
            hidden, aux = runner.cudagraph_manager.run_pw_graph(runner.model, inputs)
        else:
            hidden, aux = runner.model(**inputs)
    torch.cuda.synchronize()
    return hidden.clone(), [a.clone() for a in aux]


def check_equivalence(runner, seed: int = 1234) -> list[dict]:
    """Fresh token ids per capture size, graphs against eager, as the replica's check (kit.analysis.equivalence).

    Each step's replay batch is its last half of rows, which vLLM's dispatch
    pads to the replay graph that fits; the eager run pads them the same way
    (`pad`), so both run the replay layers on the same shapes and any
    difference is one of memory, not of a GEMM picked for another row count.
    """
    import torch

    from kit.analysis.equivalence import compare

    cfg = runner.stand_in
    generator = torch.Generator(device="cpu").manual_seed(seed)
    rows = []
    for size in sorted(cfg.cudagraph_capture_sizes):
        ids = torch.randint(cfg.vocab_size, (size,), generator=generator, dtype=torch.int32).to(runner.device)
        graph_out, graph_aux = run_forward(runner, ids, use_cudagraph=True)
        eager_out, eager_aux = run_forward(runner, ids, use_cudagraph=False, pad=True)
        rows.append(compare(size, "hidden_states", graph_out, eager_out))
        aux_ids = runner.model.model.aux_hidden_state_layers
        for layer, g, e in zip(aux_ids, graph_aux, eager_aux, strict=True):
            rows.append(compare(size, f"aux_hidden_state[{layer}]", g, e))
    return rows


def provenance(command: str) -> dict:
    import torch

    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": command,
    }


def run_variant(name: str, path: str = "runner") -> dict:
    """Build, capture under the variant's patch with both recorders on, check against eager, run the pairings;
    the raw snapshot, with the obligation and the pairings in its `kit` key."""
    if name not in VARIANTS:
        raise KitError(f"unknown variant {name!r}: one of {', '.join(VARIANTS)}")
    if path not in PATHS:
        raise KitError(f"unknown path {path!r}: one of {', '.join(PATHS)}")
    require_cuda()
    stage("import vLLM's capture path")
    stood_in = import_vllm()
    import torch

    import kit.patch.vllm as vllm_patch
    from kit.analysis.readwrite import attach_break_reads
    from kit.experiments import vllm_safety
    from kit.experiments.recorded import trim_frames
    from kit.patch.policy import has_early_aux
    from kit.record.recorder import CaptureRecorder

    variant = VARIANTS[name]
    policy = variant.policy
    cfg = StandInConfig()
    cfg = cfg.with_early_aux(pinned=variant.pinned) if variant.early_aux else cfg
    weak_ref = install_weak_ref_op()
    stage(f"apply the patch ({policy})" if policy else "no patch")
    patch = vllm_patch.patched(policy=policy) if policy else contextlib.nullcontext()
    with patch as handle, graph_capture_streams() as streams, CaptureRecorder() as recorder:
        stage("build the runner around the stand-in")
        runner = build_runner(cfg)
        torch.cuda.synchronize()
        stage(f"capture ({path}: {PATH_CALLS[path]}), recording reads and writes by phase")
        recording = capture_recorded(runner, path)
        torch.cuda.synchronize()
    stage("check the graphs against eager")
    try:
        equivalence = check_equivalence(runner)
    except Exception as e:  # noqa: BLE001 - the captures are recorded either way; the check's error is kept
        equivalence = [{"error": f"{type(e).__name__}: {e}"[:500], "where": traceback.format_exc().splitlines()[-6:]}]
    stage("the read/write obligation over the dispatchable pairings")
    readwrite = vllm_safety.guarded(vllm_safety.readwrite_result, recording, runner)
    stage("the pairings: every dispatchable replay graph in every model graph's break, against eager")
    pairings = vllm_safety.guarded(vllm_safety.run_pairings, runner, run_forward)
    stage("write the snapshot")
    raw = recorder.snapshot.raw
    trim_frames(raw)
    raw["kit"]["variant"] = {
        "name": name,
        "policy": policy or "unpatched",
        "description": variant.description,
        "path": path,
        "config": dataclasses.asdict(cfg),
        "early_aux_pinned": variant.pinned if variant.early_aux else None,
        "replay_sizes": vllm_safety.replay_sizes(runner),
        "trim_threshold": vllm_safety.trim_threshold(runner),
        "has_early_aux": has_early_aux(runner.model_state),
        "decisions": [dataclasses.asdict(d) for d in handle.decisions] if policy else [],
        "graph_capture_streams": streams,
    }
    raw["kit"]["equivalence"] = equivalence
    raw["kit"]["readwrite"] = readwrite
    raw["kit"]["pairings"] = pairings
    attached = vllm_safety.guarded(attach_break_reads, raw, recording)  # kit["break_reads"], for the lifetimes
    if attached is not raw:
        raw["kit"]["break_reads_error"] = attached
    raw["kit"]["provenance"].update(
        provenance(f"python -m kit.experiments.vllm_capture --variant {name} --path {path}"),
        vllm=vllm_source(), stubs=stubs_in_use(), stood_in=STOOD_IN, bypassed=BYPASSED,
        constructed=list(CONSTRUCTED), not_modelled=NOT_MODELLED, weak_ref_tensor=weak_ref,
        compiled_stand_ins=stood_in,
    )  # fmt: skip
    return raw


def capture_recorded(runner, path: str):
    """`capture(runner, path)` under a `ReadWriteRecorder`, by vLLM's phases (`vllm_safety.vllm_phases`); the
    recording of what every op read and wrote."""
    from kit.experiments import vllm_safety
    from kit.record.readwrite import ReadWriteRecorder

    with ReadWriteRecorder() as rw, vllm_safety.vllm_phases(runner, rw):
        capture(runner, path)
    return rw.recording()


PATH_CALLS = {
    "runner": "GPUModelRunner.capture_model",
    "managers": "ModelCudaGraphManager.capture, then DeepseekV41ModelState.capture_inner_cudagraphs",
}


def stage(name: str) -> None:
    """Say on stderr which step a variant's process is in (`record` keeps the last one a failed process reached)."""
    print(f"{STAGE_MARK}{name}", file=sys.stderr, flush=True)


# --- figures ---------------------------------------------------------------------------------


def summarize(snapshot) -> dict:
    """A variant's figures: where the replay graphs captured, the graph-pool bytes they added, the pool, the check;
    the pairings and the read/write obligation on vLLM's path (`vllm_safety.summary`: None in older recordings)."""
    from kit.analysis.attribution import is_replay_capture, replay_captures_added
    from kit.analysis.tables import segment_table
    from kit.experiments import vllm_safety
    from kit.load.snapshot import load_snapshot

    snap = load_snapshot(snapshot)
    meta = snap.kit
    pool = tuple(meta["pools"]["global graph pool"])
    streams = meta["streams"]
    table = segment_table(snap)
    in_pool = table[table["pool"] == pool]
    captures = meta["captures"]
    replay = [c for c in captures if is_replay_capture(c["manager"])]
    model_stream = streams.get("model graphs stream")
    names = {stream: name for name, stream in streams.items()}
    replay_streams = sorted({c["stream"] for c in replay})
    added = replay_captures_added(snap, pool)
    by_stream = added.groupby("stream")["bytes"].sum() if len(added) else {}
    equivalence = meta.get("equivalence", [])
    variant = meta.get("variant", {})
    return {
        "variant": variant.get("name"),
        "policy": variant.get("policy"),
        "path": variant.get("path"),
        "source": snap.source_label,
        "graph_pool_bytes": int(in_pool["reserved"].sum()),
        "graph_pool_segments": int(in_pool["segments"].sum()),
        "model_stream": model_stream,
        "replay_streams": replay_streams,
        "replay_stream_names": sorted({names.get(c["stream"], str(c["stream"])) for c in replay}),
        "replay_on_model_stream": replay_streams == [model_stream],
        "replay_streams_from_graph_capture": all(s in variant.get("graph_capture_streams", []) for s in replay_streams),
        "replay_added_bytes": int(added["bytes"].sum()) if len(added) else 0,
        "replay_added_by_stream": {str(k): int(v) for k, v in dict(by_stream).items()},
        "replay_graphs": len(replay),
        "bit_exact": all(r.get("bit_exact", False) for r in equivalence) if equivalence else None,
        "max_abs_diff": max((r["max_abs_diff"] for r in equivalence if "max_abs_diff" in r), default=None),
        "equivalence_error": next((r["error"] for r in equivalence if "error" in r), None),
        "has_early_aux": variant.get("has_early_aux"),
        "early_aux_pinned": variant.get("early_aux_pinned"),
        "replay_sizes": variant.get("replay_sizes"),
        **vllm_safety.summary(meta),
    }


# --- the shipped recordings --------------------------------------------------------------------


def recording_path(name: str) -> Path:
    from kit.recordings import RECORDINGS

    return RECORDINGS / "vllm" / f"{name}.pickle"


def load_recordings() -> dict:
    """The shipped H200 recordings of every variant, as snapshots; KitError naming how to make them if none."""
    from kit.experiments.recorded import shown
    from kit.load.snapshot import load_snapshot

    runs = {
        name: load_snapshot(recording_path(name), label=shown(recording_path(name)))
        for name in VARIANTS
        if recording_path(name).is_file()
    }
    if not runs:
        raise KitError(
            "no vLLM recordings in kit/recordings/vllm: record them on the H200 with "
            "`bash scripts/vllm_on_device.sh OUT` (docs/vllm.md)"
        )
    return runs


def demo_json(summaries: dict, provenance_by_name: dict) -> dict:
    """`{variant: {"replay_added_bytes", "graph_pool_bytes", ..., "pairings", "readwrite", ..., "provenance"}}`, as
    `demo --vllm --json` prints; the pairings' and obligation's keys are None for a recording made before them."""
    keys = (
        "replay_added_bytes", "graph_pool_bytes", "graph_pool_segments", "replay_on_model_stream",
        "replay_streams_from_graph_capture", "replay_stream_names", "bit_exact", "max_abs_diff", "path", "source",
        "has_early_aux", "early_aux_pinned", "replay_sizes", "pairings", "pairings_verdict", "readwrite",
        "readwrite_verdict", "readwrite_verdicts", "readwrite_holds",
    )  # fmt: skip
    return {
        name: {**{k: summary.get(k) for k in keys}, "provenance": provenance_by_name[name]}
        for name, summary in summaries.items()
    }


def demo_lines(summaries: dict) -> list[str]:
    """The figures of every variant for a terminal: where the replay graphs captured, what they added, the check,
    the read/write obligation and the pairings on vLLM's path."""
    from kit.analysis.readwrite import OBLIGATION
    from kit.analysis.tables import format_bytes
    from kit.experiments.vllm_safety import short_obligation

    lines = []
    for name, s in summaries.items():
        where = "the model graphs' stream" if s["replay_on_model_stream"] else "a stream of their own"
        made = "made by graph_capture()" if s["replay_streams_from_graph_capture"] else "NOT made by graph_capture()"
        check = "bit-exact" if s["bit_exact"] else f"DIFFERS, largest difference {s['max_abs_diff']:.4g}"
        about = VARIANTS[name].description if name in VARIANTS else s.get("policy")
        lines += [
            f"{name} ({about}): {s['source']}",
            f"  vLLM path: {s['path']}; replay graphs captured on {where} ({made})",
            f"  graph-pool bytes the replay captures added: {format_bytes(s['replay_added_bytes'])}",
            f"  global graph pool: {format_bytes(s['graph_pool_bytes'])} in {s['graph_pool_segments']} segments",
            f"  graphs vs eager: {check}",
            "  read/write obligation: "
            + (s.get("readwrite_error") or short_obligation(s.get("readwrite"), s.get("readwrite_holds"))),
            f"  pairings: {s.get('pairings_verdict') or s.get('pairings_error') or 'not in this recording'}",
        ]
    if "unpatched" in summaries and "patched" in summaries:
        saved = summaries["unpatched"]["graph_pool_bytes"] - summaries["patched"]["graph_pool_bytes"]
        lines.append(f"graph pool saved by the patch on vLLM's own code: {format_bytes(saved)} ({saved} bytes)")
    if any(s.get("readwrite") is not None for s in summaries.values()):
        lines.append(f"the obligation: {OBLIGATION}")
    return lines


def demo(*, live: bool = False, as_json: bool = False, vllm: bool = True) -> None:
    """`python -m kit demo --vllm [--json]`: the shipped recordings' figures."""
    if not vllm:
        raise KitError("--json goes with --vllm (the replica's demo prints text)")
    if live:
        raise KitError("vLLM's capture runs on a GPU machine from the bundle: bash scripts/vllm_on_device.sh OUT")
    runs = load_recordings()
    summaries = {name: summarize(snap) for name, snap in runs.items()}
    if as_json:
        provenance_by_name = {name: snap.kit["provenance"] for name, snap in runs.items()}
        print(json.dumps(demo_json(summaries, provenance_by_name), indent=1, default=str))
        return
    print("\n".join(demo_lines(summaries)))


# --- every variant, each in a fresh process ---------------------------------------------------


def record(out_dir: str | Path, names: tuple[str, ...] = tuple(VARIANTS)) -> dict:
    """Every variant in a fresh process into `out_dir`: `<variant>.pickle`, `PROVENANCE.json`; what each gave.

    A variant whose `GPUModelRunner.capture_model` path fails is run again on
    the `managers` path (the two managers' captures called as the runner
    calls them); what stopped the first is kept in its entry, and a variant
    that fails both ways is listed with both errors. Nothing raises for a
    failed variant: the lead gets every figure that could be had.
    """
    require_cuda()
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "PROVENANCE.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    results = {}
    for name in names:
        errors = []
        for path in PATHS:
            done = run_process([sys.executable, "-m", MODULE, "--variant", name, "--path", path, "--out", str(out)])
            if done.returncode == 0:
                break
            errors.append(failure(path, done))
        if done.returncode != 0:
            results[name] = {"failed": errors}
            manifest[f"{name}.pickle"] = {"failed": errors}
            write_manifest(manifest_path, manifest)  # after each variant: a run cut short keeps what it had
            continue
        # The summary is the last JSON line (vLLM logs to stdout too).
        summary = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
        pickle_path = out / f"{name}.pickle"
        raw = pickle.loads(pickle_path.read_bytes())
        data = pickle_path.read_bytes()
        manifest[pickle_path.name] = {
            **raw["kit"]["provenance"],
            "command": f"python -m kit.experiments.vllm_capture --out {out.name}",
            "variant": raw["kit"]["variant"],
            "figures": summary,
            "earlier_path_failed": errors,
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
        }
        results[name] = summary
        write_manifest(manifest_path, manifest)
    return results


def write_manifest(path: Path, manifest: dict) -> None:
    with atomic_write(path) as f:
        f.write(json.dumps(manifest, indent=1, default=str) + "\n")


def run_process(argv: list[str], timeout_s: float = VARIANT_TIMEOUT_S) -> subprocess.CompletedProcess:
    """A variant's process; one that runs past `timeout_s` is killed and answers as failed, with what it had said."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        said = [x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr)]
        note = f"\nkit: error: killed after {timeout_s:.0f} s (the variant's time limit)"
        return subprocess.CompletedProcess(argv, -9, said[0], said[1] + note)


def failure(path: str, done: subprocess.CompletedProcess) -> dict:
    """What stopped a variant's process: the step it had reached, the error's line, and the output's last lines."""
    lines = (done.stderr or done.stdout or "").strip().splitlines()
    stages = [line[len(STAGE_MARK) :] for line in lines if line.startswith(STAGE_MARK)]
    errors = [
        line
        for line in lines
        if line
        and not line.startswith((" ", STAGE_MARK))
        and ("Error" in line or "Exception" in line or line.startswith("kit: error"))
    ]
    return {
        "path": path,
        "stage": stages[-1] if stages else "starting the process",
        "error": errors[-1] if errors else f"exit status {done.returncode}",
        "returncode": done.returncode,
        "stderr": [line for line in lines if not line.startswith(STAGE_MARK)][-40:],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="vLLM 0.33's own capture path on this GPU, unpatched and under PR 63155."
    )
    parser.add_argument("--out", help="folder for the snapshots and PROVENANCE.json")
    parser.add_argument("--variant", choices=sorted(VARIANTS), help="run only this one, in this process")
    parser.add_argument("--path", choices=PATHS, default="runner")
    parser.add_argument("--probe", action="store_true", help="import each capture module and say what stopped it")
    parser.add_argument("--probe-modules", help=argparse.SUPPRESS)  # one process of --probe: these, in order
    args = parser.parse_args(argv)
    try:
        set_vllm_env()
        if args.probe_modules:
            results = probe(tuple(args.probe_modules.split(",")))
            if results:  # what this process had stood in, once it stopped
                results[-1]["stubs_in_this_process"] = [stub["module"] for stub in stubs_in_use()]
            print(PROBE_MARK + json.dumps(results, default=str))
            return 0 if all(r["ok"] for r in results) else 1
        if args.probe:
            results = probe_all()
            for r in results:
                print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['module']}" + ("" if r["ok"] else f": {r['error']}"))
                if r.get("stood_in"):
                    print(f"     {json.dumps(r['stood_in'], default=str)}")
            ok = all(r["ok"] for r in results)
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                payload = {"modules": results, **provenance("--probe")}
                with atomic_write(Path(args.out) / "probe.json") as f:
                    f.write(json.dumps(payload, indent=1, default=str) + "\n")
            return 0 if ok else 1
        if not args.out:
            raise KitError("--out DIR is required")
        if args.variant:
            raw = run_variant(args.variant, args.path)
            with atomic_write(Path(args.out) / f"{args.variant}.pickle", "wb") as f:
                pickle.dump(raw, f)
            print(json.dumps(summarize(raw)))
            return 0
        results = record(args.out)
        print(json.dumps(results, indent=1, default=str))
        return 0 if all("failed" not in r for r in results.values()) else 1
    except KitError as e:
        print(f"kit: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Importing vLLM 0.33's capture path here, and standing in the compiled parts it lacks.

`kit.experiments.vllm.capture` runs vLLM's own capture code; this is how that
code gets imported on a machine that has vLLM's Python sources but not all of
its compiled extensions or optional packages (the kit's GPU machine, from the
bundle `scripts/vllm_bundle.py` builds):

- the stub packages of `kit/experiments/vllm/stubs/` (shipped with the kit as
  package data) for packages the imports touch but the capture path never
  calls, and `stub_missing_extensions` for the wheel's compiled extensions;
- `stand_in_compiled`: vLLM's platform resolved, then the CUTLASS capability
  queries, Triton's `Config` and `vllm._C`'s `weak_ref_tensor` op stood in
  where missing;
- `import_vllm`: the capture modules (`CAPTURE_MODULES`) imported with those
  in place; `probe` and `probe_all` say which module stopped an import;
- `vllm_source` and `stubs_in_use`: which vLLM and which stand-ins a
  recording was made with (its provenance).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

MODULE = "kit.experiments.vllm.capture"  # the entry point a probe's fresh process runs
STUBS = Path(__file__).resolve().parent / "stubs"
STAND_IN_STEP = "kit: vLLM's platform, and stand-ins for its compiled parts"
PROBE_MARK = "KIT_PROBE "
PROBE_BUDGET_S = 150.0

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
    from kit.experiments.recorded import run_fresh

    deadline, results, left = time.monotonic() + budget_s, [], list(modules)
    while left:
        if time.monotonic() > deadline:
            results += [{"module": name, "ok": False, "error": "not tried: the probe's time ran out"} for name in left]
            break
        argv = [sys.executable, "-m", MODULE, "--probe-modules", ",".join(left)]
        done = run_fresh(argv, timeout_s=max(deadline - time.monotonic(), 1) + 60)
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
    """`_vllm_stub`: from the import path where the stubs are on it, else from the kit's packaged copy (`STUBS`)."""
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

"""A vLLM general plugin: every worker's graph capture recorded, PR 63155 applied, with no edit to vLLM.

vLLM 0.33 calls every entry point of the group `vllm.general_plugins` in each
process it starts (the API front end, the engine core, every worker:
`vllm.plugins.load_general_plugins`, filtered by `VLLM_PLUGINS`), and may call
one more than once in a process. The kit's entry point is `register`
(pyproject.toml: `kit = "kit.vllm_plugin:register"`), so installing the kit
into vLLM's environment is all it takes. It does nothing unless asked:

- `KIT_CAPTURE_DIR_VARIABLE=DIR`: each worker records memory history from the first
  graph capture vLLM asks for (`profile_cudagraph_memory`, the estimate made
  before the KV cache is sized) to the end of `capture_model()`, with the
  kit's capture labels (`kit.CaptureRecorder`: model graphs, replay graphs,
  each `graph_capture()` stream), and writes `DIR/rank{R}.pickle` (R its rank
  in vLLM's world group) and `DIR/rank{R}.json`, the manifest `kit ranks DIR`
  reads: versions, model, parallel sizes and ranks, capture sizes, trim
  threshold, replay sizes, allocator settings, the estimate vLLM used and the
  graph pool reserved at the end of capture (`worker_manifest`).
- `KIT_VLLM_PATCH=pr` (or another of `kit.patch.policy.STREAM_POLICIES`):
  `kit.patch.vllm` is applied in every process that loads the GPU model
  runner, before any capture, and each rank logs a line saying so at its
  capture. A vLLM the kit does not recognise (another version, or code the
  patch cannot find) is refused with one log line, and vLLM runs unpatched.

`register` imports neither torch nor vLLM's worker code: it waits for vLLM to
import a GPU model runner module (`RUNNER_MODULES`; only processes that run a
model do) and patches then, through `kit.patch.install.Patch`. Whatever goes
wrong in the recording is logged and never raised into vLLM; an error in
vLLM's own capture stops the recording and propagates unchanged.

    pip install kit        # into vLLM's environment
    KIT_CAPTURE_DIR_VARIABLE=caps KIT_VLLM_PATCH=pr vllm serve MODEL ...
    python -m kit ranks caps
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import json
import logging
import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

CAPTURE_DIR_VARIABLE = "KIT_CAPTURE_DIR"
PATCH_VARIABLE = "KIT_VLLM_PATCH"
RUNNER_MODULES = ("vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.gpu_model_runner")  # V2, V1
MANIFEST_VERSION = 1
ALLOCATOR_SETTINGS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS")

logger = logging.getLogger("vllm.kit_plugin")  # under vLLM's logger: its handler and format

_state: dict[str, Any] = {"registered": False, "policy": None, "patch": None, "refused": None, "wrapped": set()}


def register() -> None:
    """vLLM's entry point: read the two variables, and wait for a GPU model runner to be imported."""
    if _state["registered"]:
        return
    folder, policy = os.environ.get(CAPTURE_DIR_VARIABLE, "").strip(), os.environ.get(PATCH_VARIABLE, "").strip()
    if not folder and not policy:
        return
    _state["registered"] = True
    if policy:
        from kit.patch.policy import STREAM_POLICIES

        if policy not in STREAM_POLICIES:
            _state["refused"] = f"{PATCH_VARIABLE}={policy} is not one of {', '.join(STREAM_POLICIES)}"
            logger.error("kit: %s; vLLM runs unpatched", _state["refused"])
            policy = ""
    _state["policy"] = policy or None
    if not folder and not policy:
        return
    for name in RUNNER_MODULES:
        after_import(name, functools.partial(_on_runner_imported, folder=folder or None))


def after_import(name: str, callback: Callable[[Any], None]) -> None:
    """Call `callback(module)` once module `name` is imported: now if it is, else right after its import runs."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))


class _AfterImport(importlib.abc.MetaPathFinder):
    """A finder that lets the usual finders find one module, then runs a callback after the module's code."""

    def __init__(self, name: str, callback: Callable[[Any], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once: the search below, and any later import, goes past it
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        # On the loader itself, not a wrapper: inspect.getsource (the PR patch reads vLLM's source) asks it.
        run, callback = spec.loader.exec_module, self.callback

        def exec_module(module: Any) -> None:
            run(module)
            callback(module)

        spec.loader.exec_module = exec_module
        return spec


def _on_runner_imported(module: Any, folder: str | None) -> None:
    """Apply the PR (once per process) and wrap this runner's capture calls; log, never raise."""
    try:
        if _state["policy"] and _state["patch"] is None and _state["refused"] is None:
            _apply_pr(_state["policy"])
        if folder is not None:
            _wrap_runner(module.GPUModelRunner, Path(folder))
    except Exception as exc:  # a plugin must not stop vLLM from starting
        logger.error("kit: could not hook %s (%s); vLLM runs as installed", module.__name__, exc)


def _apply_pr(policy: str) -> None:
    import vllm

    from kit.errors import KitError
    from kit.patch import vllm as vllm_patch

    if vllm.__version__ != vllm_patch.SUPPORTED_VERSION:
        _state["refused"] = f"vLLM {vllm.__version__} is not the release the kit knows ({vllm_patch.SUPPORTED_VERSION})"
    else:
        try:
            _state["patch"] = vllm_patch.apply(policy=policy)
        except KitError as exc:
            _state["refused"] = str(exc)
    if _state["refused"]:
        logger.error("kit: PR 63155 not applied: %s; vLLM runs unpatched", _state["refused"])


def _wrap_runner(cls: type, folder: Path) -> None:
    """Wrap `cls.profile_cudagraph_memory` and `cls.capture_model` (as installed now, patched or not) to record."""
    from kit.patch.install import Patch

    if cls in _state["wrapped"]:
        return
    profile, capture = cls.profile_cudagraph_memory, cls.capture_model

    @functools.wraps(profile)
    def profile_cudagraph_memory(self, *args, **kwargs):
        recording = _recording(self, folder)
        recording.begin()
        recording.profiling = True
        try:
            estimate = profile(self, *args, **kwargs)
        except BaseException:
            recording.abandon()
            raise
        finally:
            recording.profiling = False
        recording.estimate = estimate
        return estimate

    @functools.wraps(capture)
    def capture_model(self, *args, **kwargs):
        recording = _recording(self, folder)
        if recording.profiling or kwargs.get("profile_only"):
            return capture(self, *args, **kwargs)
        recording.begin(real=True)
        try:
            took = capture(self, *args, **kwargs)
        except BaseException:
            recording.abandon()
            raise
        recording.finish(self, took)
        return took

    Patch(
        "kit plugin",
        [(cls, "profile_cudagraph_memory", profile_cudagraph_memory), (cls, "capture_model", capture_model)],
    ).apply()
    _state["wrapped"].add(cls)


def _recording(runner: Any, folder: Path) -> _Recording:
    found = runner.__dict__.get("_kit_recording")
    if found is None:
        found = runner.__dict__["_kit_recording"] = _Recording(folder)
    return found


class _Recording:
    """One worker's recording: from its first capture (the estimate's) to the end of its real `capture_model()`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.recorder = None
        self.profiling = False
        self.estimate: int | None = None
        self.real_from = 0  # the first capture record of the real capture_model()
        self.done = False

    def begin(self, real: bool = False) -> None:
        if self.done:
            return
        try:
            if self.recorder is None:
                from kit.record.recorder import CaptureRecorder

                self.recorder = CaptureRecorder().start()
            if real:
                self.real_from = len(self.recorder.records)
        except Exception as exc:
            self._give_up(f"could not start recording ({exc})")

    def abandon(self) -> None:
        if self.recorder is not None and self.recorder.recording:
            try:
                self.recorder.stop()
            except Exception as exc:  # the capture's own error is the one to see
                logger.warning("kit: stopping the recorder after a failed capture: %s", exc)
        self.done = True

    def finish(self, runner: Any, took: Any) -> None:
        if self.done or self.recorder is None:
            return
        self.done = True
        rank = "?"
        try:
            snapshot = self.recorder.stop()
            manifest = worker_manifest(runner, snapshot, self, took)
            rank = manifest["rank"]
            name_phases(snapshot.raw["kit"], self.recorder.records, self.real_from)
            write_rank(self.folder, manifest, snapshot.raw)
            line = "kit: rank %s recorded %d captures into %s (graph pool %.2f GiB; vLLM's estimate %s)"
            estimate = "not made" if self.estimate is None else f"{self.estimate / (1 << 30):.2f} GiB"
            logger.info(
                line,
                rank,
                len(self.recorder.records),
                self.folder,
                manifest["graph_pool_reserved"] / (1 << 30),
                estimate,
            )
        except Exception as exc:
            logger.error("kit: rank %s: the capture was not written (%s: %s)", rank, type(exc).__name__, exc)

    def _give_up(self, why: str) -> None:
        self.done = True
        logger.error("kit: %s; vLLM goes on without the recording", why)


ESTIMATE_PREFIX = "estimate's "


def name_phases(kit: dict, records: list, real_from: int) -> None:
    """Name streams and pools in `kit` after the real capture's records, the estimate's with `ESTIMATE_PREFIX`.

    The recorder names a stream after the first manager it saw there, which in
    a worker is the estimate's throwaway capture; `kit ranks` and the tables
    should show the real capture's "decoder replay graphs stream" and "global
    graph pool", the ones that stay.
    """
    from kit.record.recorder import pool_names, stream_names

    estimate, real = records[:real_from], records[real_from:]
    for key, names in (("streams", stream_names), ("pools", pool_names)):
        named = names(real)
        taken = list(named.values())  # stream ids, or pools as lists
        named |= {ESTIMATE_PREFIX + name: value for name, value in names(estimate).items() if value not in taken}
        kit[key] = named


def worker_manifest(runner: Any, snapshot: Any, recording: _Recording, took: Any) -> dict:
    """What `kit ranks` needs beside a rank's snapshot, read off the runner and the recording."""
    import torch
    import vllm

    from kit.analysis.tables import segment_table
    from kit.record.provenance import machine, utc_now

    config = getattr(runner, "vllm_config", None)
    parallel = getattr(config, "parallel_config", None)
    real = recording.recorder.records[recording.real_from :]
    pools = sorted({tuple(r.pool) for r in real if r.pool is not None})
    table = segment_table(snapshot)
    reserved = int(table.loc[[tuple(p) in pools for p in table["pool"]], "reserved"].sum()) if len(table) else 0
    ranks = parallel_ranks()
    sizes = {
        key: int(getattr(parallel, attr, 1) or 1)
        for key, attr in (
            ("tp", "tensor_parallel_size"),
            ("pp", "pipeline_parallel_size"),
            ("pcp", "prefill_context_parallel_size"),
            ("dp", "data_parallel_size"),
        )
    }
    ranks["world_rank"] = ranks["rank"]
    ranks["rank"] = global_rank(ranks["rank"], ranks.pop("world_size", None), sizes, ranks.get("dp_rank", 0))
    patch = _state["patch"]
    if patch is not None:
        logger.info("kit: rank %s captured with PR 63155 applied (policy %s)", ranks["rank"], patch.policy)
    return {
        "kit_manifest": MANIFEST_VERSION,
        **ranks,
        "sizes": sizes,
        "vllm": vllm.__version__,
        **{k: v for k, v in machine().items() if k in ("gpu", "torch", "cuda")},
        "date": utc_now(),
        "pid": os.getpid(),
        "command": " ".join(sys.argv),
        "asked_by": {name: os.environ.get(name) for name in (CAPTURE_DIR_VARIABLE, PATCH_VARIABLE)},
        "model": _text(getattr(getattr(config, "model_config", None), "model", None)),
        "capture_sizes": _ints(getattr(getattr(config, "compilation_config", None), "cudagraph_capture_sizes", None)),
        "replay_sizes": _replay_sizes(runner),
        "trim_threshold": _attr_int(runner, "model_state", "decoder_replay_layers", "trim_threshold"),
        "allocator": {name: os.environ.get(name) for name in ALLOCATOR_SETTINGS},
        "expandable_segments": snapshot.expandable,
        "patch": {"asked": _state["policy"], "applied": patch is not None, "refused": _state["refused"]},
        "estimate": recording.estimate if isinstance(recording.estimate, int) else None,
        "estimate_applied": os.environ.get("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1") != "0",
        "capture_model_bytes": int(took) if isinstance(took, int) else None,
        "graph_pools": [list(p) for p in pools],
        "graph_pool_reserved": reserved,
        "captures": len(real),
        "profile_captures": recording.real_from,
        "kv_cache": _kv_cache(runner),
        "device": torch.cuda.current_device() if torch.cuda.is_available() else None,
    }


def parallel_ranks() -> dict[str, int]:
    """This worker's rank in vLLM's world group and in each parallel group (0 where a group is not set up)."""
    try:
        from vllm.distributed import parallel_state as ps
    except ImportError:
        return {"rank": 0}
    ranks = {}
    for key, getter in (("rank", "get_world_group"), ("tp_rank", "get_tp_group"), ("pp_rank", "get_pp_group"),
                        ("pcp_rank", "get_pcp_group"), ("dp_rank", "get_dp_group")):  # fmt: skip
        try:
            ranks[key] = int(getattr(ps, getter)().rank_in_group)
        except Exception:  # not initialised (one process without distributed), or no such group
            ranks[key] = 0
    try:
        ranks["world_size"] = int(ps.get_world_group().world_size)
    except Exception:
        pass
    return ranks


def global_rank(rank: int, world_size: int | None, sizes: dict[str, int], dp_rank: int) -> int:
    """The rank a worker's files are named by, unique across data-parallel replicas.

    vLLM's world group spans data parallelism (its rank is offset by the DP
    rank) except where it is launched externally or with elastic EP: there
    each replica's world holds only its own TP x PP x PCP ranks, and the
    same world rank would name one file in every replica. Then the rank is
    offset as vLLM offsets it, `dp_rank * (tp * pp * pcp) + rank`.
    """
    inner = sizes.get("tp", 1) * sizes.get("pp", 1) * sizes.get("pcp", 1)
    if sizes.get("dp", 1) > 1 and world_size == inner:
        return dp_rank * inner + rank
    return rank


def write_rank(folder: Path, manifest: dict, raw: dict) -> None:
    """`rank{R}.pickle` (the snapshot, the manifest in its `kit` key) and `rank{R}.json`, each written whole."""
    from kit.fileio import atomic_write
    from kit.record.provenance import sha256

    folder.mkdir(parents=True, exist_ok=True)
    meta = raw.setdefault("kit", {})
    meta["vllm_worker"] = manifest
    meta["provenance"] = {**(meta.get("provenance") or {}), "rank": manifest["rank"], "command": "kit.vllm_plugin"}
    data = pickle.dumps(raw, protocol=pickle.HIGHEST_PROTOCOL)
    name = f"rank{manifest['rank']}"
    with atomic_write(folder / f"{name}.pickle", "wb") as f:
        f.write(data)
    entry = {**manifest, "snapshot": f"{name}.pickle", "sha256": sha256(data)}
    with atomic_write(folder / f"{name}.json") as f:
        f.write(json.dumps(entry, indent=1, sort_keys=True) + "\n")


def _kv_cache(runner: Any) -> dict | None:
    """The KV cache's blocks and bytes per block, where the runner has one."""
    config = runner.__dict__.get("kv_cache_config")
    blocks = getattr(config, "num_blocks", 0)
    tensors = getattr(config, "kv_cache_tensors", None) or []
    total = sum(int(getattr(t, "size", 0)) for t in tensors)
    if not blocks or not total:
        return None
    return {"num_blocks": int(blocks), "bytes_per_block": total // int(blocks)}


def _replay_sizes(runner: Any) -> list[int] | None:
    manager = getattr(getattr(runner, "model_state", None), "replay_cudagraphs", None)
    return _ints(getattr(getattr(manager, "compilation_config", None), "cudagraph_capture_sizes", None))


def _attr_int(obj: Any, *names: str) -> int | None:
    for name in names:
        obj = getattr(obj, name, None)
    return int(obj) if isinstance(obj, int) else None


def _ints(values: Any) -> list[int] | None:
    return sorted(int(v) for v in values) if values else None


def _text(value: Any) -> str | None:
    return None if value is None else str(value)

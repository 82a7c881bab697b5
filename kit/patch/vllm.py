"""PR 63155 applied to an installed vLLM 0.33, in-process.

The PR changes a few lines in each of these functions, and this module makes
the same edits to the installed functions (see `kit.patch.source`), leaving
every other line as the installed vLLM has it:

- `vllm.distributed.parallel_state.graph_capture(device, stream=None)` reuses
  a given stream; it is installed in `parallel_state` and in every loaded
  module that imported it by name (`vllm.v1.worker.gpu.cudagraph_utils`, the
  V1 runner, the forward benchmarks);
- `CudaGraphManager.capture(..., stream=None)` captures on it and records the
  stream it used in `capture_stream`;
- `GPUModelRunner.capture_model()` (the V2 runner) hands the model graphs'
  `capture_stream` to `model_state.capture_inner_cudagraphs(..., stream=None)`;
- `DeepseekV41ModelState` and `DeepseekV41SpecializedDecodeModelState` pass it
  on to `DecoderReplayCudaGraphManager.capture_replay_graphs(prepare,
  stream=None)`, unless aux hidden states are made before the replay layers
  (an aux layer id below the model's `decoder_replay_start`): then the replay
  graphs keep a stream of their own, as the PR does.

Every other capture (the encoder, the speculators) still enters
`graph_capture()` without a stream, and so gets a new one.

vLLM 0.33 has no `has_early_aux()` (the PR adds it); `has_early_aux()` here
reads the aux layer ids and the replay start from the model. `policy` picks
that last decision: `pr` (the PR's rule), or, for experiments, `share` (the
model graphs' stream even with early aux) or `separate` (never shared).
Every decision is kept in `VllmPatch.decisions`.

    with kit.patch.vllm.apply() as patch:
        llm = LLM(model, ...)     # captures with the PR's change
    print(patch.diff())           # what it changed, as a unified diff

An installed vLLM whose functions differ from 0.33.0 (a function missing, a
signature changed, a line the PR edits not there, or the PR already merged)
is refused with a one-line `KitError`, and nothing is patched.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kit.errors import KitError
from kit.patch.install import Patch, interrupts_deferred, qualified_name
from kit.patch.source import Hunk, Rewrite, rewrite

SUPPORTED_VERSION = "0.33.0"
POLICIES = ("pr", "share", "separate")

_PARALLEL_STATE = "vllm.distributed.parallel_state"
_CUDAGRAPH_UTILS = "vllm.v1.worker.gpu.cudagraph_utils"
_MODEL_STATE = "vllm.v1.worker.gpu.model_states.interface"
_DSV41_STATE = "vllm.models.deepseek_v41.nvidia.model_state"
_DSV41_DECODE_STATE = "vllm.models.deepseek_v41.nvidia.specialized_decode.runtime.model_state"
_REPLAY_MANAGER = "vllm.models.deepseek_v41.nvidia.decoder_replay_cudagraph"

_STREAM_ARG = "stream: torch.cuda.Stream | None = None,"
_INNER_PARAMS = ("self", "input_buffers", "block_tables", "attn_groups", "kv_cache_config")


@dataclass(frozen=True)
class Target:
    """One function the PR changes: where it is defined, its 0.33.0 parameters, the edits and what they do."""

    module: str
    qualname: str
    params: tuple[str, ...]
    hunks: tuple[Hunk, ...]
    change: str

    @property
    def where(self) -> str:
        return f"{self.module}.{self.qualname}"


TARGETS = (
    Target(
        _PARALLEL_STATE,
        "graph_capture",
        ("device",),
        (
            Hunk(
                "def graph_capture(device: torch.device):",
                "def graph_capture(device: torch.device, stream: torch.cuda.Stream | None = None):",
            ),
            Hunk(
                "context = GraphCaptureContext(torch.cuda.Stream(device=device))",
                """
                # Reuse the caller's stream: a capture on it can reuse the pool blocks it freed.
                context = GraphCaptureContext(stream if stream is not None else torch.cuda.Stream(device=device))
                """,
            ),
        ),
        "reuses `stream` when one is given, else makes a new one as before",
    ),
    Target(
        _CUDAGRAPH_UTILS,
        "CudaGraphManager.capture",
        ("self", "create_forward_fn", "progress_bar_desc"),
        (
            Hunk(
                'progress_bar_desc: str = "Capturing CUDA graphs",',
                f'progress_bar_desc: str = "Capturing CUDA graphs",\n{_STREAM_ARG}',
            ),
            Hunk(
                "progress_bar_desc: Description shown on the capture progress bar.",
                """
                progress_bar_desc: Description shown on the capture progress bar.
                stream: Capture on this stream instead of a new one.
                """,
            ),
            Hunk(
                "with graph_capture(device=self.device), ExitStack() as stack:",
                """
                with graph_capture(device=self.device, stream=stream) as context, ExitStack() as stack:
                    self.capture_stream = context.stream
                """,
            ),
        ),
        "captures on `stream` when one is given and records the stream it used in `capture_stream`",
    ),
    Target(
        "vllm.v1.worker.gpu.model_runner",
        "GPUModelRunner.capture_model",
        ("self", "profile_only"),
        (
            Hunk(
                """
                self.model_state.capture_inner_cudagraphs(
                    input_buffers,
                    self.block_tables,
                    self.attn_groups,
                    self.kv_cache_config,
                )
                """,
                """
                self.model_state.capture_inner_cudagraphs(
                    input_buffers,
                    self.block_tables,
                    self.attn_groups,
                    self.kv_cache_config,
                    stream=self.cudagraph_manager.capture_stream,
                )
                """,
            ),
        ),
        "hands the model graphs' `capture_stream` to `capture_inner_cudagraphs()`; the speculator keeps its own",
    ),
    Target(
        _MODEL_STATE,
        "ModelState.capture_inner_cudagraphs",
        _INNER_PARAMS,
        (Hunk("kv_cache_config: KVCacheConfig,", f"kv_cache_config: KVCacheConfig,\n{_STREAM_ARG}"),),
        "takes the model graphs' `stream` (unused by the base class)",
    ),
    Target(
        _DSV41_STATE,
        "DeepseekV41ModelState.capture_inner_cudagraphs",
        _INNER_PARAMS,
        (
            Hunk("kv_cache_config: KVCacheConfig,", f"kv_cache_config: KVCacheConfig,\n{_STREAM_ARG}"),
            Hunk(
                "self.replay_cudagraphs.capture_replay_graphs(prepare)",
                """
                # Not with aux hidden states made before the replay layers: the
                # forward holds them across the break, in the pool.
                self.replay_cudagraphs.capture_replay_graphs(prepare, stream=replay_stream(self, stream))
                """,
            ),
        ),
        "passes `stream` to the replay graphs, unless aux hidden states are made before the replay layers",
    ),
    Target(
        _DSV41_DECODE_STATE,
        "DeepseekV41SpecializedDecodeModelState.capture_inner_cudagraphs",
        _INNER_PARAMS,
        (
            Hunk("kv_cache_config: KVCacheConfig,", f"kv_cache_config: KVCacheConfig,\n{_STREAM_ARG}"),
            Hunk(
                """
                super().capture_inner_cudagraphs(
                    input_buffers, block_tables, attn_groups, kv_cache_config
                )
                """,
                """
                super().capture_inner_cudagraphs(
                    input_buffers, block_tables, attn_groups, kv_cache_config, stream=stream
                )
                """,
            ),
        ),
        "forwards `stream` to DeepseekV41ModelState's",
    ),
    Target(
        _REPLAY_MANAGER,
        "DecoderReplayCudaGraphManager.capture_replay_graphs",
        ("self", "prepare"),
        (
            Hunk(
                "self, prepare: Callable[[BatchExecutionDescriptor], None]",
                f"self,\nprepare: Callable[[BatchExecutionDescriptor], None],\n{_STREAM_ARG}",
            ),
            Hunk(
                'self.capture(create_forward_fn, "Capturing decoder replay CUDA graphs")',
                'self.capture(create_forward_fn, "Capturing decoder replay CUDA graphs", stream=stream)',
            ),
        ),
        "captures the replay graphs on `stream` when one is given",
    ),
)


@dataclass(frozen=True)
class ReplayDecision:
    """Which stream one model state gave its replay graphs, and why."""

    model_state: str
    early_aux: bool | None  # None: the aux layer ids or the replay start could not be read
    shared: bool
    reason: str


def has_early_aux(model_state: Any) -> bool | None:
    """Whether the model makes aux hidden states before its replay layers; None if it cannot tell.

    The aux layer ids and `decoder_replay_start` live on the backbone that owns
    the state's `decoder_replay_layers` (`model.model` for DeepSeek-V4.1).
    """
    layers = getattr(model_state, "decoder_replay_layers", None)
    candidate, seen = getattr(model_state, "model", None), set()
    while candidate is not None and id(candidate) not in seen:
        seen.add(id(candidate))
        start = getattr(candidate, "decoder_replay_start", None)
        aux = getattr(candidate, "aux_hidden_state_layers", None)
        if isinstance(start, int) and aux is not None and getattr(candidate, "decoder_replay_layers", None) is layers:
            return any(layer_id < start for layer_id in aux)
        candidate = getattr(candidate, "model", None)
    return None


class VllmPatch:
    """PR 63155 applied to the installed vLLM; `revert()` (or leaving the `with` block) takes it back."""

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.rewrites: list[Rewrite] = []  # one per entry of TARGETS
        self.installed: dict[str, list[str]] = {}  # target -> the modules or classes it was installed in
        self.decisions: list[ReplayDecision] = []
        self._patch = Patch("PR 63155 on vLLM", [])

    @property
    def applied(self) -> bool:
        return self._patch.applied

    def revert(self) -> None:
        """Put back every original object, also in modules imported while the patch was on."""
        global _applied
        with _lock, interrupts_deferred():
            self._patch.revert()
            if self.rewrites:
                graph_capture = self.rewrites[0]
                for module in _modules_holding(graph_capture.function):
                    module.graph_capture = graph_capture.original
            if _applied is self:
                _applied = None

    def targets(self) -> list[str]:
        """Every attribute the patch replaced or added, as `module.qualname.attr`."""
        return self._patch.targets()

    def table(self) -> pd.DataFrame:
        """One row per function the PR changes: where it is defined, where it was installed, what changes."""
        return pd.DataFrame(
            {
                "function": target.where,
                "defined in": _defined_in(rw.original),
                "installed in": ", ".join(self.installed.get(target.where, [])),
                "change": target.change,
            }
            for target, rw in zip(TARGETS, self.rewrites, strict=True)
        )

    def diff(self) -> str:
        """The PR's change to each installed function, as one unified diff."""
        return "\n".join(rw.diff() for rw in self.rewrites)

    def _replay_stream(self, model_state: Any, stream: Any) -> Any:
        """The stream a model state hands its replay graphs under this patch's policy."""
        early = has_early_aux(model_state)
        if self.policy == "share":
            chosen, reason = stream, "policy share: the model graphs' stream, early aux or not"
        elif self.policy == "separate":
            chosen, reason = None, "policy separate: a stream of their own"
        elif early is None:
            chosen, reason = None, "aux layer ids or replay start not found: a stream of their own, to be safe"
        elif early:
            chosen, reason = None, "aux hidden states before the replay layers: a stream of their own"
        else:
            chosen, reason = stream, "no aux hidden state before the replay layers: the model graphs' stream"
        shared = chosen is not None and stream is not None
        self.decisions.append(ReplayDecision(type(model_state).__qualname__, early, shared, reason))
        return chosen

    def __enter__(self) -> VllmPatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.revert()

    def __repr__(self) -> str:
        state = "applied" if self.applied else "reverted"
        return f"<VllmPatch PR 63155 on vLLM {_version()} ({self.policy}): {state}>"


_lock = threading.RLock()
_applied: VllmPatch | None = None


def _version() -> str:
    return getattr(sys.modules.get("vllm"), "__version__", "?")


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise KitError(f"unsupported vLLM {_version()}: cannot import {name} ({exc}); nothing was patched") from None


def _resolve(target: Target) -> tuple[type | Any, Any]:
    """The target's owner (class or module) and its function, or a one-line refusal."""
    owner: Any = _import(target.module)
    *classes, name = target.qualname.split(".")
    for cls in classes:
        owner = getattr(owner, cls, None)
        if owner is None:
            raise KitError(f"unsupported vLLM {_version()}: {target.module}.{cls} is missing; nothing was patched")
    function = vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if function is None:
        raise KitError(f"unsupported vLLM {_version()}: {target.where} is missing; nothing was patched")
    params = tuple(inspect.signature(function).parameters)
    if "stream" in params:
        raise KitError(
            f"vLLM {_version()} already has PR 63155's change ({target.where} takes a stream); nothing to patch"
        )
    if params != target.params:
        raise KitError(
            f"unsupported vLLM {_version()}: {target.where}{_args(params)} differs from "
            f"0.33.0's {target.qualname}{_args(target.params)}; nothing was patched"
        )
    return owner, function


def _defined_in(function: Any) -> str:
    """`vllm/path/to/module.py:line` of a function's definition."""
    code = inspect.unwrap(function).__code__
    root = Path(sys.modules["vllm"].__file__).parent.parent
    path = Path(code.co_filename)
    return f"{path.relative_to(root) if path.is_relative_to(root) else path}:{code.co_firstlineno}"


def _modules_holding(obj: Any) -> list[Any]:
    """Every loaded module with `obj` as its `graph_capture` (those that imported it by name)."""
    return [m for m in list(sys.modules.values()) if getattr(m, "__dict__", {}).get("graph_capture") is obj]


def _args(params: tuple[str, ...]) -> str:
    return f"({', '.join(params)})"


def _check_other_model_states(owners: list[Any]) -> None:
    """Refuse when a loaded model state overrides `capture_inner_cudagraphs` without taking a stream."""
    base = owners[[t.qualname for t in TARGETS].index("ModelState.capture_inner_cudagraphs")]
    pending, seen = list(base.__subclasses__()), set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        pending.extend(cls.__subclasses__())
        method = vars(cls).get("capture_inner_cudagraphs")
        if method is None or cls in owners:
            continue
        params = inspect.signature(method).parameters
        if "stream" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            raise KitError(
                f"unsupported model state: {cls.__module__}.{cls.__qualname__}.capture_inner_cudagraphs "
                "takes no stream, and the patched runner would pass one; nothing was patched"
            )


def rewrites(handle: VllmPatch | None = None) -> tuple[list[Rewrite], list[Any]]:
    """The PR's version of every target, compiled but not installed, and the targets' owners."""
    _import("vllm")
    found = [_resolve(target) for target in TARGETS]
    replay_stream = handle._replay_stream if handle is not None else _unbound_replay_stream
    done = []
    for target, (owner, function) in zip(TARGETS, found, strict=True):
        names = {"replay_stream": replay_stream} if "replay_stream(" in str(target.hunks) else None
        cls = owner if isinstance(owner, type) else None
        done.append(rewrite(function, target.hunks, where=target.where, owner=cls, names=names))
    return done, [owner for owner, _ in found]


def _unbound_replay_stream(model_state: Any, stream: Any) -> Any:
    raise KitError("this is a dry-run rewrite of vLLM (kit.patch.vllm.rewrites); apply() installs a usable one")


def diff() -> str:
    """What `apply()` would change in the installed vLLM, as a unified diff; installs nothing."""
    return "\n".join(rw.diff() for rw in rewrites()[0])


def apply(policy: str = "pr") -> VllmPatch:
    """Apply PR 63155 to the installed vLLM; applying again returns the patch already applied."""
    global _applied
    if policy not in POLICIES:
        raise KitError(f"unknown policy {policy!r}: choose one of {', '.join(POLICIES)}")
    with _lock:
        if _applied is not None:
            _applied.policy = policy
            return _applied
        handle = VllmPatch(policy)
        done, owners = rewrites(handle)
        _check_other_model_states(owners)
        replacements = []
        for target, rw, owner in zip(TARGETS, done, owners, strict=True):
            places = [owner]
            if target.qualname == "graph_capture":
                places += [m for m in _modules_holding(rw.original) if m is not owner]
            replacements += [(place, target.qualname.rsplit(".", 1)[-1], rw.function) for place in places]
            handle.installed[target.where] = [qualified_name(place) for place in places]
        manager = owners[1]
        handle.rewrites = done
        handle._patch = Patch("PR 63155 on vLLM", replacements, additions=[(manager, "capture_stream", None)])
        _applied = handle  # before applying: an interrupted apply is still found, and reverted, by revert()
        try:
            handle._patch.apply()
        except BaseException:
            _applied = None
            raise
        return handle


def revert() -> None:
    """Take back the applied patch, if any."""
    with _lock:
        if _applied is not None:
            _applied.revert()


def is_applied() -> bool:
    return _applied is not None and _applied.applied


_blocks = {"open": 0, "applied_before": False}  # `patched()` blocks open now, in any thread


@contextlib.contextmanager
def patched(policy: str = "pr") -> Iterator[VllmPatch]:
    """The patch applied for the block, reverted after it whatever happens inside (unless it was on before).

    Blocks may overlap, in one thread or several (vLLM's microbatch threads):
    the patch stays on until the last open block ends.
    """
    with _lock, interrupts_deferred():
        if _blocks["open"] == 0:
            _blocks["applied_before"] = is_applied()
        handle = apply(policy)
        _blocks["open"] += 1
    try:
        yield handle
    finally:
        with _lock, interrupts_deferred():
            _blocks["open"] -= 1
            if _blocks["open"] == 0 and not _blocks["applied_before"]:
                handle.revert()

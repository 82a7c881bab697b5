"""PR 63155 applied to the kit's replica, in-process.

The replacements are the PR's versions of the functions it changes:

- `graph_capture(device, stream=None)` reuses a given stream (in
  `parallel_state` and in `cudagraph_utils`, which imported it by name);
- `CudaGraphManager.capture(..., stream=None)` captures on it and records the
  stream it used in `capture_stream`;
- `GPUModelRunner.capture_model()` hands the model graphs' `capture_stream` to
  `model_state.capture_inner_cudagraphs()`;
- `DeepseekV41ModelState.capture_inner_cudagraphs(stream=None)` passes it on to
  `capture_replay_graphs(prepare, stream=None)`, unless `has_early_aux()`.

`policy` picks the last decision: `pr` (the PR's rule), or, for experiments,
`share` (always the model graphs' stream, early aux or not) or `separate`
(always a stream of their own).

    with kit.patch.replica.patched(policy="pr"):
        runner.capture_model()
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch

from kit.errors import KitError
from kit.patch.install import Patch, interrupts_deferred
from kit.replica import cudagraph_utils, decoder_replay, model, model_runner, parallel_state
from kit.replica.parallel_state import GraphCaptureContext, _on_stream

POLICIES = ("pr", "share", "separate")
_state = {"policy": "pr", "patch": None, "blocks": 0}  # blocks: `patched()` blocks open now, in any thread
_lock = threading.RLock()


@contextlib.contextmanager
def graph_capture(device: torch.device, stream: torch.cuda.Stream | None = None) -> Iterator[GraphCaptureContext]:
    """Make the capture stream current; reuse `stream` when one is given."""
    context = GraphCaptureContext(stream if stream is not None else torch.cuda.Stream(device=device))
    with _on_stream(context.stream):
        yield context


def capture(
    self: cudagraph_utils.CudaGraphManager,
    create_forward_fn: cudagraph_utils.CreateForwardFn,
    stream: torch.cuda.Stream | None = None,
) -> None:
    """Capture every size on `stream`, or a new one; record it in `capture_stream`."""
    with cudagraph_utils.graph_capture(device=self.device, stream=stream) as context:
        self.capture_stream = context.stream
        self._capture_sizes(create_forward_fn)


def capture_model(self: model_runner.GPUModelRunner) -> None:
    if self.device.type != "cuda":
        raise KitError("capture_model() needs CUDA")
    with torch.inference_mode():
        self.cudagraph_manager.capture(self._create_forward_fn)
        self.model_state.capture_inner_cudagraphs(stream=self.cudagraph_manager.capture_stream)


def replay_stream(policy: str, has_early_aux: bool, stream: torch.cuda.Stream | None):
    """The stream the replay graphs capture on under `policy` (None: a new one)."""
    if policy == "share" or (policy == "pr" and not has_early_aux):
        return stream
    return None


def capture_inner_cudagraphs(self: model.DeepseekV41ModelState, stream: torch.cuda.Stream | None = None) -> None:
    if self.replay_cudagraphs is not None:
        shared = replay_stream(_state["policy"], self.replay_layers.has_early_aux(), stream)
        self.replay_cudagraphs.capture_replay_graphs(self._prepare_capture, stream=shared)


def capture_replay_graphs(
    self: decoder_replay.DecoderReplayCudaGraphManager,
    prepare: Callable[[int], None],
    stream: torch.cuda.Stream | None = None,
) -> None:
    self.capture(self._create_forward_fn(prepare), stream=stream)
    self.layers.replay_batch = None


def _replacements() -> list:
    return [
        (parallel_state, "graph_capture", graph_capture),
        (cudagraph_utils, "graph_capture", graph_capture),
        (cudagraph_utils.CudaGraphManager, "capture", capture),
        (model_runner.GPUModelRunner, "capture_model", capture_model),
        (model.DeepseekV41ModelState, "capture_inner_cudagraphs", capture_inner_cudagraphs),
        (decoder_replay.DecoderReplayCudaGraphManager, "capture_replay_graphs", capture_replay_graphs),
    ]


def _check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise KitError(f"unknown stream policy {policy!r}: use one of {', '.join(POLICIES)}")


def apply(policy: str = "pr") -> Patch:
    """Apply the PR to the replica (once; a second call only sets the policy)."""
    _check_policy(policy)
    with _lock:
        patch = _state["patch"] or Patch("PR 63155 on the replica", _replacements())
        _state["patch"] = patch  # before applying: an interrupted apply is still found, and reverted, by revert()
        patch.apply()
        _state["policy"] = policy
        return patch


def revert() -> None:
    """Take the patch back, whatever `patched()` blocks are open."""
    with _lock:
        if _state["patch"] is not None:
            _state["patch"].revert()
        _state["policy"] = "pr"


def is_applied() -> bool:
    return _state["patch"] is not None and _state["patch"].applied


@contextlib.contextmanager
def patched(policy: str = "pr") -> Iterator[Patch]:
    """The PR applied for the block, and reverted after it, exception or not, unless it was applied before.

    Blocks may overlap, in one thread or several (vLLM's microbatch threads):
    the patch stays on until the last open block ends, if none of them applied
    it before the first began. The policy is process-wide: the innermost block
    sets it, and its end puts back the one before.
    """
    _check_policy(policy)
    with _lock, interrupts_deferred():
        first = _state["blocks"] == 0
        if first:
            _state["applied_before"] = is_applied()
        previous = _state["policy"]
        patch = apply(policy)
        _state["blocks"] += 1
    try:
        yield patch
    finally:
        with _lock, interrupts_deferred():
            _state["blocks"] -= 1
            _state["policy"] = previous
            if _state["blocks"] == 0 and not _state.get("applied_before"):
                revert()

"""Breakable PIECEWISE capture: graph segments separated by eager breaks.

vLLM's `vllm/compilation/breakable_cudagraph.py` in miniature. One capture
context drives the whole forward; a function decorated with
`eager_break_during_capture` ends the current graph segment, runs eagerly on
the capture stream (so what it allocates lands outside the graph pool), is
recorded for replay, and a new segment begins. Replay runs the recorded
segments and breaks in order.

Outputs are handed back as weak references (`weak_ref_tensors`), as vLLM does:
the allocator sees every capture's blocks as free once it ends, so the next,
smaller capture into the same pool reuses them. The graphs still write there
when replayed, which is what makes a shared stream a lifetime question. As in
vLLM 0.33, only top-level tensors are weak: tensors in a nested list or tuple
(V4.1's aux list) stay owned by the wrapper's stored output, their blocks
allocated for the life of the graph.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from kit.replica.forward_context import CUDAGraphMode, get_forward_context, is_forward_context_available

F = TypeVar("F", bound=Callable[..., Any])


def weak_ref_tensor(t: Any) -> Any:
    """A tensor viewing `t`'s memory without owning it (vLLM's C++ op, in Python)."""
    if not isinstance(t, torch.Tensor):
        return t
    assert t.is_contiguous(), "weak references are taken of contiguous outputs only"
    storage = torch._C._construct_storage_from_data_pointer(t.data_ptr(), t.device, t.numel() * t.element_size())
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, 0, t.shape, t.stride())


def weak_ref_tensors(x: Any) -> Any:
    """vLLM 0.33's `weak_ref_tensors` (`vllm/utils/torch_utils.py`): a tensor, or the tensors of a list or tuple.

    It does not recurse: a list or tuple inside the list or tuple passes through as it
    is, its tensors still owning their memory. V4.1 returns `(hidden_states, aux_list)`,
    so vLLM's wrapper keeps every aux tensor, and its graph-pool block, allocated.
    """
    if isinstance(x, list):
        return [weak_ref_tensor(v) for v in x]
    if isinstance(x, tuple):
        return tuple(weak_ref_tensor(v) for v in x)
    return weak_ref_tensor(x)


def eager_break_during_capture(fn: F) -> F:
    """Run `fn` as an eager break when called inside a breakable capture."""

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        capture = BreakableCUDAGraphCapture.current()
        if capture is None or not capture._capturing:
            return fn(*args)
        weak_args = weak_ref_tensors(args)
        return capture.add_eager(lambda: fn(*weak_args))

    return wrapper  # type: ignore[return-value]


class BreakableCUDAGraphCapture:
    """A capture whose forward may leave the graph at eager breaks; one per thread."""

    _tls = threading.local()

    @classmethod
    def current(cls) -> BreakableCUDAGraphCapture | None:
        return getattr(cls._tls, "active", None)

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.segments: list[Callable[[], Any]] = []
        self.num_graphs = 0
        self.num_eager_breaks = 0
        self._current_graph: torch.cuda.CUDAGraph | None = None
        self._capturing = False

    def __enter__(self) -> BreakableCUDAGraphCapture:
        if self.current() is not None:
            raise RuntimeError("Nested BreakableCUDAGraphCapture is not supported.")
        BreakableCUDAGraphCapture._tls.active = self
        try:
            self._begin_segment()
        except BaseException:
            self._end_segment()  # a capture begun before the exception ends; none is left open
            BreakableCUDAGraphCapture._tls.active = None
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._end_segment()
        finally:
            BreakableCUDAGraphCapture._tls.active = None

    def _begin_segment(self) -> None:
        graph = torch.cuda.CUDAGraph()
        self._current_graph = graph  # first: an exception right after capture_begin still finds it to end
        graph.capture_begin(pool=self.pool)
        self._capturing = True

    def _end_segment(self) -> None:
        graph, self._current_graph = self._current_graph, None
        if graph is None or not (self._capturing or torch.cuda.is_current_stream_capturing()):
            return  # no segment open (an eager break raised), or its capture never began
        self._capturing = False
        graph.capture_end()
        self.segments.append(graph.replay)
        self.num_graphs += 1

    def add_eager(self, fn: Callable[[], Any]) -> Any:
        """End the segment, run `fn` eagerly, record it for replay, begin the next segment."""
        self._end_segment()
        result = fn()
        self.segments.append(fn)
        self.num_eager_breaks += 1
        self._begin_segment()
        return result

    def replay(self) -> None:
        for segment in self.segments:
            segment()


class BreakableCUDAGraphWrapper:
    """Captures `runnable` once per batch size in PIECEWISE mode, then replays it.

    In mode NONE, or without a forward context, the runnable runs eagerly.
    """

    def __init__(self, runnable: Callable[..., Any], graph_pool: Any) -> None:
        self.runnable = runnable
        self.graph_pool = graph_pool
        self.captures: dict[int, BreakableCUDAGraphCapture] = {}
        self.outputs: dict[int, Any] = {}

    def __call__(self, *args: Any) -> Any:
        if not is_forward_context_available():
            return self.runnable(*args)
        context = get_forward_context()
        if context.cudagraph_runtime_mode == CUDAGraphMode.NONE:
            return self.runnable(*args)
        if context.num_tokens not in self.captures:
            return self._capture(context.num_tokens, args)
        self.captures[context.num_tokens].replay()
        return self.outputs[context.num_tokens]

    def _capture(self, num_tokens: int, args: tuple) -> Any:
        with BreakableCUDAGraphCapture(pool=self.graph_pool) as capture:
            # Weak inside the capture: the blocks are free for the next capture.
            output = weak_ref_tensors(self.runnable(*args))
        self.captures[num_tokens] = capture
        self.outputs[num_tokens] = output
        return output

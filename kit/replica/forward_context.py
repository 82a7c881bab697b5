"""The forward context: which batch size is running, and in which graph mode.

vLLM sets one around every forward (`vllm/forward_context.py`); the graph
wrappers and the replay layers read it to decide between eager execution,
capture and replay. The replica keeps only the two fields they read.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator
from dataclasses import dataclass


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1


@dataclass(frozen=True)
class ForwardContext:
    num_tokens: int
    cudagraph_runtime_mode: CUDAGraphMode = CUDAGraphMode.NONE


_forward_context: ForwardContext | None = None


def is_forward_context_available() -> bool:
    return _forward_context is not None


def get_forward_context() -> ForwardContext:
    assert _forward_context is not None, "no forward context is set"
    return _forward_context


@contextlib.contextmanager
def override_forward_context(context: ForwardContext) -> Iterator[None]:
    global _forward_context
    previous = _forward_context
    try:
        _forward_context = context
        yield
    finally:
        _forward_context = previous


def set_forward_context(num_tokens: int, mode: CUDAGraphMode = CUDAGraphMode.NONE):
    return override_forward_context(ForwardContext(num_tokens, mode))


def in_piecewise_cudagraph() -> bool:
    return is_forward_context_available() and _forward_context.cudagraph_runtime_mode == CUDAGraphMode.PIECEWISE

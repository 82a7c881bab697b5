"""`graph_capture()` as vLLM 0.33 has it: a new CUDA stream for every call.

This is the root cause PR 63155 addresses. Every `CudaGraphManager.capture()`
enters it, so each manager captures on a stream of its own, and the caching
allocator never hands one stream's free pool blocks to another stream.
(vLLM's version also enters the TP/PP/DP groups' capture contexts; one GPU
has none.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass
class GraphCaptureContext:
    stream: torch.cuda.Stream


@contextlib.contextmanager
def graph_capture(device: torch.device) -> Iterator[GraphCaptureContext]:
    """Make the capture stream current for the enclosed captures."""
    context = GraphCaptureContext(torch.cuda.Stream(device=device))
    with _on_stream(context.stream):
        yield context


@contextlib.contextmanager
def _on_stream(stream: torch.cuda.Stream) -> Iterator[None]:
    # Let work queued so far (weights, buffers) finish before capturing on it.
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield

"""`graph_capture()` as vLLM 0.33 has it: a new CUDA stream for every call.

This is the root cause PR 63155 addresses. Every `CudaGraphManager.capture()`
enters it, so each manager captures on a stream of its own, and the caching
allocator never hands one stream's free pool blocks to another stream.

The tensor-parallel group is torch.distributed's default group, one process
per GPU (`init_distributed_environment`); `tensor_model_parallel_all_reduce`
runs on the current stream, so inside a capture it is part of the graph.
Without it the replica is one GPU, as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class GraphCaptureContext:
    stream: torch.cuda.Stream


@contextlib.contextmanager
def graph_capture(device: torch.device):
    """Make the capture stream current for the enclosed captures; yields its `GraphCaptureContext`."""
    context = GraphCaptureContext(torch.cuda.Stream(device=device))
    with _on_stream(context.stream):
        yield context


@contextlib.contextmanager
def _on_stream(stream: torch.cuda.Stream) -> Iterator[None]:
    # Let work queued so far (weights, buffers) finish before capturing on it.
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield


def init_distributed_environment(world_size: int, rank: int, init_method: str, backend: str = "nccl") -> None:
    """Join the tensor-parallel group: every rank of the run, one process each."""
    dist.init_process_group(backend, init_method=init_method, world_size=world_size, rank=rank)


def get_tensor_model_parallel_world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def get_tensor_model_parallel_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def tensor_model_parallel_all_reduce(input_: torch.Tensor) -> torch.Tensor:
    """Sum `input_` over the tensor-parallel ranks, in place (nothing to do on one rank)."""
    if get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(input_)
    return input_

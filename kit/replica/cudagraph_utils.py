"""`CudaGraphManager`: one graph per capture size, largest first, in the global pool.

As in vLLM's `vllm/v1/worker/gpu/cudagraph_utils.py`, `capture()` enters
`graph_capture()` (so every manager gets a new stream) and, per size, builds
the forward with `create_forward_fn`, warms it up eagerly, then runs it in
PIECEWISE mode, which the model's `BreakableCUDAGraphWrapper` captures. All
managers share one graph pool, `get_global_graph_pool()`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from kit.replica.forward_context import CUDAGraphMode
from kit.replica.parallel_state import graph_capture

logger = logging.getLogger(__name__)

CreateForwardFn = Callable[[int, bool], Callable[[CUDAGraphMode], None]]
_global_graph_pool = None


def get_global_graph_pool():
    """The one graph pool every manager captures into (vLLM's platform-global pool).

    It lives as long as the process. Once every graph of a dropped runner is gone, torch keeps
    the pool with no users and fails an internal assert (`use_count > 0`) on the next capture
    into it; on the H200 that held even after `gc.collect()` and `torch.cuda.empty_cache()`.
    A second runner in one process needs a pool of its own (set `_global_graph_pool = None`).
    """
    global _global_graph_pool
    if _global_graph_pool is None:
        _global_graph_pool = torch.cuda.graph_pool_handle()
    return _global_graph_pool


class CudaGraphManager:
    def __init__(self, device: torch.device, capture_sizes: list[int], name: str) -> None:
        self.device = device
        self.name = name  # what the capture recorder calls this manager's captures
        self.capture_sizes = sorted(set(capture_sizes), reverse=True)
        self.pool = get_global_graph_pool() if torch.cuda.is_available() else None
        self.graphs_captured = False

    def dispatch(self, num_tokens: int) -> int | None:
        """The captured size a batch of `num_tokens` runs in: the smallest that fits; None (eager) above them all."""
        if not self.graphs_captured:
            return None
        return min((s for s in self.capture_sizes if s >= num_tokens), default=None)

    def capture(
        self,
        create_forward_fn: CreateForwardFn,
        progress_bar_desc: str = "Capturing CUDA graphs",
    ) -> None:
        """Capture every size, each after an eager warm-up; `progress_bar_desc` is logged at debug level."""
        with graph_capture(device=self.device):
            logger.debug("%s: sizes %s", progress_bar_desc, self.capture_sizes)
            # Largest first: smaller graphs then fit in the blocks the larger ones freed.
            for num_tokens in self.capture_sizes:
                create_forward_fn(num_tokens, True)(CUDAGraphMode.NONE)  # warm-up
                create_forward_fn(num_tokens, False)(CUDAGraphMode.PIECEWISE)
        self.graphs_captured = True

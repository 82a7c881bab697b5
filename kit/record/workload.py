"""Running a workload on the real GPU allocator, in this process: a recording made on the GPU.

The counterpart of `kit.allocator.simulator`: the same version-1 workload, executed with
`torch.empty` on named streams and raw `CUDAGraph.capture_begin/capture_end`
(which, unlike `torch.cuda.graph`, neither synchronizes nor empties the cache),
with memory history recorded from a clean allocator. The snapshot gets the same
`kit` key as the simulator's, mapping names to the ids torch used.
"""

from __future__ import annotations

from kit.allocator.workload import DEFAULT, Op
from kit.errors import KitError
from kit.record.history import recording_history
from kit.record.provenance import provenance, require_cuda


def run_on_gpu(ops: list[Op]) -> dict:
    """Execute `ops` on the current CUDA device; return the snapshot with its full trace."""
    import torch

    require_cuda("run-workload needs CUDA, and this process has none; use `sim` instead")
    if torch.cuda.memory_reserved() or torch.cuda.memory_allocated():
        raise KitError("run-workload needs a clean allocator: run it in a fresh process")
    streams = {DEFAULT: torch.cuda.default_stream()}
    pools: dict[str, tuple[int, int]] = {}
    graph_pools: dict[str, tuple[int, int]] = {}
    graphs: dict[str, torch.cuda.CUDAGraph] = {}
    tensors: dict[str, torch.Tensor] = {}

    def stream(name: str) -> torch.cuda.Stream:
        if name not in streams:
            streams[name] = torch.cuda.Stream()
        return streams[name]

    try:
        with recording_history(max_entries=4 * len(ops) + 1000, context=None, stacks="python"):
            for op in ops:
                if op.op == "alloc":
                    with torch.cuda.stream(stream(op.stream)):
                        tensors[op.id] = torch.empty(op.bytes, dtype=torch.uint8, device="cuda")
                elif op.op == "free":
                    del tensors[op.id]
                elif op.op == "capture_begin":
                    graph = graphs[op.graph] = torch.cuda.CUDAGraph()
                    if op.pool is not None and op.pool not in pools:
                        pools[op.pool] = torch.cuda.graph_pool_handle()
                    torch.cuda.set_stream(stream(op.stream))
                    graph.capture_begin(pool=pools[op.pool] if op.pool is not None else None)
                elif op.op == "capture_end":
                    graphs[op.graph].capture_end()
                    graph_pools[op.graph] = tuple(graphs[op.graph].pool())  # known only once captured
                    torch.cuda.set_stream(streams[DEFAULT])
                else:
                    torch.cuda.empty_cache()
            torch.cuda.synchronize()
            snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.set_stream(streams[DEFAULT])

    snap["kit"] = {
        "source": "live GPU",
        "provenance": provenance("python -m kit run-workload"),
        "workload": True,  # torch.empty and nothing else: no per-stream caches (cuBLAS workspaces)
        "streams": {name: s.cuda_stream for name, s in streams.items()},
        "pools": {name: list(pid) for name, pid in pools.items()},
        "graphs": {g: list(pid) for g, pid in graph_pools.items()},
    }
    return snap

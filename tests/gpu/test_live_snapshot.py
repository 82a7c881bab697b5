"""Live-GPU checks of the snapshot model: run by scripts/gpu_tests.sh on a CUDA machine."""

from __future__ import annotations

import pytest

from kit import load_snapshot, segment_table

pytestmark = pytest.mark.gpu


def test_live_snapshot_groups_two_capture_streams():
    import torch

    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        pool = torch.cuda.graph_pool_handle()
        x = torch.randn(256, 1024, device="cuda")
        w = torch.randn(1024, 4096, device="cuda")
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        graphs = []
        for s in streams:
            with torch.cuda.stream(s):
                (x @ w).relu()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool, stream=s):
                y = (x @ w).relu().sum(dim=1)
            graphs.append((g, y))
        snap = load_snapshot("live")
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)

    assert snap.data_source == "live GPU"
    assert snap.has_trace
    table = segment_table(snap)
    in_pool = table[table["pool"] == tuple(pool)]
    assert sorted(in_pool["stream"]) == sorted(s.cuda_stream for s in streams)
    assert table.attrs["source"].startswith("live GPU")
    # the kit's groups add up to the allocator's own totals
    stats = torch.cuda.memory_stats()
    assert table["reserved"].sum() == stats["reserved_bytes.all.current"]
    assert table["allocated"].sum() == stats["allocated_bytes.all.current"]

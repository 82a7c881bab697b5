"""Shared test setup: the GPU marker, the recorded fixtures, synthetic snapshots.

Tests marked `gpu` need CUDA. The default run (`make test`, CI) deselects them;
`scripts/gpu_tests.sh` runs them on a GPU machine. Asking for them where there
is no CUDA is an error, never a silent pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kit.recordings import RECORDINGS

FIXTURES = RECORDINGS  # the H200 recordings shipped with the kit
RECORDED = {"two_streams": FIXTURES / "two_streams.pickle", "shared_stream": FIXTURES / "shared_stream.pickle"}
MIB = 1024 * 1024


def pytest_collection_finish(session):
    if not any(item.get_closest_marker("gpu") for item in session.items):
        return
    import torch

    if not torch.cuda.is_available():
        raise pytest.UsageError("GPU tests were selected (-m gpu) but CUDA is not available here")


@pytest.fixture(params=sorted(RECORDED))
def recorded_path(request) -> Path:
    return RECORDED[request.param]


def block(address: int, size: int, state: str = "active_allocated") -> dict:
    return {"address": address, "size": size, "requested_size": size, "state": state, "frames": []}


def segment(address: int, sizes_states: list[tuple[int, str]], *, stream: int = 0, pool=(0, 0)) -> dict:
    """A torch-shaped segment dict built from its blocks, in address order."""
    blocks, cursor = [], address
    for size, state in sizes_states:
        blocks.append(block(cursor, size, state))
        cursor += size
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    pending = sum(b["size"] for b in blocks if b["state"] == "active_pending_free")
    total = cursor - address
    return {
        "device": 0,
        "address": address,
        "total_size": total,
        "allocated_size": allocated,
        "active_size": allocated + pending,
        "requested_size": allocated,
        "stream": stream,
        "segment_type": "small" if total <= 2 * MIB else "large",
        "segment_pool_id": pool,
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }


@pytest.fixture
def synthetic() -> dict:
    """Two streams in one graph pool, one of them mostly free, plus the default pool."""
    return {
        "segments": [
            segment(0x1000_0000, [(20 * MIB, "active_allocated")], stream=0),
            segment(0x2000_0000, [(8 * MIB, "active_allocated"), (12 * MIB, "inactive")], stream=7, pool=(0, 1)),
            segment(0x3000_0000, [(2 * MIB, "active_allocated"), (30 * MIB, "inactive")], stream=9, pool=(0, 1)),
            segment(0x4000_0000, [(512, "active_pending_free"), (2 * MIB - 512, "inactive")], stream=9, pool=(0, 1)),
        ],
        "device_traces": [[]],
        "allocator_settings": {},
    }

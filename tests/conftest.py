"""Shared test setup: the GPU marker and the fixtures; the helpers tests import are in tests/helpers.py.

Tests marked `gpu` need CUDA. The default run (`make test`, CI) deselects them;
`scripts/gpu_tests.sh` runs them on a GPU machine. Asking for them where there
is no CUDA is an error, never a silent pass. `--update-golden` rewrites the
CLI's golden outputs (tests/fixtures/cli_golden) instead of comparing with them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import MIB, RECORDED, segment


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/fixtures/cli_golden from the CLI now")


def pytest_collection_finish(session):
    if not any(item.get_closest_marker("gpu") for item in session.items):
        return
    import torch

    if not torch.cuda.is_available():
        raise pytest.UsageError("GPU tests were selected (-m gpu) but CUDA is not available here")


@pytest.fixture(params=sorted(RECORDED))
def recorded_path(request) -> Path:
    return RECORDED[request.param]


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

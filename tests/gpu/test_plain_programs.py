"""The plain programs live: what-if on a fresh separate-stream run predicts a fresh shared-stream run.

`scripts/record_plain.py` runs each program of `scripts/plain_programs/` in a
process of its own, as the shipped recordings were made; this asks of fresh
runs what `tests/test_plain_snapshots.py` asks of the shipped ones.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kit.analysis.check import check_snapshot
from kit.analysis.names import stream_labels
from kit.analysis.tables import segment_table
from kit.analysis.trace.walk import walk_trace
from kit.analysis.whatif import what_if
from kit.load.snapshot import load_snapshot

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plain")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "record_plain.py"), "--out", str(out)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def _graph_pool(table) -> int:
    return int(table[table["pool"] != (0, 0)]["reserved"].sum())


@pytest.mark.parametrize("program", ["two_captures", "record_stream", "replay_graphs"])
def test_what_if_on_a_fresh_separate_run_predicts_the_fresh_shared_run(fresh, program):
    separate = load_snapshot(fresh / f"{program}_separate.pickle")
    shared = load_snapshot(fresh / f"{program}_shared.pickle")
    allocs = walk_trace(separate).allocs
    in_pool = allocs[allocs["pool"].map(lambda p: tuple(p) != (0, 0))]
    first, second = list(dict.fromkeys(in_pool["stream"].tolist()))
    labels = stream_labels(separate)
    result = what_if(separate, {labels[second]: labels[first]})
    assert _graph_pool(result.predicted) == _graph_pool(segment_table(shared)) < _graph_pool(segment_table(separate))
    if program == "replay_graphs":  # its replay stream's cuBLAS and cuBLASLt workspaces, left out
        assert len(result.modelled) == 2
    assert not check_snapshot(separate).ok and check_snapshot(shared).ok


def test_a_fresh_compile_run_strands_nothing_and_replays_exactly(fresh):
    snap = load_snapshot(fresh / "compile_reduce_overhead.pickle")
    assert check_snapshot(snap).ok
    assert what_if(snap, {}).corrections == []

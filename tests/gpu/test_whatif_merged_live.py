"""What-if's ground truth made fresh: workloads run as written and with one stream merged, on this GPU.

`tests/test_whatif_merged.py` holds the shipped pairs (`kit/recordings/merged`)
to the same standard; this records new ones with `scripts/record_merged.py`
(each workload in a fresh process) and asks the same of them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kit.analysis.tables import segment_table
from kit.analysis.whatif import what_if
from kit.load.snapshot import load_snapshot

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


def reserved_by_pool(table) -> dict[tuple[int, int], int]:
    return {tuple(p): int(v) for p, v in table.groupby("pool")["reserved"].sum().items()}


def test_fresh_merged_pairs_are_predicted_pool_by_pool(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "record_merged.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    pairs = sorted(p.stem for p in tmp_path.glob("merged_*.pickle") if not p.stem.endswith("_merged"))
    assert len(pairs) >= 10
    for name in pairs:
        snap = load_snapshot(str(tmp_path / f"{name}.pickle"))
        result = what_if(snap, {snap.kit["streams"]["s2"]: snap.kit["streams"]["s1"]})
        measured = reserved_by_pool(segment_table(str(tmp_path / f"{name}_merged.pickle")))
        predicted = reserved_by_pool(result.predicted)
        for pool in measured.keys() | predicted.keys():
            got, want = predicted.get(pool, 0), measured.get(pool, 0)
            if pool != (0, 0):
                assert got == want, (name, pool, got, want)
            elif got != want:
                low, high = result.spread[pool]
                assert low <= want <= high, (name, pool, got, want, low, high)

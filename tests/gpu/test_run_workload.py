"""run-workload on the real allocator, replayed by the simulator: run by scripts/gpu_tests.sh."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kit import load_snapshot
from kit.allocator.simulator import recorded_segment_addresses, simulate
from kit.allocator.workload import generate_workload, parse_workload, pr_scenario

from ..test_simulator import canonical

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["pr_two_streams", "pr_shared_stream", "random_1000", "random_1001"])
def test_fresh_process_run_matches_the_simulator(tmp_path, name):
    workload = {
        "pr_two_streams": lambda: pr_scenario(False),
        "pr_shared_stream": lambda: pr_scenario(True),
    }.get(name, lambda: generate_workload(int(name.split("_")[1]), 400))()
    path = tmp_path / "w.json"
    path.write_text(json.dumps(workload))
    out = tmp_path / "real.pickle"
    done = subprocess.run(
        [sys.executable, "-m", "kit", "run-workload", str(path), "-o", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    real = load_snapshot(out)
    assert real.provenance["gpu"].startswith("NVIDIA")
    sim = simulate(parse_workload(workload), addresses=recorded_segment_addresses(real.raw)).snapshot()
    assert canonical(sim) == canonical(real.raw)

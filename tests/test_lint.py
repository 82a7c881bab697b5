"""The code is ruff clean (the project's style gate, run with the pinned ruff)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_check_is_clean():
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "kit", "tests", "scripts", "benchmarks", "notebooks"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr

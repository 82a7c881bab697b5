"""The CLI's output on the shipped recordings is what it was when the fixtures were captured.

tests/fixtures/cli_golden/NAME.txt holds what `python -m kit --quiet ARGS`
printed (stdout and stderr together), then a last line `exit N`. They were
captured before the recording framework was folded into one place
(kit/record/provenance.py, kit/experiments/summary.py, the vllm_capture split),
so a refactor that changes a figure, a key or a word of the output fails here.
The outputs come from recordings only: no GPU, no vLLM run. A change meant to
alter them is written with `pytest tests/test_cli_golden.py --update-golden`,
and its diff read before it is committed (docs/testing.md lists the changes).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "fixtures" / "cli_golden"

COMMANDS = {
    "demo_json": ["demo", "--json"],
    "demo_text": ["demo"],
    "demo_vllm_json": ["demo", "--vllm", "--json"],
    "demo_vllm_text": ["demo", "--vllm"],
    "safety": ["safety"],
    "safety_large_json": ["safety", "--preset", "large", "--json"],
    "alternatives": ["alternatives"],
    "alternatives_large_json": ["alternatives", "--preset", "large", "--json"],
    "check_patched_drafter": ["check", "kit/recordings/replica/small_patched_drafter.pickle"],
    "check_unpatched_json": ["check", "--json", "kit/recordings/replica/small_unpatched.pickle"],
    "table_unpatched": ["table", "kit/recordings/replica/small_unpatched.pickle"],
}


def run_kit(args: list[str]) -> str:
    """What `python -m kit --quiet ARGS` prints, then `exit N`, as the fixtures hold it: the checkout's own path,
    where a line shows one, as `<checkout>` (the fixtures were captured in another folder than CI's clone)."""
    done = subprocess.run(
        [sys.executable, "-m", "kit", "--quiet", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    return f"{done.stdout}exit {done.returncode}\n".replace(f"{ROOT}/", "<checkout>/")


def test_every_fixture_has_its_command():
    assert {p.stem for p in GOLDEN.glob("*.txt")} == set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_output_is_unchanged(name, request):
    got = run_kit(COMMANDS[name])
    if request.config.getoption("--update-golden"):
        (GOLDEN / f"{name}.txt").write_text(got)
    expected = (GOLDEN / f"{name}.txt").read_text()
    if got != expected:
        now, before = got.splitlines(), expected.splitlines()
        differs = (i for i, (a, b) in enumerate(zip(now, before, strict=False)) if a != b)
        first = next(differs, min(len(now), len(before)))
        shown = [lines[first] if first < len(lines) else "(nothing)" for lines in (now, before)]
        pytest.fail(
            f"`python -m kit {' '.join(COMMANDS[name])}` changed at line {first + 1}:\n"
            f"  now:    {shown[0]!r}\n  before: {shown[1]!r}"
        )

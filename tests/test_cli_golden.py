"""The CLI's output on the shipped recordings is what it was when the fixtures were captured.

tests/fixtures/cli_golden/NAME.txt holds what `python -m kit --quiet ARGS`
printed (stdout and stderr together), then a last line `exit N`. They were
captured before the recording framework was folded into one place
(kit/record/provenance.py, kit/experiments/summary.py, the vllm_capture split),
so a refactor that changes a figure, a key or a word of the output fails here.
The outputs come from recordings only: no GPU, no vLLM run. A change meant to
alter them is written with `pytest tests/test_cli_golden.py --update-golden`,
and its diff read before it is committed (docs/testing.md lists the changes).

The JSON of the large recordings (`safety --preset large --json`,
`alternatives --preset large --json`, `demo --vllm --json`) is not kept as a
copy: most of it is the recordings themselves, already pinned by sha256. It is
checked against them instead, figure by figure (in this process, `run_kit`):
every recorded field carried unchanged, each vLLM scenario's graph pool the sum
of the model graphs' pool segments in its snapshot.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kit.experiments.vllm.recordings import load_recordings
from kit.recordings import RECORDINGS
from tests import helpers

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "fixtures" / "cli_golden"

COMMANDS = {
    "demo_json": ["demo", "--json"],
    "demo_text": ["demo"],
    "demo_vllm_text": ["demo", "--vllm"],
    "safety": ["safety"],
    "alternatives": ["alternatives"],
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


def _json_of(*args: str) -> dict:
    done = helpers.run_kit(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_safety_json_carries_every_recorded_pairing_unchanged():
    recorded = json.loads((RECORDINGS / "safety" / "large.json").read_text())
    out = _json_of("safety", "--preset", "large", "--json")
    assert len(out["pairs"]) == len(recorded["pairs"]) > 0
    for got, pair in zip(out["pairs"], recorded["pairs"], strict=True):
        scenario = pair.pop("policy")  # the recording's old word for the scenario (kit.experiments.recorded)
        assert got["scenario"] == got["policy"] == scenario  # DESIGN's contract names it `policy` too
        assert {k: got[k] for k in pair} == pair
    assert out["provenance"] == recorded["provenance"] and out["rule"] == recorded["rule"]
    assert len(out["verdicts"]) == len({p["scenario"] for p in out["pairs"]})
    assert {"vllm_invariant", "early_aux_shapes", "early_aux_vllm"} <= set(out)


def test_alternatives_json_is_the_recording_with_share_all_backed_by_the_drafter():
    recorded = json.loads((RECORDINGS / "alternatives" / "large.json").read_text())
    out = _json_of("alternatives", "--preset", "large", "--json")
    assert set(out) == {*recorded, "source"} and "large.json" in out["source"]
    assert {k: out[k] for k in recorded if k != "share_all"} == {k: v for k, v in recorded.items() if k != "share_all"}
    kept = {k: v for k, v in recorded["share_all"].items() if k not in ("safe", "evidence")}
    assert {k: out["share_all"][k] for k in kept} == kept
    assert isinstance(out["share_all"]["safe"], bool) and "drafter_analyses" in out["share_all"]


def test_demo_vllm_json_gives_each_recordings_graph_pool_and_provenance():
    out = _json_of("demo", "--vllm", "--json")
    runs = load_recordings()
    assert set(runs) <= set(out) and runs
    for name, snap in runs.items():
        model_pools = {tuple(c["pool"]) for c in snap.kit["captures"] if c.get("manager") == "model graphs"}
        pools, sizes = snap.columns.pools(), snap.columns.total_size.tolist()
        pool_bytes = sum(size for pool, size in zip(pools, sizes, strict=True) if tuple(pool) in model_pools)
        assert out[name]["graph_pool_bytes"] == pool_bytes > 0, name
        assert out[name]["provenance"] == snap.kit["provenance"], name

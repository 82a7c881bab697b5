"""The planted cross-break read live (scenario `planted_cross_break_read`, the small preset, PR 63155's shared
stream): it must violate the structural invariant and differ from eager, while the PR's own capture of the
unplanted model keeps the invariant. Each run in a fresh process, as the recordings are made."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kit.analysis.invariant import INVARIANT

pytestmark = pytest.mark.gpu
PLANTED = "planted_cross_break_read"


def _run(module: str, scenario: str, out) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", module, "--scenario", scenario, "--preset", "small", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def readwrite(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("invariant")
    return {s: _run("kit.experiments.readwrite_run", s, folder / f"{s}.json") for s in ("pr", PLANTED)}


@pytest.fixture(scope="module")
def safety(tmp_path_factory) -> dict:
    return _run("kit.experiments.safety_run", PLANTED, tmp_path_factory.mktemp("planted") / "planted.json")


def test_the_pr_keeps_the_invariant_and_nothing_in_the_graph_pool_is_carried(readwrite):
    run = readwrite["pr"]
    assert run["invariant"]["invariant"] == INVARIANT and run["invariant"]["graph_pool"]
    assert run["invariant"]["holds"] is True
    assert all(p["graph_pool_carried_bytes"] == 0 for p in run["pairs"])


def test_the_planted_read_violates_the_invariant_on_every_dispatchable_pairing(readwrite):
    run = readwrite[PLANTED]
    assert run["config"]["planted_cross_break_read"] and not run["has_early_aux"]
    assert run["invariant"]["holds"] is False
    running = [p for p in run["pairs"] if p["dispatchable"]]
    assert running and all(not p["invariant_holds"] for p in running)
    # the kept block: at least N x 4 x hidden float32 bytes of graph pool read after the break
    assert all(p["graph_pool_carried_bytes"] >= p["model_size"] * 4 * 1024 * 4 for p in running)
    assert all(p["early_aux_carried_bytes"] == 0 for p in running)
    # the obligation is no longer vacuous: some replay graph writes the kept block
    assert any(not p["readwrite_holds"] for p in running)


def test_the_planted_read_differs_from_eager_where_a_replay_graph_overwrote_it(safety, readwrite):
    assert safety["shares_model_stream"] is True and safety["config"]["planted_cross_break_read"]
    dispatched = [p for p in safety["pairs"] if p["dispatchable"]]
    differ = {(p["model_size"], p["replay_size"]) for p in dispatched if not p["bit_exact"]}
    assert differ, "the planted cross-break read never differed from eager"
    violated = {(p["model_size"], p["replay_size"]) for p in readwrite[PLANTED]["pairs"]
                if p["dispatchable"] and not p["readwrite_holds"]}  # fmt: skip
    assert differ == violated  # R overwrote the kept block exactly where the outputs differ

"""Alternative (a)'s lifetime argument live on a GPU: the drafter's reads and writes, each scenario in a fresh process.

Asserted whatever the figures: under share_all the drafter's graphs share the model graphs'
stream and the analyses run on every (model graph, drafter graph) pairing; under the PR the
drafter keeps a stream of its own and never writes the target's outputs; the read/write
verdicts and the lifetime verdicts (with the step's reads) agree; the run's own graphs-vs-eager
step check (`target_outputs_overwritten`) matches the bytes the analysis says the drafter writes.
"""

from __future__ import annotations

import pandas as pd
import pytest

from kit.experiments.drafter_run import DRAFTER_SCENARIOS, load_recording, record

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return load_recording("small", record("small", tmp_path_factory.mktemp("drafter")))


def test_both_scenarios_cover_every_pairing(small):
    pairs = pd.DataFrame(small["pairs"])
    for scenario in DRAFTER_SCENARIOS:
        rows = pairs[pairs["scenario"] == scenario]
        assert len(rows) == rows["model_size"].nunique() * rows["drafter_size"].nunique()
        assert rows["dispatchable"].sum() == rows["model_size"].nunique()


def test_the_streams_are_the_ones_each_scenario_asks_for(small):
    pr, share = (small["scenarios"][v]["capture_streams"] for v in DRAFTER_SCENARIOS)
    assert pr["DFlash speculator graphs"] != pr["model graphs"]
    assert share["DFlash speculator graphs"] == share["model graphs"]


def test_the_analyses_agree_with_the_steps_reads(small):
    pairs = pd.DataFrame(small["pairs"])
    assert pairs["agree"].all(), pairs[~pairs["agree"]]["explanation"].tolist()


def test_an_overwrite_the_step_saw_is_one_the_analysis_found(small):
    for scenario in DRAFTER_SCENARIOS:
        run = small["scenarios"][scenario]
        pairs = pd.DataFrame([p for p in small["pairs"] if p["scenario"] == scenario and p["dispatchable"]])
        found = pairs.set_index("model_size")["outputs_overwritten_bytes"]
        for step in run["steps"]:
            if step["target_outputs_overwritten"]:
                assert found[step["size"]] > 0
        if scenario == "pr":
            assert not any(s["target_outputs_overwritten"] for s in run["steps"]) and (found == 0).all()

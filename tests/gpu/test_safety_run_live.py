"""Adversarial pairings live: the small preset, every policy in a fresh process, every pair against eager."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kit.experiments.power import NOTHING_READ
from kit.experiments.recorded import current_words
from kit.experiments.safety_run.result import (
    SAFETY_SCENARIOS,
    enumerate_pairs,
    load_recording,
    pair_verdicts,
    pairs_frame,
    scenario_safety_config,
)
from kit.experiments.safety_run.run import record, replica_pool_poison
from kit.recordings import RECORDINGS

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict:
    return load_recording("small", record("small", tmp_path_factory.mktemp("safety")))


def test_every_pair_ran_under_every_policy(small):
    df = pairs_frame(small)
    assert list(df["scenario"].unique()) == list(SAFETY_SCENARIOS)
    for policy, rows in df.groupby("scenario"):
        ran = list(zip(rows["model_size"], rows["replay_size"], rows["dispatchable"], strict=True))
        assert ran == enumerate_pairs(scenario_safety_config(policy, "small")), policy
        assert set(rows.loc[rows["dispatchable"], "how"]) == {"dispatched"}  # run as vLLM runs them
        assert (rows["outputs"] == len(small["scenarios"][policy]["outputs"])).all()


def test_the_policies_took_effect(small):
    meta = small["scenarios"]
    assert [meta[p]["shares_model_stream"] for p in SAFETY_SCENARIOS] == [True, False, True, True]
    assert [meta[p]["has_early_aux"] for p in SAFETY_SCENARIOS] == [False, False, True, False]


def test_pr_and_unpatched_are_bit_exact_on_every_pairing(small):
    df = pairs_frame(small)
    for policy in ("pr", "unpatched"):
        rows = df[df["scenario"] == policy]
        assert rows["bit_exact"].all() and (rows["max_abs_diff"] == 0).all(), rows[~rows["bit_exact"]]
        assert rows["alone_bit_exact"].all()
    n, dispatchable = len(df) // len(SAFETY_SCENARIOS), int(df["dispatchable"].sum()) // len(SAFETY_SCENARIOS)
    verdicts = pair_verdicts(df)
    assert verdicts[0].startswith(f"pr: all {n} pairings bit-exact ({dispatchable} dispatchable); ")
    assert verdicts[1].startswith(f"unpatched: all {n} pairings bit-exact ({dispatchable} dispatchable); ")


def test_stress_pairings_are_forced_into_r_and_pcp_pairings_dispatched_with_more_rows_than_n(small):
    """A pairing no pcp_size dispatches is forced into R; one only prefill context parallelism dispatches runs as
    vLLM runs it, its rows (counted over the global batch) more than N and dispatched to R."""
    df = pairs_frame(small)
    stress = df[~df["dispatchable"]]
    pcp = stress["dispatch_pcp"].notna()
    assert len(stress) > 0
    assert (stress["how"] == pcp.map({True: "dispatched", False: "forced"})).all()
    assert (stress.loc[pcp, "replay_rows"] > stress.loc[pcp, "model_size"]).all()


def test_power_where_the_early_aux_is_read_after_r_and_none_where_nothing_is(small):
    """Early aux forced to share: the early aux, read after every R, makes every pairing's check able to fail.
    Under the PR and unpatched N reads nothing from the graph pool after R but R's outputs: no pairing can fail."""
    df = pairs_frame(small)
    early = df[df["scenario"] == "early_aux_shared"]
    assert early["power"].astype(bool).all(), early[~early["power"].astype(bool)]
    assert all("aux_hidden_state[1]" in outs for outs in early["power_differing_outputs"])
    for policy in ("pr", "unpatched"):
        rows = df[df["scenario"] == policy]
        assert not rows["power"].astype(bool).any() and (rows["power_reason"] == NOTHING_READ).all(), policy
    lines = pair_verdicts(df)
    assert lines[2].endswith(f"; {len(early)} of {len(early)} pairings shown (with power)")


def test_the_poison_covers_the_graph_pool_and_is_put_back(monkeypatch):
    import torch

    from kit.replica import cudagraph_utils
    from kit.replica.model_runner import GPUModelRunner
    from tests.helpers import TINY

    monkeypatch.setattr(cudagraph_utils, "_global_graph_pool", None)  # a pool of this runner's own
    runner = GPUModelRunner(TINY)
    runner.capture_model()
    hidden, _ = runner.execute_model(torch.arange(16, device="cuda") % TINY.vocab_size)  # a view into the pool
    poison = replica_pool_poison(runner)
    pool = tuple(runner.cudagraph_manager.pool)
    reserved = sum(s["total_size"] for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) == pool)
    assert poison.nbytes == reserved > 0
    before, kept = hidden.clone(), hidden[:2]
    poison(kept)
    assert hidden[2:].isnan().all() and torch.equal(kept, before[:2])
    poison.restore()
    assert torch.equal(hidden, before)


def test_early_aux_forced_to_share_differs_from_eager_on_some_pairing(small):
    df = pairs_frame(small)
    rows = df[df["scenario"] == "early_aux_shared"]
    bad = rows[~rows["bit_exact"]]
    assert len(bad) >= 1 and (bad["max_abs_diff"] > 0).all()
    assert bad["dispatchable"].any(), "a pairing vLLM runs must show the early aux overwritten"
    assert all(out.startswith("aux_hidden_state[1]") for outs in bad["differing_outputs"] for out in outs), (
        "only the early aux hidden state, held across the break, can be overwritten"
    )


def test_safety_live_prints_the_same_contract():
    done = subprocess.run(
        [sys.executable, "-m", "kit", "safety", "--live", "--json"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["source"].startswith("live GPU (")
    recorded = current_words(json.loads((RECORDINGS / "safety" / "small.json").read_text()))["pairs"]
    key = ("scenario", "model_size", "replay_size", "dispatchable")
    assert sorted(tuple(p[k] for k in key) for p in out["pairs"]) == sorted(tuple(p[k] for k in key) for p in recorded)
    for pair in out["pairs"]:
        assert {"policy", "model_size", "replay_size", "bit_exact", "max_abs_diff"} <= set(pair)

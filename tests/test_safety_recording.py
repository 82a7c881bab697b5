"""The shipped safety recording: what the adversarial pairings measured on the H200, asserted on the CPU.

`check_safety_recording` holds what a recording of `python -m
kit.experiments.safety_run --preset small --out kit/recordings/safety` must
show: every pair of every policy ran, under the PR and unpatched every
pairing is bit-exact, with early aux forced to share at least one differs,
and the file is the one its PROVENANCE.json entry describes. The tests below
run it on fake recordings (a good one passes, each broken one fails); the
shipped recording is checked once it is recorded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from kit.experiments.power import NOT_RECORDED
from kit.experiments.safety_run.result import (
    PLANTED,
    SAFETY_SCENARIOS,
    SCENARIO_OF,
    UNPLANTED,
    enumerate_pairs,
    load_recording,
    pair_verdicts,
    pairs_frame,
    safety_config,
    safety_lines,
    scenario_safety_config,
)
from tests.helpers import owed
from tests.test_safety_run import fake_recording


def check_safety_recording(path: Path, preset: str = "small") -> None:
    data = load_recording(preset, path)  # the schema, or a KitError
    prov = data["provenance"]
    assert prov["gpu"].startswith(("NVIDIA H200", "NVIDIA H100")) and prov["torch"] and prov["date"] and prov["command"]
    entry = json.loads((path.parent / "PROVENANCE.json").read_text())[path.name]
    assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest(), "PROVENANCE.json describes another file"
    df = pairs_frame(data)
    recorded = list(df["scenario"].unique())
    assert recorded in (list(SAFETY_SCENARIOS), list(UNPLANTED)), "not every scenario was recorded"
    for policy, rows in df.groupby("scenario", sort=False):
        meta = data["scenarios"][policy]
        config = scenario_safety_config(policy, preset)
        expected = {"planted_cross_break_read": False, **json.loads(json.dumps(dataclasses.asdict(config)))}
        if "aux_return" not in meta["config"]:  # recorded before it: the replica's weak references recursed (flat)
            expected.pop("aux_return")
        made = {"planted_cross_break_read": False, **meta["config"]}  # a recording made before the planted flag
        assert made == expected, f"{policy}: the preset changed"
        ran = list(zip(rows["model_size"], rows["replay_size"], rows["dispatchable"], strict=True))
        assert ran == enumerate_pairs(config), f"{policy}: not every pair ran, or the dispatch rule changed"
        assert (rows["outputs"] == len(meta["outputs"])).all()
        dispatched = rows[rows["dispatchable"]]
        assert (dispatched["replay_size"] == dispatched["model_size"]).any(), f"{policy}: no R = N pairing ran"
    runs = data["scenarios"]
    took_effect = [(runs[p]["shares_model_stream"], runs[p]["has_early_aux"]) for p in recorded]
    planted = [(True, False)] * (len(recorded) - len(UNPLANTED))  # the planted scenario runs the PR's capture
    assert took_effect == [(True, False), (False, False), (True, True), *planted], "a policy did not take effect"
    for policy in ("pr", "unpatched"):
        rows = df[df["scenario"] == policy]
        assert rows["bit_exact"].all() and (rows["max_abs_diff"] == 0).all(), f"{policy} differs from eager"
    shared = df[df["scenario"] == "early_aux_shared"]
    assert (~shared["bit_exact"]).any(), "early aux forced to share: no pairing differs from eager"
    assert (shared.loc[~shared["bit_exact"], "max_abs_diff"] > 0).all()
    for policy in PLANTED if recorded == list(SAFETY_SCENARIOS) else ():
        rows = df[(df["scenario"] == policy) & df["dispatchable"]]
        assert (~rows["bit_exact"]).any(), f"{policy}: the planted cross-break read never differs from eager"
    verdicts = pair_verdicts(df)
    assert safety_lines(data)[-len(recorded) :] == verdicts
    assert verdicts[0].startswith("pr: all ") and verdicts[2].startswith("early_aux_shared: ")
    check_power(df, verdicts)


def check_power(df, verdicts: list[str]) -> None:
    """A recording with the positive control: every pair has its power and a reason; with early aux forced to share
    (the early aux read after every R) every pairing has power, and every pairing that differs has it. One made
    before the control says so, and counts none as shown."""
    if "power" not in df:
        sizes = df.groupby("scenario", sort=False).size()
        said = [v.endswith(f"{NOT_RECORDED}: none of these {n} pairings is counted as shown") for v, n in
                zip(verdicts, sizes, strict=True)]  # fmt: skip
        assert all(said), "a recording without power counts a pairing as shown"
        return
    assert df["power"].map(lambda p: isinstance(p, bool | np.bool_)).all(), "a pair lacks its power"
    assert df["power_reason"].map(lambda r: isinstance(r, str) and r).all(), "a pair lacks its power_reason"
    shared = df[df["scenario"] == "early_aux_shared"]
    assert shared["power"].astype(bool).all(), "early aux forced to share: a pairing without power"
    assert df.loc[~df["bit_exact"].astype(bool), "power"].astype(bool).all(), "a pairing that differs has no power"
    for policy, rows in df.groupby("scenario", sort=False):
        shown = int(rows["power"].astype(bool).sum())
        line = next(v for v in verdicts if v.startswith(f"{policy}: "))
        assert f"; {shown} of {len(rows)} pairings shown (with power)" in line, f"{policy}: power miscounted"


def _recorded(folder: Path, **kwargs) -> Path:
    path = fake_recording(folder, **kwargs)
    manifest = {path.name: {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}}
    (folder / "PROVENANCE.json").write_text(json.dumps(manifest))
    return path


def _edited(path: Path, edit) -> Path:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    (path.parent / "PROVENANCE.json").write_text(
        json.dumps({path.name: {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}})
    )
    return path


def test_a_recording_as_the_acceptance_wants_it_passes(tmp_path):
    check_safety_recording(_recorded(tmp_path, differing={(512, 96)}, alone_differing={128}))


def _pr_differs(data):
    data["pairs"][4].update(bit_exact=False, max_abs_diff=0.5)


def _a_pair_missing(data):
    del data["pairs"][-1]


def _not_shared(data):
    data["scenarios"]["pr"]["shares_model_stream"] = False


@pytest.mark.parametrize(
    "edit,why",
    [(_pr_differs, "pr differs from eager"), (_a_pair_missing, "not every pair ran"), (_not_shared, "did not take")],
)
def test_a_recording_that_breaks_the_acceptance_fails(tmp_path, edit, why):
    path = _edited(_recorded(tmp_path, differing={(512, 96)}), edit)
    with pytest.raises(AssertionError, match=why):
        check_safety_recording(path)


def test_a_recording_with_power_as_the_acceptance_wants_it_passes(tmp_path):
    check_safety_recording(_recorded(tmp_path, differing={(512, 96)}, unpowered={("pr", 128, 96)}))


@pytest.mark.parametrize(
    "unpowered,why",
    [({("early_aux_shared", 128, 96)}, "a pairing without power"), ({("early_aux_shared", 512, 96)}, "without")],
)
def test_a_recording_with_a_pairing_that_should_have_power_fails(tmp_path, unpowered, why):
    with pytest.raises(AssertionError, match=why):
        check_safety_recording(_recorded(tmp_path, differing={(512, 96)}, unpowered=unpowered))


def test_a_recording_that_counts_a_pairing_without_power_as_shown_fails(tmp_path, monkeypatch):
    from kit.experiments.safety_run import result as safety_result

    path = _recorded(tmp_path, differing={(512, 96)}, unpowered={("pr", 128, 96)})
    monkeypatch.setattr(
        safety_result, "power_clause", lambda rows: f"{len(list(rows))} of 18 pairings shown (with power)"
    )
    with pytest.raises(AssertionError, match="pr: power miscounted"):
        check_safety_recording(path)


def test_a_recording_where_forced_sharing_never_differs_fails(tmp_path):
    with pytest.raises(AssertionError, match="no pairing differs"):
        check_safety_recording(_recorded(tmp_path))


def test_a_file_its_provenance_does_not_describe_fails(tmp_path):
    path = _recorded(tmp_path, differing={(512, 96)})
    path.write_text(path.read_text() + " ")
    with pytest.raises(AssertionError, match="describes another file"):
        check_safety_recording(path)


def early_aux_differs(preset: str = "small") -> set[tuple[int, int]]:
    """The pairings the shipped recording measured differing from eager because of their replay graph R, with early
    aux forced to share; the read/write and lifetime analyses (tests/test_readwrite_recording.py) must flag exactly
    these.

    An adversary pairing (one vLLM cannot run) replays R and then the step's own replay graph. Where the model graph
    already differs with its own replay graph alone (`alone_bit_exact`), a difference there is not R's: such
    pairings are left out (`unattributed`).
    """
    early = _early_aux(preset)
    differ = {(int(r.model_size), int(r.replay_size)) for r in early.itertuples() if not r.bit_exact}
    return differ - _unattributed(early)


def unattributed(preset: str) -> set[tuple[int, int]]:
    """Adversary pairings of a model graph that differs from eager with its own replay graph alone."""
    return _unattributed(_early_aux(preset))


def _unattributed(early) -> set[tuple[int, int]]:
    return {
        (int(r.model_size), int(r.replay_size))
        for r in early.itertuples()
        if r.how == "adversary" and not r.alone_bit_exact
    }


def _early_aux(preset: str):
    df = pairs_frame(load_recording(preset))
    return df[df["scenario"] == "early_aux_shared"]


def test_the_shipped_small_recording():
    from kit.recordings import RECORDINGS

    path = RECORDINGS / "safety" / "small.json"
    check_safety_recording(path)
    df = pairs_frame(load_recording("small", path))
    for policy in ("pr", "unpatched"):
        rows = df[df["scenario"] == policy]
        assert rows["bit_exact"].all() and len(rows) == len(
            enumerate_pairs(safety_config(SCENARIO_OF[policy], "small"))
        )
    differs = early_aux_differs()
    dispatched = df[(df["scenario"] == "early_aux_shared") & df["dispatchable"]]
    assert differs & {(int(r.model_size), int(r.replay_size)) for r in dispatched.itertuples()}, (
        "a pairing vLLM runs must show the early aux overwritten"
    )


def test_the_shipped_large_recording():
    from kit.recordings import RECORDINGS

    check_safety_recording(RECORDINGS / "safety" / "large.json", "large")
    data = load_recording("large")
    assert data["scenarios"]["pr"]["no_break"] == [512]  # vLLM's threshold of 768 keeps model graph 512 whole


def _shipped(folder: str, preset: str) -> Path:
    from kit.recordings import RECORDINGS

    return RECORDINGS / folder / f"{preset}.json"


def test_the_shipped_h200_default_recording_has_no_pairing_and_every_model_graph_whole():
    if owed("safety/h200-default.json"):
        return
    path = _shipped("safety", "h200-default")
    data = load_recording("h200-default", path)
    entry = json.loads((path.parent / "PROVENANCE.json").read_text())[path.name]
    assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest(), "PROVENANCE.json describes another file"
    assert data["provenance"]["gpu"].startswith(("NVIDIA H200", "NVIDIA H100")) and data["pairs"] == []
    for policy in SAFETY_SCENARIOS:
        config = safety_config(SCENARIO_OF[policy], "h200-default")
        assert data["scenarios"][policy]["no_break"] == sorted(config.cudagraph_capture_sizes)


def test_the_shipped_gb200_default_recording_runs_r_over_n_as_vllm_dispatches_it():
    if owed("safety/gb200-default.json"):
        return
    path = _shipped("safety", "gb200-default")
    check_safety_recording(path, "gb200-default")
    df = pairs_frame(load_recording("gb200-default", path))
    pr = df[df["scenario"] == "pr"]
    # with pcp_size 2 vLLM dispatches every pairing: each ran as dispatched, none as an adversary
    assert (pr["how"] == "dispatched").all() and (pr["dispatch_pcp"] <= 2).all()
    over = pr[pr["dispatchable"] & (pr["replay_size"] > pr["model_size"])]
    assert len(set(over["model_size"])) == 14  # every model graph but 768, 896 and 1024 runs an R > N
    assert (pr.loc[pr["dispatch_pcp"] == 2, "replay_rows"] > pr.loc[pr["dispatch_pcp"] == 2, "model_size"]).all()

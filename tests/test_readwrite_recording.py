"""The shipped read/write recording, asserted on the CPU; until it is recorded, the check on fake recordings.

`check_readwrite_recording` holds what a recording of `python -m
kit.experiments.readwrite_run --preset small --out kit/recordings/readwrite`
must show: the file is the one its PROVENANCE.json entry describes; every
policy's pairings are what its own recorded accesses give when the table is
computed again here; under the PR and unpatched the obligation holds on every
dispatchable pairing and the graphs equal eager; with early aux forced to
share it fails on at least one dispatchable pairing, exactly where the
lifetime analysis (with the breaks' reads) flags a conflict; and every
disagreement between the analyses carries its explanation.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kit.analysis.invariant import INVARIANT, invariant_table
from kit.analysis.readwrite import OBLIGATION, Ranges, ReadWriteRecording, readwrite_table
from kit.errors import KitError
from kit.experiments.readwrite_run.result import load_recording, summary_lines
from kit.experiments.safety_run.result import PLANTED, SAFETY_SCENARIOS, UNPLANTED
from kit.recordings import shipped_bytes
from tests.helpers import owed
from tests.test_readwrite import _forward_with_a_replay


def check_readwrite_recording(path: Path, preset: str = "small") -> None:
    data = load_recording(preset, path)  # the schema, or a KitError
    prov = data["provenance"]
    assert prov["gpu"] and prov["torch"] and prov["date"] and prov["command"]
    entry = json.loads((path.parent / "PROVENANCE.json").read_text())[path.name]
    data_bytes = shipped_bytes(path)  # as recorded (a file shipped compressed, decompressed)
    assert entry["sha256"] == hashlib.sha256(data_bytes).hexdigest(), "PROVENANCE.json describes another file"
    assert data["obligation"] == OBLIGATION
    recorded = list(data["scenarios"])
    assert recorded in (list(SAFETY_SCENARIOS), list(UNPLANTED)), "not every scenario was recorded"
    assert [data["scenarios"][p]["has_early_aux"] for p in recorded] == [False, False, True, False][: len(recorded)]
    for policy in recorded:
        check_recorded_invariant(data, policy)
    for policy in recorded:
        pairs = [p for p in data["pairs"] if p["scenario"] == policy]
        recording = ReadWriteRecording.from_records(data["scenarios"][policy]["accesses"])
        table = readwrite_table(recording)
        again = {(r["model_size"], r["replay_size"]): (r["holds"], r["overlap_bytes"]) for _, r in table.iterrows()}
        stored = {(p["model_size"], p["replay_size"]): (p["readwrite_holds"], p["overlap_bytes"]) for p in pairs}
        assert stored == again, f"{policy}: the pairs are not what its recorded accesses give"
        for p in pairs:
            assert p["agree"] == (p["lifetime_conflict"] == (not p["readwrite_holds"]))
            assert (p["explanation"] is None) == p["agree"], f"{policy}: a disagreement without an explanation"
            assert (p["explanation_trace_only"] is None) == p["agree_trace_only"]
    for policy in ("pr", "unpatched"):
        pairs = [p for p in data["pairs"] if p["scenario"] == policy and p["dispatchable"]]
        assert all(p["readwrite_holds"] for p in pairs), f"{policy}: the obligation fails"
        assert all(r["bit_exact"] for r in data["scenarios"][policy]["equivalence"]), f"{policy} differs from eager"
    shared = [p for p in data["pairs"] if p["scenario"] == "early_aux_shared"]
    violated = {(p["model_size"], p["replay_size"]) for p in shared if not p["readwrite_holds"]}
    assert any(p["dispatchable"] and not p["readwrite_holds"] for p in shared), "early aux shared: nothing violated"
    assert violated == {(p["model_size"], p["replay_size"]) for p in shared if p["lifetime_conflict"]}
    assert summary_lines(data)[2].startswith("early_aux_shared: obligation VIOLATED")


def check_recorded_invariant(data: dict, policy: str) -> None:
    """A scenario's invariant, where recorded: what its accesses and graph-pool ranges give; holding on the
    shipped scenarios (early aux only by the exception), violated with graph-pool bytes on the planted one."""
    run = data["scenarios"][policy]
    invariant = run.get("invariant")
    pairs = [p for p in data["pairs"] if p["scenario"] == policy]
    if invariant is None:  # a recording made before the invariant: every pairing says so, none passes silently
        assert all(p.get("invariant_holds") is None for p in pairs), f"{policy}: an invariant with no ranges"
        return
    assert invariant["invariant"] == INVARIANT
    recording = ReadWriteRecording.from_records(run["accesses"])
    pool = Ranges(tuple(span) for span in invariant["graph_pool"])
    table = invariant_table(recording, pool, invariant["early_aux_outputs"])
    again = {(r["model_size"], r["replay_size"]): (r["invariant_holds"], r["graph_pool_carried_bytes"])
             for _, r in table.iterrows()}  # fmt: skip
    stored = {(p["model_size"], p["replay_size"]): (p["invariant_holds"], p["graph_pool_carried_bytes"]) for p in pairs}
    assert stored == again, f"{policy}: the invariant is not what its recorded accesses and graph pool give"
    running = [p for p in pairs if p["dispatchable"]]
    if policy in PLANTED:
        assert all(not p["invariant_holds"] and p["graph_pool_carried_bytes"] > 0 for p in running), (
            f"{policy}: the planted cross-break read does not violate the invariant"
        )
        assert any(not p["readwrite_holds"] for p in running), f"{policy}: no replay graph overwrote the planted block"
    else:
        assert all(p["invariant_holds"] for p in running), f"{policy}: the invariant fails"
        aux = [p["early_aux_carried_bytes"] for p in running]
        assert all(aux) if run["has_early_aux"] else not any(aux), f"{policy}: early aux not told apart"


def _policy(overwrite_aux: bool, has_early_aux: bool) -> dict:
    recording = _forward_with_a_replay(overwrite_aux).recording()
    table = readwrite_table(recording)
    pairs = []
    for _, row in table.iterrows():
        conflict = not row["holds"]
        pairs.append(
            {
                "model_size": int(row["model_size"]),
                "replay_size": int(row["replay_size"]),
                "dispatchable": True,
                "readwrite_holds": bool(row["holds"]),
                "overlap_bytes": int(row["overlap_bytes"]),
                "lifetime_conflict": conflict,
                "agree": True,
                "explanation": None,
                "trace_only_conflict": True,
                "agree_trace_only": conflict,
                "explanation_trace_only": None if conflict else "nothing after the break reads them",
            }
        )
    return {
        "has_early_aux": has_early_aux,
        "accesses": recording.to_records(),
        "equivalence": [{"size": 16, "bit_exact": not overwrite_aux}],
        "pairs": pairs,
    }


def fake_recording(folder: Path, edit=None) -> Path:
    """A recording in the shipped one's shape, from eager CPU runs: early aux overwritten only when shared."""
    runs = {"pr": _policy(False, False), "unpatched": _policy(False, False), "early_aux_shared": _policy(True, True)}
    data = {
        "preset": "small",
        "obligation": OBLIGATION,
        "pairs": [{"scenario": policy, **p} for policy, run in runs.items() for p in run.pop("pairs")],
        "scenarios": runs,
        "provenance": {"gpu": "NVIDIA H200", "torch": "2.11", "date": "2026", "command": "fake"},
    }
    if edit is not None:
        edit(data)
    path = folder / "small.json"
    text = json.dumps(data, indent=1) + "\n"
    path.write_text(text)
    sha = hashlib.sha256(text.encode()).hexdigest()
    (folder / "PROVENANCE.json").write_text(json.dumps({"small.json": {"sha256": sha}}))
    return path


def test_a_good_recording_passes(tmp_path):
    check_readwrite_recording(fake_recording(tmp_path))


def _flip_first(policy: str, key: str):
    def edit(data):
        next(p for p in data["pairs"] if p["scenario"] == policy)[key] ^= True

    return edit


@pytest.mark.parametrize(
    "edit",
    [
        _flip_first("pr", "readwrite_holds"),  # the stored verdict is not what the accesses give
        _flip_first("early_aux_shared", "lifetime_conflict"),  # the analyses disagree, and nothing explains it
        _flip_first("early_aux_shared", "agree"),
        lambda data: data["scenarios"]["pr"]["equivalence"][0].update(bit_exact=False),
        lambda data: data.update(obligation="something else"),
        lambda data: data["scenarios"]["early_aux_shared"].update(accesses=data["scenarios"]["pr"]["accesses"]),
    ],
)
def test_a_broken_recording_fails(tmp_path, edit):
    with pytest.raises(AssertionError):
        check_readwrite_recording(fake_recording(tmp_path, edit))


def test_a_file_that_is_no_recording_is_a_one_line_error(tmp_path):
    path = fake_recording(tmp_path, lambda data: data.update(pairs=[{"scenario": "pr"}]))
    with pytest.raises(KitError, match="not a read/write recording") as e:
        load_recording("small", path)
    assert "\n" not in str(e.value)
    changed = fake_recording(tmp_path)
    changed.write_text(changed.read_text().replace('"fake"', '"other"'))
    with pytest.raises(AssertionError, match="another file"):
        check_readwrite_recording(changed)


def test_the_summary_counts_only_the_dispatchable_pairings():
    """A pairing vLLM's dispatch never makes neither counts nor fails the obligation in the summary."""
    from kit.recordings import RECORDINGS

    def pair(policy: str, dispatchable: bool, holds: bool) -> dict:
        return {"scenario": policy, "dispatchable": dispatchable, "readwrite_holds": holds}

    pairs = [pair("pr", True, True), pair("pr", False, False), pair("pr", False, True)]
    pairs += [pair("early_aux_shared", True, False), pair("early_aux_shared", False, False)]
    data = {"pairs": [{**p, "agree": True, "agree_trace_only": False} for p in pairs]}
    pr, shared = summary_lines(data)
    assert pr == (
        "pr: obligation holds on 1 of 1 dispatchable pairings; the lifetime analysis agrees on 3 of 3 pairings "
        "with the breaks' reads, 0 from the trace alone"
    )
    assert shared.startswith("early_aux_shared: obligation VIOLATED on ") and " of 1 dispatchable pairings; " in shared
    # "VIOLATED on N of M" counts the pairings that violate it, not those that hold
    mixed = [pair("early_aux_shared", True, ok) for ok in (False, True, True, True)]
    (line,) = summary_lines({"pairs": [{**p, "agree": True, "agree_trace_only": False} for p in mixed]})
    assert "obligation VIOLATED on 1 of 4 dispatchable pairings" in line
    # the shipped recording: 11 of its 18 pairings per policy are dispatchable; the lines its PROVENANCE.json recorded
    folder = RECORDINGS / "readwrite"
    recorded = json.loads((folder / "PROVENANCE.json").read_text())["small.json"]["agreement"]
    assert summary_lines(load_recording("small", folder / "small.json")) == recorded
    assert all(" of 11 dispatchable pairings;" in line for line in recorded)


@pytest.mark.parametrize("preset", ["small", "large"])
def test_the_shipped_recording(preset):
    from kit.recordings import RECORDINGS
    from tests.test_safety_recording import early_aux_differs, unattributed

    path = RECORDINGS / "readwrite" / f"{preset}.json"
    check_readwrite_recording(path, preset)
    pairs = load_recording(preset, path)["pairs"]

    def flagged(policy: str, key: str, bad: bool) -> set:
        return {(r["model_size"], r["replay_size"]) for r in pairs if r["scenario"] == policy and bool(r[key]) == bad}

    # The obligation fails exactly where graphs differ from eager in the adversarial pairings, and the
    # lifetime analysis with the breaks' reads agrees; from the trace alone it also flags the PR's
    # pairings over the hyper-connection inputs, which the break reads and nothing reads after it.
    differs = early_aux_differs(preset)  # measured: the pairings whose graphs differed from eager on the H200
    # Where the model graph differs with its own replay graph alone, an adversary's R is not shown to be the cause
    # or not: those pairings are compared nowhere (at the large preset the analyses clear some of them, flag others).
    unknown = unattributed(preset)
    assert differs and flagged("early_aux_shared", "readwrite_holds", False) - unknown == differs
    assert flagged("early_aux_shared", "lifetime_conflict", True) - unknown == differs
    for policy in ("pr", "unpatched"):
        assert flagged(policy, "readwrite_holds", False) == set() == flagged(policy, "lifetime_conflict", True)
    assert flagged("pr", "trace_only_conflict", True) > set() and all(
        r["explanation_trace_only"] for r in pairs if r["scenario"] == "pr" and r["trace_only_conflict"]
    )


@pytest.mark.parametrize("preset", ["h200-default", "gb200-default"])
def test_the_shipped_recordings_at_vllms_default_presets(preset):
    from kit.recordings import RECORDINGS

    if owed(f"readwrite/{preset}.json"):
        return
    path = RECORDINGS / "readwrite" / f"{preset}.json"
    if preset == "h200-default":  # no model graph breaks out: nothing to pair
        data = load_recording(preset, path)
        assert not any(p["dispatchable"] for p in data["pairs"])
        assert summary_lines(data) == [
            summary_lines({**data, "pairs": []})[0] + " (4896 stress pairings recorded, none claimed)"
        ]
        assert summary_lines(data)[0].startswith("no pairings: every model graph")
        return
    check_readwrite_recording(path, preset)

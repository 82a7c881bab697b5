"""Alternative (a)'s own lifetime argument on the CPU: hand-built accesses and traces, then the H200 recording.

The drafter (the speculator's graphs) runs after the target forward in the same step. Under
share_all its graphs share the model graphs' stream and may allocate over the target's outputs;
the read/write analysis (`kit.analysis.readwrite.drafter_table`) and the lifetime analysis
(`kit.analysis.liveness.drafter_liveness_table`) say whether anything reads those outputs after
the drafter. The live run is tests/gpu/test_drafter_live.py; the last section reads the shipped
recording (`kit/recordings/drafter/small.json`) and runs both analyses on it again.
"""

from __future__ import annotations

import pandas as pd
import pytest

from kit.analysis.liveness import (
    GRAPH_OUTPUT,
    READ_AFTER,
    READ_BEFORE,
    drafter_liveness_table,
    drafter_liveness_verdicts,
)
from kit.analysis.readwrite import (
    AFTER,
    BEFORE,
    DRAFTER_OBLIGATION,
    READ,
    WRITE,
    Access,
    Ranges,
    ReadWriteRecording,
    drafter_graph,
    drafter_summary,
    drafter_table,
    drafter_verdicts,
    model_outputs,
    model_segment,
    read_step_reads,
    step_after_drafter,
    step_before_drafter,
    step_read_entries,
)
from kit.errors import KitError
from kit.experiments import drafter_run
from kit.experiments.alternatives import result

from .test_liveness import KIB, Trace

OUT, MID, STATIC = 0x1000, 0x2000, 0x9000  # the target's output, an intermediate, a static buffer outside the pool


class Accesses:
    """Accesses in order: `read(phase, start, end, op)`, `write(...)`; `recording()`."""

    def __init__(self) -> None:
        self.items: list[Access] = []

    def add(self, kind: str, phase, start: int, end: int, op: str) -> Accesses:
        self.items.append(Access(len(self.items), phase, op, kind, start, end))
        return self

    def read(self, phase, start: int, end: int, op: str = "aten.mm") -> Accesses:
        return self.add(READ, phase, start, end, op)

    def write(self, phase, start: int, end: int, op: str = "aten.mm") -> Accesses:
        return self.add(WRITE, phase, start, end, op)

    def recording(self) -> ReadWriteRecording:
        return ReadWriteRecording(self.items)


def _step(*, drafter_writes: tuple[int, int], read_after: list[tuple[int, int]] = ()) -> Accesses:
    """Model graph 64 writes its output OUT..+0x100 and MID; the sampler reads OUT; drafter 64 writes; then reads."""
    a = Accesses()
    a.write(model_segment(64), OUT, OUT + 0x100, "aten.add")
    a.write(model_segment(64), MID, MID + 0x100, "aten.mul")
    a.read(model_outputs(64), OUT, OUT + 0x100, "the forward's caller")
    a.write(drafter_graph(64), *drafter_writes, op="aten.bmm")
    a.read(drafter_graph(64), STATIC, STATIC + 0x40, "aten.bmm")
    a.read(step_before_drafter(64), OUT, OUT + 0x100, "aten.clone")
    a.write(step_before_drafter(64), STATIC, STATIC + 0x40, "aten.copy_")
    for start, end in read_after:
        a.read(step_after_drafter(64), start, end, "aten.sum")
    return a


def test_the_drafter_overwriting_outputs_read_before_it_holds():
    table = drafter_table(_step(drafter_writes=(OUT, OUT + 0x80)).recording())
    row = table.iloc[0]
    assert row["holds"] and row["outputs_overwritten_bytes"] == 0x80 and row["overlap_bytes"] == 0
    assert row["read_before_bytes"] == 0x100 and row["read_after_bytes"] == 0
    assert table.attrs["obligation"] == DRAFTER_OBLIGATION
    assert "holds" in drafter_verdicts(table)[0] and "Holds for all 1" in drafter_summary(table)


def test_a_read_of_the_outputs_after_the_drafter_is_a_violation_with_its_bytes_and_ops():
    table = drafter_table(_step(drafter_writes=(OUT + 0x40, OUT + 0xC0), read_after=[(OUT, OUT + 0x100)]).recording())
    row = table.iloc[0]
    assert not row["holds"] and row["overlap_bytes"] == 0x80 and int(row["first_overlap"]) == OUT + 0x40
    assert row["reading_ops"] == ["aten.sum"] and row["writing_ops"] == ["aten.bmm"]
    assert "VIOLATED" in drafter_verdicts(table)[0] and "Violated in 1 of 1" in drafter_summary(table)


def test_reads_after_the_drafter_of_bytes_the_model_did_not_write_or_the_step_wrote_first_are_not_carried():
    a = _step(drafter_writes=(OUT, OUT + 0x100), read_after=[(STATIC, STATIC + 0x40)])
    a.write(step_after_drafter(64), OUT, OUT + 0x20, "aten.copy_").read(step_after_drafter(64), OUT, OUT + 0x20)
    row = drafter_table(a.recording()).iloc[0]
    assert row["holds"] and row["read_after_bytes"] == 0


def test_can_run_limits_the_verdicts_to_the_speculators_dispatch():
    a = _step(drafter_writes=(OUT, OUT + 0x80), read_after=[(OUT, OUT + 0x100)])
    a.write(drafter_graph(128), MID + 0x1000, MID + 0x1100)
    table = drafter_table(a.recording(), can_run=lambda m, d: d == 128)
    assert table.set_index("drafter_size")["holds"].to_dict() == {64: False, 128: True}
    assert len(drafter_verdicts(table)) == 1 and "Holds for all 1" in drafter_summary(table)


def test_step_reads_round_trip_through_the_snapshots_kit_key():
    a = _step(drafter_writes=(OUT, OUT + 0x80), read_after=[(MID, MID + 0x10)])
    entries = step_read_entries(a.recording(), {64: "model graphs 64"})
    before, after = read_step_reads(entries)["model graphs 64"]
    assert before == Ranges([(OUT, OUT + 0x100)]) and after == Ranges([(MID, MID + 0x10)])
    with pytest.raises(KitError, match="no model graph of size 64"):
        step_read_entries(a.recording(), {})
    assert entries[0][BEFORE] and entries[0][AFTER]


# --- lifetimes: what the forward leaves, and the drafter's captures over it -----------------------

POOL_BASE = 0x1000_0000
O1, O2, I1, X = (POOL_BASE + i * 64 * KIB for i in range(4))


def _forward_and_drafter(t: Trace, drafter_over: int) -> None:
    """Model graph 64: outputs O1, O2 (dropped after the capture), intermediate I1; a drafter capture over a block."""
    begin = t.now
    t.segment(POOL_BASE)
    for addr in (O1, I1):
        t.alloc(addr)
    t.graph("model graphs 64", "model graphs", 64, 0, begin)
    begin = t.now
    t.free(I1)
    t.alloc(O2)
    t.free(O1)  # the forward has returned; the capture keeps weak references: its outputs are freed inside it
    t.free(O2)
    t.graph("model graphs 64", "model graphs", 64, 1, begin)
    begin = t.now
    t.alloc(drafter_over, where="draft")
    t.free(drafter_over)
    t.graph("DFlash speculator graphs 64", "DFlash speculator graphs", 64, 0, begin)


def _rows(found) -> dict[int, pd.Series]:
    return {row["addr"]: row for _, row in found.rows.iterrows()}


def test_the_outputs_are_the_blocks_alive_after_the_forwards_last_allocation():
    t = Trace()
    _forward_and_drafter(t, X)
    found = drafter_liveness_table(t.snapshot())
    assert set(_rows(found)) == {O1, O2}  # I1 was freed inside the forward
    assert found.model_captures == ["model graphs 64"] and found.drafter_captures == ["DFlash speculator graphs 64"]
    assert not found.rows["drafter_overlaps"].any() and "no drafter graph allocates over" in found.verdicts()[0]


def test_from_the_trace_alone_an_output_the_drafter_allocates_over_is_a_conflict():
    t = Trace()
    _forward_and_drafter(t, O2)
    found = drafter_liveness_table(t.snapshot())
    rows = _rows(found)
    assert rows[O2]["class"] == GRAPH_OUTPUT and rows[O2]["conflict"] and not rows[O1]["conflict"]
    assert "CONFLICT" in drafter_liveness_verdicts(found)[0]


@pytest.mark.parametrize(("reads", "cls", "conflict"), [("before", READ_BEFORE, False), ("after", READ_AFTER, True)])
def test_with_the_steps_reads_the_output_is_safe_only_when_read_before_the_drafter(reads, cls, conflict):
    t = Trace()
    _forward_and_drafter(t, O2)
    span = Ranges([(O2, O2 + 64 * KIB)])
    step = {"model graphs 64": (span, Ranges()) if reads == "before" else (Ranges(), span)}
    found = drafter_liveness_table(t.snapshot(), step_reads=step)
    row = _rows(found)[O2]
    assert row["class"] == cls and row["conflict"] == conflict
    assert ("CONFLICT" in found.verdicts()[0]) == conflict


def test_the_steps_reads_come_from_the_snapshots_kit_key():
    t = Trace()
    _forward_and_drafter(t, O2)
    raw = t.snapshot()
    raw["kit"]["step_reads"] = [{"capture": "model graphs 64", BEFORE: [[O2, O2 + 64]], AFTER: []}]
    found = drafter_liveness_table(raw)
    assert found.step_reads_known and _rows(found)[O2]["class"] == READ_BEFORE


# --- the H200 recording --------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["small", "large"])
def recording(request) -> dict:
    return drafter_run.load_recording(request.param)


def _pairs(data: dict, scenario: str) -> pd.DataFrame:
    return pd.DataFrame([p for p in data["pairs"] if p["scenario"] == scenario])


def test_under_share_all_the_drafter_overwrites_the_targets_outputs_and_the_obligation_holds(recording):
    share = _pairs(recording, "share_all")
    running = share[share["dispatchable"]]
    # At most one drafter graph per model graph: the one its step dispatches to (none above the largest).
    assert not running.empty and running.groupby("model_size").size().max() == 1
    # Every model graph is paired, whole ones (below the trim threshold: no break) too.
    assert set(share["model_size"]) == set(recording["scenarios"]["share_all"]["config"]["cudagraph_capture_sizes"])
    assert running["readwrite_holds"].all() and (running["outputs_overwritten_bytes"] > 0).any()
    assert not running["lifetime_conflict"].any() and share["agree"].all()
    # From the trace alone, every overwritten output is flagged: the step's reads are what clears it.
    flagged = share[share["trace_only_conflict"]]
    assert set(flagged.index) == set(share[share["outputs_overwritten_bytes"] > 0].index)
    assert flagged["explanation_trace_only"].str.contains("weak references").all()


def test_under_the_pr_the_drafter_never_touches_the_targets_outputs(recording):
    pr = _pairs(recording, "pr")
    assert (pr["outputs_overwritten_bytes"] == 0).all() and pr["readwrite_holds"].all()
    assert not pr["trace_only_conflict"].any() and pr["agree"].all() and pr["agree_trace_only"].all()
    streams = recording["scenarios"]["pr"]["capture_streams"]
    assert streams["DFlash speculator graphs"] != streams["model graphs"]
    shared = recording["scenarios"]["share_all"]["capture_streams"]
    assert shared["DFlash speculator graphs"] == shared["model graphs"]


@pytest.mark.parametrize("scenario", drafter_run.DRAFTER_SCENARIOS)
def test_the_read_write_analysis_run_again_on_the_recorded_accesses_gives_the_recorded_pairs(recording, scenario):
    run = recording["scenarios"][scenario]
    table = drafter_table(run["accesses"])
    by_pair = table.set_index(["model_size", "drafter_size"])
    for p in [p for p in recording["pairs"] if p["scenario"] == scenario]:
        row = by_pair.loc[(p["model_size"], p["drafter_size"])]
        assert bool(row["holds"]) == p["readwrite_holds"]
        assert int(row["outputs_overwritten_bytes"]) == p["outputs_overwritten_bytes"]
        assert int(row["read_before_bytes"]) == p["read_before_bytes"] > 0


@pytest.mark.parametrize("scenario", drafter_run.DRAFTER_SCENARIOS)
def test_the_lifetime_analysis_run_again_on_the_recorded_snapshot_gives_the_recorded_verdicts(recording, scenario):
    run = recording["scenarios"][scenario]
    assert drafter_liveness_verdicts(drafter_liveness_table(run["snapshot"])) == run["lifetime_verdicts"]
    raw = run["snapshot"]
    trace_only = {**raw, "kit": {k: v for k, v in raw["kit"].items() if k != "step_reads"}}
    assert drafter_liveness_verdicts(drafter_liveness_table(trace_only)) == run["trace_only_verdicts"]


def test_the_model_graphs_obligation_holds_on_the_same_run(recording):
    for scenario in drafter_run.DRAFTER_SCENARIOS:
        pairs = pd.DataFrame(recording["scenarios"][scenario]["model_graphs"]["pairs"])
        assert pairs[pairs["dispatchable"]]["readwrite_holds"].all()


def test_share_alls_verdict_is_backed_by_both_drafter_analyses(recording):
    preset = recording["preset"]
    data = drafter_run.load_alternatives(preset)
    entry = data["share_all"]
    assert entry["drafter_analyses"]["safe"] and entry["graphs_vs_eager"]["safe"] and entry["safe"]
    assert "drafter read/write obligation holds" in entry["evidence"]
    assert "lifetime analysis with the step's reads: no conflict" in entry["evidence"]
    assert "drafter_analyses" not in result.load_graphs_vs_eager(preset)["share_all"]  # graphs vs eager alone
    # A violated drafter obligation makes share_all unsafe, whatever graphs vs eager said.
    broken = {**recording, "pairs": [{**p, "readwrite_holds": False} for p in recording["pairs"]]}
    fresh = drafter_run.load_alternatives(preset)
    drafter_run.with_drafter_analyses(fresh, broken)
    assert not fresh["share_all"]["safe"] and "VIOLATED" in fresh["share_all"]["evidence"]


def test_a_missing_drafter_recording_is_one_line(tmp_path):
    with pytest.raises(KitError, match="no drafter read/write recording"):
        drafter_run.load_recording("small", tmp_path / "small.json")
    (tmp_path / "bad.json").write_text('{"pairs": []}')
    with pytest.raises(KitError, match="not a drafter read/write recording"):
        drafter_run.load_recording("small", tmp_path / "bad.json")


def test_the_drafter_summary_counts_the_pairings_that_violate_the_obligation():
    def pair(holds: bool) -> dict:
        return {
            "scenario": "share_all",
            "dispatchable": True,
            "readwrite_holds": holds,
            "outputs_overwritten_bytes": 1,
            "agree": True,
            "agree_trace_only": False,
        }

    (line,) = drafter_run.summary_lines({"scenarios": ["share_all"], "pairs": [pair(False), pair(True), pair(True)]})
    assert "drafter obligation VIOLATED on 1 of 3 dispatchable pairings" in line
    (line,) = drafter_run.summary_lines({"scenarios": ["share_all"], "pairs": [pair(True), pair(True)]})
    assert "drafter obligation holds on 2 of 2 dispatchable pairings" in line

"""The liveness analysis across the eager break: on the H200 replica recordings, and on hand-built traces.

It reads frames in one line (`kit.analysis.frames`) and graph outputs against eager (`kit.analysis.equivalence`)."""

from __future__ import annotations

import copy

import pandas as pd
import pytest

from kit import Equivalence, KitError, format_bytes, liveness_table
from kit.analysis.liveness import BREAK_INPUT, HELD, RELEASED, Liveness, break_allocations, liveness_verdicts
from kit.analysis.trace.walk import walk_trace

from .helpers import FIXTURES, KIB, segment

SCENARIOS = [
    "small_patched", "small_unpatched", "small_early_aux_pr", "small_early_aux_shared", "small_early_aux_shared_flat",
]  # fmt: skip
POOL = (0, 1)
STREAM = 7


def _fixture(name: str):
    from kit import load_snapshot

    return load_snapshot(FIXTURES / "replica" / f"{name}.pickle")


def _replay_shares_the_model_stream(snap) -> bool:
    streams = {c["manager"]: c["stream"] for c in snap.kit["captures"]}
    return streams["replay graphs"] == streams["model graphs"]


def _hidden_state_bytes(snap, tokens: int) -> int:
    config = snap.kit["scenario"]["config"]
    assert config["dtype"] == "bfloat16"
    return tokens * config["hidden_size"] * 2


def _aux_handed_out_weak(snap) -> bool:
    """The flat return: each aux a top-level output, weak-referenced by the wrapper, its block free after capture.
    V4.1's nested `(hidden_states, aux_list)` keeps every aux block allocated (vLLM's `weak_ref_tensors`)."""
    return snap.kit["scenario"]["config"]["aux_return"] == "flat"


def _early_aux_layers(snap) -> list[int]:
    config = snap.kit["scenario"]["config"]
    return [i for i in config["aux_hidden_state_layers"] if i < config["decoder_replay_start"]]


# --- the recordings -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCENARIOS)
def test_conflict_exactly_when_early_aux_shares_the_model_stream(name):
    snap = _fixture(name)
    liveness = liveness_table(snap)
    table = liveness.rows
    expected = (
        snap.kit["scenario"]["has_early_aux"] and _replay_shares_the_model_stream(snap) and _aux_handed_out_weak(snap)
    )
    assert table["conflict"].any() == expected
    verdicts = liveness_verdicts(liveness)
    assert verdicts == liveness.verdicts()
    assert len(verdicts) == len({c["capture"] for c in snap.kit["captures"] if c["manager"] == "model graphs"})
    assert all(("CONFLICT" in v) == expected for v in verdicts)
    assert all((": safe: " in v) != expected for v in verdicts)


@pytest.mark.parametrize("name", SCENARIOS)
def test_each_break_holds_its_input_and_the_early_aux_states(name):
    snap = _fixture(name)
    table = liveness_table(snap).rows
    assert set(table["capture_size"]) == set(snap.kit["scenario"]["config"]["cudagraph_capture_sizes"])
    for size, rows in table.groupby("capture_size"):
        hidden = _hidden_state_bytes(snap, size)
        # one break, one argument: the hidden states it gathers, freed as the forward rebinds
        # the name when the break returns (the recorder keeps no frame's locals alive)
        released = rows[rows["class"] == RELEASED]
        assert released["bytes"].tolist() == [hidden]
        held = rows[rows["class"] == HELD]
        assert held["bytes"].tolist() == [hidden] * len(_early_aux_layers(snap))
        # produced before the break's input, kept until the capture's end (flat), or for good (nested)
        assert (held["alloc_index"] < released["alloc_index"].iloc[0]).all()
        if _aux_handed_out_weak(snap):
            assert (held["free_index"] > held["break_end"]).all()
        else:
            assert held["free_index"].isna().all()
    assert not (table["class"] == BREAK_INPUT).any()  # the fallback for recordings that keep locals alive


def test_the_conflict_is_the_early_aux_state_and_names_its_bytes():
    snap = _fixture("small_early_aux_shared_flat")
    liveness = liveness_table(snap)
    table = liveness.rows
    bad = table[table["conflict"]]
    assert (bad["class"] == HELD).all()
    assert all(names for names in bad["replay_in_break"])
    for line, (capture, rows) in zip(liveness_verdicts(liveness), table.groupby("capture", sort=False), strict=True):
        conflict = rows[rows["conflict"]]
        assert line.startswith(f"{capture}: CONFLICT: {format_bytes(conflict['bytes'].sum())}")
        assert f"{conflict['addr'].iloc[0]:#x}" in line


def test_pairing_each_break_with_its_replay_graph_predicts_the_sizes_that_differ_from_eager():
    from kit.experiments.dispatch import dispatch_replay_size
    from kit.replica.model import PRESETS, replay_rows

    snap = _fixture("small_early_aux_shared_flat")
    sizes = PRESETS["small"].decoder_replay_cudagraph_capture_sizes
    # the replica's default step: its last N/2 rows, padded to vLLM's replay size
    table = liveness_table(snap, replay_size_for=lambda n: dispatch_replay_size(replay_rows(n), sizes)).rows
    equivalence = Equivalence(pd.DataFrame(snap.kit["equivalence"]))
    assert not equivalence.bit_exact and equivalence.max_abs_diff > 0
    differs = equivalence.rows[~equivalence.rows["bit_exact"]]
    assert set(table[table["conflict"]]["capture_size"]) == set(differs["size"])
    assert set(differs["output"]) == {f"aux_hidden_state[{i}]" for i in _early_aux_layers(snap)}
    # the conservative reading (any replay graph may run in any break) flags every model capture
    assert set(liveness_table(snap).rows[lambda t: t["conflict"]]["capture_size"]) == set(table["capture_size"])


@pytest.mark.parametrize("name", ["small_patched", "small_unpatched", "small_early_aux_pr", "small_early_aux_shared"])
def test_the_safe_recordings_are_bit_exact(name):
    assert Equivalence(pd.DataFrame(_fixture(name).kit["equivalence"])).bit_exact


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_eager_break_allocates_outside_the_graph_pool(name):
    table = break_allocations(_fixture(name))
    assert len(table) == 3 and (table["allocs"] > 0).all()
    assert table["outside_pool"].all() and (table["pool_allocs"] == 0).all()


def test_shared_stream_replay_graphs_reuse_the_break_input_only_when_they_share():
    shared = liveness_table(_fixture("small_patched")).rows
    separate = liveness_table(_fixture("small_unpatched")).rows
    assert shared["overlapping_replay"].map(bool).any()
    assert not separate["overlapping_replay"].map(bool).any()


def test_without_recorded_windows_they_are_inferred_and_without_captures_a_one_line_error():
    from kit.allocator.simulator import simulate
    from kit.allocator.workload import parse_workload

    raw = copy.deepcopy(_fixture("small_patched").raw)
    raw["kit"].pop("captures")
    found = liveness_table(raw)
    assert "inferred" in found.source and found.model_captures  # the model graphs' stream, around its breaks
    assert len(break_allocations(raw)) > 0
    ops = [{"op": "alloc", "id": f"t{i}", "bytes": 4 << 20} for i in range(3)] + [{"op": "free", "id": "t0"}]
    eager_only = simulate(parse_workload({"version": 1, "ops": ops})).snapshot()
    for analysis in (liveness_table, liveness_verdicts, break_allocations):
        with pytest.raises(KitError) as e:
            analysis(eager_only)
        assert "no captures" in str(e.value) and "\n" not in str(e.value)


def test_without_a_trace_a_one_line_error():
    raw = copy.deepcopy(_fixture("small_patched").raw)
    raw["device_traces"] = [[]]
    with pytest.raises(KitError, match="no trace recorded"):
        liveness_table(raw)


# --- hand-built traces ----------------------------------------------------------------------------


class Trace:
    """A trace built event by event; `snapshot()` adds the final segments that it leaves behind."""

    def __init__(self) -> None:
        self.entries: list[dict] = []
        self.segments: dict[int, tuple[int, tuple[int, int]]] = {}
        self.live: dict[int, int] = {}
        self.captures: list[dict] = []

    @property
    def now(self) -> int:
        return len(self.entries)

    def _entry(self, action: str, addr: int, size: int, where: str = "forward") -> None:
        frames = [
            {"filename": "/x/torch/nn/modules/module.py", "line": 1, "name": "_call_impl"},
            {"filename": "/x/model.py", "line": 10, "name": where},
        ]
        self.entries.append({"action": action, "addr": addr, "size": size, "stream": STREAM, "frames": frames})

    def segment(self, addr: int, size: int = 2048 * KIB, pool=POOL) -> None:
        self._entry("segment_alloc", addr, size)
        self.segments[addr] = (size, pool)

    def alloc(self, addr: int, size: int = 64 * KIB, where: str = "forward") -> None:
        self._entry("alloc", addr, size, where)
        self.live[addr] = size

    def free(self, addr: int) -> None:
        size = self.live.pop(addr)
        self._entry("free_requested", addr, size)
        self._entry("free_completed", addr, size)

    def graph(self, capture: str, manager: str, size: int, index: int, begin: int, pool=POOL) -> None:
        self.captures.append(
            {
                "graph": f"{capture} graph {index}",
                "capture": capture,
                "manager": manager,
                "size": size,
                "index": index,
                "stream": STREAM,
                "pool": list(pool),
                "trace_begin": begin,
                "trace_end": self.now,
            }
        )

    def snapshot(self) -> dict:
        segments = []
        for addr, (size, pool) in sorted(self.segments.items()):
            blocks, cursor = [], addr
            for start in sorted(a for a in self.live if addr <= a < addr + size):
                if start > cursor:
                    blocks.append((start - cursor, "inactive"))
                blocks.append((self.live[start], "active_allocated"))
                cursor = start + self.live[start]
            if cursor < addr + size:
                blocks.append((addr + size - cursor, "inactive"))
            segments.append(segment(addr, blocks, stream=STREAM, pool=pool))
        return {"segments": segments, "device_traces": [self.entries], "kit": {"captures": self.captures}}


GRAPH_POOL, EAGER = 0x1000_0000, 0x2000_0000
A, B, C, D, E, F = (GRAPH_POOL + i * 64 * KIB for i in range(6))


def _model_capture(t: Trace, *, b_late: bool = False, in_break: bool = False) -> None:
    """One breakable capture of size 64: five blocks before its break, one after.

    A is held after the break (freed after the next segment's first allocation), E too
    (never freed); B is freed as the break returns (or, with `b_late`, just after that
    first allocation); C is freed before the break, D inside it.
    """
    t.segment(EAGER, pool=(0, 0))
    begin = t.now
    t.segment(GRAPH_POOL)
    for addr in (A, B, C, D, E):
        t.alloc(addr)
    t.free(C)
    t.graph("model graphs 64", "model graphs", 64, 0, begin)
    t.alloc(EAGER, where="gather")  # the break: it allocates in the default pool
    t.free(D)
    if in_break:
        t.alloc(F, where="oops")
        t.free(F)
    t.free(EAGER)
    begin = t.now
    if not b_late:
        t.free(B)
    t.alloc(C, where="next segment")
    if b_late:
        t.free(B)
    t.free(A)
    t.free(C)
    t.graph("model graphs 64", "model graphs", 64, 1, begin)


def _replay_capture(t: Trace, size: int, addrs: list[tuple[int, int]]) -> None:
    begin = t.now
    for addr, nbytes in addrs:
        t.alloc(addr, nbytes, where="replay")
    for addr, _ in addrs:
        t.free(addr)
    t.graph(f"replay graphs {size}", "replay graphs", size, 0, begin)


def _by_addr(liveness: Liveness) -> dict[int, pd.Series]:
    return {row["addr"]: row for _, row in liveness.rows.iterrows()}


def test_synthetic_trace_replays_to_its_own_snapshot():
    t = Trace()
    _model_capture(t)
    _replay_capture(t, 32, [(A, 64 * KIB)])
    assert walk_trace(t.snapshot()).mismatches == []


def test_classes_on_either_side_of_the_next_segments_first_allocation():
    t = Trace()
    _model_capture(t)
    rows = _by_addr(liveness_table(t.snapshot()))
    assert set(rows) == {A, B, D, E}  # C was freed before the break
    assert rows[A]["class"] == HELD and rows[A]["free_index"] > rows[A]["break_end"]
    assert rows[B]["class"] == RELEASED and rows[B]["free_index"] >= rows[B]["break_end"]
    assert rows[D]["class"] == RELEASED and rows[D]["break_begin"] <= rows[D]["free_index"] < rows[D]["break_end"]
    assert rows[E]["class"] == HELD and pd.isna(rows[E]["free_index"])
    assert rows[A]["alloc_frame"] == "forward (model.py:10)"  # torch's own frames skipped

    late = Trace()
    _model_capture(late, b_late=True)  # B now freed just after the next segment's first allocation
    rows = _by_addr(liveness_table(late.snapshot()))
    assert rows[B]["class"] == HELD and rows[D]["class"] == RELEASED


def _capture_around_a_break(t: Trace, in_break) -> None:
    """A capture of two graphs; A is allocated before the break and freed after the next graph's first allocation,
    B before the break and freed by `in_break(t)`, which runs first in the break and may return after C's
    allocation (the next graph's first) has run."""
    t.segment(GRAPH_POOL)
    for addr in (A, B):
        t.alloc(addr)
    t.graph("model graphs 64", "model graphs", 64, 0, 0)
    begin = in_break(t)
    t.free(A)
    t.free(C)
    t.graph("model graphs 64", "model graphs", 64, 1, begin)


def test_a_block_freed_by_the_breaks_first_entry_is_held_across_it_and_released_by_it():
    def free_b_at_once(t: Trace) -> int:
        t.free(B)
        begin = t.now
        t.alloc(C)
        return begin

    t = Trace()
    _capture_around_a_break(t, free_b_at_once)
    assert walk_trace(t.snapshot()).mismatches == []
    rows = _by_addr(liveness_table(t.snapshot()))
    assert set(rows) == {A, B}
    assert rows[B]["free_index"] == rows[B]["break_begin"] == 3 and rows[B]["class"] == RELEASED
    assert rows[A]["class"] == HELD


def test_a_block_is_freed_when_its_free_is_requested_not_when_it_completes():
    """free_requested in the break, free_completed (its stream's work done) after the next graph's first allocation."""

    def request_then_complete_later(t: Trace) -> int:
        t._entry("free_requested", B, 64 * KIB)
        begin = t.now
        t.alloc(C)
        t._entry("free_completed", B, t.live.pop(B))
        return begin

    t = Trace()
    _capture_around_a_break(t, request_then_complete_later)
    assert walk_trace(t.snapshot()).mismatches == []
    rows = _by_addr(liveness_table(t.snapshot()))
    assert rows[B]["free_index"] == 3 and t.entries[3]["action"] == "free_requested"
    assert rows[B]["class"] == RELEASED and rows[A]["class"] == HELD


def _kept_bound_capture(t: Trace) -> None:
    """A break that releases nothing: A, B and D are held across it and freed only as the forward returns.

    As in DeepSeek-V4.1's forward, B and D go into the break (the hidden states' companions,
    `residual` and `post_mix`) and stay bound; A is an early aux state, read after the break.
    """
    t.segment(GRAPH_POOL)
    for addr in (A, B, D):
        t.alloc(addr)
    t.graph("model graphs 64", "model graphs", 64, 0, 0)
    begin = t.now
    t.alloc(C)
    for addr in (B, D, A, C):
        t.free(addr)
    t.graph("model graphs 64", "model graphs", 64, 1, begin)


def test_without_the_breaks_reads_no_held_block_is_taken_for_a_break_input():
    t = Trace()
    _kept_bound_capture(t)
    found = liveness_table(t.snapshot())
    assert not found.break_reads_known
    assert {addr: row["class"] for addr, row in _by_addr(found).items()} == {A: HELD, B: HELD, D: HELD}


def test_several_break_inputs_are_the_blocks_the_break_read():
    t = Trace()
    _kept_bound_capture(t)
    _replay_capture(t, 32, [(B, 64 * KIB), (D, 64 * KIB)])  # over both break inputs, not over A
    snap = t.snapshot()
    reads = {("model graphs 64", 0): [(B, B + 64 * KIB), (D + 8 * KIB, D + 16 * KIB), (F, F + KIB)]}
    found = liveness_table(snap, break_reads=reads)
    rows = _by_addr(found)
    assert found.break_reads_known
    assert rows[B]["class"] == rows[D]["class"] == BREAK_INPUT and rows[A]["class"] == HELD  # a part read is enough
    assert rows[B]["overlapping_replay"] == ["replay graphs 32"] and not rows[B]["conflict"] and not rows[D]["conflict"]
    assert liveness_verdicts(found)[0].startswith("model graphs 64: safe:")
    # from the trace alone both break inputs count as held, and the replay graph over them is a conflict
    alone = liveness_table(snap)
    assert _by_addr(alone)[B]["conflict"] and _by_addr(alone)[D]["conflict"]
    assert "the breaks' reads unrecorded" in liveness_verdicts(alone)[0]
    # a replay allocation over the early aux state (A) is still a conflict with the reads known
    t2 = Trace()
    _kept_bound_capture(t2)
    _replay_capture(t2, 32, [(A, 64 * KIB)])
    assert _by_addr(liveness_table(t2.snapshot(), break_reads=reads))[A]["conflict"]


def test_the_breaks_reads_come_from_the_snapshots_kit_key():
    from kit.analysis.readwrite import Access, ReadWriteRecording, attach_break_reads, model_break

    t = Trace()
    _kept_bound_capture(t)
    recording = ReadWriteRecording(
        [Access(0, model_break(64), "aten.index_select.default", "read", start, start + 64 * KIB) for start in (B, D)]
    )
    snap = attach_break_reads(t.snapshot(), recording)
    assert snap["kit"]["break_reads"] == [
        {"capture": "model graphs 64", "break": 0, "ranges": [[B, B + 64 * KIB], [D, D + 64 * KIB]]}
    ]
    found = liveness_table(snap)
    assert found.break_reads_known
    assert {addr: row["class"] for addr, row in _by_addr(found).items()} == {A: HELD, B: BREAK_INPUT, D: BREAK_INPUT}
    # an explicit mapping wins over the snapshot's
    assert _by_addr(liveness_table(snap, break_reads={}))[B]["class"] == HELD


def test_a_replay_allocation_over_a_held_block_is_a_conflict_and_over_a_released_one_is_not():
    t = Trace()
    _model_capture(t)
    _replay_capture(t, 32, [(A + 32 * KIB, 32 * KIB), (B, 64 * KIB)])  # over A's second half, and over B
    table = liveness_table(t.snapshot())
    rows = _by_addr(table)
    assert rows[A]["conflict"] and rows[A]["overlapping_replay"] == ["replay graphs 32"]
    assert rows[B]["overlapping_replay"] == ["replay graphs 32"] and not rows[B]["conflict"]
    assert not rows[E]["overlapping_replay"]
    (verdict,) = liveness_verdicts(table)
    assert verdict.startswith(f"model graphs 64: CONFLICT: {format_bytes(64 * KIB)} in 1 block(s)")
    assert f"{A:#x}" in verdict and "replay graphs 32" in verdict


def test_an_adjacent_replay_allocation_does_not_overlap():
    t = Trace()
    _model_capture(t)
    _replay_capture(t, 32, [(F, 64 * KIB)])  # F starts where E ends
    rows = _by_addr(liveness_table(t.snapshot()))
    assert not rows[E]["overlapping_replay"] and not rows[E]["conflict"]
    assert liveness_verdicts(t.snapshot())[0].startswith("model graphs 64: safe:")


def test_replay_size_for_keeps_only_the_replay_graph_that_runs_in_the_break():
    t = Trace()
    _model_capture(t)
    _replay_capture(t, 32, [(C, 64 * KIB)])
    _replay_capture(t, 16, [(A, 64 * KIB)])
    snap = t.snapshot()
    assert _by_addr(liveness_table(snap))[A]["conflict"]  # any replay graph may run in the break
    paired = liveness_table(snap, replay_size_for=lambda n: n // 2)
    row = _by_addr(paired)[A]
    assert row["overlapping_replay"] == ["replay graphs 16"] and row["replay_in_break"] == [] and not row["conflict"]
    assert "reused only by replay graphs 16, which does not run in this break" in liveness_verdicts(paired)[0]
    assert _by_addr(liveness_table(snap, replay_size_for=lambda n: n // 4))[A]["conflict"]


def test_a_break_that_allocates_in_the_graph_pool_fails_the_outside_pool_check():
    clean, dirty = Trace(), Trace()
    _model_capture(clean)
    _model_capture(dirty, in_break=True)
    ok, bad = break_allocations(clean.snapshot()).iloc[0], break_allocations(dirty.snapshot()).iloc[0]
    assert ok["outside_pool"] and ok["allocs"] == 1 and ok["pool_allocs"] == 0
    assert not bad["outside_pool"] and bad["pool_allocs"] == 1 and bad["pool_bytes"] == 64 * KIB

"""Capture windows inferred from a plain trace (`kit.analysis.attribution`), on traces built here entry by entry.

A window is a run of one stream's allocations into one graph pool, from its
first allocation (or the segment made for it) to just after its last; two
windows of one stream and pool are one capture's graphs around an eager break
only when no other stream allocates into a graph pool between them and no
`empty_cache` frees a segment there: from the entry right after the first
window (issue 39: an `empty_cache` there used to be missed) to the entry right
before the second. The shipped recordings' inferred windows are checked in
`test_plain_snapshots.py`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kit.allocator.simulator import simulate
from kit.allocator.workload import parse_workload
from kit.analysis.attribution import (
    SEGMENT_FREE,
    capture_attribution,
    capture_table,
    capture_windows,
    infer_capture_windows,
)
from kit.analysis.trace.walk import walk_trace
from kit.load.snapshot import Snapshot, load_snapshot

from .helpers import KIB, MIB, segment

MODEL, OTHER = 7, 9  # streams
EAGER, POOL_1, POOL_2 = 0x1000_0000, 0x2000_0000, 0x3000_0000  # segments: default pool, graph pools (0, 1), (0, 2)


def two_pools_and_eager() -> list[dict]:
    """The hand-built traces' segments: one eager, one in graph pool (0, 1) on MODEL, one in (0, 2) on OTHER."""
    return [
        segment(EAGER, [(2 * MIB, "inactive")], stream=MODEL),
        segment(POOL_1, [(2 * MIB, "inactive")], stream=MODEL, pool=(0, 1)),
        segment(POOL_2, [(2 * MIB, "inactive")], stream=OTHER, pool=(0, 2)),
    ]


def _snapshot(other_between: bool) -> Snapshot:
    """MODEL captures two graphs into pool (0, 1) around an eager break; OTHER allocates once into pool (0, 2),
    right after MODEL's first graph (`other_between`) or after both."""
    trace = []

    def entry(action: str, addr: int, size: int, stream: int) -> None:
        frames = [{"filename": "/x/model.py", "line": 10 + len(trace), "name": "forward"}]
        trace.append({"action": action, "addr": addr, "size": size, "stream": stream, "frames": frames})

    def other() -> None:
        entry("alloc", POOL_2, 64 * KIB, OTHER)

    entry("segment_alloc", EAGER, 2 * MIB, MODEL)  # 0
    entry("segment_alloc", POOL_2, 2 * MIB, OTHER)  # 1
    entry("segment_alloc", POOL_1, 2 * MIB, MODEL)  # 2: the first graph's window begins with its segment
    entry("alloc", POOL_1, 64 * KIB, MODEL)  # 3
    entry("alloc", POOL_1 + 64 * KIB, 64 * KIB, MODEL)  # 4: its last allocation; the window ends at 5
    if other_between:
        other()  # 5: the entry right after the window
    entry("alloc", EAGER, 64 * KIB, MODEL)  # the eager break, in the default pool
    entry("alloc", POOL_1 + 128 * KIB, 64 * KIB, MODEL)  # the second graph
    if not other_between:
        other()
    for addr, stream in ((POOL_1, MODEL), (POOL_1 + 64 * KIB, MODEL), (EAGER, MODEL), (POOL_1 + 128 * KIB, MODEL)):
        entry("free_requested", addr, 64 * KIB, stream)
        entry("free_completed", addr, 64 * KIB, stream)
    entry("free_requested", POOL_2, 64 * KIB, OTHER)
    entry("free_completed", POOL_2, 64 * KIB, OTHER)
    segments = two_pools_and_eager()
    return Snapshot({"segments": segments, "device_traces": [trace]}, origin="hand-built")


def _windows(snap: Snapshot) -> list[tuple]:
    return [(w["trace_begin"], w["trace_end"], w["stream"], w["capture"], w["index"]) for w in capture_windows(snap)]


def test_a_window_ends_just_after_its_last_allocation_and_holds_every_one_of_its_run():
    snap = _snapshot(other_between=False)
    assert walk_trace(snap).mismatches == []
    (first, second, other) = _windows(snap)
    assert first[:2] == (2, 5) and second[:2] == (6, 7) and other[:2] == (7, 8)
    # no other stream allocated into a graph pool between MODEL's two graphs: one capture around its break
    assert (first[3], first[4]) == (second[3], 0) and second[4] == 1
    allocs = walk_trace(snap).allocs
    in_pool = allocs[allocs["pool"].map(lambda p: tuple(p) != (0, 0))]
    for index, stream in zip(in_pool["index"], in_pool["stream"], strict=True):
        assert [w for w in _windows(snap) if w[0] <= index < w[1] and w[2] == stream], index


def test_another_streams_graph_pool_allocation_right_after_a_window_starts_another_capture():
    snap = _snapshot(other_between=True)
    assert walk_trace(snap).mismatches == []
    first, other, second = _windows(snap)
    assert first[:3] == (2, 5, MODEL) and other[:3] == (5, 6, OTHER) and second[:3] == (7, 8, MODEL)
    assert first[3] != second[3] and first[4] == second[4] == 0  # two captures, each of one graph


# --- what parts two windows: the entries from just after the first to just before the second ------------------

EAGER_2 = 0x4000_0000  # a default-pool segment `empty_cache` releases


def _parted_snapshot(what: str, where: str) -> Snapshot:
    """MODEL's two graphs into pool (0, 1) around an eager break, with one `what` entry ("segment_free": an
    `empty_cache` releasing EAGER_2; "other": OTHER allocating into pool (0, 2)) at `where`:
    "inside_first" (before the first window's last allocation), "at_low" (the entry right after the first
    window), "before_high" (the entry right before the second window) or "inside_second"."""
    trace = []

    def entry(action: str, addr: int, size: int, stream: int) -> None:
        frames = [{"filename": "/x/model.py", "line": 10 + len(trace), "name": "forward"}]
        trace.append({"action": action, "addr": addr, "size": size, "stream": stream, "frames": frames})

    def maybe(place: str) -> None:
        if place == where and what == "segment_free":
            entry("segment_free", EAGER_2, 2 * MIB, MODEL)
        elif place == where:
            entry("alloc", POOL_2, 64 * KIB, OTHER)

    entry("segment_alloc", EAGER, 2 * MIB, MODEL)
    entry("segment_alloc", EAGER_2, 2 * MIB, MODEL)
    entry("segment_alloc", POOL_2, 2 * MIB, OTHER)
    entry("segment_alloc", POOL_1, 2 * MIB, MODEL)
    entry("alloc", POOL_1, 64 * KIB, MODEL)
    maybe("inside_first")
    entry("alloc", POOL_1 + 64 * KIB, 64 * KIB, MODEL)  # the first window's last allocation
    maybe("at_low")
    entry("alloc", EAGER, 64 * KIB, MODEL)  # the eager break
    maybe("before_high")
    entry("alloc", POOL_1 + 128 * KIB, 64 * KIB, MODEL)  # the second window's first allocation
    maybe("inside_second")
    entry("alloc", POOL_1 + 192 * KIB, 64 * KIB, MODEL)
    for addr in (POOL_1, POOL_1 + 64 * KIB, EAGER, POOL_1 + 128 * KIB, POOL_1 + 192 * KIB):
        entry("free_requested", addr, 64 * KIB, MODEL)
        entry("free_completed", addr, 64 * KIB, MODEL)
    if what == "other" and where != "nowhere":
        entry("free_requested", POOL_2, 64 * KIB, OTHER)
        entry("free_completed", POOL_2, 64 * KIB, OTHER)
    segments = two_pools_and_eager()
    if what == "other" or where == "nowhere":
        segments.append(segment(EAGER_2, [(2 * MIB, "inactive")], stream=MODEL))  # not released
    return Snapshot({"segments": segments, "device_traces": [trace]}, origin="hand-built")


@pytest.mark.parametrize("what", ["segment_free", "other"])
@pytest.mark.parametrize(
    ("where", "captures"),
    [("nowhere", 1), ("inside_first", 1), ("at_low", 2), ("before_high", 2), ("inside_second", 1)],
)
def test_only_an_entry_between_two_windows_parts_them_into_two_captures(what, where, captures):
    snap = _parted_snapshot(what, where)
    assert walk_trace(snap).mismatches == []
    model = [w for w in _windows(snap) if w[2] == MODEL]
    assert len(model) == 2
    assert len({w[3] for w in model}) == captures, (what, where)
    assert [w[4] for w in model] == ([0, 1] if captures == 1 else [0, 0])


def test_an_empty_cache_right_after_a_capture_parts_it_from_the_next():
    """Issue 39's workload: capture 1, `empty_cache` (its segment_free the entry right after the window), an eager
    allocation on the capturing stream, capture 2 into the same pool."""
    ops = [
        {"op": "alloc", "id": "x", "bytes": MIB, "stream": "default"},
        {"op": "free", "id": "x"},
        {"op": "capture_begin", "graph": "g1", "pool": "P", "stream": "s"},
        {"op": "alloc", "id": "a1", "bytes": MIB // 2, "stream": "s"},
        {"op": "capture_end", "graph": "g1"},
        {"op": "empty_cache"},
        {"op": "alloc", "id": "e", "bytes": MIB // 2, "stream": "s"},
        {"op": "capture_begin", "graph": "g2", "pool": "P", "stream": "s"},
        {"op": "alloc", "id": "a2", "bytes": MIB // 2, "stream": "s"},
        {"op": "capture_end", "graph": "g2"},
    ]
    raw = simulate(parse_workload({"version": 1, "ops": ops})).snapshot()
    del raw["kit"]["graphs"]  # a plain snapshot: the windows are inferred
    snap = Snapshot(raw, origin="issue 39")
    windows = infer_capture_windows(snap)
    first, second = windows
    assert snap.trace_columns[0].action[first["trace_end"]] == SEGMENT_FREE  # the entry right after the window
    assert first["capture"] != second["capture"] and first["index"] == second["index"] == 0


# --- what a window takes (issue 36: another stream's eager allocations; captures that added nothing) ---------

RECORDINGS = Path(__file__).resolve().parents[1] / "kit" / "recordings"


def test_an_inferred_window_never_takes_another_streams_eager_allocations():
    snap = load_snapshot(RECORDINGS / "plain" / "replay_graphs_separate.pickle")  # H200, no recorded windows
    made = walk_trace(snap).new_segments
    windows = capture_windows(snap)
    assert windows and all(w["inferred"] for w in windows)
    eager = [  # the default stream's own segments, made while a capture ran: the case the window used to take
        (i, w["graph"])
        for w in windows
        for i, pool, stream in zip(made["index"], made["pool"], made["stream"], strict=True)
        if w["trace_begin"] <= i < w["trace_end"] and tuple(pool) == (0, 0) and stream != w["stream"]
    ]
    assert len(eager) == 4
    taken = capture_attribution(snap)
    assert set(taken["pool_label"]) == {"graph pool 1"} and set(taken["stream"]) == {w["stream"] for w in windows}
    table = capture_table(snap)
    assert list(table["break_segment_bytes"]) == [0, 0]  # one graph each: no eager break to have added anything


def test_every_capture_is_listed_so_their_numbers_have_no_gaps():
    snap = load_snapshot(RECORDINGS / "merged" / "merged_200.pickle")
    taken = capture_attribution(snap)
    numbers: dict[str, set[int]] = {}
    for graph in taken["graph"]:
        found = re.match(r"(.+) capture (\d+) on ", graph)
        numbers.setdefault(found.group(1), set()).add(int(found.group(2)))
    assert numbers["p0"] == set(range(1, 16))  # 15 captures into p0, several of which added no segment
    assert all(n == set(range(1, len(n) + 1)) for n in numbers.values())
    assert (taken["bytes"] == 0).sum() >= 5
    assert set(taken["graph"]) == {w["graph"] for w in capture_windows(snap)}


def test_vllms_model_graphs_break_once_and_its_replay_graphs_never():
    """On vLLM's own capture path (the H200 recording): each model graph is two graphs around one eager break (the
    replay layers), each replay graph one graph."""
    from kit.recordings import recording

    table = capture_table(load_snapshot(recording("vllm/unpatched.pickle")))
    by_manager = {
        m: set(zip(rows["graphs"], rows["eager_breaks"], strict=True)) for m, rows in table.groupby("manager")
    }
    assert by_manager == {"model graphs": {(2, 1)}, "decoder replay graphs": {(1, 0)}}

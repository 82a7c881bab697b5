"""Capture windows inferred from a plain trace (`kit.analysis.attribution`), on traces built here entry by entry.

A window is a run of one stream's allocations into one graph pool, from its
first allocation (or the segment made for it) to just after its last; two
windows of one stream and pool are one capture's graphs around an eager break
only when no other stream allocates into a graph pool between them. The
shipped recordings' inferred windows are checked in `test_plain_snapshots.py`.
"""

from __future__ import annotations

from kit.analysis.attribution import capture_windows
from kit.analysis.trace.walk import walk_trace
from kit.load.snapshot import Snapshot

from .helpers import KIB, MIB, segment

MODEL, OTHER = 7, 9  # streams
EAGER, POOL_1, POOL_2 = 0x1000_0000, 0x2000_0000, 0x3000_0000  # segments: default pool, graph pools (0, 1), (0, 2)


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
    segments = [
        segment(EAGER, [(2 * MIB, "inactive")], stream=MODEL),
        segment(POOL_1, [(2 * MIB, "inactive")], stream=MODEL, pool=(0, 1)),
        segment(POOL_2, [(2 * MIB, "inactive")], stream=OTHER, pool=(0, 2)),
    ]
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

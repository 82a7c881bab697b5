"""`replay_trace`: how each allocation of a snapshot's trace was served, by the fastest walk that can tell.

The walk on the snapshot's columns (`kit.analysis.trace.columnar`) handles
every trace but one of expandable segments, which the walk entry by entry
(`kit.analysis.trace.rows`) handles; both return the same `TraceReplay`.
"""

from __future__ import annotations

from kit.analysis.trace.columnar import replay_columns
from kit.analysis.trace.rows import replay_rows
from kit.analysis.trace.state import TraceReplay
from kit.load.snapshot import Snapshot, load_snapshot


def replay_trace(snapshot: Snapshot | str | dict, device: int = 0) -> TraceReplay:
    """Walk the snapshot's trace from its rewound start; classify every alloc.

    `allocs` has one row per alloc; its `frames` is the trace entry's own
    list of stack frames, shared with the snapshot. The walk runs on the
    snapshot's columns, except over expandable segments.
    """
    snap = load_snapshot(snapshot)
    replay = replay_columns(snap, device)
    return replay if replay is not None else replay_rows(snap, device)

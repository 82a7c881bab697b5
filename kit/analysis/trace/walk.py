"""`walk_trace`: how each allocation of a snapshot's trace was served, by the fastest walk that can tell.

The walk on the snapshot's columns (`kit.analysis.trace.columnar`) handles
every trace but one of expandable segments, which the walk entry by entry
(`kit.analysis.trace.rows`) handles; both return the same `TraceWalk`.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

from kit.analysis.trace.columnar import walk_columns
from kit.analysis.trace.rows import walk_rows
from kit.analysis.trace.state import TraceWalk
from kit.load.snapshot import Snapshot, load_snapshot

# A snapshot is read-only once loaded, so its walk is kept while the snapshot lives:
# the tables, verdicts, attribution and what-if of one snapshot walk it once.
_WALKS: WeakKeyDictionary[Snapshot, dict[int, TraceWalk]] = WeakKeyDictionary()


def walk_trace(snapshot: Snapshot | str | dict, device: int = 0) -> TraceWalk:
    """Walk the snapshot's trace from its rewound start; classify every alloc.

    `allocs` has one row per alloc; its `frames` is the trace entry's own
    list of stack frames, shared with the snapshot. The walk runs on the
    snapshot's columns, except over expandable segments.
    """
    snap = load_snapshot(snapshot)
    walks = _WALKS.setdefault(snap, {})
    if device not in walks:
        walk = walk_columns(snap, device)
        walks[device] = walk if walk is not None else walk_rows(snap, device)
    return walks[device]

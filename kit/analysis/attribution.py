"""Which capture added which memory: capture windows set against the trace walk.

The capture recorder (`kit.record.recorder`) writes, into a snapshot's `kit`
key, one window (a range of trace indices) per CUDA graph, named by the
capture it belongs to ("model graphs 512") and its place in it (0, then 1
after the first eager break). A plain snapshot has no such key, so
`capture_windows` infers them: during a capture every allocation on the
capturing stream (and on streams forked from it) lands in the graph's pool,
so a window is a run of one stream's allocations into one graph pool, from
the first to the last. Windows of one stream and pool with only that
stream's allocations elsewhere between them (no other graph-pool allocation,
no `empty_cache`) are taken as one capture's graphs around an eager break.
Inferred windows carry `"inferred": True`, and a table made from them says so
in `attrs["inferred"]`; they cannot tell two graphs captured back to back on
one stream into one pool apart.

`capture_table` gives one row per capture, `capture_attribution` one row per
(graph, pool, stream) with the segments each graph's window added, and one
row of 0 for a graph that added none (so captures read 1, 2, 3, not 1, 4).
A window takes only what its capture made: segments of its pool (streams
forked from the capture allocate there too) or of its own stream, never the
eager segments another stream made while it ran.
`captures_by_name` and `is_replay_capture` are how every other analysis reads
the windows.

`checked_capture_windows` is the one check of the recorded windows, shared by
every reader (the analyses here, liveness, the what-if's workload, the
report, and the `table`, `reuse` and `check` commands, which refuse a
malformed window before anything else): each window's fields
(`kit.load.rows.capture_window`: types, a name, `trace_begin <= trace_end`,
no negative index), then the window against the snapshot: it may not end
past the trace, and its pool must be a graph pool the snapshot knows (a
segment's, one the trace allocated into, or one its `kit` key names). A
malformed window raises a one-line `KitError` (the command line exits 2).
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np
import pandas as pd

from kit.allocator.rules import DEFAULT_POOL
from kit.analysis.names import pool_labels, stream_labels
from kit.analysis.tables import pool_label
from kit.analysis.trace.walk import walk_trace
from kit.errors import KitError
from kit.load.rows import TRACE_ACTIONS, is_pool
from kit.load.snapshot import Snapshot, load_snapshot

INFERRED = "inferred capture"  # the manager of an inferred window
SEGMENT_ALLOC = TRACE_ACTIONS.index("segment_alloc")
SEGMENT_FREE = TRACE_ACTIONS.index("segment_free")


def is_replay_capture(manager: str) -> bool:
    """Whether a capture's manager is one of the decoder replay graphs (the replica's or vLLM's)."""
    return "replay" in manager


def capture_windows(snapshot: Snapshot | str | dict) -> list[dict]:
    """The snapshot's capture windows: the recorder's (checked), or inferred from the trace when there are none."""
    snap = load_snapshot(snapshot)
    recorded = checked_capture_windows(snap)
    if recorded or not snap.has_trace:
        return recorded
    return infer_capture_windows(snap)


def checked_capture_windows(snapshot: Snapshot | str | dict) -> list[dict]:
    """The windows the snapshot's `kit` key records, each checked on its own and against the snapshot.

    Raises a one-line `KitError` for a malformed one: a field of the wrong
    type, an end before its begin (`Snapshot.captures`), an end past the
    trace (where there is one), or a pool that is the default pool or one the
    snapshot does not know (no segment of it, no allocation into it in the
    trace, no name for it in the `kit` key).
    """
    snap = load_snapshot(snapshot)
    windows = snap.captures
    if not windows:
        return windows
    length = max(len(columns) for columns in snap.trace_columns.values()) if snap.has_trace else None
    known, walked = _pools_named(snap), False
    for i, window in enumerate(windows):
        where = f"{snap.origin}: capture window {i}"
        if length is not None and window["trace_end"] > length:
            raise KitError(
                f"{where}: ends at trace index {window['trace_end']}, past the trace's {length} entries "
                "(a window written for another trace)"
            )
        pool = tuple(window["pool"])
        if pool == DEFAULT_POOL:
            raise KitError(f"{where}: its pool is the default pool (0, 0), which no graph is captured into")
        if pool not in known and not walked:  # the trace's pools, walked only when the rest do not name it
            known, walked = known | _pools_allocated(snap), True
        if pool not in known:
            raise KitError(
                f"{where}: pool {pool} is not in the snapshot (no segment of it, no allocation into it in "
                "the trace, no name for it in the kit key)"
            )
    return windows


def _pools_named(snap: Snapshot) -> set[tuple]:
    """The pools of the final segments and those the `kit` key names (its `pools` and `graphs`)."""
    known = set(snap.columns.pools())
    known |= set(snap.pool_names.values())
    graphs = snap.kit.get("graphs")
    if isinstance(graphs, dict):
        known |= {(p[0], p[1]) for p in graphs.values() if is_pool(p)}
    return known


def _pools_allocated(snap: Snapshot) -> set[tuple]:
    """The pools the trace walks allocated into, on every device with a trace (only asked when needed)."""
    if not snap.has_trace:
        return set()
    known: set[tuple] = set()
    for device, columns in snap.trace_columns.items():
        if len(columns) >= 2:
            walk = walk_trace(snap, device)
            known |= {tuple(p) for p in walk.allocs["pool"]} | {tuple(p) for p in walk.new_segments["pool"]}
    return known


def infer_capture_windows(snapshot: Snapshot, device: int = 0) -> list[dict]:
    """Windows from the trace alone: each run of one stream's allocations into one graph pool, in trace order."""
    allocs = walk_trace(snapshot, device).allocs
    if allocs.empty:
        return []
    streams = allocs["stream"].to_numpy()
    index = allocs["index"].to_numpy()
    codes, pools = pd.factorize(allocs["pool"].to_numpy())  # the pools as small numbers: a million rows, few pools
    pools = [tuple(p) for p in pools]
    labels, pool_names = stream_labels(snapshot), pool_labels(snapshot)
    in_graph_pool = codes != pools.index(DEFAULT_POOL) if DEFAULT_POOL in pools else np.ones(len(codes), dtype=bool)
    actions = snapshot.trace_columns[device].action
    between = _Between(index[in_graph_pool], streams[in_graph_pool], np.flatnonzero(actions == SEGMENT_FREE))
    counts: dict[tuple, int] = {}
    last: dict[tuple, dict] = {}  # (stream, pool) -> its latest window
    out = []
    for begin, end, stream, pool in sorted(_runs(streams, codes, index, pools)):
        if begin and actions[begin - 1] == SEGMENT_ALLOC:
            begin -= 1  # the segment made for the window's first allocation is the window's
        before = last.get((stream, pool))
        if before is not None and between.one_capture(before["trace_end"], begin, stream):
            window = {**before, "index": before["index"] + 1}
        else:
            counts[pool] = counts.get(pool, 0) + 1
            name = f"{pool_names.get(pool, pool_label(pool))} capture {counts[pool]} on {labels.get(stream, stream)}"
            window = {"capture": name, "manager": INFERRED, "size": None, "index": 0, "stream": int(stream)}
            window["pool"] = list(pool)
        window.update(graph=f"{window['capture']} graph {window['index']}", trace_begin=int(begin))
        window.update(trace_end=int(end), inferred=True)
        last[(stream, pool)] = window
        out.append(window)
    return out


def _runs(streams: np.ndarray, codes: np.ndarray, index: np.ndarray, pools: list[tuple]) -> list[tuple]:
    """`(first index, last index + 1, stream, pool)` of each run of one stream's allocations into one graph pool.

    A stream's run goes on while its allocations stay in one pool, whatever
    other streams allocate meanwhile: the rows are taken stream by stream, in
    their order, and a run ends where the stream or the pool changes.
    """
    order = np.argsort(streams, kind="stable")
    stream, code = streams[order], codes[order]
    starts = np.flatnonzero(np.concatenate(([True], (stream[1:] != stream[:-1]) | (code[1:] != code[:-1]))))
    ends = np.append(starts[1:], len(order)) - 1
    runs = zip(
        index[order[starts]].tolist(),
        index[order[ends]].tolist(),
        stream[starts].tolist(),
        code[starts].tolist(),
        strict=True,
    )
    return [(first, last + 1, s, pools[c]) for first, last, s, c in runs if pools[c] != DEFAULT_POOL]


class _Between:
    """What happened in the trace between two windows: graph-pool allocations (by stream) and segment frees."""

    def __init__(self, index: np.ndarray, streams: np.ndarray, frees: np.ndarray) -> None:
        order = np.argsort(index, kind="stable")
        self.index, self.streams, self.frees = index[order], streams[order], frees

    def one_capture(self, low: int, high: int, stream: int) -> bool:
        """Whether a window from `high` continues the capture of one on `stream` that ended at `low`.

        Between two graphs of one capture only the eager break runs: nothing
        else allocates into a graph pool, and no `empty_cache` (which each
        `torch.cuda.graph` runs as it begins) frees a segment.
        """
        if np.searchsorted(self.frees, low) < np.searchsorted(self.frees, high):
            return False
        lo, hi = np.searchsorted(self.index, low), np.searchsorted(self.index, high)
        return not (self.streams[lo:hi] != stream).any()


def captures_by_name(snapshot: Snapshot) -> dict[str, list[dict]]:
    """The snapshot's capture windows grouped by capture, each capture's graphs in order, captures as recorded."""
    out: dict[str, list[dict]] = {}
    for window in capture_windows(snapshot):
        out.setdefault(window.get("capture", window["graph"]), []).append(window)
    return {name: sorted(gs, key=lambda g: (g.get("index", 0), g["trace_begin"])) for name, gs in out.items()}


def capture_table(snapshot: Snapshot) -> pd.DataFrame:
    """Per recorded capture: manager, size, stream, pool, graphs, eager breaks, and the segments it added.

    `new_segment_bytes` are the segments its graphs added to its pool;
    `break_segment_bytes` those its eager breaks added elsewhere (the breaks
    run outside the capture, so outside the graph pool).
    """
    captures = captures_by_name(snapshot)
    made = _Made(walk_trace(snapshot).new_segments) if captures else None
    labels = stream_labels(snapshot)
    pools = pool_labels(snapshot)
    rows = []
    for name, mine in captures.items():
        first, last, pool = mine[0], mine[-1], tuple(mine[0]["pool"])
        inside = made.by({**first, "trace_end": last["trace_end"]})
        in_pool = [size for p, _, size in inside if p == pool]
        rows.append(
            {
                "manager": first.get("manager", name),
                "size": first.get("size"),
                "stream": first["stream"],
                "stream_label": labels.get(first["stream"], str(first["stream"])),
                "pool": pool,
                "pool_label": pools.get(pool, pool_label(pool)),
                "graphs": len(mine),
                "eager_breaks": len(mine) - 1,
                "new_segments": len(in_pool),
                "new_segment_bytes": sum(in_pool),
                "break_segment_bytes": sum(size for _, _, size in inside) - sum(in_pool),
                "trace_begin": first["trace_begin"],
                "trace_end": last["trace_end"],
            }
        )
    columns = ["manager", "size", "stream", "stream_label", "pool", "pool_label", "graphs", "eager_breaks"]
    columns += ["new_segments", "new_segment_bytes", "break_segment_bytes", "trace_begin", "trace_end"]
    table = pd.DataFrame(rows, columns=columns)
    table.attrs["inferred"] = _inferred(snapshot)
    table.attrs["source"] = snapshot.source_label + (
        ", capture windows inferred from the trace" if table.attrs["inferred"] else ""
    )
    table.attrs["byte_columns"] = ["new_segment_bytes", "break_segment_bytes"]
    return table


def _inferred(snapshot: Snapshot) -> bool:
    return not snapshot.captures and snapshot.has_trace


def capture_attribution(snapshot: Snapshot | str | dict, windows: list[dict] | None = None) -> pd.DataFrame:
    """Segments and bytes each capture added, per (pool, stream) group; a capture that added none, one row of 0.

    `windows` are dicts with `graph`, `trace_begin` and `trace_end` (trace
    indices); by default the snapshot's own, or inferred (`capture_windows`).
    A window with a `pool` and `stream` takes only what its capture made
    (`_Made.by`), not what other streams allocated eagerly meanwhile.
    """
    snap = load_snapshot(snapshot)
    inferred = windows is None and _inferred(snap)
    windows = windows if windows is not None else capture_windows(snap)
    made = _Made(walk_trace(snap).new_segments)
    labels = stream_labels(snap)
    pools = pool_labels(snap)
    rows = []
    for w in windows:
        groups: dict[tuple, list[int]] = {}
        for pool, stream, size in made.by(w):
            group = groups.setdefault((pool, stream), [0, 0])
            group[0] += 1
            group[1] += size
        if not groups and "pool" in w and "stream" in w:  # a capture that added nothing is listed all the same
            groups[tuple(w["pool"]), int(w["stream"])] = [0, 0]
        for (pool, stream), (segments, size) in sorted(groups.items()):
            rows.append(
                {
                    "graph": w["graph"],
                    "pool": pool,
                    "stream": stream,
                    "pool_label": pools.get(pool, pool_label(pool)),
                    "stream_label": labels.get(stream, str(stream)),
                    "segments": segments,
                    "bytes": size,
                }
            )
    table = pd.DataFrame(rows, columns=["graph", "pool", "stream", "pool_label", "stream_label", "segments", "bytes"])
    table.attrs["source"] = snap.source_label + (", capture windows inferred from the trace" if inferred else "")
    table.attrs["inferred"] = inferred
    return table


class _Made:
    """The segments a trace walk saw made, in trace order, to cut each capture window out of by bisection."""

    def __init__(self, made: pd.DataFrame) -> None:
        order = np.argsort(made["index"].to_numpy(), kind="stable").tolist()
        index, pool = made["index"].tolist(), made["pool"].tolist()
        stream, size = made["stream"].tolist(), made["size"].tolist()
        self.index = [int(index[i]) for i in order]
        self.made = [(tuple(pool[i]), int(stream[i]), int(size[i])) for i in order]

    def by(self, window: dict) -> list[tuple[tuple[int, int], int, int]]:
        """(pool, stream, bytes) of each segment made within `window` that its capture made (`_takes`); a window
        that names no pool and stream (one a caller wrote) takes everything made within it."""
        lo = bisect_left(self.index, window["trace_begin"])
        hi = bisect_left(self.index, window["trace_end"])
        if "pool" not in window or "stream" not in window:
            return self.made[lo:hi]
        own = (tuple(window["pool"]), int(window["stream"]))
        return [m for m in self.made[lo:hi] if _takes(own, m[0], m[1])]


def _takes(own: tuple[tuple[int, int], int], pool: tuple[int, int], stream: int) -> bool:
    """Whether a segment made during a capture window is the capture's: in its pool (any stream: streams forked
    from the capture allocate there too) or on its own stream; another stream's eager segment is not."""
    return pool == own[0] or stream == own[1]


def replay_captures_added(snapshot: Snapshot | str | dict, pool: tuple[int, int]) -> pd.DataFrame:
    """What the replay captures added to `pool`, from the first replay graph's start to the last's end.

    One window over all of them, so what a break between two replay graphs
    added counts too; the captures the recorder wrote into the snapshot.
    """
    snap = load_snapshot(snapshot)
    replay = [c for c in checked_capture_windows(snap) if is_replay_capture(c.get("manager", ""))]
    window = [{**replay[0], "trace_end": replay[-1]["trace_end"]}] if replay else []
    added = capture_attribution(snap, window)
    return added[(added["pool"] == pool) & (added["bytes"] > 0)] if len(added) else added

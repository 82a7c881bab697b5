"""Reports from a trace walk: reuse per (pool, stream) group, and which memory a stream stranded.

`reuse_table` counts, per group, the allocations served from a cached block,
those that needed a new segment, and the bytes of new segments made while a
fitting free block sat in the same pool on another stream (stranded).

`stranding_report` says what happened, one verdict per group, from figures
taken at the moment each new segment was made (never from the end of the run):

- stranded: the bytes of new segments the group made while a fitting free
  block sat in the same pool on another stream at that moment (the walk's
  `served == "stranded"` allocations), the streams those blocks sat on, and
  how many of those very segments are still reserved at the end (segments
  made before the trace began are not counted);
- pending: the bytes of its new segments (stranded or not) made while a
  fitting block of the same pool was freed but still pending on
  `record_stream` (between its trace entries `free_requested` and
  `free_completed`), on any stream, its own included: memory the allocator
  could not hand out yet.

Groups whose new segments of either kind are below `min_bytes` are left out.
Graph pools' verdicts come first, largest first, then the default pool's:
a side stream's eager churn in the default pool is not what a graph capture
keeps, however large.

A verdict's figures are cumulative: the bytes cudaMalloc'ed in new segments
over the whole trace (churn), then how many of those segments are still
reserved at the end. Each verdict says why (a free block is handed only to
requests on the stream its segment was allocated on; a block freed after
`record_stream` waits for that stream's work) and what to do about it.
"""

from __future__ import annotations

from collections import Counter
from weakref import WeakKeyDictionary

import numpy as np
import pandas as pd

from kit.allocator.rules import DEFAULT_POOL, is_small_request, round_size, round_sizes
from kit.analysis.frames import user_frame_line
from kit.analysis.names import generated_labels, natural_order, pool_labels, stream_labels
from kit.analysis.trace.state import TraceWalk
from kit.analysis.trace.walk import walk_trace
from kit.load.columns import TraceColumns
from kit.load.rows import TRACE_ACTIONS
from kit.load.snapshot import Snapshot, load_snapshot
from kit.units import format_bytes

REUSE_COLUMNS = ("allocs", "reused", "new_segments", "new_segment_bytes", "stranded_bytes")
REPORT_COLUMNS = (
    "pool",
    "stream",
    "pool_label",
    "stream_label",
    "stranded_bytes",
    "still_reserved",
    "other_streams",
    "other_labels",
    "pending_bytes",
    "pending_still_reserved",
    "pending_streams",
    "frames",
    "verdict",
)
REPORT_BYTE_COLUMNS = ("stranded_bytes", "still_reserved", "pending_bytes", "pending_still_reserved")
MIN_BYTES = 1 << 20  # groups that made less than this are left out of the verdicts

_ALLOC, _FREE_REQUESTED, _FREE_COMPLETED, _SEGMENT_FREE, _SEGMENT_UNMAP = (
    TRACE_ACTIONS.index(a) for a in ("alloc", "free_requested", "free_completed", "segment_free", "segment_unmap")
)


def reuse_table(snapshot: Snapshot | str | dict, walk: TraceWalk | None = None) -> pd.DataFrame:
    """Per (pool, stream) group: allocs, reused, new segments, their bytes, and the stranded bytes.

    Pass `walk` (from `walk_trace` of the same snapshot) to skip walking the trace again.
    """
    snap = load_snapshot(snapshot)
    walk = walk or walk_trace(snap)
    a = walk.allocs
    a = a.assign(
        reused=a["served"] == "reused",
        new=a["served"] != "reused",
        new_bytes=a["segment_bytes"],
        stranded_bytes=a["segment_bytes"].where(a["served"] == "stranded", 0),
    )
    table = (
        a.groupby(["pool", "stream"], sort=True)
        .agg(
            allocs=("index", "size"),
            reused=("reused", "sum"),
            new_segments=("new", "sum"),
            new_segment_bytes=("new_bytes", "sum"),
            stranded_bytes=("stranded_bytes", "sum"),
        )
        .reset_index()
    )
    streams, pools = stream_labels(snap), pool_labels(snap)
    table["pool_label"] = [pools.get(tuple(p), str(tuple(p))) for p in table["pool"]]
    table["stream_label"] = [streams.get(s, str(s)) for s in table["stream"]]
    table = table.astype({c: "int64" for c in ("stream", *REUSE_COLUMNS)})
    table.attrs["source"] = snap.source_label
    made_up = generated_labels(snap)
    table.attrs["generated_labels"] = sorted(
        {x for x in (*table["pool_label"], *table["stream_label"]) if x in made_up}, key=natural_order
    )
    table.attrs["mismatches"] = walk.mismatches
    table.attrs["byte_columns"] = ("new_segment_bytes", "stranded_bytes")
    return table


def stranding_report(
    snapshot: Snapshot | str | dict, walk: TraceWalk | None = None, *, min_bytes: int = MIN_BYTES
) -> pd.DataFrame:
    """One verdict per (pool, stream) group that made new segments it need not have, largest first.

    Columns: `pool`, `stream`, `pool_label`, `stream_label`; `stranded_bytes`
    (new segments made while a fitting free block sat in the pool on another
    stream at that moment), `still_reserved` (of those segments, the bytes
    still in the final snapshot), `other_streams` (the streams those blocks sat
    on, ints) and `other_labels`; `pending_bytes` (its new segments, stranded
    ones included, made while a fitting block of the pool waited on
    `record_stream`), `pending_still_reserved`, `pending_streams` (the streams
    of the pending blocks); `frames` (the first stack frames of its first such
    allocation) and `verdict`, one line. Groups whose new segments of either
    kind come to less than `min_bytes` are left out; graph pools come first,
    each ordered by those bytes, largest first, then the default pool's
    groups, ordered alike. `attrs["source"]` names the data source.
    """
    snap = load_snapshot(snapshot)
    walk = walk or walk_trace(snap)
    rows = [row for either, row in _verdict_rows(snap, walk) if either >= min_bytes]
    table = pd.DataFrame(rows, columns=list(REPORT_COLUMNS))
    table = table.astype({c: "int64" for c in ("stream", *REPORT_BYTE_COLUMNS)})
    table.attrs["source"] = snap.source_label
    table.attrs["byte_columns"] = REPORT_BYTE_COLUMNS
    return table


_VERDICT_ROWS: WeakKeyDictionary = WeakKeyDictionary()  # snapshot -> (the walk, its rows): the report asks twice


def _verdict_rows(snap: Snapshot, walk: TraceWalk) -> list[tuple[int, dict]]:
    """Every group's verdict row with its bytes of new segments of either kind, in `stranding_report`'s order."""
    done = _VERDICT_ROWS.get(snap)
    if done is not None and done[0] is walk:
        return done[1]
    tc = snap.trace_columns[walk.device]
    a = walk.allocs
    new = a[a["segment_bytes"] > 0]
    kept = _kept_per_alloc(tc, new, walk.new_segments, _still_reserved(snap, tc, walk))
    waits = _pending_waits(snap, tc, a, new)
    labels = stream_labels(snap), pool_labels(snap)
    stranded = (new["served"] == "stranded").to_numpy()
    waited = np.isin(new["index"].to_numpy(), np.fromiter(waits, dtype=np.int64, count=len(waits)))
    columns = _VerdictColumns(new, stranded, waited, kept, waits)
    rows = [
        _verdict_row(columns, members, labels, snap.expandable)
        for members in _groups(new)
        if (stranded[members] | waited[members]).any()
    ]
    rows.sort(key=_verdict_order)
    _VERDICT_ROWS[snap] = (walk, rows)
    return rows


def _groups(new: pd.DataFrame) -> list[np.ndarray]:
    """The rows (positions) of each (pool, stream) group of `new`, groups in order, each group's rows in order."""
    group = new.groupby(["pool", "stream"], sort=True).ngroup().to_numpy()
    order = np.argsort(group, kind="stable")
    starts = np.flatnonzero(np.diff(group[order], prepend=-1))
    return np.split(order, starts[1:]) if len(order) else []


class _VerdictColumns:
    """The columns of the new-memory allocs a verdict row reads, as arrays (a group's rows: positions in them)."""

    def __init__(self, new: pd.DataFrame, stranded: np.ndarray, waited: np.ndarray, kept: np.ndarray, waits: dict):
        self.pool, self.stream = new["pool"].to_numpy(), new["stream"].to_numpy()
        self.index, self.frames = new["index"].to_numpy(), new["frames"].to_numpy()
        self.bytes, self.other_stream = new["segment_bytes"].to_numpy(), new["other_stream"].to_numpy()
        self.stranded, self.waited, self.kept, self.waits = stranded, waited, kept, waits


def _verdict_row(c: _VerdictColumns, members: np.ndarray, labels: tuple[dict, dict], expandable: bool) -> tuple:
    """One group's verdict row (`members`: its rows, in order, some stranded or pending) and its bytes of either."""
    streams, pools = labels
    stranded, pending = members[c.stranded[members]], members[c.waited[members]]
    pool, stream = tuple(c.pool[members[0]]), int(c.stream[members[0]])
    others = c.other_stream[stranded].tolist()
    row = {
        "pool": pool,
        "stream": stream,
        "pool_label": pools.get(pool, str(pool)),
        "stream_label": streams.get(stream, str(stream)),
        "stranded_bytes": int(c.bytes[stranded].sum()),
        "still_reserved": int(c.kept[stranded].sum()),
        "other_streams": sorted({int(s) for s in others}),
        "pending_bytes": int(c.bytes[pending].sum()),
        "pending_still_reserved": int(c.kept[pending].sum()),
        "pending_streams": sorted({s for i in c.index[pending].tolist() for s in c.waits[i]}),
        "frames": user_frame_line(c.frames[stranded[0] if stranded.size else pending[0]]),
    }
    row["other_labels"] = [streams.get(s, str(s)) for s in row["other_streams"]]
    target = _most_often(others) if others else None
    pending_labels = [streams.get(s, str(s)) for s in row["pending_streams"]]
    row["verdict"] = _verdict(row, pending_labels, target, streams.get(target, str(target)), expandable)
    either = int(c.bytes[members[c.stranded[members] | c.waited[members]]].sum())
    return either, row


def _most_often(values: list) -> int:
    """The value that comes most often (the least of those that tie), as an int."""
    counts = Counter(values)
    most = max(counts.values())
    return int(min(v for v, n in counts.items() if n == most))


def stranding_verdicts(snapshot: Snapshot | str | dict, *, min_bytes: int = MIN_BYTES) -> list[str]:
    """The one-line verdicts of `stranding_report`: graph pools first, largest first, then the default pool."""
    return list(stranding_report(snapshot, min_bytes=min_bytes)["verdict"])


def _verdict_order(item: tuple[int, dict]) -> tuple:
    """Graph pools before the default pool; within each, the most bytes of new segments first."""
    either, row = item
    return (row["pool"] == DEFAULT_POOL, -either, row["pool"], row["stream"])


WHY_STREAM = "a free block is handed only to requests on the stream its segment was allocated on"
EXPANDABLE_NOTE = (
    "recorded with expandable_segments:True: each (pool, stream) reserves one range that the allocator maps and "
    "unmaps page by page (2 MiB pages in the small pool, 20 MiB in the large); `table` lists each mapped run of a "
    "range as a segment, and `reuse` and `check` count each mapping (a range that grew) as a new segment"
)
WHY_PENDING = (
    "a block freed after record_stream is handed out only once the streams it was recorded on have reached its free"
)


def _verdict(
    row: dict, pending_labels: list[str], target: int | None, target_label: str, expandable: bool = False
) -> str:
    """`graph pool 1, stream of f (x.py:3): 20.00 MiB of new segments were cudaMalloc'ed over the trace ...`.

    The figures are cumulative (churn over the trace), then what is still
    reserved of it; then why, and what to do. `target`: the stream whose free
    blocks the group's stranded allocations would have fitted most often.
    """
    head = f"{row['pool_label']}, {row['stream_label']}: "
    waited = f"a fitting block waited on record_stream (freed but pending) on {', '.join(pending_labels)}"
    churn = (
        "of new pages were mapped over the trace (cumulative churn)"
        if expandable
        else "of new segments were cudaMalloc'ed over the trace (cumulative churn)"
    )
    if not row["stranded_bytes"]:
        return head + (
            f"{format_bytes(row['pending_bytes'])} {churn} while {waited}; "
            f"{format_bytes(row['pending_still_reserved'])} of them are still reserved at the end. "
            f"Why: {WHY_PENDING}. What to do: free the tensor once that stream's work is done (synchronize first) "
            "instead of record_stream, or reuse it across the steps"
        )
    text = (
        f"{format_bytes(row['stranded_bytes'])} {churn} while a fitting free block of this pool sat on "
        f"{', '.join(row['other_labels'])}; "
        f"{format_bytes(row['still_reserved'])} of them are still reserved at the end"
    )
    if row["pending_bytes"]:
        text += f"; {format_bytes(row['pending_bytes'])} of its new segments were made while {waited}"
    if row["pool"] == DEFAULT_POOL:
        fix = (
            f"only if this churn matters, run that eager work on {target_label}, whose free blocks would serve it; "
            "it is not graph-pool memory (`check` counts the default pool only with --pools all)"
        )
    else:
        move = map_argument(row["stream_label"], row["stream"], target_label, target)
        fix = (
            f"capture on the stream that already holds the pool's free blocks, {target_label} (pass that stream to "
            f"the graph capture); `python -m kit what-if SNAPSHOT --map {move}` predicts the saving"
        )
    return f"{head}{text}. Why: {WHY_STREAM}. What to do: {fix}"


def map_argument(source_label: str, source: int, target_label: str, target: int | None) -> str:
    """`FROM=TO` for `what-if --map`: by label as `table` prints it, or by id where a label would not parse."""
    if any(c in label for label in (source_label, target_label) for c in "='\"\\\n"):
        return f"{source}={target}"
    return f"'{source_label}={target_label}'"


def _kept_per_alloc(tc: TraceColumns, allocs: pd.DataFrame, new_segments: pd.DataFrame, kept: np.ndarray) -> np.ndarray:
    """Per row of `allocs` (allocs that needed new memory): the bytes of the segments made for it still kept at the end.

    As the walk counts `segment_bytes`: the segments made for an alloc are
    those made after the alloc before it whose range meets the alloc's rounded
    range; `kept` says, per row of `new_segments`, whether it is still reserved.
    """
    out = np.zeros(len(allocs), dtype=np.int64)
    if new_segments.empty or allocs.empty:
        return out
    every_alloc = np.flatnonzero(tc.action == _ALLOC)
    at = np.searchsorted(every_alloc, new_segments["index"].to_numpy(dtype=np.int64))
    has = at < every_alloc.size
    made = np.flatnonzero(has)  # rows of new_segments with an alloc after them
    alloc = every_alloc[at[made]]
    index = allocs["index"].to_numpy(dtype=np.int64)
    by_index = np.argsort(index, kind="stable")
    pos = np.minimum(np.searchsorted(index, alloc, sorter=by_index), index.size - 1)
    row = by_index[pos]
    lo, need = tc.addr[alloc], round_sizes(tc.size[alloc])
    seg_addr = new_segments["addr"].to_numpy()[made]
    seg_size = new_segments["size"].to_numpy()[made]
    # The ranges meet: seg_addr < lo + need and lo < seg_addr + seg_size, as differences (no overflow).
    meets = (seg_addr - lo < need) & (lo - seg_addr < seg_size)
    counted = (index[row] == alloc) & meets & kept[made]
    np.add.at(out, row[counted], seg_size[counted])
    return out


def _still_reserved(snap: Snapshot, tc: TraceColumns, walk: TraceWalk) -> np.ndarray:
    """Per row of `walk.new_segments`: whether that segment is still in the final snapshot.

    A segment made at trace index i is gone if a later segment_free at its
    address (or a later segment_unmap over its range) removed it, or if the
    final snapshot holds no segment at its address.
    """
    ns = walk.new_segments
    if ns.empty:
        return np.zeros(0, dtype=bool)
    made_at = ns["index"].to_numpy(dtype=np.int64)
    addr = ns["addr"].to_numpy(dtype=np.int64)
    size = ns["size"].to_numpy(dtype=np.int64)
    frees = np.flatnonzero(tc.action == _SEGMENT_FREE)
    last_free = dict(zip(tc.addr[frees].tolist(), frees.tolist(), strict=True))  # the last one per address wins
    kept = np.array([last_free.get(x, -1) < i for x, i in zip(addr.tolist(), made_at.tolist(), strict=True)])
    unmaps = np.flatnonzero(tc.action == _SEGMENT_UNMAP)
    for k in np.flatnonzero(kept).tolist() if unmaps.size else ():
        later = unmaps[unmaps > made_at[k]]
        if ((tc.addr[later] < addr[k] + size[k]) & (addr[k] < tc.addr[later] + tc.size[later])).any():
            kept[k] = False
    c = snap.columns
    on = c.device == walk.device
    starts, ends = c.address[on], c.address[on] + c.total_size[on]
    order = np.argsort(starts)
    starts, ends = starts[order], ends[order]
    j = np.searchsorted(starts, addr, side="right") - 1
    inside = (j >= 0) & (addr < ends[np.maximum(j, 0)]) if starts.size else np.zeros(addr.size, dtype=bool)
    return kept & inside


def _pending_waits(snap: Snapshot, tc: TraceColumns, allocs: pd.DataFrame, new: pd.DataFrame) -> dict[int, set[int]]:
    """Per alloc of `new` (its trace index): the streams of fitting blocks of its pool pending on record_stream then.

    A block is pending from its `free_requested` to the next `free_completed`
    at its address (to the end of the trace if none comes): the allocator does
    not hand it out until the streams it was recorded on reach the free. Its
    pool is that of the alloc that made it (the last alloc at its address
    before the free), else that of the final segment holding it; its size, the
    request's rounded size (the trace does not say whether it took more).
    """
    if new.empty:
        return {}
    action = tc.action
    requested = np.flatnonzero(action == _FREE_REQUESTED)
    if not requested.size:
        return {}
    ends = _pending_until(tc, requested)
    asks = new["index"].to_numpy(dtype=np.int64)
    lo = np.searchsorted(asks, requested, side="right")
    hi = np.searchsorted(asks, ends, side="left")
    spans = np.flatnonzero(hi > lo)  # the pending intervals with a new segment inside: few
    if not spans.size:
        return {}
    pool_of = _pool_of_blocks(snap, tc, allocs, requested[spans])
    need = round_sizes(new["size"].to_numpy(dtype=np.int64)).tolist()
    ask_pools = [tuple(p) for p in new["pool"]]
    ask_index = asks.tolist()
    out: dict[int, set[int]] = {}
    for s in spans.tolist():
        i = int(requested[s])
        pool = pool_of.get(i)
        if pool is None:
            continue
        block = round_size(int(tc.size[i]))
        for k in range(int(lo[s]), int(hi[s])):
            fits = need[k] <= block and is_small_request(need[k]) == is_small_request(block)
            if fits and ask_pools[k] == pool:
                out.setdefault(ask_index[k], set()).add(int(tc.stream[i]))
    return out


def _pending_until(tc: TraceColumns, requested: np.ndarray) -> np.ndarray:
    """For each free_requested: the trace index of the next free_completed at its address, else the trace's end."""
    completed = np.flatnonzero(tc.action == _FREE_COMPLETED)
    events = np.concatenate((requested, completed))
    is_done = np.concatenate((np.zeros(requested.size, bool), np.ones(completed.size, bool)))
    addr = tc.addr[events]
    order = np.lexsort((events, addr))
    events, is_done, addr = events[order], is_done[order], addr[order]
    nxt = np.append(np.arange(1, events.size), events.size - 1)
    same = np.append(addr[1:] == addr[:-1], False)
    done = same & is_done[nxt]
    until = np.where(done, events[nxt], len(tc))
    out = np.empty(events.size, dtype=np.int64)
    out[order] = until  # back to the order of `events` before sorting
    return out[: requested.size]


def _pool_of_blocks(snap: Snapshot, tc: TraceColumns, allocs: pd.DataFrame, freed: np.ndarray) -> dict[int, tuple]:
    """Per free_requested entry (trace index): the pool of its block, or nothing where it cannot be told."""
    out: dict[int, tuple] = {}
    addresses = set(tc.addr[freed].tolist())
    at = allocs[allocs["addr"].isin(addresses)]
    by_addr = {x: (g["index"].to_numpy(), list(g["pool"])) for x, g in at.groupby("addr", sort=False)}
    c = snap.columns
    on = np.flatnonzero(c.device == tc.device)
    final_pools = c.pools()
    for i in freed.tolist():
        x = int(tc.addr[i])
        if x in by_addr:
            index, pools = by_addr[x]
            j = int(np.searchsorted(index, i)) - 1
            if j >= 0:
                out[i] = tuple(pools[j])
                continue
        held = on[(c.address[on] <= x) & (x < c.address[on] + c.total_size[on])]
        if held.size:
            out[i] = final_pools[int(held[0])]
    return out

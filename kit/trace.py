"""Trace analysis: how each allocation was served, and which memory a stream stranded.

A snapshot's trace lists allocator events but names no pool, and usually starts
mid-process. `replay_trace` rewinds the final snapshot to the trace's first
entry (segments and active blocks), walks the trace forward again, and checks
that the walk ends at the snapshot; any difference is reported in
`TraceReplay.mismatches`, never ignored.

Walking forward it classifies every `alloc`:
- `reused`: served from a cached free block of its stream;
- `new_segment`: needed a new segment (the `segment_alloc` just before it);
- `stranded`: needed a new segment although a free block at least as large
  sat in the same pool and size class on another stream, the case PR 63155 is
  about. The row names that block and its stream.

Free blocks are not in the trace, but they need not be: the allocator merges
free neighbours, so the free blocks of a segment are exactly the gaps between
its active blocks. An allocation takes the low end of the gap that starts at
its address, and the whole gap when the rest is too small to split off.

At DeepSeek scale (millions of events, tens of thousands of segments) the
walk reads the snapshot's columns (`kit.columns`), finds the segment of every
block event at once with numpy, and keeps per (pool, size class, stream) a
heap of segments by largest free gap, refreshed only where blocks changed,
so that asking "a fitting free block on another stream?" does not visit every
segment. It returns what the per-row walk it replaced returned
(tests/test_scale.py holds the two side by side).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass, field
from heapq import heappop, heappush
from itertools import chain
from operator import itemgetter

import numpy as np
import pandas as pd

from kit.columns import ACTION_CODE, INACTIVE, gc_paused, trace_columns
from kit.simulator import K_MIN_BLOCK_SIZE, K_SMALL_SIZE, round_size
from kit.snapshot import Snapshot, load_snapshot
from kit.tables import format_bytes, pool_label, segment_table, stream_labels

REUSE_COLUMNS = ("allocs", "reused", "new_segments", "new_segment_bytes", "stranded_bytes")


class _Segment:
    __slots__ = ("address", "size", "end", "pool", "stream", "small", "limit", "starts", "sizes", "seq", "dirty")

    def __init__(self, address, size, pool, stream, small):
        self.address, self.size, self.pool, self.stream, self.small = address, size, pool, stream, small
        self.end = address + size
        # A block splits when what is left of it exceeds this (ALLOCATOR.md: a small block
        # keeps a remainder of 512 bytes or more, a large one more than 1 MiB).
        self.limit = K_MIN_BLOCK_SIZE - 1 if small else K_SMALL_SIZE
        self.starts: list[int] = []  # active block addresses, sorted
        self.sizes: dict[int, int] = {}
        self.seq = 0  # its place in the walk's segment dict (the order the old per-row search went in)
        self.dirty: set | None = None  # its group's set of segments whose gaps changed

    def gap_at(self, address: int) -> int:
        """Size of the free block starting at `address`: up to the next active block."""
        i = bisect_right(self.starts, address)
        end = self.starts[i] if i < len(self.starts) else self.address + self.size
        return end - address

    def largest_gap(self) -> tuple[int, int]:
        best, at, cursor = 0, 0, self.address
        for start in self.starts:
            if start - cursor > best:
                best, at = start - cursor, cursor
            cursor = start + self.sizes[start]
        if self.address + self.size - cursor > best:
            best, at = self.address + self.size - cursor, cursor
        return best, at

    def activate(self, address: int, size: int) -> None:
        insort(self.starts, address)
        self.sizes[address] = size

    def release(self, address: int) -> None:
        del self.starts[bisect_left(self.starts, address)]
        del self.sizes[address]


class _Group:
    """The segments of one (pool, size class, stream), by largest free gap: a heap, refreshed lazily.

    A segment whose blocks changed is only marked dirty; its gap is measured
    again when another stream's new segment asks, so a walk of millions of
    events measures each segment at most once between two such questions.
    """

    __slots__ = ("stream", "heap", "dirty")

    def __init__(self, stream: int) -> None:
        self.stream = stream
        self.heap: list[tuple] = []  # (-gap, seq, version, at, segment)
        self.dirty: set[_Segment] = set()

    def best(self, live: dict[int, _Segment], versions: dict[_Segment, int], counter: list[int]):
        """(gap, seq, at) of the live segment with the largest gap, the earliest on ties; None if none."""
        heap = self.heap
        for seg in self.dirty:
            if live.get(seg.address) is seg:
                gap, at = seg.largest_gap()
                counter[0] += 1
                versions[seg] = counter[0]
                heappush(heap, (-gap, seg.seq, counter[0], at, seg))
        self.dirty.clear()
        while heap:
            gap, seq, version, at, seg = heap[0]
            if versions.get(seg) == version and live.get(seg.address) is seg:
                return -gap, seq, at
            heappop(heap)
        return None


@dataclass
class TraceReplay:
    """The result of walking a trace: one row per alloc, and what did not add up."""

    allocs: pd.DataFrame
    new_segments: pd.DataFrame  # one row per segment_alloc: index, addr, size, pool, stream
    mismatches: list[str] = field(default_factory=list)
    rewound_segments: int = 0


_ALLOC, _FREE_COMPLETED = ACTION_CODE["alloc"], ACTION_CODE["free_completed"]
_SEGMENT_ALLOC, _SEGMENT_FREE = ACTION_CODE["segment_alloc"], ACTION_CODE["segment_free"]
_SMALL_SEGMENT = 2 * K_SMALL_SIZE
ALLOC_COLUMNS = (
    "index",
    "time_us",
    "addr",
    "size",
    "stream",
    "pool",
    "served",
    "segment_bytes",
    "other_block",
    "other_block_size",
    "other_stream",
    "frames",
)


class _FinalSegments:
    """The snapshot's segments, each made into a `_Segment` (with its active blocks) only when asked for."""

    def __init__(self, snap: Snapshot) -> None:
        c = snap.columns
        active = c.block_state != INACTIVE
        counts = np.bincount(c.block_segment[active], minlength=len(c))
        self.at = np.concatenate(([0], np.cumsum(counts))).tolist()
        self.block_addr, self.block_size = c.block_address[active].tolist(), c.block_size[active].tolist()
        self.address, self.size = c.address.tolist(), c.total_size.tolist()
        self.pool, self.stream, self.small = c.pools(), c.stream.tolist(), c.small.tolist()

    def make(self, i: int) -> _Segment:
        seg = _Segment(self.address[i], self.size[i], self.pool[i], self.stream[i], self.small[i])
        lo, hi = self.at[i], self.at[i + 1]
        if hi > lo:
            seg.starts = self.block_addr[lo:hi]
            seg.sizes = dict(zip(seg.starts, self.block_size[lo:hi], strict=True))
        return seg


def _initial_state(snap: Snapshot, acts: list, addrs: list, sizes: list, streams: list) -> dict[int, _Segment]:
    """Rewind the final snapshot backwards through the trace to its first entry.

    The snapshot's segments enter the dict as row numbers and become
    `_Segment`s when a block event reaches them or when they outlast the
    rewind: most of a long trace's segments are dropped again at their
    segment_alloc without ever being needed.
    """
    final = _FinalSegments(snap)
    segments: dict = {address: i for i, address in enumerate(final.address)}
    starts = sorted(segments)
    keep = _rewind_rows(snap, acts, addrs, sizes)
    for r in reversed(keep):
        a, addr = acts[r], addrs[r]
        if a == _SEGMENT_ALLOC:
            if segments.pop(addr, None) is not None:
                del starts[bisect_left(starts, addr)]
        elif a == _SEGMENT_FREE:
            # A segment freed within the trace belonged to the default pool (graph
            # pools are not freed while their graphs live).
            segments[addr] = _Segment(addr, sizes[r], (0, 0), streams[r], sizes[r] <= _SMALL_SEGMENT)
            insort(starts, addr)
        else:
            j = bisect_right(starts, addr) - 1
            if j < 0:
                continue
            seg = segments[starts[j]]
            if type(seg) is int:
                seg = segments[starts[j]] = final.make(seg)
            if addr >= seg.address + seg.size:
                continue
            if a == _ALLOC:
                if addr in seg.sizes:
                    seg.release(addr)
            elif addr not in seg.sizes:  # free_completed
                seg.activate(addr, round_size(sizes[r]))  # its exact size is not in the trace
    for address, seg in segments.items():
        if type(seg) is int:
            segments[address] = final.make(seg)
    return segments


def _rewind_rows(snap: Snapshot, acts: list, addrs: list, sizes: list) -> list[int]:
    """The rows the rewind must visit: every segment event, and the block events of segments that outlive it.

    Walking backwards, a block event changes the segment that holds its address
    at that moment; a segment the trace allocated is dropped again at its
    segment_alloc, so its block events change nothing that lasts. Only the
    segments present at the trace's first entry keep what the rewind does to
    them: the snapshot's segments the trace never allocated, and segments the
    trace frees but never allocated (present up to their segment_free).
    """
    action = np.array(acts, dtype=np.int8)
    is_segment = (action == _SEGMENT_ALLOC) | (action == _SEGMENT_FREE)
    segment_rows = np.flatnonzero(is_segment).tolist()
    c = snap.columns
    n = len(acts)
    present = {a: (a, size, n) for a, size in zip(c.address.tolist(), c.total_size.tolist(), strict=True)}
    for r in reversed(segment_rows):
        if acts[r] == _SEGMENT_ALLOC:
            present.pop(addrs[r], None)
        else:
            present[addrs[r]] = (addrs[r], sizes[r], r)  # present before row r
    if not present:
        return segment_rows
    first, size, until = (np.array(x, dtype=np.int64) for x in zip(*sorted(present.values()), strict=True))
    if np.any(first[1:] < first[:-1] + size[:-1]):
        return list(range(n))  # overlapping segments: visit everything, as the old walk did
    address = np.array(addrs, dtype=np.int64)
    at = np.searchsorted(first, address, side="right") - 1
    held = (at >= 0) & (address < (first + size)[at]) & (np.arange(n) < until[at])
    return np.flatnonzero(is_segment | held).tolist()


def _freed_later(acts: list, addrs: list, index: list) -> set[int]:
    """Trace indices of segment_allocs whose segment a later segment_free releases."""
    out, last_alloc = set(), {}
    for a, addr, i in zip(acts, addrs, index, strict=True):
        if a == _SEGMENT_ALLOC:
            last_alloc[addr] = i
        elif a == _SEGMENT_FREE and addr in last_alloc:
            out.add(last_alloc[addr])
    return out


def replay_trace(snapshot: Snapshot | str | dict, device: int = 0) -> TraceReplay:
    """Walk the snapshot's trace from its rewound start; classify every alloc.

    `allocs` has one row per alloc (`ALLOC_COLUMNS`); its `frames` is the
    trace entry's own list of stack frames, shared with the snapshot.
    """
    snap = load_snapshot(snapshot)
    tc = trace_columns(snap, device)
    if tc is None or not len(tc):
        from kit.errors import KitError

        raise KitError(f"{snap.origin}: no trace recorded (record with torch.cuda.memory._record_memory_history)")
    with gc_paused():  # the walk makes a few hundred thousand objects that almost all die with it
        return _walk(snap, tc)


def _walk(snap: Snapshot, tc) -> TraceReplay:
    # Only these four actions move memory; the walk skips the rest.
    index = np.flatnonzero(np.isin(tc.action, (_ALLOC, _FREE_COMPLETED, _SEGMENT_ALLOC, _SEGMENT_FREE)))
    action, address, size = tc.action[index], tc.addr[index], tc.size[index]
    acts, addrs, sizes, streams = action.tolist(), address.tolist(), size.tolist(), tc.stream[index].tolist()
    live = _initial_state(snap, acts, addrs, sizes, streams)  # address -> segment, in the old walk's dict order
    rewound = len(live)
    instances = list(live.values())
    made, made_by = _segments_made(snap, action, acts, addrs, sizes, streams, index, instances)
    holder = _holders(live, instances, made_by, action, address)
    if (holder == -2).any():
        _search_holders(holder, live, instances, made_by, acts, addrs)
    rows = np.flatnonzero((action == _ALLOC) & (holder >= 0))
    ask = _first_allocs(action, address, holder, rows)
    rounded = np.where(size < K_MIN_BLOCK_SIZE, K_MIN_BLOCK_SIZE, -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE)
    # The per-(pool, size class, stream) groups that answer "a fitting free block on another stream?".
    groups: dict[tuple, dict[int, _Group]] = {}
    versions: dict[_Segment, int] = {}
    counter = [0]

    def enter(seg: _Segment, seq: int) -> None:
        by_stream = groups.setdefault((seg.pool, seg.small), {})
        group = by_stream.get(seg.stream)
        if group is None:
            group = by_stream[seg.stream] = _Group(seg.stream)
        seg.seq, seg.dirty = seq, group.dirty
        group.dirty.add(seg)

    for seq, seg in enumerate(instances[:rewound]):
        enter(seg, seq)
    next_seq = rewound
    new_rows: dict[int, tuple] = {}  # row -> (segment bytes, other block, its size, its stream) or 3 Nones
    for a, addr, k, need, q in zip(acts, addrs, holder.tolist(), rounded.tolist(), ask.tolist(), strict=True):
        if a == _ALLOC:
            if k < 0:
                continue
            seg = instances[k]
            ss = seg.starts
            j = bisect_right(ss, addr)
            gap = (ss[j] if j < len(ss) else seg.end) - addr
            ss.insert(j, addr)
            seg.sizes[addr] = need if gap - need > seg.limit else gap
            seg.dirty.add(seg)
            if q >= 0:  # the first alloc in a new segment: was a free block as large on another stream?
                new_rows[q] = (seg.size, *_free_elsewhere(groups, live, versions, counter, seg, need))
        elif a == _FREE_COMPLETED:
            if k < 0:
                continue
            seg = instances[k]
            if addr in seg.sizes:
                ss = seg.starts
                del ss[bisect_left(ss, addr)]
                del seg.sizes[addr]
                seg.dirty.add(seg)
        elif a == _SEGMENT_ALLOC:
            seg = instances[k]
            replaced = live.get(addr)
            if replaced is not None:
                enter(seg, replaced.seq)  # a dict keeps a replaced key's place
            else:
                enter(seg, next_seq)
                next_seq += 1
            live[addr] = seg
        else:  # segment_free
            live.pop(addr, None)
    pools = np.empty(len(instances), dtype=object)
    pools[:] = [seg.pool for seg in instances]
    allocs = _alloc_frame(tc, index[rows], pools[holder[rows]], new_rows)
    new_segments = pd.DataFrame(made, columns=["index", "addr", "size", "pool", "stream"])
    return TraceReplay(allocs, new_segments, _compare_with_snapshot(snap, live), rewound)


def _search_holders(holder: np.ndarray, live: dict, instances: list, made_by: dict, acts: list, addrs: list) -> None:
    """Fill in the rows `_holders` left (-2) by searching the live segments at each, in trace order."""
    live = dict(live)
    starts = sorted(live)
    number = {id(seg): k for k, seg in enumerate(instances)}
    for r in np.flatnonzero((holder == -2) | np.isin(np.array(acts), (_SEGMENT_ALLOC, _SEGMENT_FREE))).tolist():
        a, addr = acts[r], addrs[r]
        if a == _SEGMENT_ALLOC:
            live[addr] = instances[made_by[r]]
            insort(starts, addr)
        elif a == _SEGMENT_FREE:
            if live.pop(addr, None) is not None:
                del starts[bisect_left(starts, addr)]
        else:
            seg = _segment_at(starts, live, addr)
            holder[r] = -1 if seg is None else number[id(seg)]


def _first_allocs(action: np.ndarray, address: np.ndarray, holder: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per row: for the first alloc in a segment just made, its place among `rows` (the allocs placed); else -1.

    That is an alloc whose last segment_alloc or placed alloc before it is a
    segment_alloc at its own address (the allocator cudaMallocs, then serves
    the request from the new segment's start).
    """
    ask = np.full(len(action), -1, dtype=np.int64)
    marks = np.flatnonzero(action == _SEGMENT_ALLOC)
    events = np.concatenate((marks, rows))
    order = np.argsort(events, kind="stable")
    events = events[order]
    is_alloc = np.concatenate((np.zeros(marks.size, dtype=bool), np.ones(rows.size, dtype=bool)))[order]
    after_mark = np.zeros(events.size, dtype=bool)
    after_mark[1:] = ~is_alloc[:-1] & (address[events[1:]] == address[events[:-1]])
    first = events[is_alloc & after_mark]
    ask[first] = np.searchsorted(rows, first)
    return ask


def _segment_at(starts: list[int], live: dict[int, _Segment], address: int) -> _Segment | None:
    """The segment holding `address`: the last one starting at or below it, if it reaches that far."""
    i = bisect_right(starts, address) - 1
    if i >= 0:
        seg = live[starts[i]]
        if address < seg.address + seg.size:
            return seg
    return None


def _segments_made(snap: Snapshot, action, acts, addrs, sizes, streams, index, instances: list) -> tuple[list, dict]:
    """A segment object for every segment_alloc, appended to `instances`; the `made` rows; row -> instance."""
    c = snap.columns
    # A segment's pool is in the snapshot only for the segment there now. Addresses come
    # back after a segment_free, so an earlier segment at the same address, one freed
    # within the trace, is taken as the default pool's (graph pools are not freed while
    # their graphs live).
    final = dict(zip(c.address.tolist(), zip(c.pools(), c.small.tolist(), strict=True), strict=True))
    segment_rows = np.flatnonzero((action == _SEGMENT_ALLOC) | (action == _SEGMENT_FREE)).tolist()
    trace_index = index.tolist()
    freed_later = _freed_later(
        [acts[r] for r in segment_rows], [addrs[r] for r in segment_rows], [trace_index[r] for r in segment_rows]
    )
    made, made_by = [], {}
    for r in segment_rows:
        if acts[r] != _SEGMENT_ALLOC:
            continue
        i, addr, size, stream = trace_index[r], addrs[r], sizes[r], streams[r]
        known = final.get(addr) if i not in freed_later else None
        pool, small = known or ((0, 0), size <= _SMALL_SEGMENT)
        made_by[r] = len(instances)
        instances.append(_Segment(addr, size, pool, stream, small))
        made.append((i, addr, size, pool, stream))
    return made, made_by


def _holders(live: dict[int, _Segment], instances: list, made_by: dict, action, address) -> np.ndarray:
    """For each row: the instance whose segment holds its address then, -1 for none, -2 to look it up while walking.

    Segment rows get the instance they make (segment_alloc). Block rows are
    placed with numpy: a segment lives from its segment_alloc (or the trace's
    start) to the next segment event at its address, and when no two live
    segments ever overlap, the one holding an address at a row is the latest
    one made before that row at the nearest start at or below the address that
    is still live. Overlapping segments (an inconsistent trace) leave every
    block row to the walk's own search.
    """
    n = len(action)
    holder = np.full(n, -1, dtype=np.int64)
    for r, k in made_by.items():
        holder[r] = k
    blocks = np.flatnonzero((action == _ALLOC) | (action == _FREE_COMPLETED))
    if not instances or not blocks.size:
        return holder
    if _ever_overlap(live, instances, made_by, action, address):
        holder[blocks] = -2
        return holder
    rewound = len(instances) - len(made_by)
    first = np.fromiter((s.address for s in instances), dtype=np.int64, count=len(instances))
    end = first + np.fromiter((s.size for s in instances), dtype=np.int64, count=len(instances))
    born = np.concatenate((np.full(rewound, -1, dtype=np.int64), np.fromiter(made_by, dtype=np.int64)))
    # A segment lives until the next segment event at its address (its segment_free).
    segment_rows = np.flatnonzero((action == _SEGMENT_ALLOC) | (action == _SEGMENT_FREE))
    _, rank = np.unique(np.concatenate((address[segment_rows], first)), return_inverse=True)
    width = n + 2
    event_key = np.sort(rank[: segment_rows.size] * width + segment_rows + 1)
    own_key = rank[segment_rows.size :] * width + born + 1
    j = np.searchsorted(event_key, own_key, side="right")
    next_key = event_key[np.minimum(j, event_key.size - 1)] if event_key.size else own_key
    died = np.where((j < event_key.size) & (next_key // width == own_key // width), next_key % width - 1, n)
    # Place each block row: nearest start at or below its address, latest segment made there before the row.
    order = np.lexsort((born, first))
    first_s, end_s, born_s, died_s = first[order], end[order], born[order], died[order]
    starts_at, group_first = np.unique(first_s, return_index=True)
    group = np.repeat(np.arange(starts_at.size), np.diff(np.append(group_first, first_s.size)))
    key = group * width + born_s + 1
    x, row = address[blocks], blocks
    g = np.searchsorted(starts_at, x, side="right") - 1
    found = np.full(blocks.size, -1, dtype=np.int64)
    pending = np.flatnonzero(g >= 0)
    reach = int((end - first).max())
    for _ in range(8):  # each round steps one start further down, for addresses reused over time
        if not pending.size:
            break
        gp, xp, rp = g[pending], x[pending], row[pending]
        cand = np.searchsorted(key, gp * width + rp + 1, side="left") - 1
        c = np.maximum(cand, 0)
        ok = (cand >= 0) & (group[c] == gp) & (xp < end_s[c]) & (rp < died_s[c])
        found[pending[ok]] = order[c[ok]]
        rest = pending[~ok]
        g[rest] -= 1
        further = g[rest] >= 0
        further[further] &= starts_at[g[rest][further]] + reach > x[rest][further]
        pending = rest[further]
    found[pending] = -2
    holder[blocks] = found
    return holder


def _ever_overlap(live: dict[int, _Segment], instances: list, made_by: dict, action, address) -> bool:
    """Whether two live segments ever overlap (or one replaces another), walking the segment events."""
    current = dict(live)
    starts = sorted(current)
    if _overlapping(starts, current):
        return True
    for r in np.flatnonzero((action == _SEGMENT_ALLOC) | (action == _SEGMENT_FREE)).tolist():
        addr = int(address[r])
        if r in made_by:
            if addr in current:
                return True
            seg = current[addr] = instances[made_by[r]]
            insort(starts, addr)
            if _overlaps_neighbours(starts, current, seg):
                return True
        elif current.pop(addr, None) is not None:
            del starts[bisect_left(starts, addr)]
    return False


def _overlapping(starts: list[int], segments: dict[int, _Segment]) -> bool:
    """Whether any two of the segments overlap (or share a start)."""
    if len(set(starts)) != len(starts):
        return True
    ends = [segments[a].address + segments[a].size for a in starts]
    return any(e > a for e, a in zip(ends[:-1], starts[1:], strict=True))


def _overlaps_neighbours(starts: list[int], segments: dict[int, _Segment], seg: _Segment) -> bool:
    """Whether `seg`, just added to `starts`, overlaps the segment before or after it."""
    k = bisect_left(starts, seg.address)
    before = segments[starts[k - 1]] if k > 0 else None
    after = starts[k + 1] if k + 1 < len(starts) else None
    return (before is not None and before.address + before.size > seg.address) or (
        after is not None and seg.address + seg.size > after
    )


def _alloc_frame(tc, rows: np.ndarray, row_pools: np.ndarray, new_rows: dict) -> pd.DataFrame:
    """One row per alloc the walk placed (`rows`: their trace indices), columns as `ALLOC_COLUMNS`."""
    n = len(rows)
    if not n:
        return pd.DataFrame([], columns=list(ALLOC_COLUMNS))
    served = np.full(n, "reused", dtype=object)
    segment_bytes, other_size = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    # Built as pandas reads a column of ints and Nones: floats with NaN, or objects when all are None.
    any_stranded = any(v[1] is not None for v in new_rows.values())
    other_block, other_stream = (np.full(n, np.nan) if any_stranded else np.full(n, None) for _ in range(2))
    for r, (seg_bytes, block, block_size, block_stream) in new_rows.items():
        segment_bytes[r] = seg_bytes
        if block is None:
            served[r] = "new_segment"
        else:
            served[r] = "stranded"
            other_block[r], other_size[r], other_stream[r] = block, block_size, block_stream
    time_us = tc.time_us[rows]
    picked = itemgetter(*rows.tolist())(tc.frames) if n > 1 else (tc.frames[int(rows[0])],)
    if set(map(type, picked)) != {list}:
        picked = [f if type(f) is list else [] for f in picked]
    return pd.DataFrame(
        {
            "index": rows,
            "time_us": time_us if time_us.dtype != object else time_us.tolist(),
            "addr": tc.addr[rows],
            "size": tc.size[rows],
            "stream": tc.stream[rows],
            "pool": row_pools,
            "served": served,
            "segment_bytes": segment_bytes,
            "other_block": other_block,
            "other_block_size": other_size,
            "other_stream": other_stream,
            "frames": np.fromiter(picked, dtype=object, count=n),  # the entries' own lists: copying costs
        }
    )


def capture_attribution(snapshot: Snapshot | str | dict, windows: list[dict] | None = None) -> pd.DataFrame:
    """Segments and bytes each capture added, per (pool, stream) group.

    `windows` are dicts with `graph`, `trace_begin` and `trace_end` (trace
    indices); by default the snapshot's own `kit.captures`.
    """
    snap = load_snapshot(snapshot)
    windows = windows if windows is not None else snap.kit.get("captures") or []
    made = replay_trace(snap).new_segments
    labels = stream_labels(snap)
    rows = []
    for w in windows:
        inside = made[(made["index"] >= w["trace_begin"]) & (made["index"] < w["trace_end"])]
        for (pool, stream), group in inside.groupby(["pool", "stream"], sort=True):
            rows.append(
                {
                    "graph": w["graph"],
                    "pool": pool,
                    "stream": int(stream),
                    "pool_label": pool_label(pool, snap.pool_names),
                    "stream_label": labels.get(stream, str(stream)),
                    "segments": len(group),
                    "bytes": int(group["size"].sum()),
                }
            )
    table = pd.DataFrame(rows, columns=["graph", "pool", "stream", "pool_label", "stream_label", "segments", "bytes"])
    table.attrs["source"] = snap.source_label
    return table


def _free_elsewhere(groups, segments, versions, counter, new: _Segment, rounded: int) -> tuple:
    """The largest free block of the same pool and size class on another stream, if it fits.

    As a search of every segment in walk order would find it: the largest gap,
    the first segment on ties; (address, size, stream), or three Nones.
    """
    best = None
    for stream, group in groups.get((new.pool, new.small), {}).items():
        if stream == new.stream:
            continue
        found = group.best(segments, versions, counter)
        if found and found[0] >= rounded and (best is None or (found[0], -found[1]) > (best[0], -best[1])):
            best = (*found, stream)
    if best is None:
        return None, None, None
    size, _seq, at, stream = best
    return at, size, stream


def _compare_with_snapshot(snap: Snapshot, segments: dict[int, _Segment]) -> list[str]:
    c = snap.columns
    try:
        if _same_as_snapshot(c, segments):
            return []
    except (OverflowError, ValueError):  # addresses beyond int64: compare them one by one
        pass
    # Something differs: say what, segment by segment.
    want = {}
    for i, (address, total) in enumerate(zip(c.address.tolist(), c.total_size.tolist(), strict=True)):
        lo, k = int(c.first_block[i]), int(c.n_blocks[i])
        states = c.block_state[lo : lo + k].tolist()
        want[address] = (
            total,
            {
                a: n
                for a, n, st in zip(
                    c.block_address[lo : lo + k].tolist(), c.block_size[lo : lo + k].tolist(), states, strict=True
                )
                if st != INACTIVE
            },
        )
    got = {a: (s.size, dict(s.sizes)) for a, s in segments.items()}
    out = []
    for address in sorted(want.keys() | got.keys()):
        if address not in got:
            out.append(f"segment {address:#x} is in the snapshot but not in the replayed trace")
        elif address not in want:
            out.append(f"segment {address:#x} is in the replayed trace but not in the snapshot")
        elif want[address] != got[address]:
            out.append(f"segment {address:#x}: blocks differ between the replayed trace and the snapshot")
    return out


def _same_as_snapshot(c, segments: dict[int, _Segment]) -> bool:
    """Whether the walk's segments and active blocks are the snapshot's, compared as sorted arrays."""
    if np.unique(c.address).size != len(c) or len(segments) != len(c):
        return False
    values = list(segments.values())
    got_addr = np.fromiter(segments, dtype=np.int64, count=len(values))
    order = np.argsort(got_addr)
    want_order = np.argsort(c.address)
    got_size = np.fromiter((s.size for s in values), dtype=np.int64, count=len(values))
    if not (
        np.array_equal(got_addr[order], c.address[want_order])
        and np.array_equal(got_size[order], c.total_size[want_order])
    ):
        return False
    active = c.block_state != INACTIVE
    counts = np.fromiter((len(s.sizes) for s in values), dtype=np.int64, count=len(values))
    if counts.sum() != active.sum():
        return False
    got = np.stack(
        [
            np.repeat(got_addr, counts),
            np.fromiter(chain.from_iterable(s.sizes for s in values), dtype=np.int64, count=int(counts.sum())),
            np.fromiter(chain.from_iterable(s.sizes.values() for s in values), dtype=np.int64, count=int(counts.sum())),
        ]
    )
    want = np.stack([c.address[c.block_segment[active]], c.block_address[active], c.block_size[active]])
    return np.array_equal(got[:, np.lexsort(got[1::-1])], want[:, np.lexsort(want[1::-1])])


def reuse_table(snapshot: Snapshot | str | dict, replay: TraceReplay | None = None) -> pd.DataFrame:
    """Per (pool, stream) group: allocs, reused, new segments, their bytes, and the stranded bytes.

    Pass `replay` (from `replay_trace` of the same snapshot) to skip walking the trace again.
    """
    snap = load_snapshot(snapshot)
    replay = replay or replay_trace(snap)
    a = replay.allocs
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
    labels = stream_labels(snap)
    pools = snap.pool_names
    table["pool_label"] = [pool_label(p, pools) for p in table["pool"]]
    table["stream_label"] = [labels.get(s, str(s)) for s in table["stream"]]
    table = table.astype({c: "int64" for c in ("stream", *REUSE_COLUMNS)})
    table.attrs["source"] = snap.source_label
    table.attrs["mismatches"] = replay.mismatches
    return table


def _frame_line(frames: list) -> str:
    return " < ".join(
        f"{f.get('name', '?')} ({str(f.get('filename', '?')).rsplit('/', 1)[-1]}:{f.get('line', '?')})"
        for f in frames[:3]
        if isinstance(f, dict)
    )


def stranding_report(snapshot: Snapshot | str | dict, replay: TraceReplay | None = None) -> pd.DataFrame:
    """Every (pool, stream) group that made segments while a fitting free block sat on another stream.

    Columns: `pool`, `stream`, `stranded_bytes` (its new segments' bytes),
    `reserved` (the group's bytes at the end), `other_streams`, `other_free`
    (free bytes at the end on those streams, same pool), `frames` (the first
    stack frames of the first stranded allocation, when recorded) and
    `verdict`, one line.
    """
    snap = load_snapshot(snapshot)
    a = (replay or replay_trace(snap)).allocs
    labels = stream_labels(snap)
    end = segment_table(snap).set_index(["pool", "stream"])
    rows = []
    for (pool, stream), group in a[a["served"] == "stranded"].groupby(["pool", "stream"], sort=True):
        others = sorted(set(group["other_stream"]))
        other_free = sum(int(end["free"].get((pool, o), 0)) for o in others)
        reserved = int(end["reserved"].get((pool, stream), 0))
        name = labels.get(stream, str(stream))
        other_names = ", ".join(labels.get(o, str(o)) for o in others)
        verdict = (
            f"pool {pool_label(pool, snap.pool_names)} {tuple(pool)}: {format_bytes(reserved)} reserved on {name} "
            f"while {format_bytes(other_free)} sat free on {other_names} "
            f"({format_bytes(group['segment_bytes'].sum())} of its new segments had a fitting free block there)"
        )
        rows.append(
            {
                "pool": pool,
                "stream": int(stream),
                "stranded_bytes": int(group["segment_bytes"].sum()),
                "reserved": reserved,
                "other_streams": others,
                "other_free": other_free,
                "frames": _frame_line(group["frames"].iloc[0]),
                "verdict": verdict,
            }
        )
    table = pd.DataFrame(
        rows,
        columns=["pool", "stream", "stranded_bytes", "reserved", "other_streams", "other_free", "frames", "verdict"],
    )
    table.attrs["source"] = snap.source_label
    return table


def stranding_verdicts(snapshot: Snapshot | str | dict) -> list[str]:
    """The one-line verdicts of `stranding_report`."""
    return list(stranding_report(snapshot)["verdict"])

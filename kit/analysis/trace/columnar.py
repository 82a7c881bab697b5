"""The trace walk on the snapshot's columns: the row walk's result, at millions of events.

`kit.analysis.trace.rows.walk_rows` walks the trace entry by entry over
typed records; at DeepSeek scale (millions of events, tens of thousands of
segments) that takes minutes, and its question "a fitting free block on
another stream?" visits every segment for every new one. `walk_columns`
returns the same `TraceWalk`:

- it reads the trace and the segments as numpy columns (`kit.load.columns`);
- the rewind visits only the block events of segments that outlive it (a
  segment the trace allocated is dropped again at its segment_alloc);
- the segment holding each block event's address is found at once with
  numpy: a segment lives from its segment_alloc (or the trace's start) to the
  next segment event at its address, and as long as no two live segments
  overlap, the one holding an address at a row is the latest one made before
  that row at the nearest start at or below the address that is still live.
  Rows this cannot place (inconsistent traces) are searched as the walk would;
- per (pool, size class, stream), a heap of segments by largest free gap,
  refreshed only where blocks changed, answers the stranding question.

Traces of expandable segments (`segment_map`, `segment_unmap`) are left to the
walk entry by entry (`walk_columns` returns None). tests/test_scale.py
holds the two walks side by side.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from heapq import heappop, heappush
from itertools import chain
from operator import itemgetter
from typing import NamedTuple

import numpy as np
import pandas as pd

from kit import progress
from kit.allocator.rules import DEFAULT_POOL, is_small_segment, round_size, round_sizes, split_limit
from kit.analysis.trace.state import ALLOC_COLUMNS, CapturePools, TraceWalk, WalkSegment, segment_differences
from kit.errors import KitError
from kit.load.columns import ACTION_CODE, INACTIVE, TraceColumns
from kit.load.snapshot import Snapshot
from kit.load.unpickle import gc_paused

ALLOC, FREE_COMPLETED = ACTION_CODE["alloc"], ACTION_CODE["free_completed"]
SEGMENT_ALLOC, SEGMENT_FREE = ACTION_CODE["segment_alloc"], ACTION_CODE["segment_free"]
MAPPING = (ACTION_CODE["segment_map"], ACTION_CODE["segment_unmap"])


class _Segment(WalkSegment):
    """A segment in the walk: `WalkSegment`, with what the columnar walk keeps beside it."""

    __slots__ = ("end", "limit", "seq", "dirty")

    def __init__(self, address, size, pool, stream, small):
        super().__init__(address, size, pool, stream, small)
        self.end = address + size
        self.limit = split_limit(small)  # `should_split`, read once per segment on the hot path
        self.seq = 0  # its place in the walk's segment dict (the order `free_elsewhere` searches in)
        self.dirty: set | None = None  # its group's set of segments whose gaps changed


class _Events(NamedTuple):
    """The trace entries that move memory (alloc, free_completed, segment_alloc, segment_free), in trace order.

    Each field twice: numpy arrays for the vectorised steps, lists for the
    loops (a list hands out its ints as they are; an array makes each anew).
    """

    index: np.ndarray  # each event's entry in the trace
    action: np.ndarray
    address: np.ndarray
    size: np.ndarray
    acts: list
    addrs: list
    sizes: list
    streams: list


def _events(tc: TraceColumns) -> _Events:
    """The entries that move memory; the walk skips the rest."""
    index = np.flatnonzero(np.isin(tc.action, (ALLOC, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE)))
    action, address, size = tc.action[index], tc.addr[index], tc.size[index]
    lists = action.tolist(), address.tolist(), size.tolist(), tc.stream[index].tolist()
    return _Events(index, action, address, size, *lists)


def walk_columns(snap: Snapshot, device: int = 0) -> TraceWalk | None:
    """`walk_trace` on the columns; None for a trace of expandable segments."""
    if snap.history != "all":
        snap.require_trace(device)  # raises its one-line error, reading nothing
    tc = snap.trace_columns.get(device)
    if tc is None or len(tc) < 2:
        raise KitError(f"{snap.origin}: no trace recorded on device {device}")
    if np.isin(tc.action, MAPPING).any():
        return None
    with gc_paused():  # the walk makes a few hundred thousand objects that almost all die with it
        return _walk(snap, tc, device)


def _walk(snap: Snapshot, tc: TraceColumns, device: int) -> TraceWalk:
    """Rewind to the trace's start, find each event's segment, walk forward classifying allocs, compare at the end."""
    events = _events(tc)
    final = _FinalSegments(snap, device)
    live = _rewound(final, events)  # address -> segment, in the walk's dict order
    rewound = len(live)
    instances = list(live.values())  # every segment of the walk: the rewound ones, then one per segment_alloc
    made, made_by = _segments_made(final, events, instances, CapturePools(snap.kit))
    holder = _holders(live, instances, made_by, events.action, events.address)
    if (holder == -2).any():
        _search_holders(holder, live, instances, made_by, events.acts, events.addrs)
    rounded = round_sizes(events.size)
    rows = np.flatnonzero((events.action == ALLOC) & (holder >= 0))  # the allocs placed: the frame's rows
    fresh = _fresh_bytes(events.action, events.address, events.size, rounded, rows)
    asks = _asks(len(events.acts), rows, fresh)
    new_rows = _walk_forward(events, holder, rounded, asks, instances, live)
    pools = np.empty(len(instances), dtype=object)
    pools[:] = [seg.pool for seg in instances]
    allocs = alloc_frame(tc, events.index[rows], pools[holder[rows]], fresh, new_rows)
    new_segments = pd.DataFrame(made, columns=["index", "addr", "size", "pool", "stream"])
    return TraceWalk(allocs, new_segments, _compare(snap, live, device), rewound, device)


class _FinalSegments:
    """The snapshot's segments on one device, each made into a `_Segment` only when asked for."""

    def __init__(self, snap: Snapshot, device: int) -> None:
        c = snap.columns
        on = np.flatnonzero(c.device == device)
        active = (c.block_state != INACTIVE) & np.isin(c.block_segment, on)
        counts = np.bincount(c.block_segment[active], minlength=len(c))[on]
        self.at = np.concatenate(([0], np.cumsum(counts))).tolist()
        self.block_addr, self.block_size = c.block_address[active].tolist(), c.block_size[active].tolist()
        self.address, self.size = c.address[on].tolist(), c.total_size[on].tolist()
        pools = c.pools()
        self.pool = [pools[i] for i in on.tolist()]
        self.stream, self.small = c.stream[on].tolist(), c.small[on].tolist()

    def make(self, i: int) -> _Segment:
        """Segment `i`, with its active blocks."""
        seg = _Segment(self.address[i], self.size[i], self.pool[i], self.stream[i], self.small[i])
        lo, hi = self.at[i], self.at[i + 1]
        if hi > lo:
            seg.starts = self.block_addr[lo:hi]
            seg.sizes = dict(zip(seg.starts, self.block_size[lo:hi], strict=True))
        return seg


def _rewound(final: _FinalSegments, events: _Events) -> dict[int, _Segment]:
    """Rewind the final segments backwards through the trace to its first entry (as `kit.analysis.trace.rows` rewinds).

    The snapshot's segments enter the dict as row numbers and become
    `_Segment`s when a block event reaches them or when they outlast the
    rewind: most of a long trace's segments are dropped again at their
    segment_alloc without ever being needed.
    """
    acts, addrs, sizes, streams = events.acts, events.addrs, events.sizes, events.streams
    segments: dict = {address: i for i, address in enumerate(final.address)}
    starts = sorted(segments)
    for r in reversed(_rewind_rows(final, events)):
        a, addr = acts[r], addrs[r]
        if a == SEGMENT_ALLOC:
            if segments.pop(addr, None) is not None:
                del starts[bisect_left(starts, addr)]
        elif a == SEGMENT_FREE:
            # A segment freed within the trace belonged to the default pool (graph
            # pools are not freed while their graphs live).
            if addr not in segments:
                insort(starts, addr)
            segments[addr] = _Segment(addr, sizes[r], DEFAULT_POOL, streams[r], is_small_segment(sizes[r]))
        else:
            j = bisect_right(starts, addr) - 1
            if j < 0:
                continue
            seg = segments[starts[j]]
            if type(seg) is int:
                seg = segments[starts[j]] = final.make(seg)
            if addr >= seg.end:
                continue
            if a == ALLOC:
                seg.release(addr)
            elif addr not in seg.sizes:  # free_completed
                seg.activate(addr, round_size(sizes[r]))  # its exact size is not in the trace
    for address, seg in segments.items():
        if type(seg) is int:
            segments[address] = final.make(seg)
    return segments


def _rewind_rows(final: _FinalSegments, events: _Events) -> list[int]:
    """The events the rewind must visit: every segment event, and the block events of segments that outlive it.

    Walking backwards, a block event changes the segment that holds its address
    at that moment; a segment the trace allocated is dropped again at its
    segment_alloc, so its block events change nothing that lasts. Only the
    segments present at the trace's first entry keep what the rewind does to
    them: the snapshot's segments the trace never allocated, and segments the
    trace frees but never allocated (present up to their segment_free).
    """
    acts, addrs, sizes = events.acts, events.addrs, events.sizes
    is_segment = (events.action == SEGMENT_ALLOC) | (events.action == SEGMENT_FREE)
    segment_rows = np.flatnonzero(is_segment).tolist()
    n = len(acts)
    present = {a: (a, size, n) for a, size in zip(final.address, final.size, strict=True)}
    for r in reversed(segment_rows):
        if acts[r] == SEGMENT_ALLOC:
            present.pop(addrs[r], None)
        else:
            present[addrs[r]] = (addrs[r], sizes[r], r)  # present before row r
    if not present:
        return segment_rows
    first, size, until = (np.array(x, dtype=np.int64) for x in zip(*sorted(present.values()), strict=True))
    if np.any(first[1:] < first[:-1] + size[:-1]):
        return list(range(n))  # overlapping segments: visit everything, as the walk by entry does
    address = np.array(addrs, dtype=np.int64)
    at = np.searchsorted(first, address, side="right") - 1
    held = (at >= 0) & (address < (first + size)[at]) & (np.arange(n) < until[at])
    return np.flatnonzero(is_segment | held).tolist()


def _segments_made(final: _FinalSegments, events: _Events, instances: list, captured: CapturePools) -> tuple:
    """A segment object for every segment_alloc, appended to `instances`; the `made` rows; event -> instance."""
    # A segment's pool is in the snapshot only for the segment there now. Addresses come
    # back after a segment_free, so an earlier segment at the same address, one freed
    # within the trace, is the pool of the recorded capture it was made in, else the
    # default pool's (graph pools are not freed while their graphs live).
    acts, addrs, sizes, streams = events.acts, events.addrs, events.sizes, events.streams
    known = dict(zip(final.address, zip(final.pool, final.small, strict=True), strict=True))
    segment_rows = np.flatnonzero((events.action == SEGMENT_ALLOC) | (events.action == SEGMENT_FREE)).tolist()
    trace_index = events.index.tolist()
    freed_later, last_alloc = set(), {}
    for r in segment_rows:
        if acts[r] == SEGMENT_ALLOC:
            last_alloc[addrs[r]] = trace_index[r]
        elif addrs[r] in last_alloc:
            freed_later.add(last_alloc[addrs[r]])
    made, made_by = [], {}
    for r in segment_rows:
        if acts[r] != SEGMENT_ALLOC:
            continue
        i, addr, size, stream = trace_index[r], addrs[r], sizes[r], streams[r]
        if i in freed_later:
            pool, small = captured.at(i, stream) or DEFAULT_POOL, is_small_segment(size)
        else:
            pool, small = known.get(addr) or (DEFAULT_POOL, is_small_segment(size))
        made_by[r] = len(instances)
        instances.append(_Segment(addr, size, pool, stream, small))
        made.append((i, addr, size, pool, stream))
    return made, made_by


def _holders(live: dict[int, _Segment], instances: list, made_by: dict, action, address) -> np.ndarray:
    """For each event: the instance whose segment holds its address then, -1 for none, -2 to search while walking.

    Segment events get the instance they make (segment_alloc). Block events are
    placed with numpy (see the module's docstring); overlapping segments (an
    inconsistent trace) leave every block event to the search.
    """
    holder = np.full(len(action), -1, dtype=np.int64)
    for r, k in made_by.items():
        holder[r] = k
    blocks = np.flatnonzero((action == ALLOC) | (action == FREE_COMPLETED))
    if not instances or not blocks.size:
        return holder
    if _ever_overlap(live, instances, made_by, action, address):
        holder[blocks] = -2
        return holder
    first = np.fromiter((s.address for s in instances), dtype=np.int64, count=len(instances))
    end = np.fromiter((s.end for s in instances), dtype=np.int64, count=len(instances))
    # Born at their segment_alloc (`made_by` is in instance order), or before the trace (-1) for the rewound ones.
    rewound = len(instances) - len(made_by)
    born = np.concatenate((np.full(rewound, -1, dtype=np.int64), np.fromiter(made_by, dtype=np.int64)))
    died = _deaths(first, born, action, address)
    holder[blocks] = _place(blocks, address[blocks], first, end, born, died, len(action))
    return holder


def _pack(rank: np.ndarray, row, width: int) -> np.ndarray:
    """(rank, row) packed in one int64 key, `rank * width + row + 1`, that sorts by rank, then by row.

    With all keys in one sorted array, one `searchsorted` answers for every
    rank at once "the next (or last) segment event at this start after (or
    before) this row"; the caller checks the key found is of the same rank.
    `rank` numbers segment starts in address order: an address itself times
    a row count would overflow int64. The rows the walk names run from -1
    (born before the trace) to n (never dies: past the last of n events):
    `+ 1` makes them 0 to n + 1, so -1 does not fall into the rank below, and
    `width = n + 2` holds all n + 2 of them below the next rank's first key.
    Unpacked: `key // width` is the rank, `key % width - 1` the row.
    """
    return rank * width + row + 1


def _deaths(first: np.ndarray, born: np.ndarray, action, address) -> np.ndarray:
    """Each instance's last event: the next segment event at its start after its birth (its segment_free), else n."""
    n = len(action)
    width = n + 2
    segment_rows = np.flatnonzero((action == SEGMENT_ALLOC) | (action == SEGMENT_FREE))
    # One ranking for the events' addresses and the instances' starts, so one rank is one address in both.
    _, rank = np.unique(np.concatenate((address[segment_rows], first)), return_inverse=True)
    event_key = np.sort(_pack(rank[: segment_rows.size], segment_rows, width))
    own_key = _pack(rank[segment_rows.size :], born, width)
    # side="right": past the instance's own segment_alloc, whose key equals its own.
    j = np.searchsorted(event_key, own_key, side="right")
    next_key = event_key[np.minimum(j, event_key.size - 1)] if event_key.size else own_key
    return np.where((j < event_key.size) & (next_key // width == own_key // width), next_key % width - 1, n)


def _place(rows: np.ndarray, x: np.ndarray, first, end, born, died, n: int) -> np.ndarray:
    """The instance holding address `x` at each of `rows`; -1 for none, -2 where the rounds left it undecided.

    The holder is at the nearest start at or below the address: the latest
    instance made there before the row, if it is still live and reaches the
    address. If not, an address under a start reused over time may belong to
    a larger, earlier segment further down: each round steps one start down.
    """
    width = n + 2
    order = np.lexsort((born, first))
    first_s, end_s, born_s, died_s = first[order], end[order], born[order], died[order]
    starts_at, group_first = np.unique(first_s, return_index=True)
    group = np.repeat(np.arange(starts_at.size), np.diff(np.append(group_first, first_s.size)))  # ranks of starts
    key = _pack(group, born_s, width)  # sorted, as `order` sorts by start, then birth
    g = np.searchsorted(starts_at, x, side="right") - 1
    found = np.full(rows.size, -1, dtype=np.int64)
    pending = np.flatnonzero(g >= 0)
    reach = int((end - first).max())
    for _ in range(8):
        if not pending.size:
            break
        gp, xp, rp = g[pending], x[pending], rows[pending]
        # The last key below (start, row): the latest instance born at that start before the row.
        cand = np.searchsorted(key, _pack(gp, rp, width), side="left") - 1
        c = np.maximum(cand, 0)
        ok = (cand >= 0) & (group[c] == gp) & (xp < end_s[c]) & (rp < died_s[c])
        found[pending[ok]] = order[c[ok]]
        rest = pending[~ok]
        g[rest] -= 1
        further = g[rest] >= 0
        further[further] &= starts_at[g[rest][further]] + reach > x[rest][further]  # a segment there could reach
        pending = rest[further]
    found[pending] = -2
    return found


def _ever_overlap(live: dict[int, _Segment], instances: list, made_by: dict, action, address) -> bool:
    """Whether two live segments ever overlap (or one replaces another), walking the segment events."""
    current = dict(live)
    starts = sorted(current)
    if len(set(starts)) != len(starts) or any(current[a].end > b for a, b in zip(starts[:-1], starts[1:], strict=True)):
        return True
    for r in np.flatnonzero((action == SEGMENT_ALLOC) | (action == SEGMENT_FREE)).tolist():
        addr = int(address[r])
        if r in made_by:
            if addr in current:
                return True
            seg = current[addr] = instances[made_by[r]]
            insort(starts, addr)
            k = bisect_left(starts, addr)
            if (k > 0 and current[starts[k - 1]].end > addr) or (k + 1 < len(starts) and seg.end > starts[k + 1]):
                return True
        elif current.pop(addr, None) is not None:
            del starts[bisect_left(starts, addr)]
    return False


def _search_holders(holder: np.ndarray, live: dict, instances: list, made_by: dict, acts: list, addrs: list) -> None:
    """Fill in the events `_holders` left (-2) by searching the live segments at each, in trace order."""
    live = dict(live)
    starts = sorted(live)
    number = {id(seg): k for k, seg in enumerate(instances)}
    for r in np.flatnonzero((holder == -2) | np.isin(np.array(acts), (SEGMENT_ALLOC, SEGMENT_FREE))).tolist():
        a, addr = acts[r], addrs[r]
        if a == SEGMENT_ALLOC:
            if addr not in live:
                insort(starts, addr)
            live[addr] = instances[made_by[r]]
        elif a == SEGMENT_FREE:
            if live.pop(addr, None) is not None:
                del starts[bisect_left(starts, addr)]
        else:
            i = bisect_right(starts, addr) - 1
            seg = live[starts[i]] if i >= 0 else None
            holder[r] = number[id(seg)] if seg is not None and addr < seg.end else -1


def _fresh_bytes(action, address, size, rounded, rows: np.ndarray) -> np.ndarray:
    """Per alloc placed (`rows`): bytes of the segments cudaMalloc'ed since the last alloc that it overlaps.

    As the walk by entry counts them: the ranges of the segment_allocs after
    the previous alloc (placed or not) whose range meets [addr, addr + rounded).
    """
    allocs = np.flatnonzero(action == ALLOC)
    made = np.flatnonzero(action == SEGMENT_ALLOC)
    out = np.zeros(rows.size, dtype=np.int64)
    if not made.size or not rows.size:
        return out
    nxt = np.searchsorted(allocs, made)  # the alloc each new segment is fresh for
    has = nxt < allocs.size
    made, by = made[has], allocs[nxt[has]]
    at = np.searchsorted(rows, by)
    placed = (at < rows.size) & (rows[np.minimum(at, rows.size - 1)] == by)
    made, by, at = made[placed], by[placed], at[placed]
    meets = (address[made] < address[by] + rounded[by]) & (address[by] < address[made] + size[made])
    np.add.at(out, at[meets], size[made[meets]])
    return out


def _asks(n: int, rows: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    """Per event: its frame row if it is an alloc that needed new memory (it asks about stranding), else -1."""
    ask = np.full(n, -1, dtype=np.int64)
    asked = np.flatnonzero(fresh)
    ask[rows[asked]] = asked
    return ask


class _Group:
    """The segments of one (pool, size class, stream), by largest free gap: a heap, refreshed lazily.

    A segment whose blocks changed is only marked dirty; its gap is measured
    again when another stream's new segment asks, so a walk of millions of
    events measures each segment at most once between two such questions.
    Each measure pushes a new entry; the older ones of that segment are stale
    (their version is not its latest) and are dropped when they reach the top.
    """

    __slots__ = ("heap", "dirty", "versions", "pushes")

    def __init__(self) -> None:
        self.heap: list[tuple] = []  # (-gap, seq, version, at, segment)
        self.dirty: set[_Segment] = set()
        self.versions: dict[_Segment, int] = {}  # segment -> the version of its latest entry
        self.pushes = 0  # the last version given: unique, so entries never tie up to the segment

    def best(self, live: dict[int, _Segment]):
        """(gap, seq, at) of the live segment with the largest gap, the earliest on ties; None if none."""
        heap, versions = self.heap, self.versions
        for seg in self.dirty:
            if live.get(seg.address) is seg:
                gap, at = seg.largest_gap()
                self.pushes += 1
                versions[seg] = self.pushes
                heappush(heap, (-gap, seg.seq, self.pushes, at, seg))
        self.dirty.clear()
        while heap:
            gap, seq, version, at, seg = heap[0]
            if versions.get(seg) == version and live.get(seg.address) is seg:
                return -gap, seq, at
            heappop(heap)
        return None


class _StrandingIndex:
    """The walk's segments by (pool, size class, stream), to answer "a fitting free block on another stream?".

    `live` is the walk's address -> segment dict, which the walk keeps
    current; a group's segments that left it are skipped when asked.
    """

    __slots__ = ("groups", "live")

    def __init__(self, live: dict[int, _Segment]) -> None:
        self.groups: dict[tuple, dict[int, _Group]] = {}
        self.live = live
        for seq, seg in enumerate(live.values()):
            self.enter(seg, seq)

    def enter(self, seg: _Segment, seq: int) -> None:
        """Add a segment, `seq` its place in the walk's dict order; its gap is measured when first asked."""
        by_stream = self.groups.setdefault((seg.pool, seg.small), {})
        group = by_stream.get(seg.stream)
        if group is None:
            group = by_stream[seg.stream] = _Group()
        seg.seq, seg.dirty = seq, group.dirty
        group.dirty.add(seg)

    def free_elsewhere(self, new: _Segment, rounded: int) -> tuple:
        """The largest free block of the same pool and size class on another stream, if it fits.

        As the row walk's `_free_elsewhere` finds it searching every segment in the
        walk's order: the largest gap, the first segment on ties; (address, size,
        stream), or three Nones.
        """
        best = None
        for stream, group in self.groups.get((new.pool, new.small), {}).items():
            if stream == new.stream:
                continue
            found = group.best(self.live)
            if found and found[0] >= rounded and (best is None or (found[0], -found[1]) > (best[0], -best[1])):
                best = (*found, stream)
        if best is None:
            return None, None, None
        size, _seq, at, stream = best
        return at, size, stream


def _walk_forward(
    events: _Events, holder: np.ndarray, rounded: np.ndarray, asks: np.ndarray, instances: list, live: dict
) -> dict[int, tuple]:
    """Walk the events forward from the rewound `live`; frame row -> (other block, size, stream) of each ask.

    Keeps `live` current. An alloc takes the low end of the gap at its address,
    and the whole gap when `should_split` says the rest stays with it.
    """
    stranding = _StrandingIndex(live)
    enter, free_elsewhere = stranding.enter, stranding.free_elsewhere
    next_seq = len(live)
    new_rows: dict[int, tuple] = {}  # frame row -> (other block, its size, its stream) or three Nones
    walked = zip(events.acts, events.addrs, holder.tolist(), rounded.tolist(), asks.tolist(), strict=True)
    for a, addr, k, need, q in progress.track(walked, "walking the trace", len(events.acts), every=65536):
        if a == ALLOC:
            if k < 0:
                continue
            seg = instances[k]
            ss, sizes_of = seg.starts, seg.sizes
            j = bisect_right(ss, addr)
            gap = (ss[j] if j < len(ss) else seg.end) - addr
            if addr not in sizes_of:
                ss.insert(j, addr)
            sizes_of[addr] = need if gap - need > seg.limit else max(gap, need)
            seg.dirty.add(seg)
            if q >= 0:  # the alloc needed new memory: was a free block as large on another stream?
                new_rows[q] = free_elsewhere(seg, need)
        elif a == FREE_COMPLETED:
            if k < 0:
                continue
            seg = instances[k]
            if seg.sizes.pop(addr, None) is not None:
                del seg.starts[bisect_left(seg.starts, addr)]
                seg.dirty.add(seg)
        elif a == SEGMENT_ALLOC:
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
    return new_rows


def alloc_frame(tc: TraceColumns, rows: np.ndarray, row_pools: np.ndarray, fresh, new_rows: dict) -> pd.DataFrame:
    """One row per alloc the walk placed (`rows`: their trace indices), columns as the walk by entry makes them."""
    n = len(rows)
    if not n:
        return pd.DataFrame([], columns=list(ALLOC_COLUMNS))
    served = _SERVED[(np.asarray(fresh) > 0).view(np.int8)]
    other_size = np.zeros(n, dtype=np.int64)
    # Built as pandas reads a column of ints and Nones: floats with NaN, or objects when all are None.
    any_stranded = any(v[0] is not None for v in new_rows.values())
    other_block, other_stream = (np.full(n, np.nan) if any_stranded else np.full(n, None) for _ in range(2))
    found = [(r, *v) for r, v in new_rows.items() if v[0] is not None]
    if found:
        r, blocks, block_sizes, block_streams = zip(*found, strict=True)
        r = np.array(r, dtype=np.int64)
        served[r] = "stranded"
        other_block[r], other_size[r], other_stream[r] = blocks, block_sizes, block_streams
    time_us = tc.time_us[rows]
    columns = {
        "index": rows,
        "time_us": time_us if time_us.dtype != object else time_us.tolist(),
        "addr": tc.addr[rows],
        "size": tc.size[rows],
        "stream": tc.stream[rows],
        "pool": row_pools,
        "served": served,
        "segment_bytes": fresh,
        "other_block": other_block,
        "other_block_size": other_size,
        "other_stream": other_stream,
        "frames": _frames_of(tc, rows),
    }
    return pd.DataFrame(columns, copy=False)  # not copied into one block per dtype: a million rows, a tenth of a second


_SERVED = np.array(["reused", "new_segment"], dtype=object)  # by whether the alloc made new memory


def _frames_of(tc: TraceColumns, rows: np.ndarray) -> np.ndarray:
    """The frames of each of `rows`: the entries' own lists (copying costs), as objects."""
    if tc.stack is not None and tc.stacks is not None:  # read from a file: each stack's one list, by number
        lists = tc.stacks.lists()
        return np.fromiter(lists, dtype=object, count=len(lists))[tc.stack[rows]]
    picked = itemgetter(*rows.tolist())(tc.frames) if len(rows) > 1 else (tc.frames[int(rows[0])],)
    if set(map(type, picked)) != {list}:
        picked = [f if type(f) is list else [] for f in picked]
    return np.fromiter(picked, dtype=object, count=len(rows))


def _compare(snap: Snapshot, segments: dict[int, _Segment], device: int) -> list[str]:
    """As the row walk's `_compare_with_snapshot`: what differs between the walk's end and the snapshot's segments."""
    c = snap.columns
    on = c.device == device
    try:
        if _same_as_snapshot(c, on, segments):
            return []
    except (OverflowError, ValueError):  # addresses beyond int64: compare them one by one
        pass
    want = {}
    for i in np.flatnonzero(on).tolist():
        lo, hi = int(c.first_block[i]), int(c.first_block[i] + c.n_blocks[i])
        blocks = zip(
            c.block_address[lo:hi].tolist(), c.block_size[lo:hi].tolist(), c.block_state[lo:hi].tolist(), strict=True
        )
        want[int(c.address[i])] = (int(c.total_size[i]), {a: n for a, n, st in blocks if st != INACTIVE})
    return segment_differences(want, segments)


def _same_as_snapshot(c, on: np.ndarray, segments: dict[int, _Segment]) -> bool:
    """Whether the walk's segments and active blocks are the snapshot's, compared as sorted arrays."""
    address, total = c.address[on], c.total_size[on]
    if np.unique(address).size != address.size or len(segments) != address.size:
        return False
    values = list(segments.values())
    got_addr = np.fromiter(segments, dtype=np.int64, count=len(values))
    got_size = np.fromiter((s.size for s in values), dtype=np.int64, count=len(values))
    order, want_order = np.argsort(got_addr), np.argsort(address)
    if not (
        np.array_equal(got_addr[order], address[want_order]) and np.array_equal(got_size[order], total[want_order])
    ):
        return False
    active = (c.block_state != INACTIVE) & on[c.block_segment]
    counts = np.fromiter((len(s.sizes) for s in values), dtype=np.int64, count=len(values))
    if counts.sum() != active.sum():
        return False
    n = int(counts.sum())
    got = np.stack(
        [
            np.repeat(got_addr, counts),
            np.fromiter(chain.from_iterable(s.sizes for s in values), dtype=np.int64, count=n),
            np.fromiter(chain.from_iterable(s.sizes.values() for s in values), dtype=np.int64, count=n),
        ]
    )
    want = np.stack([c.address[c.block_segment[active]], c.block_address[active], c.block_size[active]])
    return np.array_equal(got[:, np.lexsort(got[1::-1])], want[:, np.lexsort(want[1::-1])])

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
from operator import itemgetter
from typing import NamedTuple

import numpy as np
import pandas as pd

from kit import progress
from kit.allocator.rules import DEFAULT_POOL, is_small_segment, round_size, round_sizes, split_limit
from kit.analysis.trace.forward import Forward, Instances, places_in_runs, walk_forward
from kit.analysis.trace.state import ALLOC_COLUMNS, CapturePools, TraceWalk, WalkSegment, segment_differences
from kit.errors import KitError
from kit.load.columns import ACTION_CODE, INACTIVE, TraceColumns, ints_or_objects
from kit.load.snapshot import Snapshot
from kit.load.unpickle import gc_paused

ALLOC, FREE_COMPLETED = ACTION_CODE["alloc"], ACTION_CODE["free_completed"]
SEGMENT_ALLOC, SEGMENT_FREE = ACTION_CODE["segment_alloc"], ACTION_CODE["segment_free"]
MAPPING = (ACTION_CODE["segment_map"], ACTION_CODE["segment_unmap"])


class _Segment(WalkSegment):
    """A segment of the rewind: `WalkSegment`, with its end kept."""

    __slots__ = ("end",)

    def __init__(self, address, size, pool, stream, small):
        super().__init__(address, size, pool, stream, small)
        self.end = address + size


class _Events(NamedTuple):
    """The trace entries that move memory (alloc, free_completed, segment_alloc, segment_free), in trace order."""

    index: np.ndarray  # each event's entry in the trace
    action: np.ndarray
    address: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    segment_rows: np.ndarray  # the segment_allocs and segment_frees among them

    def lists(self, rows: np.ndarray) -> tuple[list, ...]:
        """`rows` and their action, address, size and stream, as lists for a loop (a list hands out its ints as
        they are; an array makes each anew)."""
        return rows.tolist(), *(column[rows].tolist() for column in (self.action, self.address, self.size, self.stream))


def _events(tc: TraceColumns) -> _Events:
    """The entries that move memory; the walk skips the rest."""
    index = np.flatnonzero(np.isin(tc.action, (ALLOC, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE)))
    action = tc.action[index]
    segment_rows = np.flatnonzero((action == SEGMENT_ALLOC) | (action == SEGMENT_FREE))
    return _Events(index, action, tc.addr[index], tc.size[index], tc.stream[index], segment_rows)


def walk_columns(snap: Snapshot, device: int = 0) -> TraceWalk | None:
    """`walk_trace` on the columns; None for a trace of expandable segments."""
    if snap.history != "all":
        snap.require_trace(device)  # raises its one-line error, reading nothing
    tc = snap.trace_columns.get(device)
    if tc is None or len(tc) < 2:
        raise KitError(f"{snap.origin}: no trace recorded on device {device}")
    if np.isin(tc.action, MAPPING).any():
        return None
    with gc_paused(), progress.working("walking the trace"):  # it makes objects that almost all die with it
        return _walk(snap, tc, device)


def _walk(snap: Snapshot, tc: TraceColumns, device: int) -> TraceWalk:
    """Rewind to the trace's start, find each event's segment, walk forward classifying allocs, compare at the end."""
    events = _events(tc)
    final = _FinalSegments(snap, device)
    live = _rewound(final, events)  # address -> segment, in the walk's dict order
    rewound = len(live)
    instances = list(live.values())  # every segment of the walk: the rewound ones, then one per segment_alloc
    made, made_by = _segments_made(final, events, instances, CapturePools(snap.kit))
    inst = _instances(instances, rewound)
    # Born at their segment_alloc (`made_by` is in instance order), or before the trace (-1) for the rewound ones.
    born = np.concatenate((np.full(rewound, -1, dtype=np.int64), np.fromiter(made_by, dtype=np.int64)))
    n = len(events.action)
    died = _deaths(inst.address, born, events.action, events.address) if instances else born
    holder = _holders(live, inst, born, died, made_by, events.action, events.address)
    if (holder == -2).any():
        _search_holders(holder, live, instances, made_by, events)
    rounded = round_sizes(events.size)
    rows = np.flatnonzero((events.action == ALLOC) & (holder >= 0))  # the allocs placed: the frame's rows
    fresh = _fresh_bytes(events.action, events.address, events.size, rounded, rows)
    dying = np.full(n, -1, dtype=np.int64)  # the instance leaving the walk at each event
    gone = np.flatnonzero(died < n)
    dying[died[gone]] = gone
    rewound_blocks = _blocks_of(instances[:rewound])
    ask = _asks(n, rows, fresh)
    walked = walk_forward(inst, rewound_blocks, (events.action, events.address, holder, rounded, ask), dying, rows.size)
    stranded = np.flatnonzero(walked.found)
    pools = np.empty(len(instances), dtype=object)
    pools[:] = [seg.pool for seg in instances]
    on_other = (stranded, walked.block[stranded], walked.size[stranded], walked.stream[stranded])
    allocs = alloc_frame(tc, events.index[rows], pools[holder[rows]], fresh, on_other)
    new_segments = pd.DataFrame(made, columns=["index", "addr", "size", "pool", "stream"])
    at_end = np.flatnonzero(died == n)
    return TraceWalk(allocs, new_segments, _compare(snap, inst, at_end, walked, device), rewound, device)


def _instances(instances: list, rewound: int) -> Instances:
    """The walk's segments as the forward pass's arrays; a (pool, size class) group numbered by first appearance."""
    count = len(instances)
    groups: dict[tuple, int] = {}
    group = [groups.setdefault((seg.pool, seg.small), len(groups)) for seg in instances]
    small = np.fromiter((seg.small for seg in instances), dtype=bool, count=count)
    return Instances(
        address=ints_or_objects([seg.address for seg in instances]),
        end=ints_or_objects([seg.end for seg in instances]),
        limit=np.where(small, split_limit(True), split_limit(False)).astype(np.int64),
        group=np.array(group, dtype=np.int64),
        stream=ints_or_objects([seg.stream for seg in instances]),
        rewound=rewound,
    )


def _blocks_of(segments: list) -> tuple[list, list, list]:
    """The active blocks of the rewound segments: (instance, address, size), by instance, then address."""
    out: tuple[list, list, list] = ([], [], [])
    for k, seg in enumerate(segments):
        out[0].extend([k] * len(seg.starts))
        out[1].extend(seg.starts)
        out[2].extend(seg.sizes[a] for a in seg.starts)
    return out


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
    segments: dict = {address: i for i, address in enumerate(final.address)}
    starts = sorted(segments)
    for _, a, addr, size, stream in zip(*events.lists(_rewind_rows(final, events)[::-1]), strict=True):
        if a == SEGMENT_ALLOC:
            if segments.pop(addr, None) is not None:
                del starts[bisect_left(starts, addr)]
        elif a == SEGMENT_FREE:
            # A segment freed within the trace belonged to the default pool (graph
            # pools are not freed while their graphs live).
            if addr not in segments:
                insort(starts, addr)
            segments[addr] = _Segment(addr, size, DEFAULT_POOL, stream, is_small_segment(size))
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
                seg.activate(addr, round_size(size))  # its exact size is not in the trace
    for address, seg in segments.items():
        if type(seg) is int:
            segments[address] = final.make(seg)
    return segments


def _rewind_rows(final: _FinalSegments, events: _Events) -> np.ndarray:
    """The events the rewind must visit: every segment event, and the block events of segments that outlive it.

    Walking backwards, a block event changes the segment that holds its address
    at that moment; a segment the trace allocated is dropped again at its
    segment_alloc, so its block events change nothing that lasts. Only the
    segments present at the trace's first entry keep what the rewind does to
    them: the snapshot's segments the trace never allocated, and segments the
    trace frees but never allocated (present up to their segment_free).
    """
    segment_rows = events.segment_rows
    n = len(events.action)
    present = {a: (a, size, n) for a, size in zip(final.address, final.size, strict=True)}
    for r, a, addr, size, _ in zip(*events.lists(segment_rows[::-1]), strict=True):
        if a == SEGMENT_ALLOC:
            present.pop(addr, None)
        else:
            present[addr] = (addr, size, r)  # present before row r
    if not present:
        return segment_rows
    first, size, until = (np.array(x, dtype=np.int64) for x in zip(*sorted(present.values()), strict=True))
    if np.any(first[1:] < first[:-1] + size[:-1]):
        return np.arange(n)  # overlapping segments: visit everything, as the walk by entry does
    address = np.asarray(events.address, dtype=np.int64)
    at = np.searchsorted(first, address, side="right") - 1
    held = (at >= 0) & (address < (first + size)[at]) & (np.arange(n) < until[at])
    held[segment_rows] = True
    return np.flatnonzero(held)


def _segments_made(final: _FinalSegments, events: _Events, instances: list, captured: CapturePools) -> tuple:
    """A segment object for every segment_alloc, appended to `instances`; the `made` rows; event -> instance."""
    # A segment's pool is in the snapshot only for the segment there now. Addresses come
    # back after a segment_free, so an earlier segment at the same address, one freed
    # within the trace, is the pool of the recorded capture it was made in, else the
    # default pool's (graph pools are not freed while their graphs live).
    known = dict(zip(final.address, zip(final.pool, final.small, strict=True), strict=True))
    segment_rows = events.segment_rows
    trace_index = events.index[segment_rows].tolist()
    rows, acts, addrs, sizes, streams = events.lists(segment_rows)
    freed_later, last_alloc = set(), {}
    for a, addr, i in zip(acts, addrs, trace_index, strict=True):
        if a == SEGMENT_ALLOC:
            last_alloc[addr] = i
        elif addr in last_alloc:
            freed_later.add(last_alloc[addr])
    made, made_by = [], {}
    for r, a, addr, size, stream, i in zip(rows, acts, addrs, sizes, streams, trace_index, strict=True):
        if a != SEGMENT_ALLOC:
            continue
        if i in freed_later:
            pool, small = captured.at(i, stream) or DEFAULT_POOL, is_small_segment(size)
        else:
            pool, small = known.get(addr) or (DEFAULT_POOL, is_small_segment(size))
        made_by[r] = len(instances)
        instances.append(_Segment(addr, size, pool, stream, small))
        made.append((i, addr, size, pool, stream))
    return made, made_by


def _holders(live: dict[int, _Segment], inst: Instances, born, died, made_by: dict, action, address) -> np.ndarray:
    """For each event: the instance whose segment holds its address then, -1 for none, -2 to search while walking.

    Segment events get the instance they make (segment_alloc). Block events are
    placed with numpy (see the module's docstring); overlapping segments (an
    inconsistent trace) leave every block event to the search. An instance
    lives from `born` to `died` (event rows).
    """
    holder = np.full(len(action), -1, dtype=np.int64)
    holder[np.fromiter(made_by, dtype=np.int64, count=len(made_by))] = np.arange(len(made_by)) + inst.rewound
    blocks = np.flatnonzero((action == ALLOC) | (action == FREE_COMPLETED))
    if not len(inst.address) or not blocks.size:
        return holder
    if _ever_overlap(live, inst, made_by, action, address):
        holder[blocks] = -2
        return holder
    holder[blocks] = _place(blocks, address[blocks], inst.address, inst.end, born, died, len(action))
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


def _ever_overlap(live: dict[int, _Segment], inst: Instances, made_by: dict, action, address) -> bool:
    """Whether two live segments ever overlap (or one replaces another), walking the segment events."""
    current = {a: seg.end for a, seg in live.items()}  # start -> end
    starts = sorted(current)
    if any(current[a] > b for a, b in zip(starts[:-1], starts[1:], strict=True)):
        return True
    ends = inst.end.tolist()
    for r in np.flatnonzero((action == SEGMENT_ALLOC) | (action == SEGMENT_FREE)).tolist():
        addr = int(address[r])
        if r in made_by:
            if addr in current:
                return True
            end = current[addr] = ends[made_by[r]]
            insort(starts, addr)
            k = bisect_left(starts, addr)
            if (k > 0 and current[starts[k - 1]] > addr) or (k + 1 < len(starts) and end > starts[k + 1]):
                return True
        elif current.pop(addr, None) is not None:
            del starts[bisect_left(starts, addr)]
    return False


def _search_holders(holder: np.ndarray, live: dict, instances: list, made_by: dict, events: _Events) -> None:
    """Fill in the events `_holders` left (-2) by searching the live segments at each, in trace order."""
    live = dict(live)
    starts = sorted(live)
    number = {id(seg): k for k, seg in enumerate(instances)}
    searched = np.union1d(np.flatnonzero(holder == -2), events.segment_rows)
    for r, a, addr, _, _ in zip(*events.lists(searched), strict=True):
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


def alloc_frame(tc: TraceColumns, rows: np.ndarray, row_pools: np.ndarray, fresh, stranded: tuple) -> pd.DataFrame:
    """One row per alloc the walk placed (`rows`: their trace indices), columns as the walk by entry makes them.

    `stranded` is (frame row, other block, its size, its stream) of each alloc
    that made new memory while a free block as large was on another stream.
    """
    n = len(rows)
    if not n:
        return pd.DataFrame([], columns=list(ALLOC_COLUMNS))
    served = _SERVED[(np.asarray(fresh) > 0).view(np.int8)]
    other_size = np.zeros(n, dtype=np.int64)
    # Built as pandas reads a column of ints and Nones: floats with NaN, objects when all are None, ints when none is.
    at, blocks, block_sizes, block_streams = stranded
    empty = np.zeros(n, dtype=np.int64) if len(at) == n else np.full(n, np.nan) if len(at) else np.full(n, None)
    other_block, other_stream = empty, empty.copy()
    if len(at):
        served[at] = "stranded"
        other_block[at], other_size[at], other_stream[at] = blocks, block_sizes, block_streams
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


def _compare(snap: Snapshot, inst: Instances, at_end: np.ndarray, walked: Forward, device: int) -> list[str]:
    """As the row walk's `_compare_with_snapshot`: what differs between the walk's end and the snapshot's segments.

    `at_end` numbers the instances still live when the walk ends; `walked`
    holds their blocks.
    """
    c = snap.columns
    on = c.device == device
    address = inst.address[at_end]
    size = inst.end[at_end] - address
    slots = np.repeat(walked.start[at_end], walked.count[at_end]) + places_in_runs(walked.count[at_end])
    got = (address, size, np.repeat(address, walked.count[at_end]), walked.buf_addr[slots], walked.buf_size[slots])
    try:
        if _same_as_snapshot(c, on, got):
            return []
    except (OverflowError, ValueError, TypeError):  # addresses beyond int64: compare them one by one
        pass
    want = {}
    for i in np.flatnonzero(on).tolist():
        lo, hi = int(c.first_block[i]), int(c.first_block[i] + c.n_blocks[i])
        blocks = zip(
            c.block_address[lo:hi].tolist(), c.block_size[lo:hi].tolist(), c.block_state[lo:hi].tolist(), strict=True
        )
        want[int(c.address[i])] = (int(c.total_size[i]), {a: n for a, n, st in blocks if st != INACTIVE})
    segments = {}
    for k, a, n in zip(at_end.tolist(), address.tolist(), size.tolist(), strict=True):
        seg = segments[a] = WalkSegment(a, n, None, None, None)
        lo, hi = int(walked.start[k]), int(walked.start[k] + walked.count[k])
        seg.sizes = dict(zip(walked.buf_addr[lo:hi].tolist(), walked.buf_size[lo:hi].tolist(), strict=True))
    return segment_differences(want, segments)


def _same_as_snapshot(c, on: np.ndarray, got: tuple) -> bool:
    """Whether the walk's segments and active blocks are the snapshot's, compared as sorted arrays.

    `got` is the walk's (segment address, size) and, per block, (its
    segment's address, address, size).
    """
    address, total = c.address[on], c.total_size[on]
    got_addr, got_size, *got_blocks = got
    if np.unique(address).size != address.size or got_addr.size != address.size:
        return False
    order, want_order = np.argsort(got_addr), np.argsort(address)
    if not (
        np.array_equal(got_addr[order], address[want_order]) and np.array_equal(got_size[order], total[want_order])
    ):
        return False
    active = (c.block_state != INACTIVE) & on[c.block_segment]
    if got_blocks[0].size != active.sum():
        return False
    mine = np.stack(got_blocks)
    want = np.stack([c.address[c.block_segment[active]], c.block_address[active], c.block_size[active]])
    return np.array_equal(mine[:, np.lexsort(mine[1::-1])], want[:, np.lexsort(want[1::-1])])

"""The columnar walk's forward pass: each block event applied to its segment, and the stranding question asked.

`kit.analysis.trace.columnar` rewinds the segments to the trace's start and
finds the segment (the instance) that holds each event's address; this pass
then walks the events in trace order over plain int64 arrays:

- each instance keeps its active blocks, sorted by address, in a slot of one
  buffer (sized for its rewound blocks plus its allocs, so a slot never
  overflows); an alloc takes the low end of the gap at its address, and the
  whole gap when `should_split` says the rest stays with it;
- each (pool, size class) group lists its live instances: an instance enters
  at its segment_alloc (or the trace's start) and leaves at the next segment
  event at its address, a segment_free or a segment_alloc that replaces it,
  which then takes its place in the walk's order (`seq`);
- an alloc that needed new memory asks "was a free block as large on another
  stream of the same group?": each (group, stream) keeps a max-tree of its
  live instances' largest gaps, measured again only where blocks changed
  since the last question, and the largest over the other streams wins, the
  earliest in the walk's order on ties, as the walk by entry
  (`kit.analysis.trace.rows`) searches.

The same function runs compiled by numba (vLLM pins it, so a vLLM
environment has it) on traces of `JIT_EVENTS` events or more, and as plain
Python on smaller ones, where compiling would cost more than it saves; the
plain run is also what a machine without numba gets, and what runs on
addresses beyond int64 (object arrays). The two are one source, so one test
of either checks the rule both follow.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kit.load.columns import ACTION_CODE

ALLOC, FREE_COMPLETED = ACTION_CODE["alloc"], ACTION_CODE["free_completed"]
SEGMENT_ALLOC = ACTION_CODE["segment_alloc"]
JIT_EVENTS = 200_000  # below this many events the plain run is done before numba would have loaded
_compiled = None


class Instances(NamedTuple):
    """Every segment of the walk (the rewound ones first, in the walk's order, then one per segment_alloc)."""

    address: np.ndarray
    end: np.ndarray
    limit: np.ndarray  # `split_limit` of its size class
    group: np.ndarray  # its (pool, size class), numbered
    stream: np.ndarray
    rewound: int  # how many were there at the trace's start


class Forward(NamedTuple):
    """What the pass leaves: every instance's active blocks at the end, and each ask's answer."""

    start: np.ndarray  # instance k's blocks are buf_addr[start[k] : start[k] + count[k]], sorted
    count: np.ndarray
    buf_addr: np.ndarray
    buf_size: np.ndarray
    found: np.ndarray  # per frame row: whether a fitting free block was on another stream
    block: np.ndarray  # its address, size and stream
    size: np.ndarray
    stream: np.ndarray


def walk_forward(
    inst: Instances,
    blocks: tuple[list, list, list],
    events: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    dying: np.ndarray,
    rows: int,
) -> Forward:
    """Walk `events` (action, address, holder, rounded size, ask) forward from the rewound blocks.

    `blocks` gives each rewound instance's active blocks (instance, address,
    size); `dying[r]` is the instance leaving the walk at event r, else -1;
    `rows` is how many frame rows the asks number.
    """
    action, address, holder, need, ask = events
    k = len(inst.address)
    allocs = np.bincount(holder[(action == ALLOC) & (holder >= 0)], minlength=k)
    rewound_blocks = np.bincount(np.asarray(blocks[0], dtype=np.int64), minlength=k)
    count = rewound_blocks.copy()  # the kernel keeps it current
    start = _firsts(allocs + rewound_blocks)
    dtype = np.int64 if address.dtype == np.int64 and inst.address.dtype == np.int64 else object
    buf_addr = np.zeros(int(allocs.sum() + rewound_blocks.sum()), dtype=dtype)
    buf_size = np.zeros(buf_addr.size, dtype=dtype)
    if blocks[0]:  # sorted by instance, then address
        slot = np.repeat(start, count) + places_in_runs(count)
        buf_addr[slot], buf_size[slot] = blocks[1], blocks[2]
    found = np.zeros(rows, dtype=np.bool_)
    other = np.zeros((3, rows), dtype=dtype)
    args = (action, address, holder, need, ask, dying, inst.address, inst.end, inst.limit, inst.group, inst.stream)
    state = (inst.rewound, start, count, buf_addr, buf_size, *_streams_of_groups(inst), found, other)
    _kernel(len(action), dtype is np.int64)(*args, *state)
    return Forward(start, count, buf_addr, buf_size, found, other[0], other[1], other[2])


def _streams_of_groups(inst: Instances) -> tuple[np.ndarray, ...]:
    """The instances by (group, stream) ("pair"), each pair with a max-tree of its live instances over its slots.

    Pairs are numbered in (group, stream) order, so a group's pairs are
    `group_pairs[g]` to `group_pairs[g + 1]`. A pair of n instances has a
    tree of 2 * width nodes from `tree_base[p]` (width: n rounded up to a
    power of two; node 1 the root, leaf i at width + i) and a stack of n
    places from `stack_base[p]` for its instances whose gaps changed.
    """
    _, stream_code = np.unique(inst.stream, return_inverse=True)
    streams = int(stream_code.max(initial=0)) + 1
    keys, pair = np.unique(inst.group * streams + stream_code, return_inverse=True)
    members = np.bincount(pair, minlength=keys.size)
    leaf = np.empty(pair.size, dtype=np.int64)
    leaf[np.argsort(pair, kind="stable")] = places_in_runs(members)
    width = 1 << np.ceil(np.log2(np.maximum(members, 1))).astype(np.int64)
    tree_base, stack_base = _firsts(2 * width), _firsts(members)
    group_pairs = np.searchsorted(keys // streams, np.arange(int(inst.group.max(initial=-1)) + 2))
    return pair.astype(np.int64), leaf, width, tree_base, stack_base, group_pairs


def _firsts(count: np.ndarray) -> np.ndarray:
    """Where each run starts when runs of `count` elements lie end to end: 0, count[0], count[0] + count[1], ..."""
    return (np.cumsum(count) - count).astype(np.int64)


def places_in_runs(count: np.ndarray) -> np.ndarray:
    """0, 1, ... count[0] - 1, 0, 1, ... count[1] - 1, ...: each element's place within its run."""
    return np.arange(int(count.sum())) - np.repeat(_firsts(count), count)


def _kernel(events: int, int64: bool):
    """The pass itself: compiled when the trace is long, numba is there and the arrays are int64."""
    global _compiled
    if events < JIT_EVENTS or not int64:
        return _walk
    if _compiled is None:
        try:
            import numba
        except ImportError:
            _compiled = _walk
        else:
            _compiled = numba.njit(cache=True, nogil=True)(_walk)
    return _compiled


def _walk(
    action, address, holder, need, ask, dying, seg_addr, seg_end, limit, group, stream,
    rewound, start, count, buf_addr, buf_size, pair, leaf, width, tree_base, stack_base, group_pairs, found, other,
):  # fmt: skip
    """`walk_forward`'s loop, over arrays only (numba compiles it as it is)."""
    n_inst = seg_addr.size
    gap = np.zeros(n_inst, dtype=buf_addr.dtype)
    gap_at = np.zeros(n_inst, dtype=buf_addr.dtype)
    seq = np.arange(n_inst)  # the walk's order: a dict's, where a replaced key keeps its place
    live = np.zeros(n_inst, dtype=np.bool_)
    stacked = np.zeros(n_inst, dtype=np.bool_)  # on its pair's stack of gaps to measure again
    stack = np.zeros(n_inst, dtype=np.int64)
    stacked_n = np.zeros(width.size, dtype=np.int64)
    tree = np.full(int(tree_base[-1] + 2 * width[-1]) if width.size else 0, -1, dtype=np.int64)

    def better(a, b):
        """Whether instance a's gap beats b's: larger, or as large and earlier in the walk's order."""
        return b < 0 or (a >= 0 and (gap[a] > gap[b] or (gap[a] == gap[b] and seq[a] < seq[b])))

    def put(m, value):
        """Leaf of instance m set to `value` (m, or -1 for none), and the tree above it."""
        base, node = tree_base[pair[m]], width[pair[m]] + leaf[m]
        tree[base + node] = value
        while node > 1:
            node //= 2
            a, b = tree[base + 2 * node], tree[base + 2 * node + 1]
            tree[base + node] = a if better(a, b) else b

    def changed(m):
        """Instance m's blocks changed: its gap is measured again before the next question to its pair."""
        if not stacked[m]:
            stacked[m] = True
            p = pair[m]
            stack[stack_base[p] + stacked_n[p]] = m
            stacked_n[p] += 1

    def measure(m):
        """(size, address) of instance m's largest free block, the lowest on ties; (0, 0) when there is none."""
        best, at, cursor = 0, 0, seg_addr[m]
        for p in range(start[m], start[m] + count[m]):
            if buf_addr[p] - cursor > best:
                best, at = buf_addr[p] - cursor, cursor
            cursor = max(cursor, buf_addr[p] + buf_size[p])
        if seg_end[m] - cursor > best:
            best, at = seg_end[m] - cursor, cursor
        return best, at

    def best_of(p):
        """Pair p's live instance with the largest gap, measuring those that changed; -1 for none."""
        for s in range(stack_base[p], stack_base[p] + stacked_n[p]):
            m = stack[s]
            stacked[m] = False
            if live[m]:
                gap[m], gap_at[m] = measure(m)
                put(m, m)
        stacked_n[p] = 0
        return tree[tree_base[p] + 1]

    def enter(m):
        live[m] = True
        changed(m)

    def leave(m):
        live[m] = False
        put(m, -1)

    for m in range(rewound):
        enter(m)
    next_seq = rewound
    for t in range(action.size):
        a, x, i = action[t], address[t], holder[t]
        if a == ALLOC or a == FREE_COMPLETED:
            if i < 0:
                continue
            lo, hi = start[i], start[i] + count[i]
            if a == ALLOC:
                j = lo + np.searchsorted(buf_addr[lo:hi], x, side="right")
                room = (buf_addr[j] if j < hi else seg_end[i]) - x
                size = need[t] if room - need[t] > limit[i] else max(room, need[t])
                if j > lo and buf_addr[j - 1] == x:
                    buf_size[j - 1] = size
                else:
                    for m in range(hi, j, -1):
                        buf_addr[m], buf_size[m] = buf_addr[m - 1], buf_size[m - 1]
                    buf_addr[j], buf_size[j] = x, size
                    count[i] += 1
                changed(i)
                q = ask[t]
                if q >= 0:  # it needed new memory: was a free block as large on another stream?
                    best = -1
                    g = group[i]
                    for p in range(group_pairs[g], group_pairs[g + 1]):
                        if p != pair[i]:
                            m = best_of(p)
                            if better(m, best):
                                best = m
                    if best >= 0 and gap[best] >= need[t]:
                        found[q] = True
                        other[0, q], other[1, q], other[2, q] = gap_at[best], gap[best], stream[best]
            else:
                j = lo + np.searchsorted(buf_addr[lo:hi], x, side="left")
                if j < hi and buf_addr[j] == x:
                    for m in range(j, hi - 1):
                        buf_addr[m], buf_size[m] = buf_addr[m + 1], buf_size[m + 1]
                    count[i] -= 1
                    changed(i)
            continue
        gone = dying[t]  # a segment_free, or a segment_alloc over a live segment's address
        if gone >= 0:
            leave(gone)
        if a == SEGMENT_ALLOC:
            if gone >= 0:
                seq[i] = seq[gone]
            else:
                seq[i] = next_seq
                next_seq += 1
            enter(i)

"""The trace walk entry by entry: the reference walk, and the one for expandable segments.

`walk_rows` rewinds the final snapshot to the trace's first entry (segments
and active blocks), walks the trace forward again, and checks that the walk
ends at the snapshot; any difference is reported in `TraceWalk.mismatches`,
never ignored. Walking forward it classifies every `alloc`:

- `reused`: served from a cached free block of its stream;
- `new_segment`: needed a new segment (the `segment_alloc` just before it);
- `stranded`: needed a new segment although a free block at least as large
  sat in the same pool and size class on another stream, the case PR 63155 is
  about. The row names that block and its stream.

An allocation takes the low end of the free block (gap) that starts at its
address, and the whole gap when `should_split` says the rest stays with it.

Expandable segments (`expandable_segments:True`) grow and shrink by mapping
pages (`segment_map`, `segment_unmap`), and a snapshot lists one segment per
mapped range; the walk does the same, so an allocation that needed pages
mapped counts as a new segment of the mapped bytes; its blocks split as the
small pool's do (`should_split(..., expandable=True)`), and one unmap can take
pages from ranges the walk holds apart (`Layout.unmap`). It ends at the
snapshot on all 24 recordings of `kit/recordings/expandable`. A trace that contradicts the snapshot (a free of a block
never allocated, a segment freed twice) never stops the walk: what does not
add up is reported in `mismatches`. Actions a newer torch adds are skipped.

This walk visits every segment for every new one, which takes minutes at
DeepSeek scale; `kit.analysis.trace.columnar` returns the same result from
the snapshot's columns and is what `walk_trace` uses where it can.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kit.allocator.rules import DEFAULT_POOL, is_small_segment, round_size, should_split
from kit.analysis.trace.state import ALLOC_COLUMNS, CapturePools, Layout, TraceWalk, WalkSegment, segment_differences
from kit.load.columns import INACTIVE
from kit.load.rows import TraceEntry
from kit.load.snapshot import Snapshot


def _final_layout(snap: Snapshot, device: int) -> Layout:
    """The snapshot's segments on `device` and their active blocks."""
    layout = Layout()
    c = snap.columns  # not the typed segments: those read the whole file again
    first, counts = c.first_block.tolist(), c.n_blocks.tolist()
    block_address, block_size, block_state = c.block_address.tolist(), c.block_size.tolist(), c.block_state.tolist()
    for i in np.flatnonzero(c.device == device).tolist():
        pool = (int(c.pool_a[i]), int(c.pool_b[i]))
        seg = WalkSegment(int(c.address[i]), int(c.total_size[i]), pool, int(c.stream[i]), bool(c.small[i]))
        for j in range(first[i], first[i] + counts[i]):
            if block_state[j] != INACTIVE:
                seg.activate(block_address[j], block_size[j])
        layout.add(seg)
    return layout


def _pool_at(final: Layout, address: int, size: int) -> tuple[tuple[int, int], bool]:
    """Pool and size class of the snapshot's segment at `address`; the default pool's if none is there."""
    seg = final.find(address)
    if seg is not None:
        return seg.pool, seg.small
    return DEFAULT_POOL, is_small_segment(size)


def initial_state(snap: Snapshot, entries, device: int) -> tuple[Layout, int]:
    """Rewind the final snapshot backwards through the trace to its first entry: the layout, its segment count.

    A block freed within the trace gets `round_size` of its request: the trace
    does not say whether it also took an unsplit remainder.
    """
    layout = _final_layout(snap, device)
    final = _final_layout(snap, device)
    for e in reversed(entries):
        action = e.action
        if action == "segment_alloc":
            layout.remove(e.addr)
        elif action == "segment_free":
            # A segment freed within the trace belonged to the default pool (graph
            # pools are not freed while their graphs live).
            layout.add(WalkSegment(e.addr, e.size, DEFAULT_POOL, e.stream, is_small_segment(e.size)))
        elif action == "segment_map":
            layout.unmap(e.addr, e.size)
        elif action == "segment_unmap":
            layout.map(e.addr, e.size, e.stream, *_pool_at(final, e.addr, e.size))
        elif action == "alloc":
            seg = layout.find(e.addr)
            if seg is not None:
                seg.release(e.addr)
        elif action == "free_completed":
            seg = layout.find(e.addr)
            if seg is not None and e.addr not in seg.sizes:
                seg.activate(e.addr, round_size(e.size))  # its exact size is not in the trace
    return layout, len(layout.by_start)


def walk_rows(snap: Snapshot, device: int) -> TraceWalk:
    """Walk the snapshot's trace entry by entry from its rewound start; classify every alloc."""
    entries = snap.require_trace(device)
    expandable = snap.expandable
    layout, rewound = initial_state(snap, entries, device)
    final = _final_layout(snap, device)
    freed_later = _freed_later(entries)
    captured = CapturePools(snap.kit)
    rows = []
    made = []
    fresh: list[tuple[int, int]] = []  # ranges cudaMalloc'ed or mapped since the last alloc
    for i, e in enumerate(entries):
        action = e.action
        if action == "segment_alloc" or action == "segment_map":
            freed_pool = (captured.at(i, e.stream) or DEFAULT_POOL) if i in freed_later else None
            seg = _new_segment(layout, final, e, freed_pool)
            fresh.append((e.addr, e.size))
            made.append((i, e.addr, e.size, seg.pool, e.stream))
        elif action == "segment_free":
            layout.remove(e.addr)
        elif action == "segment_unmap":
            layout.unmap(e.addr, e.size)
        elif action == "free_completed":
            seg = layout.find(e.addr)
            if seg is not None:
                seg.release(e.addr)
        elif action == "alloc":
            row = _placed_alloc(layout, i, e, fresh, expandable)
            if row is not None:
                rows.append(row)
            fresh.clear()
    allocs = pd.DataFrame(rows, columns=list(ALLOC_COLUMNS))
    new_segments = pd.DataFrame(made, columns=["index", "addr", "size", "pool", "stream"])
    return TraceWalk(allocs, new_segments, _compare_with_snapshot(snap, layout, device), rewound, device)


def _freed_later(entries) -> set[int]:
    """The segment_allocs (entry numbers) whose segment the trace frees again."""
    # A segment's pool is in the snapshot only for the segment there now. Addresses come
    # back after a segment_free, so an earlier segment at the same address, one freed
    # within the trace, gets its pool from the capture windows (`CapturePools`), else the
    # default pool's (graph pools are not freed while their graphs live).
    freed_later = set()
    last_alloc: dict[int, int] = {}
    for i, e in enumerate(entries):
        if e.action == "segment_alloc":
            last_alloc[e.addr] = i
        elif e.action == "segment_free" and e.addr in last_alloc:
            freed_later.add(last_alloc[e.addr])
    return freed_later


def _new_segment(layout: Layout, final: Layout, e: TraceEntry, freed_pool: tuple | None) -> WalkSegment:
    """The segment a segment_alloc makes, or the one a segment_map grows; its pool as the snapshot says.

    `freed_pool`: for a segment the trace frees again, its pool (the recorded capture's it was
    made in, else the default pool); None for one the snapshot may still hold.
    """
    if e.action == "segment_map":
        return layout.map(e.addr, e.size, e.stream, *_pool_at(final, e.addr, e.size))
    known = final.by_start.get(e.addr) if freed_pool is None else None
    if known:
        pool, small = known.pool, known.small
    else:
        pool, small = freed_pool or DEFAULT_POOL, is_small_segment(e.size)
    seg = WalkSegment(e.addr, e.size, pool, e.stream, small)
    layout.add(seg)
    return seg


def _placed_alloc(
    layout: Layout, i: int, e: TraceEntry, fresh: list[tuple[int, int]], expandable: bool = False
) -> dict | None:
    """Place alloc entry `i` in its segment and classify it: its row of `TraceWalk.allocs`; None if no segment."""
    seg = layout.find(e.addr)
    if seg is None:
        return None
    rounded = round_size(e.size)
    gap = seg.gap_at(e.addr)
    split = should_split(gap - rounded, seg.small, expandable)  # expandable segments split as the small pool does
    seg.activate(e.addr, rounded if split else max(gap, rounded))
    row = {
        "index": i,
        "time_us": e.time_us,
        "addr": e.addr,
        "size": e.size,
        "stream": e.stream,
        "pool": seg.pool,
        "served": "reused",
        "segment_bytes": 0,
        "other_block": None,
        "other_block_size": 0,
        "other_stream": None,
        "frames": e.frames,
    }
    new_bytes = sum(size for a, size in fresh if a < e.addr + rounded and e.addr < a + size) if fresh else 0
    if new_bytes:
        row["served"] = "new_segment"
        row["segment_bytes"] = new_bytes
        other = _free_elsewhere(layout, seg, rounded)
        if other:
            row["served"] = "stranded"
            row["other_block"], row["other_block_size"], row["other_stream"] = other
    return row


def _free_elsewhere(layout: Layout, new: WalkSegment, rounded: int) -> tuple[int, int, int] | None:
    """The largest free block of the same pool and size class on another stream, if it fits."""
    best = None
    for seg in layout.by_start.values():
        if seg is new or seg.pool != new.pool or seg.small != new.small or seg.stream == new.stream:
            continue
        size, at = seg.largest_gap()
        if size >= rounded and (best is None or size > best[1]):
            best = (at, size, seg.stream)
    return best


def _compare_with_snapshot(snap: Snapshot, layout: Layout, device: int) -> list[str]:
    """What differs between the walk's end and the snapshot's segments on `device`."""
    want = {
        s.address: (s.total_size, {b.address: b.size for b in s.blocks if b.state != "inactive"})
        for s in snap.segments
        if s.device == device
    }
    return segment_differences(want, layout.by_start)

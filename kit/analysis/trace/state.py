"""What both trace walks keep: the segments at one point of the walk, their active blocks, and the result.

A snapshot's trace names no pool and lists no free block, but neither is
needed: the allocator merges free neighbours, so the free blocks of a segment
are exactly the gaps between its active blocks. A `WalkSegment` keeps a
segment's active blocks (sorted start addresses and their sizes) and answers
"how large is the free block at this address" from them. `Layout` indexes the
live segments by address, and grows and shrinks expandable segments' mapped
ranges. `TraceWalk` is what a walk returns.

The pool of a segment the trace makes is the snapshot's where the segment is
still there at the end. One the trace also frees is the default pool's, as
graph pools are not freed while their graphs live, unless the recorder's
capture windows (the `kit` key) put its segment_alloc inside a capture on
its stream: vLLM's graph-memory estimate captures into a pool of its own and
frees it again, and a plain trace cannot tell those segments apart
(`CapturePools`).

There are two walks over this state, on purpose: `kit.analysis.trace.rows`
walks entry by entry over typed records (the reference, and the only walk
for expandable segments), `kit.analysis.trace.columnar` walks the numpy
columns at millions of events. `walk_trace` picks one; the tests hold the
two side by side.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass, field

import pandas as pd

# One row per allocation of the walk (`TraceWalk.allocs`), in the row walk and the columnar one.
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


class WalkSegment:
    """A segment during a walk: its pool, stream and size class, and its active blocks."""

    __slots__ = ("address", "size", "pool", "stream", "small", "starts", "sizes")

    def __init__(self, address, size, pool, stream, small):
        self.address, self.size, self.pool, self.stream, self.small = address, size, pool, stream, small
        self.starts: list[int] = []  # active block addresses, sorted
        self.sizes: dict[int, int] = {}

    def gap_at(self, address: int) -> int:
        """Size of the free block starting at `address`: up to the next active block."""
        i = bisect_right(self.starts, address)
        end = self.starts[i] if i < len(self.starts) else self.address + self.size
        return end - address

    def largest_gap(self) -> tuple[int, int]:
        """(size, address) of the largest free block, the lowest on ties; (0, 0) when there is none."""
        best, at, cursor = 0, 0, self.address
        for start in self.starts:
            if start - cursor > best:
                best, at = start - cursor, cursor
            cursor = max(cursor, start + self.sizes[start])
        if self.address + self.size - cursor > best:
            best, at = self.address + self.size - cursor, cursor
        return best, at

    def activate(self, address: int, size: int) -> None:
        """The block at `address` is active, `size` bytes."""
        if address not in self.sizes:
            insort(self.starts, address)
        self.sizes[address] = size

    def release(self, address: int) -> None:
        """The block at `address` is free again (nothing happens if it was not active)."""
        if self.sizes.pop(address, None) is not None:
            del self.starts[bisect_left(self.starts, address)]

    def blocks_in(self, low: int, high: int) -> list[tuple[int, int]]:
        """The active blocks starting in [low, high)."""
        return [(a, self.sizes[a]) for a in self.starts[bisect_left(self.starts, low) : bisect_left(self.starts, high)]]


class Layout:
    """The segments at one point of the walk, indexed by address."""

    def __init__(self) -> None:
        self.by_start: dict[int, WalkSegment] = {}
        self.starts: list[int] = []

    def add(self, seg: WalkSegment) -> None:
        """Add `seg`, in place of any segment at its address."""
        if seg.address not in self.by_start:
            insort(self.starts, seg.address)
        self.by_start[seg.address] = seg

    def remove(self, address: int) -> WalkSegment | None:
        """Remove the segment at `address`, and return it (None if there is none)."""
        seg = self.by_start.pop(address, None)
        if seg is not None:
            del self.starts[bisect_left(self.starts, address)]
        return seg

    def find(self, address: int) -> WalkSegment | None:
        """The segment holding `address`."""
        i = bisect_right(self.starts, address) - 1
        if i >= 0:
            seg = self.by_start[self.starts[i]]
            if address < seg.address + seg.size:
                return seg
        return None

    def map(self, address: int, size: int, stream: int, pool: tuple[int, int], small: bool) -> WalkSegment:
        """Pages [address, address + size) mapped: the neighbouring range of the same stream and pool grows."""
        before = self.find(address - 1) if address else None
        if (
            before is not None
            and before.address + before.size == address
            and (before.stream, before.pool) == (stream, pool)
        ):
            seg = before
            seg.size += size
        else:
            seg = WalkSegment(address, size, pool, stream, small)
            self.add(seg)
        after = self.by_start.get(seg.address + seg.size)
        if after is not None and (after.stream, after.pool) == (stream, pool):
            self.remove(after.address)
            seg.size += after.size
            for a, s in after.sizes.items():
                seg.activate(a, s)
        return seg

    def unmap(self, address: int, size: int) -> None:
        """Pages [address, address + size) unmapped: every range they cover shrinks, splits in two, or goes.

        One unmap can cover ranges the walk holds apart (mapped at different
        times and not merged): each loses its part of the pages.
        """
        end = address + size
        first = self.find(address)
        covered = [first] if first is not None else []
        covered += [
            self.by_start[a] for a in self.starts[bisect_right(self.starts, address) : bisect_left(self.starts, end)]
        ]
        for seg in covered:
            self.remove(seg.address)
            for low, high in (
                (seg.address, min(address, seg.address + seg.size)),
                (max(end, seg.address), seg.address + seg.size),
            ):
                if high > low:
                    part = WalkSegment(low, high - low, seg.pool, seg.stream, seg.small)
                    for a, s in seg.blocks_in(low, high):
                        part.activate(a, s)
                    self.add(part)


@dataclass
class TraceWalk:
    """The result of walking a trace: one row per alloc, and what did not add up."""

    allocs: pd.DataFrame
    new_segments: pd.DataFrame  # one row per segment_alloc or segment_map: index, addr, size, pool, stream
    mismatches: list[str] = field(default_factory=list)
    rewound_segments: int = 0
    device: int = 0


class CapturePools:
    """The pool a segment made during a recorded capture belongs to, from the snapshot's `kit` key.

    Each window (trace indices `trace_begin` to `trace_end`, its stream, its
    pool) says that a segment_alloc on that stream between them was made for
    the capture's pool. A plain snapshot has no windows: nothing is known.
    Windows are read as plain integers; one that is not is skipped here (the
    commands check windows before anything else, `checked_capture_windows`).
    """

    def __init__(self, kit: dict | None) -> None:
        self.windows: list[tuple[int, int, int, tuple[int, int]]] = []
        for c in (kit or {}).get("captures") or []:
            try:
                window = (int(c["trace_begin"]), int(c["trace_end"]), int(c["stream"]), tuple(map(int, c["pool"])))
            except (KeyError, TypeError, ValueError):
                continue
            if len(window[3]) == 2:
                self.windows.append(window)

    def at(self, index: int, stream: int) -> tuple[int, int] | None:
        """The pool of the capture running on `stream` at trace entry `index`, or None."""
        for begin, end, on, pool in self.windows:
            if begin <= index <= end and on == stream:
                return pool
        return None


def segment_differences(want: dict[int, tuple[int, dict[int, int]]], segments: dict) -> list[str]:
    """How the walk's segments differ from the snapshot's: `want` maps address to (size, {block: size})."""
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

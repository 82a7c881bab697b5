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

Expandable segments (`expandable_segments:True`) grow and shrink by mapping
pages (`segment_map`, `segment_unmap`), and a snapshot lists one segment per
mapped range; the walk does the same, so an allocation that needed pages
mapped counts as a new segment of the mapped bytes. Graph pools never use
expandable segments. A trace that contradicts the snapshot (a free of a block
never allocated, a segment freed twice) never stops the walk: what does not
add up is reported in `mismatches`. Actions a newer torch adds are skipped.

At DeepSeek scale (millions of events, tens of thousands of segments) the
walk runs on the snapshot's columns (`kit.walk`) and returns what the walk
entry by entry here (`_replay_rows`) returns; tests/test_scale.py holds the
two side by side.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass, field

import pandas as pd

from kit.errors import as_text
from kit.simulator import K_MIN_BLOCK_SIZE, K_SMALL_SIZE, round_size
from kit.snapshot import Snapshot, load_snapshot
from kit.tables import format_bytes, pool_label, segment_table, stream_labels

REUSE_COLUMNS = ("allocs", "reused", "new_segments", "new_segment_bytes", "stranded_bytes")


# One row per allocation of the walk (`TraceReplay.allocs`), in the row walk and the columnar one.
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


class _Segment:
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
        best, at, cursor = 0, 0, self.address
        for start in self.starts:
            if start - cursor > best:
                best, at = start - cursor, cursor
            cursor = max(cursor, start + self.sizes[start])
        if self.address + self.size - cursor > best:
            best, at = self.address + self.size - cursor, cursor
        return best, at

    def activate(self, address: int, size: int) -> None:
        if address not in self.sizes:
            insort(self.starts, address)
        self.sizes[address] = size

    def release(self, address: int) -> None:
        if self.sizes.pop(address, None) is not None:
            del self.starts[bisect_left(self.starts, address)]

    def blocks_in(self, low: int, high: int) -> list[tuple[int, int]]:
        """The active blocks starting in [low, high)."""
        return [(a, self.sizes[a]) for a in self.starts[bisect_left(self.starts, low) : bisect_left(self.starts, high)]]


class _Layout:
    """The segments at one point of the walk, indexed by address."""

    def __init__(self) -> None:
        self.by_start: dict[int, _Segment] = {}
        self.starts: list[int] = []

    def add(self, seg: _Segment) -> None:
        if seg.address not in self.by_start:
            insort(self.starts, seg.address)
        self.by_start[seg.address] = seg

    def remove(self, address: int) -> _Segment | None:
        seg = self.by_start.pop(address, None)
        if seg is not None:
            del self.starts[bisect_left(self.starts, address)]
        return seg

    def find(self, address: int) -> _Segment | None:
        """The segment holding `address`."""
        i = bisect_right(self.starts, address) - 1
        if i >= 0:
            seg = self.by_start[self.starts[i]]
            if address < seg.address + seg.size:
                return seg
        return None

    def map(self, address: int, size: int, stream: int, pool: tuple[int, int], small: bool) -> _Segment:
        """Pages [address, address + size) mapped: the neighbouring range of the same stream and pool grows."""
        before = self.find(address - 1) if address else None
        if (
            before is not None
            and before.address + before.size == address
            and (before.stream, before.pool)
            == (
                stream,
                pool,
            )
        ):
            seg = before
            seg.size += size
        else:
            seg = _Segment(address, size, pool, stream, small)
            self.add(seg)
        after = self.by_start.get(seg.address + seg.size)
        if after is not None and (after.stream, after.pool) == (stream, pool):
            self.remove(after.address)
            seg.size += after.size
            for a, s in after.sizes.items():
                seg.activate(a, s)
        return seg

    def unmap(self, address: int, size: int) -> None:
        """Pages [address, address + size) unmapped: the range holding them shrinks, or splits in two."""
        seg = self.find(address)
        if seg is None:
            return
        end = min(address + size, seg.address + seg.size)
        self.remove(seg.address)
        for low, high in ((seg.address, address), (end, seg.address + seg.size)):
            if high > low:
                part = _Segment(low, high - low, seg.pool, seg.stream, seg.small)
                for a, s in seg.blocks_in(low, high):
                    part.activate(a, s)
                self.add(part)


@dataclass
class TraceReplay:
    """The result of walking a trace: one row per alloc, and what did not add up."""

    allocs: pd.DataFrame
    new_segments: pd.DataFrame  # one row per segment_alloc or segment_map: index, addr, size, pool, stream
    mismatches: list[str] = field(default_factory=list)
    rewound_segments: int = 0
    device: int = 0


def _final_layout(snap: Snapshot, device: int) -> _Layout:
    """The snapshot's segments on `device` and their active blocks."""
    layout = _Layout()
    for s in snap.segments:
        if s.device != device:
            continue
        seg = _Segment(s.address, s.total_size, s.segment_pool_id, s.stream, s.segment_type == "small")
        for b in s.blocks:
            if b.state != "inactive":
                seg.activate(b.address, b.size)
        layout.add(seg)
    return layout


def _pool_at(final: _Layout, address: int, size: int) -> tuple[tuple[int, int], bool]:
    """Pool and size class of the snapshot's segment at `address`; the default pool's if none is there."""
    seg = final.find(address)
    if seg is not None:
        return seg.pool, seg.small
    return (0, 0), size <= 2 * K_SMALL_SIZE


def _initial_state(snap: Snapshot, entries, device: int) -> tuple[_Layout, int]:
    """Rewind the final snapshot backwards through the trace to its first entry."""
    layout = _final_layout(snap, device)
    final = _final_layout(snap, device)
    for e in reversed(entries):
        action = e.action
        if action == "segment_alloc":
            layout.remove(e.addr)
        elif action == "segment_free":
            # A segment freed within the trace belonged to the default pool (graph
            # pools are not freed while their graphs live).
            layout.add(_Segment(e.addr, e.size, (0, 0), e.stream, e.size <= 2 * K_SMALL_SIZE))
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


def replay_trace(snapshot: Snapshot | str | dict, device: int = 0) -> TraceReplay:
    """Walk the snapshot's trace from its rewound start; classify every alloc.

    `allocs` has one row per alloc; its `frames` is the trace entry's own
    list of stack frames, shared with the snapshot. The walk runs on the
    snapshot's columns (`kit.walk`), except over expandable segments.
    """
    snap = load_snapshot(snapshot)
    from kit.walk import fast_replay  # it builds on this module

    replay = fast_replay(snap, device)
    return replay if replay is not None else _replay_rows(snap, device)


def _replay_rows(snap: Snapshot, device: int) -> TraceReplay:
    """The walk entry by entry over the typed records: for expandable segments, and `kit.walk`'s reference."""
    entries = snap.require_trace(device)
    layout, rewound = _initial_state(snap, entries, device)
    final = _final_layout(snap, device)
    # A segment's pool is in the snapshot only for the segment there now. Addresses come
    # back after a segment_free, so an earlier segment at the same address, one freed
    # within the trace, is taken as the default pool's (graph pools are not freed while
    # their graphs live).
    freed_later = set()
    last_alloc: dict[int, int] = {}
    for i, e in enumerate(entries):
        if e.action == "segment_alloc":
            last_alloc[e.addr] = i
        elif e.action == "segment_free" and e.addr in last_alloc:
            freed_later.add(last_alloc[e.addr])
    rows = []
    made = []
    fresh: list[tuple[int, int]] = []  # ranges cudaMalloc'ed or mapped since the last alloc
    for i, e in enumerate(entries):
        action = e.action
        if action == "segment_alloc" or action == "segment_map":
            if action == "segment_alloc":
                known = final.by_start.get(e.addr) if i not in freed_later else None
                pool, small = (known.pool, known.small) if known else ((0, 0), e.size <= 2 * K_SMALL_SIZE)
                seg = _Segment(e.addr, e.size, pool, e.stream, small)
                layout.add(seg)
            else:
                pool, small = _pool_at(final, e.addr, e.size)
                seg = layout.map(e.addr, e.size, e.stream, pool, small)
            fresh.append((e.addr, e.size))
            made.append((i, e.addr, e.size, seg.pool, e.stream))
            continue
        if action == "segment_free":
            layout.remove(e.addr)
            continue
        if action == "segment_unmap":
            layout.unmap(e.addr, e.size)
            continue
        if action == "free_completed":
            seg = layout.find(e.addr)
            if seg is not None:
                seg.release(e.addr)
            continue
        if action != "alloc":
            continue
        seg = layout.find(e.addr)
        if seg is None:
            fresh.clear()
            continue
        rounded = round_size(e.size)
        gap = seg.gap_at(e.addr)
        rest = gap - rounded
        splits = rest >= K_MIN_BLOCK_SIZE if seg.small else rest > K_SMALL_SIZE
        seg.activate(e.addr, rounded if splits else max(gap, rounded))
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
        fresh.clear()
        rows.append(row)
    allocs = pd.DataFrame(rows, columns=list(ALLOC_COLUMNS))
    new_segments = pd.DataFrame(made, columns=["index", "addr", "size", "pool", "stream"])
    return TraceReplay(allocs, new_segments, _compare_with_snapshot(snap, layout, device), rewound, device)


def capture_attribution(snapshot: Snapshot | str | dict, windows: list[dict] | None = None) -> pd.DataFrame:
    """Segments and bytes each capture added, per (pool, stream) group.

    `windows` are dicts with `graph`, `trace_begin` and `trace_end` (trace
    indices); by default the snapshot's own `kit.captures`.
    """
    snap = load_snapshot(snapshot)
    windows = windows if windows is not None else snap.captures
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


def _free_elsewhere(layout: _Layout, new: _Segment, rounded: int) -> tuple[int, int, int] | None:
    """The largest free block of the same pool and size class on another stream, if it fits."""
    best = None
    for seg in layout.by_start.values():
        if seg is new or seg.pool != new.pool or seg.small != new.small or seg.stream == new.stream:
            continue
        size, at = seg.largest_gap()
        if size >= rounded and (best is None or size > best[1]):
            best = (at, size, seg.stream)
    return best


def _compare_with_snapshot(snap: Snapshot, layout: _Layout, device: int) -> list[str]:
    want = {
        s.address: (s.total_size, {b.address: b.size for b in s.blocks if b.state != "inactive"})
        for s in snap.segments
        if s.device == device
    }
    return segment_differences(want, layout.by_start)


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
    def one(f: dict) -> str:
        filename = as_text(f.get("filename", "?")).rsplit("/", 1)[-1]
        return f"{as_text(f.get('name', '?'))} ({filename}:{as_text(f.get('line', '?'))})"

    return " < ".join(one(f) for f in frames[:3] if isinstance(f, dict))


def stranding_report(snapshot: Snapshot | str | dict, replay: TraceReplay | None = None) -> pd.DataFrame:
    """Every (pool, stream) group that made segments while a fitting free block sat on another stream.

    Columns: `pool`, `stream`, `stranded_bytes` (its new segments' bytes),
    `reserved` (the group's bytes at the end), `other_streams`, `other_free`
    (free bytes at the end on those streams, same pool), `frames` (the first
    stack frames of the first stranded allocation, when recorded) and
    `verdict`, one line.
    """
    snap = load_snapshot(snapshot)
    replay = replay or replay_trace(snap)
    a = replay.allocs
    labels = stream_labels(snap)
    end = segment_table(snap)
    end = end[end["device"] == replay.device].set_index(["pool", "stream"])
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

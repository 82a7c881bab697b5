"""The kit's per-row implementations as they were before the columnar rewrite (commit 4cbaa57).

Kept, unchanged but for imports, as the reference the vectorised versions in
`kit.tables`, `kit.trace` and `kit.pictures` must equal on every fixture
(tests/test_scale.py). They read `Snapshot.segments` and `Snapshot.trace`,
the typed records.
"""

# ruff: noqa: B007, C401, RUF005

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Mapping

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from kit.pictures import MIB, STATE_STYLE, _titled
from kit.simulator import K_MIN_BLOCK_SIZE, K_SMALL_SIZE, round_size
from kit.snapshot import DEFAULT_STREAM, Snapshot, load_snapshot
from kit.tables import FIGURES, KEY, _letters, format_bytes, pool_label
from kit.trace import REUSE_COLUMNS, TraceReplay, _frame_line


def stream_labels(snapshot: Snapshot, names: Mapping | None = None) -> dict[int, str]:
    """Short names for the snapshot's streams: given names first, then A, B, ...

    Letters follow the order in which the trace first uses each stream (its
    creation order, as far as the allocator saw it), then ascending id.
    """
    names = {**snapshot.stream_names, **(names or {})}
    order: dict[int, None] = {}
    for e in snapshot.trace:
        order.setdefault(e.stream, None)
    for sid in sorted({s.stream for s in snapshot.segments}):
        order.setdefault(sid, None)
    labels: dict[int, str] = {}
    letter = 0
    for sid in order:
        if sid in names:
            labels[sid] = names[sid]
        elif sid == DEFAULT_STREAM:
            labels[sid] = "default stream"
        else:
            labels[sid] = f"stream {_letters(letter)}"
            letter += 1
    return labels


def segment_frame(snapshot: Snapshot) -> pd.DataFrame:
    """One row per segment, with its free bytes and largest free block."""
    rows = [
        (
            s.device,
            s.segment_pool_id,
            s.stream,
            s.address,
            s.total_size,
            s.allocated_size,
            s.active_size,
            s.free_size,
            s.largest_free,
            s.segment_type,
        )
        for s in snapshot.segments
    ]
    return pd.DataFrame(
        rows,
        columns=[
            "device",
            "pool",
            "stream",
            "address",
            "reserved",
            "allocated",
            "active",
            "free",
            "largest_free",
            "segment_type",
        ],
    )


def segment_table(
    snapshot: Snapshot | str | dict,
    *,
    stream_names: Mapping[int, str] | None = None,
    pool_names: Mapping[tuple[int, int], str] | None = None,
) -> pd.DataFrame:
    """One row per (device, pool, stream) group of segments, largest first within a pool."""
    snapshot = load_snapshot(snapshot)
    frame = segment_frame(snapshot)
    columns = ["device", "pool", "stream", *FIGURES, "pool_label", "stream_label"]
    if frame.empty:
        table = pd.DataFrame(columns=columns)
    else:
        table = (
            frame.groupby(list(KEY), sort=True)
            .agg(
                segments=("address", "size"),
                reserved=("reserved", "sum"),
                allocated=("allocated", "sum"),
                active=("active", "sum"),
                free=("free", "sum"),
                largest_free=("largest_free", "max"),
            )
            .reset_index()
        )
    pools = {**snapshot.pool_names, **(pool_names or {})}
    labels = stream_labels(snapshot, stream_names)
    table["pool_label"] = [pool_label(p, pools) for p in table["pool"]]
    table["stream_label"] = [labels.get(s, str(s)) for s in table["stream"]]
    table = table[columns].astype({c: "int64" for c in ("device", "stream", *FIGURES)})
    table.attrs["source"] = snapshot.source_label
    return table


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


def _segment_of(segments: dict[int, _Segment], starts: list[int], address: int) -> _Segment | None:
    i = bisect_right(starts, address) - 1
    if i >= 0:
        seg = segments[starts[i]]
        if address < seg.address + seg.size:
            return seg
    return None


def _initial_state(snap: Snapshot, entries) -> tuple[dict[int, _Segment], int]:
    """Rewind the final snapshot backwards through the trace to its first entry."""
    segments = {}
    for s in snap.segments:
        seg = _Segment(s.address, s.total_size, s.segment_pool_id, s.stream, s.segment_type == "small")
        for b in s.blocks:
            if b.state != "inactive":
                seg.activate(b.address, b.size)
        segments[s.address] = seg
    starts = sorted(segments)
    for e in reversed(entries):
        if e.action == "segment_alloc":
            if segments.pop(e.addr, None) is not None:
                del starts[bisect_left(starts, e.addr)]
        elif e.action == "segment_free":
            # A segment freed within the trace belonged to the default pool (graph
            # pools are not freed while their graphs live).
            segments[e.addr] = _Segment(e.addr, e.size, (0, 0), e.stream, e.size <= 2 * K_SMALL_SIZE)
            insort(starts, e.addr)
        elif e.action == "alloc":
            seg = _segment_of(segments, starts, e.addr)
            if seg is not None and e.addr in seg.sizes:
                seg.release(e.addr)
        elif e.action == "free_completed":
            seg = _segment_of(segments, starts, e.addr)
            if seg is not None and e.addr not in seg.sizes:
                seg.activate(e.addr, round_size(e.size))  # its exact size is not in the trace
    return segments, len(segments)


def replay_trace(snapshot: Snapshot | str | dict, device: int = 0) -> TraceReplay:
    """Walk the snapshot's trace from its rewound start; classify every alloc."""
    snap = load_snapshot(snapshot)
    entries = snap.traces.get(device, ())
    if not entries:
        from kit.errors import KitError

        raise KitError(f"{snap.origin}: no trace recorded (record with torch.cuda.memory._record_memory_history)")
    segments, rewound = _initial_state(snap, entries)
    starts = sorted(segments)
    # A segment's pool is in the snapshot only for the segment there now. Addresses come
    # back after a segment_free, so an earlier segment at the same address, one freed
    # within the trace, is taken as the default pool's (graph pools are not freed while
    # their graphs live).
    final = {s.address: (s.segment_pool_id, s.segment_type == "small") for s in snap.segments}
    freed_later = set()
    last_alloc: dict[int, int] = {}
    for i, e in enumerate(entries):
        if e.action == "segment_alloc":
            last_alloc[e.addr] = i
        elif e.action == "segment_free" and e.addr in last_alloc:
            freed_later.add(last_alloc[e.addr])
    rows = []
    made = []
    last_segment_alloc = None
    for i, e in enumerate(entries):
        if e.action == "segment_alloc":
            known = final.get(e.addr) if i not in freed_later else None
            pool, small = known or ((0, 0), e.size <= 2 * K_SMALL_SIZE)
            segments[e.addr] = _Segment(e.addr, e.size, pool, e.stream, small)
            insort(starts, e.addr)
            last_segment_alloc = e.addr
            made.append((i, e.addr, e.size, pool, e.stream))
            continue
        if e.action == "segment_free":
            if segments.pop(e.addr, None) is not None:
                del starts[bisect_left(starts, e.addr)]
            continue
        if e.action == "free_completed":
            seg = _segment_of(segments, starts, e.addr)
            if seg is not None and e.addr in seg.sizes:
                seg.release(e.addr)
            continue
        if e.action != "alloc":
            continue
        seg = _segment_of(segments, starts, e.addr)
        if seg is None:
            continue
        rounded = round_size(e.size)
        gap = seg.gap_at(e.addr)
        rest = gap - rounded
        splits = rest >= K_MIN_BLOCK_SIZE if seg.small else rest > K_SMALL_SIZE
        seg.activate(e.addr, rounded if splits else gap)
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
            "frames": e.frames[:3],
        }
        if last_segment_alloc == e.addr:
            row["served"] = "new_segment"
            row["segment_bytes"] = seg.size
            other = _free_elsewhere(segments, seg, rounded)
            if other:
                row["served"] = "stranded"
                row["other_block"], row["other_block_size"], row["other_stream"] = other
        last_segment_alloc = None
        rows.append(row)
    allocs = pd.DataFrame(
        rows,
        columns=[
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
        ],
    )
    new_segments = pd.DataFrame(made, columns=["index", "addr", "size", "pool", "stream"])
    return TraceReplay(allocs, new_segments, _compare_with_snapshot(snap, segments), rewound)


def _free_elsewhere(segments: dict[int, _Segment], new: _Segment, rounded: int) -> tuple[int, int, int] | None:
    """The largest free block of the same pool and size class on another stream, if it fits."""
    best = None
    for seg in segments.values():
        if seg is new or seg.pool != new.pool or seg.small != new.small or seg.stream == new.stream:
            continue
        size, at = seg.largest_gap()
        if size >= rounded and (best is None or size > best[1]):
            best = (at, size, seg.stream)
    return best


def _compare_with_snapshot(snap: Snapshot, segments: dict[int, _Segment]) -> list[str]:
    want = {
        s.address: (s.total_size, {b.address: b.size for b in s.blocks if b.state != "inactive"}) for s in snap.segments
    }
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


def segment_map_figure(snapshot: Snapshot | str | dict, *, max_segments: int = 2000, **names) -> go.Figure:
    """Each segment a bar of its blocks, coloured by stream, grouped by pool.

    Segments beyond `max_segments` (largest kept) are left out and the title
    says how many, so a browser never receives a million bars.
    """
    snapshot = load_snapshot(snapshot)
    labels = stream_labels(snapshot, names.get("stream_names"))
    pools = {**snapshot.pool_names, **(names.get("pool_names") or {})}
    segments = sorted(
        snapshot.segments, key=lambda s: (s.device, s.segment_pool_id, labels.get(s.stream, ""), s.address)
    )
    dropped = 0
    if len(segments) > max_segments:
        keep = set(id(s) for s in sorted(segments, key=lambda s: -s.total_size)[:max_segments])
        dropped = len(segments) - max_segments
        segments = [s for s in segments if id(s) in keep]
    palette = px.colors.qualitative.Plotly
    colour = {sid: palette[i % len(palette)] for i, sid in enumerate(labels)}
    bars: dict[tuple[int, str], dict[str, list]] = {}
    rows = []
    for s in segments:
        row = f"{pool_label(s.segment_pool_id, pools)} | {s.address:#x}"
        rows.append(row)
        blocks = s.blocks or ()
        for b in blocks:
            bar = bars.setdefault((s.stream, b.state), {"y": [], "x": [], "base": [], "text": []})
            bar["y"].append(row)
            bar["base"].append((b.address - s.address) / MIB)
            bar["x"].append(b.size / MIB)
            offset = format_bytes(b.address - s.address)
            bar["text"].append(f"{format_bytes(b.size)} {STATE_STYLE[b.state][0]} at +{offset}")
    fig = go.Figure()
    for (sid, state), bar in sorted(bars.items(), key=lambda kv: (labels.get(kv[0][0], ""), kv[0][1])):
        name, opacity, pattern = STATE_STYLE[state]
        fig.add_bar(
            orientation="h",
            name=f"{labels.get(sid, sid)}: {name}",
            legendgroup=labels.get(sid, str(sid)),
            y=bar["y"],
            x=bar["x"],
            base=bar["base"],
            hovertext=bar["text"],
            hovertemplate="%{y}<br>%{hovertext}<extra></extra>",
            marker=dict(
                color=colour.get(sid, "grey"),
                opacity=opacity,
                pattern_shape=pattern,
                line=dict(width=0.5, color="white"),
            ),
        )
    title = "Segment map: blocks of each segment, coloured by stream"
    if dropped:
        title += f" ({dropped} smallest segments not drawn)"
    fig.update_layout(
        barmode="overlay",
        title=_titled(title, snapshot.source_label),
        xaxis_title="offset in segment (MiB)",
        yaxis=dict(categoryorder="array", categoryarray=rows, autorange="reversed", title="pool | segment"),
        height=max(300, 80 + 22 * len(rows)),
        legend_title="stream: block state",
    )
    return fig

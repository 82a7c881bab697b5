"""Plotly figures of allocator state: group totals and the segment map.

- `group_bar_figure`: per (pool, stream) group, reserved bytes split into
  allocated, pending free and free, as stacked bars.
- `segment_map_figure`: every segment as a horizontal bar of its blocks,
  coloured by stream, grouped by pool, so a stranded stream's free blocks
  stand out next to the other stream's segments of the same pool.

Every figure's title names its data source.
"""

from __future__ import annotations

import plotly.express as px
import plotly.graph_objects as go

from kit.snapshot import Snapshot, load_snapshot
from kit.tables import format_bytes, pool_label, segment_table, stream_labels

MIB = 1024 * 1024
STATE_STYLE = {  # block state -> (legend name, opacity, bar pattern)
    "active_allocated": ("allocated", 1.0, ""),
    "active_pending_free": ("pending free", 0.8, "x"),
    "inactive": ("free", 0.25, ""),
}


def _titled(title: str, source: str) -> str:
    return f"{title}<br><sup>source: {source}</sup>"


def group_bar_figure(snapshot: Snapshot | str | dict, **names) -> go.Figure:
    """Stacked bars of allocated, pending-free and free MiB per (pool, stream) group."""
    snapshot = load_snapshot(snapshot)
    table = segment_table(snapshot, **names)
    groups = [f"{p} / {s}" for p, s in zip(table["pool_label"], table["stream_label"], strict=True)]
    parts = {  # name -> (bytes per group, colour)
        "allocated": (table["allocated"], "#34495e"),
        "pending free": (table["active"] - table["allocated"], "#e67e22"),
        "free": (table["free"], "#aed6f1"),
    }
    fig = go.Figure()
    for name, (values, colour) in parts.items():
        fig.add_bar(
            marker_color=colour,
            y=groups,
            x=values / MIB,
            name=name,
            orientation="h",
            hovertext=[format_bytes(v) for v in values],
            hovertemplate="%{y}: %{hovertext} " + name + "<extra></extra>",
        )
    fig.update_layout(
        barmode="stack",
        title=_titled("Reserved memory per (pool, stream) group", snapshot.source_label),
        xaxis_title="MiB",
        yaxis=dict(autorange="reversed"),
        height=max(250, 60 + 40 * len(groups)),
        legend_title="block state",
    )
    return fig


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

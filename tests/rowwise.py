"""The kit's per-row tables and segment map as they were before the columnar rewrite (commit 4cbaa57).

Kept, unchanged but for imports, as the reference the vectorised versions in
`kit.analysis.tables` and `kit.show.pictures` must equal on every fixture
(tests/test_scale.py). They read `Snapshot.segments` and `Snapshot.trace`,
the typed records. The trace walk's reference is the kit's own walk entry by
entry, `kit.analysis.trace.rows.walk_rows`.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from kit.analysis.names import pool_labels, stream_labels
from kit.analysis.tables import FIGURES, KEY, pool_label
from kit.load.snapshot import Snapshot, load_snapshot
from kit.show.pictures import STATE_STYLE
from kit.show.pictures import titled as _titled
from kit.units import MIB, format_bytes


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
    pools = pool_labels(snapshot, pool_names)
    labels = stream_labels(snapshot, stream_names)
    table["pool_label"] = [pools.get(p) or pool_label(p) for p in table["pool"]]
    table["stream_label"] = [labels.get(s, str(s)) for s in table["stream"]]
    table = table[columns].astype({c: "int64" for c in ("device", "stream", *FIGURES)})
    table.attrs["source"] = snapshot.source_label
    return table


def segment_map_figure(snapshot: Snapshot | str | dict, *, max_segments: int = 2000, **names) -> go.Figure:
    """Each segment a bar of its blocks, coloured by stream, grouped by pool.

    Segments beyond `max_segments` (largest kept) are left out and the title
    says how many, so a browser never receives a million bars.
    """
    snapshot = load_snapshot(snapshot)
    labels = stream_labels(snapshot, names.get("stream_names"))
    pools = pool_labels(snapshot, names.get("pool_names"))
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
        row = f"{pools.get(s.segment_pool_id) or pool_label(s.segment_pool_id)} | {s.address:#x}"
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

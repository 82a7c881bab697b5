"""Plotly figures of allocator state: group totals and the segment map.

- `group_bar_figure`: per (pool, stream) group, reserved bytes split into
  allocated, pending free and free, as stacked bars.
- `segment_map_figure`: every segment as a horizontal bar of its blocks,
  coloured by stream, grouped by pool, so a stranded stream's free blocks
  stand out next to the other stream's segments of the same pool.

Every figure's title names its data source. Plotly renders titles, trace
names, category labels and hover text as HTML, so every label and source from
the snapshot is escaped (`kit.markup`) before it goes into a figure.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.express as px
import plotly.graph_objects as go

from kit.analysis.names import pool_labels
from kit.analysis.tables import format_bytes, pool_label, segment_table, stream_labels
from kit.load.rows import BLOCK_STATES
from kit.load.snapshot import Snapshot, load_snapshot
from kit.markup import html_text

MIB = 1024 * 1024
BAR_TOP_MARGIN = 120  # px above the bars: the two-line title, then the legend's row
STATE_STYLE = {  # block state -> (legend name, opacity, bar pattern)
    "active_allocated": ("allocated", 1.0, ""),
    "active_pending_free": ("pending free", 0.8, "x"),
    "inactive": ("free", 0.25, ""),
}


def _titled(title: str, source: str) -> str:
    return f"{title}<br><sup>source: {html_text(source)}</sup>"


def segment_row(pool: str, address: int) -> str:
    """A segment map's row: the pool's label (escaped: plotly renders it as HTML) and the segment's address."""
    return f"{html_text(pool)} | {address:#x}"


def group_bar_figure(snapshot: Snapshot | str | dict, **names) -> go.Figure:
    """Stacked bars of allocated, pending-free and free MiB per (pool, stream) group."""
    snapshot = load_snapshot(snapshot)
    table = segment_table(snapshot, **names)
    groups = [html_text(f"{p} / {s}") for p, s in zip(table["pool_label"], table["stream_label"], strict=True)]
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
        yaxis=dict(autorange="reversed", automargin=True),
        # The legend in one row between the title and the bars, in a top margin kept for both: on the
        # right it took the height of the bars, and with few groups its last entries were cut off.
        legend=dict(
            orientation="h", x=0, xanchor="left", y=1, yanchor="bottom", title_text="block state", traceorder="normal"
        ),
        margin=dict(t=BAR_TOP_MARGIN, b=50),
        height=BAR_TOP_MARGIN + 90 + 32 * len(groups),
    )
    return fig


def segment_map_figure(
    snapshot: Snapshot | str | dict, *, max_segments: int = 2000, max_bars: int = 20_000, **names
) -> go.Figure:
    """Each segment a bar of its blocks, coloured by stream, grouped by pool.

    The browser never receives more than `max_segments` segments (the largest
    are kept) nor more than `max_bars` bars: past that, neighbouring blocks of
    one state are drawn as one bar ("12 blocks, ..." on hover), and if that is
    not enough, more of the smallest segments are left out. The title says
    what was left out or merged.
    """
    snapshot = load_snapshot(snapshot)
    c = snapshot.columns
    labels = stream_labels(snapshot, names.get("stream_names"))
    pools = pool_labels(snapshot, names.get("pool_names"))
    pool_of = c.pools()
    order, dropped, merged = _drawn(c, _map_order(c, pool_of, labels), max_segments, max_bars)
    bars, rows = _bars(c, order, _runs if merged else _blocks, pool_of, pools)
    fig = go.Figure()
    _add_bars(fig, bars, labels)
    title = "Segment map: blocks of each segment, coloured by stream"
    if dropped:
        title += f" ({dropped} smallest segments not drawn)"
    if merged:
        title += " (neighbouring blocks of one state drawn as one bar)"
    fig.update_layout(
        barmode="overlay",
        title=_titled(title, snapshot.source_label),
        xaxis_title="offset in segment (MiB)",
        yaxis=dict(categoryorder="array", categoryarray=rows, autorange="reversed", title="pool | segment"),
        height=max(300, 80 + 22 * len(rows)),
        legend_title="stream: block state",
    )
    return fig


def _map_order(c, pool_of: list[tuple[int, int]], labels: dict[int, str]) -> list[int]:
    """The segments in the map's order: by device, pool, stream label, address."""
    stream_of, address_of, device_of = c.stream.tolist(), c.address.tolist(), c.device.tolist()
    return sorted(range(len(c)), key=lambda i: (device_of[i], pool_of[i], labels.get(stream_of[i], ""), address_of[i]))


def _drawn(c, order: list[int], max_segments: int, max_bars: int) -> tuple[list[int], int, bool]:
    """The segments to draw, how many were left out, and whether neighbouring blocks are merged to fit `max_bars`."""
    total_of = c.total_size.tolist()
    dropped = 0
    if len(order) > max_segments:
        dropped = len(order) - max_segments
        order = _largest(order, total_of, max_segments)
    merged = sum(int(c.n_blocks[i]) for i in order) > max_bars
    bars_of = _runs if merged else _blocks
    while order and sum(len(bars_of(c, i)[0]) for i in order) > max_bars:
        keep = max(1, len(order) * 3 // 4)
        dropped += len(order) - keep
        order = _largest(order, total_of, keep)
    return order, dropped, merged


def _bars(
    c, order: list[int], bars_of, pool_of: list[tuple[int, int]], pools: dict
) -> tuple[dict[tuple[int, str], dict[str, list]], list[str]]:
    """The bars per (stream, block state), and the map's rows ("pool | address"), top to bottom."""
    stream_of, address_of = c.stream.tolist(), c.address.tolist()
    bars: dict[tuple[int, str], dict[str, list]] = {}
    rows = []
    for i in order:
        address = address_of[i]
        row = segment_row(pools.get(pool_of[i]) or pool_label(pool_of[i]), address)
        rows.append(row)
        starts, sizes, states, counts = bars_of(c, i)
        for start, size, state, count in zip(starts, sizes, states, counts, strict=True):
            state = BLOCK_STATES[state]
            bar = bars.setdefault((stream_of[i], state), {"y": [], "x": [], "base": [], "text": []})
            bar["y"].append(row)
            bar["base"].append((start - address) / MIB)
            bar["x"].append(size / MIB)
            what = f"{format_bytes(size)} {STATE_STYLE[state][0]} at +{format_bytes(start - address)}"
            bar["text"].append(what if count == 1 else f"{count} blocks, {what}")
    return bars, rows


def _add_bars(fig: go.Figure, bars: dict[tuple[int, str], dict[str, list]], labels: dict[int, str]) -> None:
    """One trace per (stream, block state): the stream's colour, the state's opacity and pattern."""
    palette = px.colors.qualitative.Plotly
    colour = {sid: palette[i % len(palette)] for i, sid in enumerate(labels)}
    for (sid, state), bar in sorted(bars.items(), key=lambda kv: (labels.get(kv[0][0], ""), kv[0][1])):
        name, opacity, pattern = STATE_STYLE[state]
        fig.add_bar(
            orientation="h",
            name=html_text(f"{labels.get(sid, sid)}: {name}"),
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


def _largest(order: list[int], total_size: list[int], keep: int) -> list[int]:
    """The `keep` largest segments of `order`, in `order`'s order (ties: the earlier one)."""
    chosen = set(sorted(order, key=lambda i: -total_size[i])[:keep])
    return [i for i in order if i in chosen]


def _blocks(c, i: int) -> tuple[list, list, list, list]:
    """Segment `i`'s blocks: starts, sizes, states, and a count of one each."""
    lo, hi = int(c.first_block[i]), int(c.first_block[i] + c.n_blocks[i])
    if hi == lo:
        return [], [], [], []
    return c.block_address[lo:hi].tolist(), c.block_size[lo:hi].tolist(), c.block_state[lo:hi].tolist(), [1] * (hi - lo)


def _runs(c, i: int) -> tuple[list, list, list, list]:
    """Segment `i`'s blocks with each run of neighbours in one state merged into one."""
    lo, hi = int(c.first_block[i]), int(c.first_block[i] + c.n_blocks[i])
    if hi == lo:
        return [], [], [], []
    state = c.block_state[lo:hi]
    first = np.flatnonzero(np.concatenate(([True], state[1:] != state[:-1])))
    sizes = np.add.reduceat(c.block_size[lo:hi], first)
    counts = np.diff(np.append(first, hi - lo))
    return c.block_address[lo:hi][first].tolist(), sizes.tolist(), state[first].tolist(), counts.tolist()


def show_in(widget: go.FigureWidget, figure: go.Figure, extra_traces: Sequence = ()) -> None:
    """Replace what a FigureWidget shows with `figure` (and `extra_traces` on top), in one update.

    The widget stays the same object, so a notebook's controls redraw it in
    place instead of adding a new figure per change.
    """
    with widget.batch_update():
        widget.data = []
        widget.add_traces([*figure.data, *extra_traces])
        widget.layout = figure.layout

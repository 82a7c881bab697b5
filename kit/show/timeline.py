"""The liveness timeline: the graph-pool blocks a model graph holds across its eager breaks, in trace order.

Notebook 04 (safety) draws `kit.analysis.liveness.liveness_table` with it.
Each held block is a horizontal bar from its allocation to its free (trace
index; the trace's end when it is never freed), coloured by its class
(released by the break, break input, held after the break). Behind the bars,
`break_bands` shades the eager breaks grey and the replay captures orange;
over them, `timeline_figure` marks every replay-graph allocation over a
block's bytes: a cross when the replay graph runs in that block's break, an
open circle when it is another break's.
"""

from __future__ import annotations

import plotly.graph_objects as go

from kit.analysis.attribution import captures_by_name, is_replay_capture
from kit.analysis.liveness import BREAK_INPUT, HELD, RELEASED, Liveness
from kit.analysis.tables import format_bytes
from kit.load.snapshot import Snapshot

COLOURS = {RELEASED: "#27ae60", BREAK_INPUT: "#2980b9", HELD: "#c0392b"}
BREAK_COLOUR, REPLAY_COLOUR = "#7f8c8d", "#e67e22"
MARKS = {  # does the replay graph that allocated over the block run in the block's break? -> (name, symbol, colour)
    True: ("a replay graph of this break allocates here", "x", "black"),
    False: ("a replay graph of another break allocates here", "circle-open", "grey"),
}


def break_bands(snapshot: Snapshot) -> list[dict]:
    """Background rectangles over the trace index: grey for each eager break, orange for each replay capture."""
    spans = []
    for graphs in captures_by_name(snapshot).values():
        for before, after in zip(graphs, graphs[1:], strict=False):
            spans.append((before["trace_end"], after["trace_begin"], BREAK_COLOUR))
    for window in snapshot.captures:
        if is_replay_capture(window.get("manager", "")):
            spans.append((window["trace_begin"], window["trace_end"], REPLAY_COLOUR))
    common = dict(type="rect", xref="x", yref="paper", y0=0, y1=1, opacity=0.15, line_width=0, layer="below")
    return [{**common, "x0": x0, "x1": x1, "fillcolor": colour} for x0, x1, colour in spans]


def block_labels(liveness: Liveness) -> list[str]:
    """The timeline's row label of each liveness row: model capture size, block address and bytes."""
    return [f"{r.capture_size}: {r.addr:#x} ({format_bytes(r.bytes)})" for r in liveness.rows.itertuples(index=False)]


def timeline_figure(snapshot: Snapshot, liveness: Liveness, title: str, source: str | None = None) -> go.Figure:
    """Per held block a bar from its allocation to its free, with the replay allocations over it marked.

    `liveness` is `liveness_table(snapshot, ...)`; `source` names the data
    source under the title (default: the liveness result's).
    """
    labels = block_labels(liveness)
    frees = liveness.rows["free_index"].fillna(len(snapshot.trace)).astype(int)  # never freed: the trace's end
    blocks = list(zip(labels, liveness.rows.to_dict("records"), frees.tolist(), strict=True))
    fig = go.Figure()
    for cls, colour in COLOURS.items():
        mine = [(label, r, free) for label, r, free in blocks if r["class"] == cls]
        hover = [
            f"{r['capture']}, break {r['break']}: {format_bytes(r['bytes'])} at {r['addr']:#x}<br>"
            f"allocated at {r['alloc_frame']} (trace {r['alloc_index']}), freed at trace {free}"
            for _, r, free in mine
        ]
        fig.add_bar(
            orientation="h",
            name=cls,
            marker_color=colour,
            y=[label for label, _, _ in mine],
            base=[r["alloc_index"] for _, r, _ in mine],
            x=[free - r["alloc_index"] for _, r, free in mine],
            hovertext=hover,
            hovertemplate="%{hovertext}<extra></extra>",
        )
    for in_break, (name, symbol, colour) in MARKS.items():
        points = [
            (index, label)
            for label, r, _ in blocks
            for replay, index in r["replay_overlaps"]
            if (replay in r["replay_in_break"]) == in_break
        ]
        fig.add_scatter(
            mode="markers",
            name=name,
            marker=dict(symbol=symbol, size=12, color=colour),
            x=[x for x, _ in points],
            y=[y for _, y in points],
        )
    fig.update_layout(
        title=f"{title}<br><sup>source: {source or liveness.source}</sup>",
        shapes=break_bands(snapshot),
        barmode="overlay",
        xaxis_title="trace index (allocator events, in order)",
        yaxis=dict(categoryorder="array", categoryarray=labels, autorange="reversed", title="model graph: block"),
        legend=dict(orientation="h", yanchor="top", y=-0.25),
        height=320 + 40 * len(labels),
    )
    return fig

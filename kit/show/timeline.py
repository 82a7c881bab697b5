"""The liveness timeline: what a model graph holds across its eager break, and the replay graphs written over it.

Notebook 04 (safety) draws `kit.analysis.liveness.liveness_table` with it.
Rows are labelled by role, not by address (`block_role`):

- a model graph's blocks held across its break: `break input` (released by
  the break, or kept bound when the break's reads say the break read it),
  `aux hidden state` (a held block the forward returns: freed by the code
  that called the forward, or never), or `held after the break`;
- the replay graphs' allocations over those blocks (`replay_allocations`):
  `replay output` (returned by the replay graph's forward) or `replay
  activation` (freed inside it).

Each is a bar from its allocation to its free in capture order (the trace
index; the trace's end when never freed), coloured by role. Behind the bars,
`break_bands` shades the eager breaks grey and the replay captures orange;
the x axis names each capture (`capture_ticks`). On a held block's row,
`timeline_figure` marks every replay-graph allocation over its bytes: a
cross when that replay graph runs in the block's break, an open circle when
it runs in another's. The replay graphs are captured after the model graphs,
so a mark sits right of the bar it lands on: at run time that replay graph
runs inside the block's break. Capture names, frames and the source are the
snapshot's own text, escaped (`kit.markup`): plotly renders them as HTML.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import plotly.graph_objects as go

from kit.analysis.attribution import captures_by_name, is_replay_capture
from kit.analysis.frames import user_frame_line
from kit.analysis.liveness import BREAK_INPUT, HELD, RELEASED, Liveness
from kit.load.snapshot import Snapshot
from kit.markup import html_text
from kit.units import format_bytes

BREAK_INPUT_RELEASED, BREAK_INPUT_BOUND = "break input, released by the break", "break input, kept bound"
AUX_HIDDEN_STATE, HELD_AFTER = "aux hidden state", "held after the break"
REPLAY_OUTPUT, REPLAY_ACTIVATION = "replay output", "replay activation"
COLOURS = {
    BREAK_INPUT_RELEASED: "#27ae60",
    BREAK_INPUT_BOUND: "#2980b9",
    AUX_HIDDEN_STATE: "#c0392b",
    HELD_AFTER: "#8e44ad",
    REPLAY_OUTPUT: "#d35400",
    REPLAY_ACTIVATION: "#f5b041",
}
BREAK_COLOUR, REPLAY_COLOUR = "#7f8c8d", "#e67e22"
MARKS = {  # does the replay graph that allocated over the block run in the block's break? -> (name, symbol, colour)
    True: ("a replay graph of this break allocates here", "x", "black"),
    False: ("a replay graph of another break allocates here", "circle-open", "grey"),
}
ROW_HEIGHT, LEGEND_HEIGHT = 30, 150  # px
BAND_OPACITY = 0.35  # light enough for the bars over it, dark enough that orange reads as orange
_FILE = re.compile(r"\(([^():]+):\d+\)")


def _file_of(frame: str) -> str | None:
    """The file of a `name (file:line)` frame line, or None."""
    found = _FILE.search(frame or "")
    return found.group(1) if found else None


def returned_by_forward(alloc_frame: str, free_frame: str | None) -> bool:
    """Whether a block outlived the forward that made it: freed in another file than it was allocated in, or never.

    A block the forward drops is freed in the forward's own code; one it
    returns is freed by its caller (the capture code, when the capture lets
    go of the graph's outputs), or not at all.
    """
    if not free_frame:
        return True
    return _file_of(free_frame) != _file_of(alloc_frame)


def block_role(cls: str, alloc_frame: str, free_frame: str | None) -> str:
    """A held block's role from its liveness class and frames (see the module docstring)."""
    if cls == RELEASED:
        return BREAK_INPUT_RELEASED
    if cls == BREAK_INPUT:
        return BREAK_INPUT_BOUND
    if cls == HELD and returned_by_forward(alloc_frame, free_frame):
        return AUX_HIDDEN_STATE  # held across the break and returned: made before the break, so not the final output
    return HELD_AFTER


def block_roles(liveness: Liveness) -> list[str]:
    """`block_role` of each liveness row."""
    rows = liveness.rows
    return [
        block_role(cls, alloc, free)
        for cls, alloc, free in zip(rows["class"], rows["alloc_frame"], rows["free_frame"], strict=True)
    ]


def _labels(keys: Iterable[str]) -> list[str]:
    """Row labels, a count appended to each repeat (`model graph 512: break input, kept bound (2)`)."""
    seen: dict[str, int] = {}
    out = []
    for key in keys:
        seen[key] = seen.get(key, 0) + 1
        out.append(key if seen[key] == 1 else f"{key} ({seen[key]})")
    return out


def block_labels(liveness: Liveness) -> list[str]:
    """The timeline's row label of each liveness row: the model graph and the block's role."""
    sizes = liveness.rows["capture_size"]
    return _labels(f"model graph {size}: {role}" for size, role in zip(sizes, block_roles(liveness), strict=True))


def _trace(snapshot: Snapshot) -> tuple:
    """Device 0's trace: the one `liveness_table` reads by default."""
    return tuple(snapshot.traces.get(0, ()))


def _free_of(trace: tuple, index: int) -> tuple[int | None, list]:
    """The trace index and frames of the free of the allocation at `index`; (None, []) when never freed."""
    addr = trace[index].addr
    for i in range(index + 1, len(trace)):
        e = trace[i]
        if e.addr == addr and e.action in ("free_requested", "free_completed"):
            return i, e.frames
    return None, []


def replay_allocations(snapshot: Snapshot, liveness: Liveness) -> list[dict]:
    """Each replay-graph allocation over a held block, once: its capture, size, span, role and frames."""
    sizes = {name: gs[0].get("size") for name, gs in captures_by_name(snapshot).items()}
    trace = _trace(snapshot)
    seen, rows = set(), []
    for overlaps in liveness.rows["replay_overlaps"]:
        for capture, index in overlaps:
            if index in seen:
                continue
            seen.add(index)
            free, free_frames = _free_of(trace, index)
            entry = trace[index]
            alloc_frame, free_frame = user_frame_line(entry.frames), user_frame_line(free_frames)
            returned = returned_by_forward(alloc_frame, free_frame if free is not None else None)
            rows.append(
                {
                    "capture": capture,
                    "size": sizes.get(capture),
                    "alloc_index": index,
                    "free_index": len(trace) if free is None else free,
                    "bytes": entry.size,
                    "role": REPLAY_OUTPUT if returned else REPLAY_ACTIVATION,
                    "alloc_frame": alloc_frame,
                    "free_frame": free_frame or "never freed",
                }
            )
    return sorted(rows, key=lambda r: (-(r["size"] or 0), r["role"], r["alloc_index"]))


def break_bands(snapshot: Snapshot) -> list[dict]:
    """Background rectangles over the trace index: grey for each eager break, orange for each replay capture."""
    spans = []
    for graphs in captures_by_name(snapshot).values():
        for before, after in zip(graphs, graphs[1:], strict=False):
            spans.append((before["trace_end"], after["trace_begin"], BREAK_COLOUR))
    for window in snapshot.captures:
        if is_replay_capture(window.get("manager", "")):
            spans.append((window["trace_begin"], window["trace_end"], REPLAY_COLOUR))
    common = dict(type="rect", xref="x", yref="paper", y0=0, y1=1, opacity=BAND_OPACITY, line_width=0, layer="below")
    return [{**common, "x0": x0, "x1": x1, "fillcolor": colour} for x0, x1, colour in spans]


def capture_ticks(snapshot: Snapshot) -> tuple[list[float], list[str]]:
    """One x tick per capture, at the middle of its windows, named `model graph N` or `replay graph R`."""
    values, texts = [], []
    for name, graphs in captures_by_name(snapshot).items():
        kind = "replay graph" if is_replay_capture(graphs[0].get("manager", "")) else "model graph"
        size = graphs[0].get("size")
        values.append((graphs[0]["trace_begin"] + graphs[-1]["trace_end"]) / 2)
        texts.append(f"{kind}<br>{size}" if size is not None else html_text(name))
    return values, texts


def _add_bars(fig: go.Figure, role: str, bars: list[tuple[str, int, int, str]]) -> None:
    """One legend entry of bars: (row label, from, to, hover text) each."""
    fig.add_bar(
        orientation="h",
        name=role,
        marker_color=COLOURS[role],
        y=[label for label, _, _, _ in bars],
        base=[begin for _, begin, _, _ in bars],
        x=[end - begin for _, begin, end, _ in bars],
        hovertext=[hover for _, _, _, hover in bars],
        hovertemplate="%{hovertext}<extra></extra>",
    )


def timeline_figure(snapshot: Snapshot, liveness: Liveness, title: str, source: str | None = None) -> go.Figure:
    """Per held block, and per replay allocation over one, a bar from its allocation to its free; rows by role.

    `liveness` is `liveness_table(snapshot, ...)`; `source` names the data
    source under the title (default: the liveness result's).
    """
    trace = _trace(snapshot)
    rows = liveness.rows.to_dict("records")
    labels, roles = block_labels(liveness), block_roles(liveness)
    frees = liveness.rows["free_index"].fillna(len(trace)).astype(int).tolist()
    replays = replay_allocations(snapshot, liveness)
    replay_labels = [f"replay graph {r['size']}: {r['role'].removeprefix('replay ')}" for r in replays]
    fig = go.Figure()
    for role in COLOURS:
        held = [
            (
                label,
                r["alloc_index"],
                free,
                f"{label}: {format_bytes(r['bytes'])} at {r['addr']:#x}, break {r['break']}<br>"
                f"allocated at {html_text(user_frame_line(trace[r['alloc_index']].frames))} "
                f"(trace {r['alloc_index']})<br>freed at {html_text(r['free_frame'] or 'never')} (trace {free})",
            )
            for label, r, free, mine in zip(labels, rows, frees, roles, strict=True)
            if mine == role
        ]
        made = [
            (
                label,
                r["alloc_index"],
                r["free_index"],
                f"{label}: {format_bytes(r['bytes'])}<br>allocated at {html_text(r['alloc_frame'])} "
                f"(trace {r['alloc_index']})<br>freed at {html_text(r['free_frame'])} (trace {r['free_index']})",
            )
            for label, r in zip(replay_labels, replays, strict=True)
            if r["role"] == role
        ]
        if held or made:
            _add_bars(fig, role, held + made)
    for in_break, (name, symbol, colour) in MARKS.items():
        points = [
            (index, label)
            for label, r in zip(labels, rows, strict=True)
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
    order = labels + list(dict.fromkeys(replay_labels))
    tick_values, tick_texts = capture_ticks(snapshot)
    fig.update_layout(
        title=f"{title}<br><sup>source: {html_text(source or liveness.source)}</sup>",
        shapes=break_bands(snapshot),
        barmode="overlay",
        xaxis=dict(
            title="capture order (allocator events); grey bands: eager breaks, orange bands: replay captures",
            tickvals=tick_values,
            ticktext=tick_texts,
            tickangle=0,
        ),
        yaxis=dict(categoryorder="array", categoryarray=order, autorange="reversed", automargin=True),
        # The legend under the axis title, in a bottom margin kept for it (two rows at this width).
        legend=dict(orientation="h", x=0, xanchor="left", y=0, yref="container", yanchor="bottom"),
        height=160 + LEGEND_HEIGHT + ROW_HEIGHT * len(order),
        margin=dict(l=10, r=10, b=LEGEND_HEIGHT),
    )
    return fig

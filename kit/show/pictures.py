"""Plotly figures of allocator state: group totals and the segment map.

- `group_bar_figure`: per (pool, stream) group, reserved bytes split into
  allocated, pending free and free, as stacked bars.
- `segment_map_figure`: every segment as a horizontal bar of its blocks,
  coloured by stream, grouped by pool, so a stranded stream's free blocks
  stand out next to the other stream's segments of the same pool.

Every figure's title names its data source. Plotly renders titles, trace
names, category labels and hover text as HTML, so every label and source from
the snapshot is escaped (`kit.markup`) before it goes into a figure.

The colours and names every figure of the kit shares live here: `MIB`, the
block states' (`STATE_COLOURS`), the streams' (`stream_colours`: the default
stream and the kit's named streams fixed, every other stream of a figure a
colour of its own, kept clear of `MARK_COLOURS`, the step-through's
outlines). `FigureWidget` is plotly's widget sized to its cell (plotly's own
sizes itself once, before JupyterLab attaches it: 700 px).
"""

from __future__ import annotations

import colorsys
import itertools
import re
import textwrap
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import plotly
import plotly.graph_objects as go

from kit.analysis.names import (
    DEFAULT_STREAM_LABEL,
    MODEL_STREAM_LABEL,
    REPLAY_STREAM_LABEL,
    SPECULATOR_STREAM_LABEL,
    pool_labels,
)
from kit.analysis.tables import pool_label, segment_table, stream_labels
from kit.errors import KitError
from kit.load.rows import BLOCK_STATES
from kit.load.snapshot import Snapshot, load_snapshot
from kit.markup import html_text
from kit.units import MIB, format_bytes

BAR_TOP_MARGIN = 120  # px above the bars: the two-line title, then the legend's row
TITLE_LINE = 16  # px per extra line of a wrapped source
SOURCE_CHARS = 150  # a source line's length before it wraps (about 900 px of <sup> text)
STATE_COLOURS = {"allocated": "#34495e", "pending free": "#e67e22", "free": "#aed6f1"}  # group bars' parts
STATE_STYLE = {  # block state -> (legend name, share of the stream's colour, bar pattern)
    "active_allocated": ("allocated", 1.0, ""),
    "active_pending_free": ("pending free", 0.7, "x"),
    "inactive": ("free", 0.3, "/"),
}
MARK_COLOURS = {"taken by this request": "black", "refused: other stream": "#c0392b"}  # outlines, kept unique
STREAM_COLOURS = {  # the kit's stream names; no red (refused) nor black (taken)
    DEFAULT_STREAM_LABEL: "#7f8c8d",
    MODEL_STREAM_LABEL: "#2874a6",
    REPLAY_STREAM_LABEL: "#e67e22",
    SPECULATOR_STREAM_LABEL: "#8e44ad",
}
DISTINCT = 25.0  # CIE76 distance two stream colours of one figure keep at least, where the palette allows


def stream_colours(labels: Mapping[Hashable, str]) -> dict[Hashable, str]:
    """A colour for every stream of one figure, no two alike.

    The default stream (id 0, whatever a recorder named it) and the kit's
    named streams keep their fixed colours; every other stream takes, in
    order, the next of `OTHER_STREAM_COLOURS` (plotly's qualitative palettes,
    less any colour within `DISTINCT` of a fixed colour, a mark or another),
    and past those a hue of its own (`_spare_colour`).
    """
    out: dict[Hashable, str] = {}
    rest = []
    for key, label in labels.items():
        if (key == 0 and not isinstance(key, bool)) or label == DEFAULT_STREAM_LABEL:
            out[key] = STREAM_COLOURS[DEFAULT_STREAM_LABEL]
        elif label in STREAM_COLOURS:
            out[key] = STREAM_COLOURS[label]
        else:
            rest.append(key)
    palette = iter(c for c in OTHER_STREAM_COLOURS if c not in out.values())
    for n, key in enumerate(rest):
        out[key] = next(palette, None) or _spare_colour(n, set(out.values()))
    return out


def _lab(colour: str) -> tuple[float, float, float]:
    """#rrggbb as CIE L*a*b* (D65): the space where distance is how different two colours look."""
    rgb = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (((v + 0.055) / 1.055) ** 2.4 if v > 0.04045 else v / 12.92 for v in rgb)
    xyz = (
        (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047,
        0.2126 * r + 0.7152 * g + 0.0722 * b,
        (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883,
    )
    fx, fy, fz = (t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116 for t in xyz)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def colour_distance(x: str, y: str) -> float:
    """How different two #rrggbb colours look (CIE76: 2.3 is just noticeable)."""
    return float(np.linalg.norm(np.subtract(_lab(x), _lab(y))))


def _palette() -> tuple[str, ...]:
    """Plotly's qualitative colours a stream may take: none too light to hatch, none like a fixed one or another."""
    marks = ("#000000", "#c0392b")  # MARK_COLOURS: an outline must never look like a stream
    out: list[str] = []
    for colour in (c.lower() for c in (*plotly.colors.qualitative.Dark24, *plotly.colors.qualitative.Alphabet)):
        if (
            _lab(colour)[0] < 80  # free blocks are drawn in a tint of it: white would hide them
            and all(colour_distance(colour, k) >= 2 * DISTINCT for k in marks)
            and all(colour_distance(colour, k) >= DISTINCT for k in (*STREAM_COLOURS.values(), *out))
        ):
            out.append(colour)
    return tuple(out)


def _spare_colour(n: int, taken: set[str]) -> str:
    """A colour past the palette: hues a golden angle apart, at three lightnesses, never one already taken."""
    for k in itertools.count(n):
        h, light = (k * 0.618034) % 1.0, (0.35, 0.5, 0.65)[k % 3]
        colour = "#" + "".join(f"{round(v * 255):02x}" for v in colorsys.hls_to_rgb(h, light, 0.75))
        if colour not in taken:
            return colour
    raise AssertionError("unreachable")


OTHER_STREAM_COLOURS = _palette()


def lighter(colour: str, share: float) -> str:
    """`colour` (#rrggbb) mixed with white: `share` of the colour, the rest white (an opaque legend swatch)."""
    rgb = [int(colour[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(255 - (255 - v) * share):02x}" for v in rgb)


def _source_lines(source: str) -> list[str]:
    return textwrap.wrap(f"source: {source}", SOURCE_CHARS, break_long_words=True) or ["source:"]


def titled(title: str, source: str) -> str:
    """A title with its source under it, wrapped so that a long path is never cut off at the figure's edge."""
    lines = "<br>".join(html_text(line) for line in _source_lines(source))
    return f"{title}<br><sup>{lines}</sup>"


def title_room(source: str) -> int:
    """Extra px of top margin a wrapped source needs beyond its first line."""
    return TITLE_LINE * (len(_source_lines(source)) - 1)


def segment_row(pool: str, address: int) -> str:
    """A segment map's row: the pool's label (escaped: plotly renders it as HTML) and the segment's address."""
    return f"{html_text(pool)} | {address:#x}"


def group_bar_figure(snapshot: Snapshot | str | dict, **names) -> go.Figure:
    """Stacked bars of allocated, pending-free and free MiB per (pool, stream) group."""
    snapshot = load_snapshot(snapshot)
    table = segment_table(snapshot, **names)
    groups = [html_text(f"{p} / {s}") for p, s in zip(table["pool_label"], table["stream_label"], strict=True)]
    parts = {  # name -> (bytes per group, colour)
        "allocated": (table["allocated"], STATE_COLOURS["allocated"]),
        "pending free": (table["active"] - table["allocated"], STATE_COLOURS["pending free"]),
        "free": (table["free"], STATE_COLOURS["free"]),
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
        title=titled("Reserved memory per (pool, stream) group", snapshot.source_label),
        xaxis_title="MiB",
        yaxis=dict(autorange="reversed", automargin=True),
        # The legend in one row between the title and the bars, in a top margin kept for both: on the
        # right it took the height of the bars, and with few groups its last entries were cut off.
        legend=dict(
            orientation="h", x=0, xanchor="left", y=1, yanchor="bottom", title_text="block state", traceorder="normal"
        ),
        margin=dict(t=BAR_TOP_MARGIN + title_room(snapshot.source_label), b=50),
        height=BAR_TOP_MARGIN + title_room(snapshot.source_label) + 90 + 32 * len(groups),
    )
    return fig


def segment_map_figure(
    snapshot: Snapshot | str | dict, *, max_segments: int = 2000, max_bars: int = 20_000, **names
) -> go.Figure:
    """Each segment a bar of its blocks, coloured by stream, grouped by pool.

    The browser never receives more than `max_segments` segments (the largest
    are kept) nor more than `max_bars` bars: past that, neighbouring blocks of
    one state are drawn as one bar ("12 blocks, ..." on hover), and if that is
    not enough, more of the smallest segments are left out. Where one segment
    alone still has more runs than `max_bars`, its runs are drawn in
    `max_bars` groups of neighbours, each in the colour of the state holding
    most of its bytes (its bytes per state on hover). The title says what was
    left out, merged or grouped. `max_bars` below 1 is refused (`KitError`).
    """
    check_bar_limit(max_bars)
    snapshot = load_snapshot(snapshot)
    c = snapshot.columns
    labels = stream_labels(snapshot, names.get("stream_names"))
    pools = pool_labels(snapshot, names.get("pool_names"))
    pool_of = c.pools()
    drawn = _drawn(c, _map_order(c, pool_of, labels), max_segments, max_bars)
    bars, rows = _bars(c, drawn.order, _bars_of(drawn, max_bars), pool_of, pools)
    fig = go.Figure()
    _add_bars(fig, bars, labels)
    title = "Segment map: blocks of each segment, coloured by stream"
    if drawn.dropped:
        title += f" ({drawn.dropped} smallest segments not drawn)"
    if drawn.merged:
        title += " (neighbouring blocks of one state drawn as one bar)"
    if drawn.grouped is not None:
        i, runs = drawn.grouped
        title += (
            f" (segment {int(c.address[i]):#x}: its {runs:,} runs drawn as {max_bars:,} bars of neighbouring runs,"
            " each in the colour of its largest state)"
        )
    legend_rows = (len(fig.data) + 3) // 4 + 1  # entries four to a row, and the room for outlines added later
    top = BAR_TOP_MARGIN + title_room(snapshot.source_label) + 22 * legend_rows
    fig.update_layout(
        barmode="overlay",
        title=titled(title, snapshot.source_label),
        xaxis_title="offset in segment (MiB)",
        yaxis=dict(categoryorder="array", categoryarray=rows, autorange="reversed", title="pool | segment"),
        # The legend in rows above the map, every entry shown: on the right it scrolled, and took the map's width.
        legend=dict(orientation="h", x=0, xanchor="left", y=1, yanchor="bottom", title_text="stream: block state"),
        margin=dict(t=top),
        height=top + max(220, 80 + 22 * len(rows)),
    )
    return fig


def check_bar_limit(max_bars: int) -> None:
    """Refuse a segment map limit of fewer than one bar: no segment with a block could be drawn."""
    if isinstance(max_bars, bool) or not isinstance(max_bars, int) or max_bars < 1:
        raise KitError(f"max_bars is {max_bars!r}: a segment map needs at least 1 bar")


def _map_order(c, pool_of: list[tuple[int, int]], labels: dict[int, str]) -> list[int]:
    """The segments in the map's order: by device, pool, stream label, address."""
    stream_of, address_of, device_of = c.stream.tolist(), c.address.tolist(), c.device.tolist()
    return sorted(range(len(c)), key=lambda i: (device_of[i], pool_of[i], labels.get(stream_of[i], ""), address_of[i]))


class Drawn(NamedTuple):
    """What a segment map draws: its segments, how many were left out, and how their blocks were merged."""

    order: list[int]  # the segments drawn, in the map's order
    dropped: int  # segments left out (the smallest)
    merged: bool  # neighbouring blocks of one state drawn as one bar
    grouped: tuple[int, int] | None  # (segment, its runs) where one segment's runs alone pass `max_bars`


def _drawn(c, order: list[int], max_segments: int, max_bars: int) -> Drawn:
    """The segments to draw and how: every block, runs of one state merged, or one segment's runs grouped.

    Each pass of the loop leaves out at least one segment and stops at one, so
    it ends; a segment whose runs alone pass `max_bars` is drawn in groups.
    """
    total_of = c.total_size.tolist()
    dropped = 0
    if len(order) > max_segments:
        dropped = len(order) - max_segments
        order = _largest(order, total_of, max_segments)
    merged = sum(int(c.n_blocks[i]) for i in order) > max_bars
    bars_of = _runs if merged else _blocks
    while len(order) > 1 and sum(len(bars_of(c, i)[0]) for i in order) > max_bars:
        keep = min(len(order) - 1, max(1, len(order) * 3 // 4))
        dropped += len(order) - keep
        order = _largest(order, total_of, keep)
    runs = len(bars_of(c, order[0])[0]) if len(order) == 1 else 0
    return Drawn(order, dropped, merged, (order[0], runs) if runs > max_bars else None)


def _bars_of(drawn: Drawn, max_bars: int):
    """The function giving a drawn segment's bars: its blocks, its runs, or, for a grouped one, its groups."""
    if drawn.grouped is not None:
        return lambda c, i: _groups(c, i, max_bars)
    return _runs if drawn.merged else _blocks


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
        starts, sizes, states, counts, mixes = bars_of(c, i)
        for start, size, state, count, mix in zip(starts, sizes, states, counts, mixes, strict=True):
            state = BLOCK_STATES[state]
            bar = bars.setdefault((stream_of[i], state), {"y": [], "x": [], "base": [], "text": []})
            bar["y"].append(row)
            bar["base"].append((start - address) / MIB)
            bar["x"].append(size / MIB)
            name = STATE_STYLE[state][0] if mix is None else f"mostly {STATE_STYLE[state][0]}"
            what = f"{format_bytes(size)} {name} at +{format_bytes(start - address)}"
            if mix is not None:
                what += ": " + ", ".join(f"{format_bytes(n)} {STATE_STYLE[BLOCK_STATES[s]][0]}" for s, n in mix)
            bar["text"].append(what if count == 1 else f"{count} blocks, {what}")
    return bars, rows


def _add_bars(fig: go.Figure, bars: dict[tuple[int, str], dict[str, list]], labels: dict[int, str]) -> None:
    """One trace per (stream, block state): the stream's colour, lighter and hatched for free blocks."""
    colour = stream_colours(labels)
    for (sid, state), bar in sorted(bars.items(), key=lambda kv: (labels.get(kv[0][0], ""), kv[0][1])):
        name, share, pattern = STATE_STYLE[state]
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
                color=lighter(colour.get(sid, "#808080"), share),
                pattern=dict(shape=pattern, fgcolor=colour.get(sid, "#808080"), fgopacity=0.6, size=6),
                line=dict(width=0.5, color="white"),
            ),
        )


def _largest(order: list[int], total_size: list[int], keep: int) -> list[int]:
    """The `keep` largest segments of `order`, in `order`'s order (ties: the earlier one)."""
    chosen = set(sorted(order, key=lambda i: -total_size[i])[:keep])
    return [i for i in order if i in chosen]


def _blocks(c, i: int) -> tuple[list, list, list, list, list]:
    """Segment `i`'s blocks: starts, sizes, states, a count of one each, and no mix of states."""
    lo, hi = int(c.first_block[i]), int(c.first_block[i] + c.n_blocks[i])
    if hi == lo:
        return [], [], [], [], []
    starts, sizes = c.block_address[lo:hi].tolist(), c.block_size[lo:hi].tolist()
    return starts, sizes, c.block_state[lo:hi].tolist(), [1] * (hi - lo), [None] * (hi - lo)


def _runs(c, i: int) -> tuple[list, list, list, list, list]:
    """Segment `i`'s blocks with each run of neighbours in one state merged into one."""
    lo, hi = int(c.first_block[i]), int(c.first_block[i] + c.n_blocks[i])
    if hi == lo:
        return [], [], [], [], []
    state = c.block_state[lo:hi]
    first = np.flatnonzero(np.concatenate(([True], state[1:] != state[:-1])))
    sizes = np.add.reduceat(c.block_size[lo:hi], first)
    counts = np.diff(np.append(first, hi - lo))
    starts = c.block_address[lo:hi][first].tolist()
    return starts, sizes.tolist(), state[first].tolist(), counts.tolist(), [None] * len(first)


def _groups(c, i: int, bars: int) -> tuple[list, list, list, list, list]:
    """Segment `i`'s runs in `bars` groups of neighbours (as even in runs as can be), where it has more runs.

    A group's state is the one holding most of its bytes (ties: the first of
    `BLOCK_STATES`); its mix is its bytes per state, in that order (None where
    it holds one state only).
    """
    starts, sizes, states, counts, mixes = _runs(c, i)
    if len(starts) <= bars:
        return starts, sizes, states, counts, mixes
    first = np.array([k * len(starts) // bars for k in range(bars)])  # n > bars: every group holds a run
    size, state = np.array(sizes, dtype=np.int64), np.array(states)
    per_state = np.stack([np.add.reduceat(np.where(state == s, size, 0), first) for s in range(len(BLOCK_STATES))])
    largest = per_state.argmax(axis=0)
    mix = [[(s, n) for s, n in enumerate(column) if n] for column in per_state.T.tolist()]
    mix = [m if len(m) > 1 else None for m in mix]  # a group of one state is drawn as a run is
    total = np.add.reduceat(size, first).tolist()
    begins = [starts[k] for k in first.tolist()]  # addresses as Python ints: one may pass int64
    return begins, total, largest.tolist(), np.add.reduceat(counts, first).tolist(), mix


def figure_widget(widget: go.FigureWidget | None, figure: go.Figure, extra_traces: Sequence = ()) -> go.FigureWidget:
    """`widget` showing `figure` (and `extra_traces`); a new `FigureWidget` of them where `widget` is None.

    A view's first figure goes into a new widget whole: redrawn before it is displayed, plotly's view could
    miss the redraw and show an empty plot.
    """
    if widget is None:
        return FigureWidget(go.Figure(data=[*figure.data, *extra_traces], layout=figure.layout))
    show_in(widget, figure, extra_traces)
    return widget


def show_in(widget: go.FigureWidget, figure: go.Figure, extra_traces: Sequence = ()) -> None:
    """Replace what a FigureWidget shows with `figure` (and `extra_traces` on top), in one update.

    The widget stays the same object, so a notebook's controls redraw it in
    place instead of adding a new figure per change.
    """
    with widget.batch_update():
        widget.data = []
        widget.add_traces([*figure.data, *extra_traces])
        widget.layout = figure.layout


def _wide_esm() -> str:
    """Plotly's widget module with its default export wrapped: the view redrawn whenever its width changes."""
    bundle = (Path(plotly.__file__).parent / "package_data" / "widgetbundle.js").read_text()
    exports = list(re.finditer(r"export\s*\{([^}]*)\}", bundle))[-1]
    names = [n.strip() for n in exports.group(1).split(",")]
    default = next(n.split(" as ")[0] for n in names if n.endswith(" as default"))
    kept = ",".join(n for n in names if not n.endswith(" as default"))
    bundle = bundle[: exports.start()] + f"export{{{kept}}}" + bundle[exports.end() :]
    return bundle + _RESIZE.replace("PLOTLY_DEFAULT", default) + "export default __kitWideWidget;\n"


# The plotly view draws at once, before JupyterLab attaches its element, so at plotly's 700 px default. Once
# it has drawn (plotly's "plotlywidget-after-render" event; a resize before then would redraw a half-made plot
# empty) and whenever its element's width changes, this calls the handler plotly's `responsive` config puts
# on the element, which fits the figure to it: this plot only, not every plot on the page.
_RESIZE = """
const __kitWideWidget = () => {
  const widget = PLOTLY_DEFAULT();
  return {
    initialize: widget.initialize,
    render(context) {
      const el = context.el;
      let width = 0;
      let rendered = false;
      const fit = () => {
        const now = el.getBoundingClientRect().width;
        if (rendered && now > 0 && Math.abs(now - width) > 1 && el._responsiveChartHandler) {
          width = now;
          el._responsiveChartHandler();
        }
      };
      const onRendered = (event) => {
        if (event.detail && event.detail.element === el) {
          rendered = true;
          fit();
        }
      };
      document.addEventListener('plotlywidget-after-render', onRendered);
      const cleanup = widget.render(context);
      const observer = new ResizeObserver(fit);
      observer.observe(el);
      return () => {
        observer.disconnect();
        document.removeEventListener('plotlywidget-after-render', onRendered);
        if (cleanup) cleanup();
      };
    },
  };
};
"""


class FigureWidget(go.FigureWidget):
    """Plotly's FigureWidget as wide as its cell: the kit's views draw every figure in one of these."""

    _esm = _wide_esm()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._config = {**self._config, "responsive": True}

"""Two runs side by side and what changed between them: notebook 03's replica unpatched and patched.

The runs are separate processes, so their stream ids differ: the change per
(pool, stream) group matches groups by stream name
(`kit.analysis.tables.diff_tables(..., by="label")`). `saving_line` says
what the graph pool saved in that change; `change_figure` draws both sides
of each group; `replay_segments_line` says what graph-pool segments the
replay captures added in one run (`kit.capture_table`). `BeforeAfterView`
is notebook 03's preset toggle over the replica's runs: the replica
unpatched (its mirror of vLLM 0.33's capture path) against the replica
patched with PR 63155's policy `pr`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from kit.analysis.attribution import capture_table, is_replay_capture
from kit.analysis.names import GRAPH_POOL_LABEL
from kit.analysis.tables import diff_tables, segment_table, style_table
from kit.experiments.safety_run import result as safety_result
from kit.load.snapshot import Snapshot
from kit.markup import html_text
from kit.show.pictures import BAR_TOP_MARGIN, STATE_COLOURS, FigureWidget, figure_widget, title_room, titled
from kit.units import MIB, format_bytes

GRAPH_POOL_AXIS = "MiB (the graph pool's groups; every pool is in the tables above)"
# The two runs the view compares: experiment scenario -> the replica scenario that runs it.
SCENARIO_OF = {name: safety_result.SCENARIO_OF[name] for name in ("unpatched", "pr")}
RUN_TITLES = {  # scenario -> what the run is: the replica, never vLLM itself
    "unpatched": "replica, unpatched (its mirror of vLLM 0.33's capture path)",
    "patched": "replica, patched (PR 63155, policy pr)",
}
TABLE_COLUMNS = ["pool_label", "stream_label", "segments", "reserved", "allocated", "free"]
CHANGE_COLUMNS = ["pool_label", "stream_label", "status", "reserved_before", "reserved_after", "reserved", "free"]


def saving_line(change: pd.DataFrame) -> str:
    """One sentence from a `diff_tables` change: the graph pool's reserved bytes before, after, and saved."""
    pool = change[change["pool_label"] == GRAPH_POOL_LABEL]
    saved = -pool["reserved"].sum()
    return (
        f"graph pool: {format_bytes(pool['reserved_before'].sum())} before, "
        f"{format_bytes(pool['reserved_after'].sum())} after: {format_bytes(saved)} saved ({saved:,} bytes)"
    )


def replay_segment_bytes(snapshot: Snapshot) -> int:
    """Bytes of the graph-pool segments the run's replay captures added (`new_segment_bytes`, `capture_table`)."""
    captures = capture_table(snapshot)
    replay = captures[captures["manager"].map(is_replay_capture) & (captures["pool_label"] == GRAPH_POOL_LABEL)]
    return int(replay["new_segment_bytes"].sum())


def replay_segments_line(name: str, snapshot: Snapshot) -> str:
    """One sentence: the graph-pool segments the replay captures of one run added."""
    added = replay_segment_bytes(snapshot)
    return f"{name}: the replay captures added {format_bytes(added)} ({added:,} bytes) of graph-pool segments"


def change_figure(
    change: pd.DataFrame, before: str = "before", after: str = "after", xaxis_title: str = "MiB"
) -> go.Figure:
    """Each (pool, stream) group of a `diff_tables` change in both runs: allocated, pending free and free, stacked.

    A group only one run has shows an empty bar for the other; the title
    names both runs' sources. Labels and sources are escaped: plotly renders them as HTML.
    """
    groups = [html_text(f"{p} / {s}") for p, s in zip(change["pool_label"], change["stream_label"], strict=True)]
    source = change.attrs.get("source", "?")
    fig = go.Figure()
    for part, colour in STATE_COLOURS.items():
        ys, xs = [[], []], []
        for side, name in (("before", before), ("after", after)):
            allocated, active = change[f"allocated_{side}"], change[f"active_{side}"]
            values = {"allocated": allocated, "pending free": active - allocated, "free": change[f"free_{side}"]}
            ys[0] += groups
            ys[1] += [name] * len(groups)
            xs += values[part].tolist()
        fig.add_bar(
            y=ys,
            x=[x / MIB for x in xs],
            name=part,
            orientation="h",
            marker_color=colour,
            hovertext=[format_bytes(x) for x in xs],
            hovertemplate="%{y}: %{hovertext} " + part + "<extra></extra>",
        )
    fig.update_layout(
        barmode="stack",
        title=titled(f"Reserved memory per (pool, stream) group: {before} and {after}", source),
        xaxis_title=xaxis_title,
        yaxis=dict(autorange="reversed", automargin=True),
        legend=dict(orientation="h", x=0, xanchor="left", y=1, yanchor="bottom", title_text="block state"),
        margin=dict(t=BAR_TOP_MARGIN + title_room(source), b=50),
        height=BAR_TOP_MARGIN + title_room(source) + 90 + 2 * 32 * len(groups),
    )
    return fig


class BeforeAfterView:
    """Pick a preset: the replica unpatched on the left, patched on the right, what changed below.

    `runs` maps (preset, scenario) to a run of the replica, for the
    scenarios `unpatched` and `patched`; the bars show both runs' groups.
    `widget` is the view to display; `preset` is its main control.
    """

    def __init__(self, runs: Mapping[tuple[str, str], Snapshot], presets: Sequence[str]) -> None:
        self.runs = runs
        self.preset = widgets.ToggleButtons(options=list(presets), description="preset")
        self.preset.add_class("kit-main-control")
        self.before_html, self.after_html, self.change_html = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.bars: FigureWidget | None = None  # made by the first show()
        self.preset.observe(self.show, names="value")
        self.show()

    @property
    def widget(self) -> widgets.VBox:
        sides = widgets.HBox([self.before_html, self.after_html])
        return widgets.VBox([self.preset, sides, self.change_html, self.bars])

    def show(self, change=None) -> None:
        before, after = (self.runs[self.preset.value, name] for name in ("unpatched", "patched"))
        old, new = segment_table(before), segment_table(after)
        self.before_html.value = f"<b>{RUN_TITLES['unpatched']}</b>" + style_table(old[TABLE_COLUMNS]).to_html()
        self.after_html.value = f"<b>{RUN_TITLES['patched']}</b>" + style_table(new[TABLE_COLUMNS]).to_html()
        groups = diff_tables(old, new, by="label")
        lines = [saving_line(groups), replay_segments_line("unpatched", before), replay_segments_line("patched", after)]
        table = style_table(groups[CHANGE_COLUMNS]).to_html()
        self.change_html.value = "".join(f"<p><b>{line}</b></p>" for line in lines) + table
        # The graph pool's groups only: beside the default pool's GiB the saving would be a sliver.
        graph_pool = groups[groups["pool_label"] == GRAPH_POOL_LABEL]
        self.bars = figure_widget(self.bars, change_figure(graph_pool, "unpatched", "patched", GRAPH_POOL_AXIS))

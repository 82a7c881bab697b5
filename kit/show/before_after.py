"""Notebook 03's before and after: the replica unpatched and under a policy, side by side, and what the pool saved.

The runs are separate processes, so their stream ids differ: the change per
(pool, stream) group matches groups by stream name
(`kit.analysis.tables.diff_tables(..., by="label")`). `saving_line` says
what the graph pool saved in that change; `BeforeAfterView` is the
notebook's preset and policy toggles over the runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from kit.analysis.tables import diff_tables, format_bytes, segment_table, style_table
from kit.load.snapshot import Snapshot
from kit.show.pictures import group_bar_figure, show_in

GRAPH_POOL = "global graph pool"
SCENARIO_OF = {"unpatched": "unpatched", "pr": "patched"}  # policy -> the replica scenario that runs it
TABLE_COLUMNS = ["pool_label", "stream_label", "segments", "reserved", "allocated", "free"]
CHANGE_COLUMNS = ["pool_label", "stream_label", "status", "reserved_before", "reserved_after", "reserved", "free"]


def saving_line(change: pd.DataFrame) -> str:
    """One sentence from a `diff_tables` change: the graph pool's reserved bytes before, after, and saved."""
    pool = change[change["pool_label"] == GRAPH_POOL]
    saved = -pool["reserved"].sum()
    return (
        f"graph pool: {format_bytes(pool['reserved_before'].sum())} before, "
        f"{format_bytes(pool['reserved_after'].sum())} after: {format_bytes(saved)} saved ({saved:,} bytes)"
    )


class BeforeAfterView:
    """Pick a preset and a policy: vLLM 0.33's run on the left, the policy's on the right, the change below.

    `runs` maps (preset, scenario) to a run of the replica, as in
    `SCENARIO_OF`'s scenarios; the bars show the right-hand run. `widget` is
    the view to display; `policy` is its main control.
    """

    def __init__(self, runs: Mapping[tuple[str, str], Snapshot], presets: Sequence[str]) -> None:
        self.runs = runs
        self.preset = widgets.ToggleButtons(options=list(presets), description="preset")
        self.policy = widgets.ToggleButtons(options=list(SCENARIO_OF), value="pr", description="policy")
        self.policy.add_class("kit-main-control")
        self.before_html, self.after_html, self.change_html = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.bars = go.FigureWidget()
        self.preset.observe(self.show, names="value")
        self.policy.observe(self.show, names="value")
        self.show()

    @property
    def widget(self) -> widgets.VBox:
        sides = widgets.HBox([self.before_html, self.after_html])
        return widgets.VBox([self.preset, self.policy, sides, self.change_html, self.bars])

    def show(self, change=None) -> None:
        before = self.runs[self.preset.value, "unpatched"]
        after = self.runs[self.preset.value, SCENARIO_OF[self.policy.value]]
        old, new = segment_table(before), segment_table(after)
        self.before_html.value = "<b>vLLM 0.33 (unpatched)</b>" + style_table(old[TABLE_COLUMNS]).to_html()
        self.after_html.value = f"<b>policy {self.policy.value}</b>" + style_table(new[TABLE_COLUMNS]).to_html()
        groups = diff_tables(old, new, by="label")
        self.change_html.value = f"<p><b>{saving_line(groups)}</b></p>" + style_table(groups[CHANGE_COLUMNS]).to_html()
        show_in(self.bars, group_bar_figure(after))

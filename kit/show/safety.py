"""Notebook 04's views of the safety argument: the scenarios side by side, and the policy explorer.

The replica's four scenario runs (`kit.experiments.scenarios.replica_runs`)
each carry a trace with the capture recorder's windows and the graphs-vs-eager
check made right after the capture. Here they become tables a reader can
follow:

- `overview_table`: one row per scenario, the three checks in its last
  columns (held after the break, breaks outside the pool, graphs vs eager);
- `liveness_view`, `equivalence_view`: one scenario's liveness rows and
  equivalence rows, styled;
- `SafetyView`: pick a stream policy and whether an aux hidden state comes
  before the replay layers; PR 63155's rule (`kit.patch.policy`) picks the
  replay graphs' stream, and with it the scenario whose capture is shown as a
  timeline (`kit.show.timeline`) with its verdicts and tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from pandas.io.formats.style import Styler

from kit.analysis.equivalence import Equivalence
from kit.analysis.liveness import HELD, Liveness, break_allocations, liveness_table
from kit.analysis.tables import format_bytes, style_table
from kit.experiments.scenarios import summarize
from kit.load.snapshot import Snapshot
from kit.patch.policy import replay_stream
from kit.show.pictures import show_in
from kit.show.timeline import timeline_figure

LIVENESS_SHOWN = ["capture", "break", "addr", "bytes", "class", "alloc_index", "free_index", "alloc_frame"]
LIVENESS_SHOWN += ["free_frame", "overlapping_replay", "replay_in_break", "conflict"]


def overview_row(name: str, snapshot: Snapshot) -> dict:
    """One scenario in a line: its policy, the replay graphs' stream, the pool, and the three checks."""
    figures = summarize(snapshot)
    rows = liveness_table(snapshot).rows  # any replay graph in any break, as in vLLM
    equivalence = Equivalence.recorded_in(snapshot)
    return {
        "scenario": name,
        "policy": figures["policy"],
        "early aux": snapshot.kit["scenario"]["has_early_aux"],
        "replay graphs on": ", ".join(figures["replay_capture_stream"]),
        "graph pool": format_bytes(figures["graph_pool_reserved"]),
        "held after the break": format_bytes(rows[rows["class"] == HELD]["bytes"].sum()),
        "of it under a replay graph": format_bytes(rows[rows["conflict"]]["bytes"].sum()),
        "breaks allocate outside the pool": bool(break_allocations(snapshot)["outside_pool"].all()),
        "graphs vs eager": "bit-exact" if equivalence.bit_exact else f"differ, up to {equivalence.max_abs_diff:.3g}",
    }


def overview_table(snapshots: Mapping[str, Snapshot]) -> pd.DataFrame:
    """`overview_row` per scenario run, its source named after the PR's own case (`patched`) when there is one."""
    table = pd.DataFrame([overview_row(name, snap) for name, snap in snapshots.items()])
    named = snapshots["patched"] if "patched" in snapshots else next(iter(snapshots.values()))
    table.attrs["source"] = named.source_label
    return table


def liveness_view(liveness: Liveness, source: str | None = None) -> Styler:
    """The liveness rows a reader needs, styled: addresses in hex, bytes readable, "never" for a block never freed."""
    view = liveness.rows[LIVENESS_SHOWN].copy()
    view.attrs["source"] = source or liveness.source
    names = ", ".join
    return style_table(view).format(
        {
            "addr": "{:#x}".format,
            "bytes": format_bytes,
            "free_index": lambda v: "never" if pd.isna(v) else f"{int(v)}",
            "overlapping_replay": names,
            "replay_in_break": names,
        }
    )


def equivalence_view(snapshot: Snapshot) -> Styler:
    """A scenario run's graphs-vs-eager rows, styled, with its source."""
    rows = Equivalence.recorded_in(snapshot).rows.copy()
    rows.attrs["source"] = snapshot.source_label
    return style_table(rows)


def scenario_for(policy: str, has_early_aux: bool) -> tuple[str, bool]:
    """The scenario whose capture shows `policy` on this model, and whether the replay graphs share the stream."""
    shares = replay_stream(policy, has_early_aux, "model graphs stream") is not None
    if has_early_aux:
        return ("early_aux_shared" if shares else "early_aux_pr"), shares
    return ("patched" if shares else "unpatched"), shares


class SafetyView:
    """A policy toggle and an early-aux checkbox over the scenario runs: the timeline, verdicts and tables shown.

    `replay_size_for` pairs each model graph with the replay graph that runs in
    its breaks (the replica: `kit.replica.model.replay_rows`). `widget` is the
    view to display; `policy` is its main control.
    """

    def __init__(self, snapshots: Mapping[str, Snapshot], replay_size_for: Callable[[int], int] | None = None) -> None:
        self.snapshots = snapshots
        self.liveness = {
            name: liveness_table(snap, replay_size_for=replay_size_for) for name, snap in snapshots.items()
        }
        self.policy = widgets.ToggleButtons(options=[("pr", "pr"), ("share (forced)", "share")], description="policy")
        self.policy.add_class("kit-main-control")
        self.early_aux = widgets.Checkbox(
            value=True,
            description="aux hidden state at layer 1 (before the replay layers)",
            indent=False,
            layout={"width": "auto"},
        )
        self.status, self.liveness_html, self.equivalence_html = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.scenario = scenario_for(self.policy.value, self.early_aux.value)[0]
        self.timeline = go.FigureWidget(self.figure())  # the first view, also in a saved page
        self.policy.observe(self.update, names="value")
        self.early_aux.observe(self.update, names="value")
        self.update()

    @property
    def widget(self) -> widgets.VBox:
        controls = widgets.HBox([self.policy, self.early_aux])
        return widgets.VBox([controls, self.status, self.timeline, self.liveness_html, self.equivalence_html])

    def figure(self) -> go.Figure:
        """The shown scenario's timeline, titled with the choice that picked it."""
        title = (
            f"Pool blocks held across the eager breaks: policy {self.policy.value}, early aux {self.early_aux.value}"
        )
        snapshot = self.snapshots[self.scenario]
        return timeline_figure(snapshot, self.liveness[self.scenario], title, source=snapshot.source_label)

    def update(self, change=None) -> None:
        """Show the scenario the PR's rule picks for the current policy and early-aux choice."""
        self.scenario, shares = scenario_for(self.policy.value, self.early_aux.value)
        snapshot, liveness = self.snapshots[self.scenario], self.liveness[self.scenario]
        show_in(self.timeline, self.figure())
        decision = "share the model graphs' stream" if shares else "keep a stream of their own"
        self.status.value = (
            f"<b>policy {self.policy.value}, early aux {'on' if self.early_aux.value else 'off'}</b>: the replay "
            f"graphs {decision}; capture <code>{self.scenario}</code>; graphs vs eager: "
            f"{Equivalence.recorded_in(snapshot).summary()}<br>" + "<br>".join(liveness.verdicts())
        )
        self.liveness_html.value = liveness_view(liveness, snapshot.source_label).to_html()
        self.equivalence_html.value = equivalence_view(snapshot).to_html()

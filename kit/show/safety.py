"""Notebook 04's views of the safety argument: the proof obligation checked three ways, and the policy explorer.

Three checks ask one question, whether a replay graph that runs in a model
graph's eager break overwrites anything the model graph still needs:

- the adversarial pairings (`kit.experiments.safety_run`): every replay graph
  replayed in every model graph's break, the outputs against eager;
- the read/write obligation (`kit.analysis.readwrite`, recorded by
  `kit.experiments.readwrite_run`): the bytes each replay graph writes
  against the bytes each model graph carries across its break;
- the lifetime analysis (`kit.analysis.liveness`), with the breaks' reads
  and from the trace alone, recorded beside the read/write one.

`load_safety` reads the two recordings (or records them live on a GPU);
`pairings_table`, `agreement_table` and `disagreement_lines` put them side
by side. For the replica's four scenario captures
(`kit.experiments.scenarios.replica_runs`): `overview_table` (one row per
capture), `liveness_view` (a capture's held blocks by role), and
`SafetyView`: pick a stream policy and whether an aux hidden state comes
before the replay layers; PR 63155's rule (`kit.patch.policy`) picks the
replay graphs' stream, and with it the capture shown as a timeline
(`kit.show.timeline`) with its verdicts and blocks.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from pandas.io.formats.style import Styler

from kit.analysis.equivalence import Equivalence
from kit.analysis.liveness import BREAK_INPUT, HELD, Liveness, break_allocations, liveness_table
from kit.analysis.names import MODEL_STREAM_LABEL
from kit.analysis.tables import style_table
from kit.errors import KitError
from kit.experiments.readwrite_run import result as readwrite_result
from kit.experiments.readwrite_run import run as readwrite_gpu
from kit.experiments.safety_run import result as safety_result
from kit.experiments.safety_run import run as safety_gpu
from kit.experiments.summary import summarize
from kit.load.snapshot import Snapshot
from kit.markup import html_text
from kit.patch.policy import replay_stream
from kit.recordings import LIVE, RECORDINGS, check_source
from kit.show.pictures import FigureWidget, show_in
from kit.show.timeline import block_roles, timeline_figure
from kit.units import format_bytes

# The four checks of one pairing, in the order `agreement_table` shows them: (column, rows it flags).
CHECKS = {
    "graphs differ from eager": "differs",
    "obligation violated (reads and writes)": "violated",
    "lifetime conflict (with the breaks' reads)": "lifetime",
    "lifetime conflict (trace only)": "trace_only",
}
SCROLL = '<div style="overflow-x: auto; max-width: 100%">{}</div>'


# --- the recordings ----------------------------------------------------------------------------------


@dataclass
class SafetyRecords:
    """The adversarial pairings (`pairs`, `kit.experiments.safety_run.result.pairs_frame`) and the read/write run.

    `readwrite` is a `kit.experiments.readwrite_run` recording with a
    `source` line added; `pairs.attrs["source"]` names the pairings' source.
    """

    pairs: pd.DataFrame
    readwrite: dict

    @property
    def checks(self) -> pd.DataFrame:
        """One row per (scenario, model graph, replay graph): each check's verdict, whether vLLM can run it, and
        whether a difference from eager there is the replay graph's to answer for (`attributable`)."""
        left = self.pairs[["scenario", "model_size", "replay_size", "dispatchable", "bit_exact", "max_abs_diff"]]
        left = left.assign(attributable=attributable(self.pairs))
        right = pd.DataFrame(self.readwrite["pairs"])
        right = right[["scenario", "model_size", "replay_size", "readwrite_holds", "lifetime_conflict"]].assign(
            trace_only=right["trace_only_conflict"]
        )
        table = left.merge(right, on=["scenario", "model_size", "replay_size"], how="outer", validate="one_to_one")
        if table[["bit_exact", "readwrite_holds"]].isna().any().any():
            raise KitError("the pairings and read/write recordings do not cover the same scenarios and pairings")
        order = {scenario: i for i, scenario in enumerate(safety_result.SAFETY_SCENARIOS)}
        table = table.sort_values(
            ["scenario", "model_size", "replay_size"], key=lambda c: c.map(order) if c.name == "scenario" else c
        ).reset_index(drop=True)
        return table.assign(
            differs=~table["bit_exact"].astype(bool),
            violated=~table["readwrite_holds"].astype(bool),
            lifetime=table["lifetime_conflict"].astype(bool),
            trace_only=table["trace_only"].astype(bool),
        )


def attributable(pairs: pd.DataFrame) -> pd.Series:
    """Whether a difference from eager in each pairing can be put down to its replay graph R.

    An adversary pairing (one vLLM's dispatch cannot make, in a recording made
    before stress pairings were forced into R) replays R and then the step's
    own replay graph. Where the model graph already differs from eager with
    its own replay graph alone (`alone_bit_exact`, recorded by `safety_run`), a
    difference there is not R's, and no check of R can be held to it.
    """
    if not {"how", "alone_bit_exact"} <= set(pairs.columns):
        return pd.Series(True, index=pairs.index)
    return ~((pairs["how"] == "adversary") & ~pairs["alone_bit_exact"].fillna(True).astype(bool))


def agreement_lines(records: SafetyRecords) -> list[str]:
    """Per scenario: the obligation on the pairings vLLM can make, and whether outputs and lifetimes agree with it.

    The pairings that differ from eager and those the lifetime analysis (with the
    breaks' reads) flags are compared with those that fail the obligation, over
    every pairing; where they differ only on pairings that are not attributable
    (`attributable`), over the rest, and the ones left out are counted and named.
    """
    lines = []
    for scenario, mine in records.checks.groupby("scenario", sort=False):
        can_run = mine[mine["dispatchable"]]
        violated = int(can_run["violated"].sum())
        obligation = "holds on every one" if not violated else f"fails on {violated}"
        agree = _agree(mine)
        judged = mine if agree else mine[mine["attributable"]]
        agree = agree or _agree(judged)
        line = (
            f"{scenario}: of the {len(can_run)} pairings vLLM's dispatch can produce, the obligation {obligation}; "
            "over "
            f"{'all ' if len(judged) == len(mine) else ''}{len(judged)}, the pairings that differ from eager and those "
            f"the lifetime analysis flags with the breaks' reads are {'exactly' if agree else 'not exactly'} "
            "the pairings that fail it"
        )
        left_out = mine.drop(judged.index)
        if len(left_out):
            models = sorted(set(left_out["model_size"]))
            one = len(models) == 1
            graphs = f"model graph{'' if one else 's'} {', '.join(map(str, models))}"
            differ = "differs from eager with its own" if one else "differ from eager with their own"
            line += (
                f" ({len(left_out)} left out: adversary pairings of {graphs}, which {differ} replay graph alone, "
                "so a difference there is not the replay graph's)"
            )
        lines.append(line)
    return lines


def _agree(checks: pd.DataFrame) -> bool:
    return bool(((checks["differs"] == checks["violated"]) & (checks["lifetime"] == checks["violated"])).all())


def _recorded_source(data: dict, path: Path) -> str:
    prov = data["provenance"]
    try:
        shown = path.resolve().relative_to(RECORDINGS.parents[1])
    except ValueError:
        shown = path
    return f"recorded on {prov.get('gpu', '?')}, torch {prov.get('torch', '?')}, {prov.get('date', '?')} ({shown})"


def load_safety(preset: str, source: str) -> SafetyRecords:
    """The pairings and read/write runs at `preset`: the H200 recordings, or recorded now on this GPU (`LIVE`).

    Live, each scenario of each experiment is captured in a fresh process
    (`safety_gpu.run_live`, `readwrite_gpu.record`), some minutes on a GPU.
    """
    check_source(source)
    if source == LIVE:
        pairs = safety_result.pairs_frame(safety_gpu.run_live(preset))
        path = readwrite_gpu.record(preset, Path(tempfile.mkdtemp(prefix="kit-readwrite-")))
        data = readwrite_result.load_recording(preset, path)
        data["source"] = f"live GPU ({data['provenance'].get('gpu', '?')}: captured just now, each scenario in a fresh "
        data["source"] += f"process; {path})"
    else:
        pairs = safety_result.load_pairs(preset)
        path = readwrite_result.RECORDINGS_DIR / f"{preset}.json"
        data = readwrite_result.load_recording(preset, path)
        data["source"] = _recorded_source(data, path)
    return SafetyRecords(pairs, data)


# --- the pairings and the three analyses side by side ---------------------------------------------------


def _differs(cell: object) -> str:
    return "background-color: #fadbd8" if isinstance(cell, str) and cell.startswith("differs") else ""


def pairings_table(pairs: pd.DataFrame) -> Styler:
    """Every scenario's pairings in one table (`safety_result.pair_tables`): model graphs down, replay graphs across."""
    table = pd.concat(
        [t.assign(scenario=scenario) for scenario, t in safety_result.pair_tables(pairs).items()], ignore_index=True
    )
    table = table[["scenario", *(c for c in table.columns if c != "scenario")]]
    table.attrs["source"] = (
        f"{pairs.attrs.get('source', '?')}; {safety_result.STRESS_NOTE}; † without power: it could not have failed, "
        "not shown"
    )
    return style_table(table).map(_differs)


def pair_list(rows: pd.DataFrame) -> str:
    """`(N, R)` per row, `*` after a pairing vLLM's dispatch cannot produce without PCP (stress only at pcp 1,
    `kit.experiments.dispatch`); "none" when empty."""
    if rows.empty:
        return "none"
    return ", ".join(
        f"({m}, {r}){'' if d else '*'}"
        for m, r, d in zip(rows["model_size"], rows["replay_size"], rows["dispatchable"], strict=True)
    )


def agreement_table(records: SafetyRecords) -> pd.DataFrame:
    """Per scenario, the pairings each check flags: outputs against eager, reads and writes, lifetimes (two ways)."""
    checks = records.checks
    rows = []
    for scenario, mine in checks.groupby("scenario", sort=False):
        row = {"scenario": scenario, "pairings": len(mine)}
        row.update({column: pair_list(mine[mine[flag]]) for column, flag in CHECKS.items()})
        rows.append(row)
    table = pd.DataFrame(rows)
    table.attrs["source"] = f"pairings: {records.pairs.attrs.get('source', '?')}; "
    table.attrs["source"] += f"reads, writes and lifetimes: {records.readwrite['source']}"
    return table


TRACE_ONLY = "from the trace alone"
ANALYSES = (  # the lifetime analysis two ways: (name, its agreement column, its explanation column)
    ("with the breaks' reads", "agree", "explanation"),
    (TRACE_ONLY, "agree_trace_only", "explanation_trace_only"),
)


def bound_break_inputs(pair: Mapping) -> bool:
    """Whether a pairing's trace-only conflict is exactly over break inputs the forward keeps bound.

    True when the read/write obligation holds, the lifetime analysis given
    the breaks' reads finds no conflict, and the bytes it classes `break
    input` under the replay graph's allocations are the bytes the trace-only
    analysis flags: blocks the break read and that nothing reads after it.
    """
    inputs = sum(b["bytes"] for b in pair["lifetime_blocks"] or [] if b["class"] == BREAK_INPUT)
    clear = bool(pair["readwrite_holds"]) and not pair["lifetime_conflict"]
    return clear and bool(pair["trace_only_conflict"]) and inputs == pair["trace_only_conflict_bytes"] > 0


def _bound_inputs_line(scenario: str, pairs: pd.DataFrame, config: Mapping) -> str:
    sizes = sorted({b["bytes"] for bs in pairs["lifetime_blocks"] for b in bs if b["class"] == BREAK_INPUT})
    which = ": the hyper-connection state residual, post_mix, res_mix" if config.get("hyper_connections") else ""
    return (
        f"{scenario}, lifetime analysis {TRACE_ONLY}: flags {len(pairs)} pairing(s) the obligation clears, "
        f"{pair_list(pairs)}; the blocks it flags ({format_bytes(sizes[0])} to {format_bytes(sizes[-1])}{which}) "
        "are break inputs the forward keeps bound: the break reads them and nothing reads them after it, but a trace "
        "shows them held to the forward's end like an aux hidden state; given the breaks' reads the analysis calls "
        "them break inputs and agrees"
    )


def disagreement_lines(records: SafetyRecords) -> list[str]:
    """One sentence per disagreement between the lifetime analysis and the read/write obligation.

    The trace-only false positives over kept-bound break inputs
    (`bound_break_inputs`, checked on the recording) are grouped per scenario
    into one sentence; any other disagreement gets the explanation recorded
    with it (`kit.experiments.readwrite_run.result.explain`), one line per pairing.
    """
    lines = []
    frame = pd.DataFrame(records.readwrite["pairs"])
    for scenario, mine in frame.groupby("scenario", sort=False):
        for analysis, agree, why in ANALYSES:
            wrong = mine[~mine[agree].astype(bool)]
            known = wrong.iloc[:0]
            if analysis == TRACE_ONLY and not wrong.empty:
                known = wrong[wrong.apply(bound_break_inputs, axis=1).astype(bool)]
            if not known.empty:
                config = records.readwrite.get("scenarios", {}).get(scenario, {}).get("config", {})
                lines.append(_bound_inputs_line(scenario, known, config))
            for _, pair in wrong.drop(known.index).iterrows():
                lines.append(f"{scenario} ({pair['model_size']}, {pair['replay_size']}), {analysis}: {pair[why]}")
        if mine["agree"].all() and mine["agree_trace_only"].all():
            lines.append(f"{scenario}: the lifetime analysis agrees with the obligation on all {len(mine)} pairings")
    return lines


# --- the scenario captures -----------------------------------------------------------------------------------


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


def _short(names: list[str]) -> str:
    """`replay graphs 128, replay graphs 64` as `128, 64`."""
    return ", ".join(str(n).rsplit(" ", 1)[-1] for n in names) or "none"


def liveness_view(liveness: Liveness, source: str | None = None) -> Styler:
    """A capture's held blocks by role, in few columns: what the replay graphs allocate over, and the conflict."""
    rows = liveness.rows
    view = pd.DataFrame(
        {
            "model graph": rows["capture_size"],
            "role": block_roles(liveness),
            "bytes": rows["bytes"],
            "freed at": rows["free_frame"].map(lambda f: f or "never"),
            "replay graphs over it": rows["overlapping_replay"].map(_short),
            "of them in its break": rows["replay_in_break"].map(_short),
            "conflict": rows["conflict"],
        }
    )
    view.attrs["source"] = source or liveness.source
    return style_table(view).format({"bytes": format_bytes})


def scenario_for(policy: str, has_early_aux: bool, aux_return: str = "nested") -> tuple[str, bool]:
    """The scenario whose capture shows `policy` on this model, and whether the replay graphs share the stream.

    `aux_return` matters only where early aux shares the stream: `nested` is V4.1's `(hidden_states, aux_list)`,
    which vLLM's wrapper keeps allocated; `flat` the hypothetical whose aux blocks later captures may take.
    """
    shares = replay_stream(policy, has_early_aux, MODEL_STREAM_LABEL) is not None
    if has_early_aux and shares:
        return ("early_aux_shared_flat" if aux_return == "flat" else "early_aux_shared"), shares
    if has_early_aux:
        return "early_aux_pr", shares
    return ("patched" if shares else "unpatched"), shares


class SafetyView:
    """A policy toggle and an early-aux checkbox over the scenario runs: the timeline, verdicts and blocks shown.

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
        self.aux_return = widgets.ToggleButtons(
            options=[("nested, as V4.1", "nested"), ("flat (hypothetical)", "flat")], description="aux returned"
        )
        self.status, self.blocks_html = widgets.HTML(), widgets.HTML()
        self.scenario = self.choice()[0]
        self.timeline = FigureWidget(self.figure())  # the first view, also in a saved page
        for control in (self.policy, self.early_aux, self.aux_return):
            control.observe(self.update, names="value")
        self.update()

    def choice(self) -> tuple[str, bool]:
        """`scenario_for` the controls as they are."""
        return scenario_for(self.policy.value, self.early_aux.value, self.aux_return.value)

    @property
    def widget(self) -> widgets.VBox:
        controls = widgets.HBox([self.policy, self.early_aux, self.aux_return])
        return widgets.VBox([controls, self.status, self.timeline, self.blocks_html])

    def figure(self) -> go.Figure:
        """The shown scenario's timeline, titled with the choice that picked it."""
        title = f"Held across the eager breaks: policy {self.policy.value}, early aux {self.early_aux.value}"
        if self.early_aux.value:
            title += f", aux returned {self.aux_return.value}"
        snapshot = self.snapshots[self.scenario]
        return timeline_figure(snapshot, self.liveness[self.scenario], title, source=snapshot.source_label)

    def update(self, change=None) -> None:
        """Show the scenario the PR's rule picks for the current policy and early-aux choice."""
        self.scenario, shares = self.choice()
        self.aux_return.disabled = not self.early_aux.value
        snapshot, liveness = self.snapshots[self.scenario], self.liveness[self.scenario]
        show_in(self.timeline, self.figure())
        decision = "share the model graphs' stream" if shares else "keep a stream of their own"
        self.status.value = (
            f"<b>policy {self.policy.value}, early aux {'on' if self.early_aux.value else 'off'}</b>: the replay "
            f"graphs {decision}; capture <code>{self.scenario}</code>; graphs vs eager: "
            f"{html_text(Equivalence.recorded_in(snapshot).summary())}<br>"
            + "<br>".join(html_text(line) for line in liveness.verdicts())
        )
        self.blocks_html.value = SCROLL.format(liveness_view(liveness, snapshot.source_label).to_html())

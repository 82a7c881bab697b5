"""Notebook 05's views of PR 63155's alternatives: the graph pool per scenario and per cap, and what it buys.

They read the alternatives JSON (`kit.experiments.drafter_run.load_alternatives`, or
`run_alternatives_live` on a GPU: share_all backed by the drafter's analyses too), whose
`source` line every table and figure carries:

- `scenario_table`: one row per scenario, the three of alternative (a) (`unpatched`, `pr`,
  `share_all`), one per cap of alternative (b) (`cap 96`, ...) and one per kept set of
  replay sizes (`keep 96, 512`, ...): the graph pool, what it saves against `unpatched`,
  the replay batches that run eagerly, the profile estimate
  (`capture_model(profile_only=True)`) and the KV cache its drop frees in the replica;
- `pool_figure`: the graph pool of every scenario, split by the stream that captured into it,
  one scenario picked out;
- `checks_table`: a scenario's graphs-vs-eager steps (target outputs and draft);
- `deepseek_table`: what the PR's 5.18 GiB buys on DeepSeek-V4.1-Flash (an assumed layout,
  its source stated) and on DeepSeek-V3's MLA;
- `extra_diff`: the lines alternative (a) changes beyond the PR (the speculator's capture);
- `AlternativesView`: a scenario toggle (the notebook's main control) over the figure and the
  picked scenario's details.
"""

from __future__ import annotations

from dataclasses import fields

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from pandas.io.formats.style import Styler

from kit.analysis.kv_cache import KVLayout, kv_cache_bought
from kit.analysis.tables import style_table
from kit.experiments.alternatives.scenarios import MAIN_SCENARIOS, steps_with_eager_replay
from kit.markup import html_text
from kit.show.pictures import STREAM_COLOURS, FigureWidget, show_in, stream_colours
from kit.units import MIB, format_bytes

WHAT = {
    "unpatched": "vLLM 0.33: every capture on a stream of its own",
    "pr": "PR 63155: the replay graphs on the model graphs' stream",
    "share_all": "alternative (a): the replay graphs and the speculator on the model graphs' stream",
}
DIMMED = 0.3  # opacity of the scenarios not picked
LEGEND_BOTTOM_MARGIN = 120  # px
TABLE_COLUMNS = ["scenario", "what", "graph_pool_bytes", "saved_bytes", "eager replay batches"]
TABLE_COLUMNS += ["profile_estimate_bytes", "kv_freed_bytes", "kv_blocks", "kv_tokens", "safe"]
BYTE_COLUMNS = ["graph_pool_bytes", "saved_bytes", "profile_estimate_bytes", "kv_freed_bytes"]
CHECK_COLUMNS = ["size", "previous_size", "draft_graph_size", "target_outputs_overwritten", "bit_exact"]
CHECK_COLUMNS += ["max_abs_diff", "differing_outputs"]


def cap_name(max_replay_size: int) -> str:
    return f"cap {max_replay_size}"


def keep_name(kept: list[int]) -> str:
    return f"keep {_sizes(kept)}"


def replica_layout_of(data: dict) -> KVLayout:
    """The replica's KV layout as the recording states it (`kv_cache.replica.layout`)."""
    stated = data["kv_cache"]["replica"]["layout"]
    return KVLayout(**{f.name: stated[f.name] for f in fields(KVLayout)})


def _sizes(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes)) or "none"


def _row(data: dict, name: str, what: str, entry: dict, eager: list[int], base_estimate: int) -> dict:
    base = data["unpatched"]["graph_pool_bytes"]
    freed = kv_cache_bought(base_estimate - entry["profile_estimate_bytes"], replica_layout_of(data))
    return {
        "scenario": name,
        "what": what,
        "graph_pool_bytes": entry["graph_pool_bytes"],
        "saved_bytes": base - entry["graph_pool_bytes"],
        "eager replay batches": _sizes(eager),
        "profile_estimate_bytes": entry["profile_estimate_bytes"],
        "kv_freed_bytes": freed["bytes"],
        "kv_blocks": freed["blocks"],
        "kv_tokens": freed["tokens"],
        "by_stream": dict(entry.get("graph_pool_by_stream", {})),
        "eager_replay_sizes": list(eager),
        "max_replay_size": None,
    }


def scenario_table(data: dict) -> pd.DataFrame:
    """One row per scenario: (a)'s three, then each cap of (b); the graph pool, the estimate and the KV cache freed.

    A cap's row is safe-unchecked (None) unless its config is one of the three (a cap that
    leaves every replay size captured is `unpatched` itself, `measured_in`).
    """
    base_estimate = data["unpatched"]["profile_estimate_bytes"]
    rows = []
    for name in MAIN_SCENARIOS:
        row = _row(data, name, WHAT[name], data[name], [], base_estimate)
        rows.append({**row, "safe": bool(data[name]["safe"]), "evidence": data[name]["evidence"]})
    for cap in data["cap_replay_sizes"]:
        if cap["max_replay_size"] is None:
            continue  # no cap: unpatched itself, already the first row
        eager = cap["eager_replay_sizes"]
        measured_in = cap.get("measured_in", "")
        what = f"alternative (b): replay graphs captured up to {cap['max_replay_size']} rows"
        if measured_in in MAIN_SCENARIOS:
            what += f" (every size: {measured_in} itself)"
        row = _row(data, cap_name(cap["max_replay_size"]), what, cap, eager, base_estimate)
        checked = measured_in in MAIN_SCENARIOS
        evidence = (
            data[measured_in]["evidence"]
            if checked
            else "not checked: a cap shares no stream; the replica's replay dispatch has no eager fallback to compare"
        )
        rows.append({**row, "safe": bool(data[measured_in]["safe"]) if checked else None, "evidence": evidence})
        rows[-1]["max_replay_size"] = cap["max_replay_size"]
    for kept in data.get("drop_intermediate_sizes", []):
        if kept.get("measured_in") in MAIN_SCENARIOS:
            continue  # every size kept: unpatched itself
        sizes = kept["kept_replay_sizes"]
        what = (
            f"alternative (b): only replay sizes {_sizes(sizes)} captured; a batch runs in the smallest kept size "
            "that fits it"
        )
        row = _row(data, keep_name(sizes), what, kept, kept["eager_replay_sizes"], base_estimate)
        evidence = "not checked: dropping sizes shares no stream; batches only pad further, as vLLM's dispatch does"
        rows.append({**row, "safe": None, "evidence": evidence})
    table = pd.DataFrame(rows)
    table.attrs.update(source=data.get("source", "?"), byte_columns=BYTE_COLUMNS)
    return table


def shown_table(table: pd.DataFrame) -> Styler:
    """The scenario table's columns a reader needs, styled, its source as caption."""
    shown = table[TABLE_COLUMNS].copy()
    shown["safe"] = shown["safe"].map(lambda s: "not checked" if s is None else ("yes" if s else "NO"))
    shown.attrs.update(table.attrs)
    return style_table(shown).format("{:,}".format, subset=["kv_blocks", "kv_tokens"])


def _get(table: pd.DataFrame, scenario: str) -> pd.Series:
    rows = table[table["scenario"] == scenario]
    if rows.empty:
        raise ValueError(f"no scenario {scenario!r}: one of {', '.join(table['scenario'])}")
    return rows.iloc[0]


def saving_line(table: pd.DataFrame, scenario: str) -> str:
    """One sentence: a scenario's graph pool and what it saves against unpatched."""
    row, base = _get(table, scenario), _get(table, "unpatched")
    return (
        f"{scenario}: graph pool {format_bytes(row['graph_pool_bytes'])}, saves {format_bytes(row['saved_bytes'])} "
        f"({row['saved_bytes']:,} bytes) against unpatched's {format_bytes(base['graph_pool_bytes'])}"
    )


def cap_line(table: pd.DataFrame, scenario: str, config: dict) -> str:
    """One sentence: a cap's graph pool and saving, and the replay batches (and model steps) it leaves to eager.

    `config` is the recording's replica config: which steps can make a replay batch above the
    cap follows vLLM's rule (`kit.experiments.alternatives.scenarios.steps_with_eager_replay`).
    """
    row = _get(table, scenario)
    eager = row["eager_replay_sizes"]
    line = f"{saving_line(table, scenario)}; "
    if not eager:
        return line + "every replay batch still has a graph"
    steps = _sizes(steps_with_eager_replay(config, row["max_replay_size"]))
    return line + f"replay batches of {_sizes(eager)} rows would run eagerly (in steps padded to {steps} tokens)"


def kv_line(table: pd.DataFrame, scenario: str) -> str:
    """One sentence: the profile estimate before (unpatched) and after, and the KV cache its drop frees."""
    row, base = _get(table, scenario), _get(table, "unpatched")
    return (
        f"{scenario}: the profile estimate falls from {format_bytes(base['profile_estimate_bytes'])} to "
        f"{format_bytes(row['profile_estimate_bytes'])}: {format_bytes(row['kv_freed_bytes'])} more KV budget = "
        f"{row['kv_blocks']:,} blocks, {row['kv_tokens']:,} tokens"
    )


def estimate_table(data: dict) -> pd.DataFrame:
    """Per scenario of (a): the graph pool, the capture's drop in free memory, the part outside the pool, the estimate.

    The drop in free device memory counts every segment the capture reserved and kept,
    the graph pool's and the default pool's blocks cached on the capture streams alike;
    `outside_graph_pool` is the drop less the graph pool.
    """
    rows = []
    for name in MAIN_SCENARIOS:
        entry = data[name]
        delta = entry["capture_free_memory_delta"]
        rows.append(
            {
                "scenario": name,
                "graph_pool_bytes": entry["graph_pool_bytes"],
                "capture_free_memory_delta": delta,
                "outside_graph_pool": delta - entry["graph_pool_bytes"],
                "profile_estimate_bytes": entry["profile_estimate_bytes"],
            }
        )
    table = pd.DataFrame(rows)
    table.attrs.update(source=data.get("source", "?"), byte_columns=list(table.columns[1:]))
    return table


def streams_of(table: pd.DataFrame) -> list[str]:
    """Every capture stream that holds graph-pool bytes in some scenario: the known three first, in capture order."""
    seen = dict.fromkeys(s for by_stream in table["by_stream"] for s in by_stream)
    return [s for s in STREAM_COLOURS if s in seen] + [s for s in seen if s not in STREAM_COLOURS]


def pool_figure(table: pd.DataFrame, selected: str) -> go.Figure:
    """The graph pool of every scenario, stacked by capture stream; `selected` drawn solid, the others dimmed."""
    row = _get(table, selected)
    names = list(table["scenario"])
    opacity = [1.0 if name == selected else DIMMED for name in names]
    fig = go.Figure()
    streams = streams_of(table)
    colours = stream_colours({s: s for s in streams})
    for stream in streams:
        values = [by_stream.get(stream, 0) for by_stream in table["by_stream"]]
        fig.add_bar(
            y=names,
            x=[v / MIB for v in values],
            name=html_text(stream),
            orientation="h",
            marker=dict(color=colours[stream], opacity=opacity),
            hovertext=[format_bytes(v) for v in values],
            hovertemplate="%{y}: %{hovertext} on the " + html_text(stream) + "<extra></extra>",
        )
    fig.add_vline(x=table["graph_pool_bytes"].iloc[0] / MIB, line_dash="dash", line_color="#7f8c8d")
    fig.add_annotation(
        y=selected,
        x=row["graph_pool_bytes"] / MIB,
        xanchor="left",
        showarrow=False,
        text=f"  saves {format_bytes(row['saved_bytes'])}; frees {row['kv_blocks']:,} KV blocks",
    )
    title = (
        f"Graph pool per scenario, by capture stream: {selected} {format_bytes(row['graph_pool_bytes'])} "
        f"(dashed: unpatched)<br><sup>source: {html_text(table.attrs.get('source', '?'))}</sup>"
    )
    fig.update_layout(
        barmode="stack",
        title=title,
        xaxis_title="MiB",
        yaxis=dict(autorange="reversed", automargin=True),
        # The legend under the axis: above the bars, three long stream names wrapped into the title.
        legend=dict(
            orientation="h", x=0, xanchor="left", y=-0.18, yanchor="top", title_text="captured on", traceorder="normal"
        ),
        margin=dict(t=90, b=LEGEND_BOTTOM_MARGIN, r=240),
        height=90 + LEGEND_BOTTOM_MARGIN + 40 * len(names),
    )
    return fig


def checks_table(data: dict, scenario: str) -> pd.DataFrame:
    """A scenario's graphs-vs-eager steps: each size after a graph step of each size, target outputs and draft."""
    rows = pd.DataFrame(data[scenario].get("checks") or [], columns=CHECK_COLUMNS)
    rows = rows[CHECK_COLUMNS].copy()
    rows["differing_outputs"] = rows["differing_outputs"].map(lambda o: ", ".join(o) or "none")
    rows.attrs["source"] = f"{data.get('source', '?')}: {scenario}"
    return rows


def drafter_analyses_table(data: dict) -> pd.DataFrame:
    """The drafter's two analyses side by side, per scenario and (model graph, drafter graph) that can run.

    From `share_all.drafter_analyses` (`kit.experiments.drafter_run.with_drafter_analyses`);
    empty when the recording has no drafter analyses.
    """
    found = data["share_all"].get("drafter_analyses") or {}
    rows = [
        {
            "scenario": p["scenario"],
            "model graph": p["model_size"],
            "drafter graph": p["drafter_size"],
            "target outputs it overwrites": format_bytes(p["outputs_overwritten_bytes"]),
            "model graph's values read after it": format_bytes(p["read_after_bytes"]),
            "read/write obligation": "holds" if p["readwrite_holds"] else "VIOLATED",
            "lifetimes, with the step's reads": "CONFLICT" if p["lifetime_conflict"] else "safe",
            "lifetimes, trace alone": "CONFLICT" if p["trace_only_conflict"] else "safe",
        }
        for p in found.get("pairs", [])
        if p["dispatchable"]
    ]
    return pd.DataFrame(rows)


def deepseek_table(data: dict) -> pd.DataFrame:
    """What the PR's 5.18 GiB buys per GPU on each DeepSeek layout, with the layout and where it comes from."""
    rows = []
    for key in ("deepseek_v41_flash", "deepseek_v3_mla"):
        entry = data["kv_cache"].get(key)
        if not entry:
            continue
        layout = entry["layout"]
        rows.append(
            {
                "layout": layout["name"],
                "bytes per token": layout["bytes_per_token"],
                "block size": layout["block_size"],
                "saved_bytes": entry["saved_bytes"],
                "blocks": entry["blocks"],
                "tokens": entry["tokens"],
                "assumed / from": layout["source"],
            }
        )
    table = pd.DataFrame(rows)
    table.attrs.update(
        source="PR 63155's stated 5.18 GiB (not measured by the kit), priced by kit.analysis.kv_cache",
        byte_columns=["saved_bytes"],
    )
    return table


def extra_diff(diff: str) -> str:
    """The function diffs of alternative (a) that the PR does not make: the speculator's and the runner's."""
    blocks, current = [], []
    for line in diff.splitlines():
        if line.startswith("--- ") and current:
            blocks.append(current)
            current = []
        current.append(line)
    if current:
        blocks.append(current)
    kept = [b for b in blocks if any(k in b[0] for k in ("speculator", "capture_model"))]
    return "\n".join(line.replace("(PR 63155)", "(alternative (a))") for block in kept for line in block)


def details_html(data: dict, table: pd.DataFrame, selected: str) -> str:
    """The picked scenario in a few lines: where it captured, what runs eagerly, what it buys, whether it is safe."""
    row = _get(table, selected)
    base_estimate = data["unpatched"]["profile_estimate_bytes"]
    held = row["by_stream"]
    by_stream = ", ".join(f"{s} {format_bytes(held[s])}" for s in streams_of(table) if s in held)
    lines = [
        f"<b>{html_text(selected)}</b>: {html_text(row['what'])}",
        f"graph pool {format_bytes(row['graph_pool_bytes'])} ({html_text(by_stream)}); saves "
        f"{format_bytes(row['saved_bytes'])} against unpatched",
    ]
    streams = data[selected].get("capture_streams") if selected in MAIN_SCENARIOS else None
    if streams:
        lines.append("captured on: " + html_text(", ".join(f"{m} on the {s}" for m, s in streams.items())))
    eager = row["eager_replay_sizes"]
    lines.append(f"replay batches that run eagerly: {_sizes(eager)}" if eager else "every replay batch has a graph")
    lines.append(
        f"profile estimate {format_bytes(row['profile_estimate_bytes'])} (unpatched {format_bytes(base_estimate)}): "
        f"{format_bytes(row['kv_freed_bytes'])} more KV budget, {row['kv_blocks']:,} blocks, "
        f"{row['kv_tokens']:,} tokens in the replica"
    )
    lines.append(f"graphs vs eager: {html_text(row['evidence'])}")
    page = "".join(f"<p>{line}</p>" for line in lines)
    if selected in MAIN_SCENARIOS:
        page += style_table(checks_table(data, selected)).to_html()
    return page


class AlternativesView:
    """Pick a scenario: the graph pool of all of them by stream, the picked one solid, and its details below.

    `data` is the alternatives JSON. `widget` is the view to display; `scenario` is its main control.
    """

    def __init__(self, data: dict) -> None:
        self.data = data
        self.table = scenario_table(data)
        self.scenario = widgets.ToggleButtons(options=list(self.table["scenario"]), description="scenario")
        self.scenario.add_class("kit-main-control")
        self.details = widgets.HTML()
        self.bars = FigureWidget(pool_figure(self.table, self.scenario.value))  # the first view, also saved
        self.scenario.observe(self.show, names="value")
        self.show()

    @property
    def widget(self) -> widgets.VBox:
        return widgets.VBox([self.scenario, self.bars, self.details])

    def show(self, change=None) -> None:
        show_in(self.bars, pool_figure(self.table, self.scenario.value))
        self.details.value = details_html(self.data, self.table, self.scenario.value)

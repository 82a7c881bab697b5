"""The safety experiment's scenarios and pairings (which model and replay graphs meet), its recording read back and
checked (`load_recording`), and the tables, verdicts, text and JSON the kit shows of it. Nothing here needs torch."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kit.analysis.invariant import (
    INVARIANT,
    INVARIANT_PAIR_KEYS,
    invariant_by_scenario,
    invariant_of_pairs,
    verdict_line,
)
from kit.analysis.invariant import (
    NOT_RECORDED as INVARIANT_NOT_RECORDED,
)
from kit.analysis.readwrite import OBLIGATION
from kit.experiments import recorded
from kit.experiments.dispatch import (
    PCP_SIZES,
    breaks_out,
    config_dispatchable,
    config_rule,
    dispatchable_under,
    smallest_pcp,
)
from kit.experiments.dispatch import RULE as DISPATCH_RULE
from kit.experiments.power import CONTROL, NOT_RECORDED, NOTHING_READ, power_clause
from kit.recordings import RECORDINGS

# The safety and read/write experiments' scenarios -> the replica scenario of
# kit.experiments.scenarios that captures it (the PR's run is `patched` there). Their early-aux scenario is the
# hypothetical flat return (each aux weak, its block free for R), the case the checks exist to catch: with V4.1's
# nested return vLLM's wrapper keeps the block (`kit.experiments.early_aux`); its recorded config says which ran.
SCENARIO_OF = {"pr": "patched", "unpatched": "unpatched", "early_aux_shared": "early_aux_shared_flat"}


# PLANTED scenarios: the PR's capture (its replica scenario above) of a model with a bug put in on purpose
# (`ReplicaConfig.planted_cross_break_read`: a graph-pool intermediate read after the replay break), to show the
# structural invariant (kit.analysis.invariant) and graphs-vs-eager failing.
PLANTED = {"planted_cross_break_read": "patched"}


PLANTED_DESCRIPTION = (
    "PLANTED: PR 63155 on a model that keeps a graph-pool intermediate made before the replay break and reads it "
    "after the break (ReplicaConfig.planted_cross_break_read)"
)


SCENARIO_OF.update(PLANTED)


SAFETY_SCENARIOS = tuple(SCENARIO_OF)


UNPLANTED = tuple(s for s in SAFETY_SCENARIOS if s not in PLANTED)  # what recordings made before PLANTED hold


RECORDINGS_DIR = RECORDINGS / "safety"


SEED = 1234


PAIR_KEYS = ("scenario", "model_size", "replay_size", "dispatchable", "bit_exact", "max_abs_diff", "outputs")


def enumerate_pairs(config) -> list[tuple[int, int, bool]]:
    """Every (model graph size, replay graph size, dispatchable) of a replica config, small first.

    Model graphs below the trim threshold have no break for a replay graph and are left out (`no_break_sizes`).
    """
    replay_sizes, threshold = config_rule(config)
    pairs = []
    for model_size in sorted(config.cudagraph_capture_sizes):
        if not breaks_out(model_size, threshold):
            continue
        reachable = config_dispatchable(config, model_size)
        pairs += [(model_size, r, r in reachable) for r in replay_sizes]
    return pairs


def no_break_sizes(config) -> list[int]:
    """The model graphs that keep the replay layers inside the graph (below the trim threshold)."""
    _, threshold = config_rule(config)
    return [n for n in sorted(config.cudagraph_capture_sizes) if not breaks_out(n, threshold)]


def safety_config(replica_scenario: str, preset: str):
    """The scenario's replica with V4.1's break inputs and an eager break at every attention."""
    from kit.experiments.scenarios import scenario_config

    return dataclasses.replace(scenario_config(replica_scenario, preset), hyper_connections=True, attention_breaks=True)


def scenario_safety_config(scenario: str, preset: str):
    """`safety_config` of a safety scenario's replica scenario, with the planted bug where the scenario plants it."""
    config = safety_config(SCENARIO_OF[scenario], preset)
    return dataclasses.replace(config, planted_cross_break_read=True) if scenario in PLANTED else config


def scenario_description(scenario: str) -> str:
    """What a safety scenario shows: its replica scenario's description, or the planted one's."""
    from kit.experiments.scenarios import SCENARIOS

    return PLANTED_DESCRIPTION if scenario in PLANTED else SCENARIOS[SCENARIO_OF[scenario]][2]


def recording_path(preset: str) -> Path:
    return RECORDINGS_DIR / f"{preset}.json"


def load_recording(preset: str, path: str | Path | None = None) -> dict:
    """A safety recording (the shipped one for `preset` by default), checked, with its `source` line."""
    from kit.experiments.scenarios import check_preset

    check_preset(preset)
    path = Path(path) if path is not None else recording_path(preset)
    return recorded.load_shipped(path, preset, "safety", _schema_problem)


def pairless_preset(data: Any) -> bool:
    """Whether the recording's preset has no model graph at or above the trim threshold, so no pairing at all
    (h200-default: vLLM's default largest capture size on an H200, 512, is below the threshold of 768)."""
    from kit.replica.model import PRESETS

    config = PRESETS.get(data.get("preset")) if isinstance(data, dict) else None
    return config is not None and not enumerate_pairs(config)


def _schema_problem(data: Any) -> str | None:
    if not isinstance(data, dict) or not isinstance(data.get("pairs"), list):
        return "no 'pairs' list"
    if not data["pairs"] and not pairless_preset(data):
        return "no 'pairs' list"
    if not isinstance(data.get("provenance"), dict):
        return "no 'provenance'"
    for row in data["pairs"]:
        missing = [k for k in PAIR_KEYS if not isinstance(row, dict) or k not in row]
        if missing:
            return f"a pair lacks {', '.join(missing)}"
    return None


def pairs_frame(data: dict) -> pd.DataFrame:
    """A recording's pairs, one row each, scenarios in `SAFETY_SCENARIOS` order; `attrs` keep source and provenance."""
    df = pd.DataFrame(with_dispatch(data), columns=None if data["pairs"] else [*PAIR_KEYS, "dispatch_pcp"])
    order = {p: i for i, p in enumerate(SAFETY_SCENARIOS)}
    df = df.sort_values(
        ["scenario", "model_size", "replay_size"],
        key=lambda c: c.map(order).fillna(len(order)) if c.name == "scenario" else c,
    ).reset_index(drop=True)
    df.attrs["source"] = data.get("source", "?")
    df.attrs["provenance"] = data.get("provenance", {})
    return df


def load_pairs(preset: str, path: str | Path | None = None) -> pd.DataFrame:
    """The shipped recording's pairs at `preset` (or the recording at `path`) as a frame."""
    return pairs_frame(load_recording(preset, path))


def _cell(row) -> str:
    text = "bit-exact" if row["bit_exact"] else f"differs {row['max_abs_diff']:.4g}"
    if row.get("power") is False or row.get("power") is np.False_:
        text += " †"  # measured without power: not shown
    if row["dispatchable"]:
        return text
    pcp = row.get("dispatch_pcp")
    return f"{text} *" if pcp is None or pd.isna(pcp) else f"{text} *{int(pcp)}"


def with_dispatch(data: dict) -> list[dict]:
    """The recording's pairs, each with `dispatchable_under` ({'pcp1': ..., 'pcp2': ...}) and `dispatch_pcp` (the
    smallest PCP size vLLM runs it under, None if none of `PCP_SIZES` does), by the rule of the recording's preset."""
    from kit.replica.model import PRESETS

    config = PRESETS.get(data.get("preset"))
    if config is None:
        return [dict(pair) for pair in data["pairs"]]
    return [
        {
            **pair,
            "dispatchable_under": dispatchable_under(config, pair["model_size"], pair["replay_size"]),
            "dispatch_pcp": smallest_pcp(config, pair["model_size"], pair["replay_size"]),
        }
        for pair in data["pairs"]
    ]


def no_pairs_line(data: dict) -> str:
    """What a recording without pairings shows: no model graph breaks out, replay graphs run only in eager steps."""
    from kit.replica.model import PRESETS

    config = PRESETS.get(data.get("preset"))
    if config is None:
        return "no pairings"
    return (
        f"no pairings: every model graph of {data['preset']} (up to {max(config.cudagraph_capture_sizes)} tokens) is "
        f"below the trim threshold of {config.decoder_replay_trim_threshold} and keeps the replay layers inside it; "
        "the replay graphs run only in eager steps, where no model graph is running"
    )


def pcp_line(df: pd.DataFrame) -> str:
    """How many of a scenario's pairings vLLM dispatches under each PCP size (the same for every scenario)."""
    rows = df[df["scenario"] == df["scenario"].iloc[0]] if not df.empty else df
    counts = ", ".join(
        f"pcp {k}: {int((rows['dispatch_pcp'] <= k).sum()) if 'dispatch_pcp' in rows else '?'}" for k in PCP_SIZES
    )
    return f"pairings vLLM's dispatch runs, of {len(rows)} per scenario: {counts}"


STRESS_NOTE = (
    f"*k: not dispatched without prefill context parallelism (pcp 1: stress only there); vLLM's dispatch runs that "
    f"replay graph in that model graph's break with pcp_size k, its rows counted over the global batch (up to k x N); "
    f"* alone: stress only, no pcp_size in {', '.join(map(str, PCP_SIZES))} dispatches it"
)


def pair_tables(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per scenario: model graphs down, replay graphs across, each cell bit-exact or the largest difference."""
    tables = {}
    for scenario, rows in df.groupby("scenario", sort=False):
        cells = rows.assign(cell=rows.apply(_cell, axis=1))
        table = cells.pivot(index="model_size", columns="replay_size", values="cell")
        if "alone_bit_exact" in rows:
            alone = rows.groupby("model_size")[["alone_bit_exact", "alone_max_abs_diff"]].first()
            table["own replay alone"] = [
                "bit-exact" if exact else f"differs {diff:.4g}"
                for exact, diff in zip(alone["alone_bit_exact"], alone["alone_max_abs_diff"], strict=True)
            ]
        table.columns = [str(c) for c in table.columns]
        tables[scenario] = table.rename_axis("N \\ R").reset_index()
    return tables


def pair_verdicts(df: pd.DataFrame) -> list[str]:
    """One line per scenario: all pairings bit-exact, or which differ from eager and by how much; then how many
    are shown (with power), and which are not and why (`kit.experiments.power.power_clause`)."""
    lines = []
    groups = list(df.groupby("scenario", sort=False))
    for scenario, rows in groups:
        n, dispatchable = len(rows), int(rows["dispatchable"].sum())
        bad = rows[~rows["bit_exact"].astype(bool)]
        if bad.empty:
            lines.append(f"{scenario}: all {n} pairings bit-exact ({dispatchable} dispatchable)")
            continue
        pairs = ", ".join(f"({m}, {r})" for m, r in zip(bad["model_size"], bad["replay_size"], strict=True))
        line = (
            f"{scenario}: {len(bad)} of {n} pairings differ from eager ({int(bad['dispatchable'].sum())} of them "
            f"dispatchable): {pairs} — largest difference {float(bad['max_abs_diff'].max()):.4g}"
        )
        if "alone_bit_exact" in rows:
            alone = sorted(set(rows.loc[~rows["alone_bit_exact"].astype(bool), "model_size"]))
            if alone:
                line += f"; with only its own replay graph, model graph {', '.join(map(str, alone))} differs too"
        lines.append(line)
    return [f"{line}; {power_clause(pair_records(rows))}" for line, (_, rows) in zip(lines, groups, strict=True)]


def pair_records(rows: pd.DataFrame) -> list[dict]:
    """A frame's rows as dicts, with `power` None where a recording has none (made before the positive control)."""
    out = rows.to_dict("records")
    for row in out:
        if "power" not in row or not isinstance(row["power"], bool | np.bool_):
            row["power"] = None
    return out


def safety_lines(data: dict, readwrite: dict | None = None, more: list[str] | None = None) -> list[str]:
    """The `python -m kit safety` text: source, rule, a table per scenario, the structural invariant per scenario
    (its verdict and list, from `readwrite`, the read/write recording at the same preset, beside the obligation;
    "not recorded" where that recording lacks it or there is none), `more` lines, then the verdicts, last."""
    df = pairs_frame(data)
    lines = [
        f"source: {data.get('source', '?')}",
        _how_line(df),
        DISPATCH_RULE,  # the rule the marks follow (a recording keeps the one it was run under in `rule`)
    ]
    if "power" in df and df["power"].map(lambda p: isinstance(p, bool | np.bool_)).any():
        lines.append(CONTROL)
    described = data.get("scenarios", {})
    for scenario, table in pair_tables(df).items():
        about = described.get(scenario, {}).get("description")
        lines += ["", f"{scenario} ({about})" if about else scenario, *table.to_string(index=False).splitlines()]
    if df.empty:
        lines.append(no_pairs_line(data))
    else:
        lines += [STRESS_NOTE, pcp_line(df)]
    if "power" in df and (df["power"].astype(object) == False).any():  # noqa: E712 - False, not None or NaN
        lines.append(f"† without power, not shown: {NOTHING_READ}")
    no_break = sorted({n for about in described.values() for n in about.get("no_break", [])})
    if no_break:
        sizes = ", ".join(map(str, no_break))
        lines.append(f"model graph {sizes}: below the trim threshold, the replay layers stay in the graph (no break)")
    lines += ["", *safety_invariant_lines(data, readwrite), *(["", *more] if more else []), ""]
    return lines + pair_verdicts(df)


HOW_FORCED = (
    "rows: model graph N, run on fresh token ids; columns: replay graph R, the one replay graph in N's break "
    "(dispatched, or forced where vLLM's dispatch does not pick it); cells: N's outputs against eager, bit-exact or "
    "the largest difference"
)


HOW_ADVERSARY = (
    "rows: model graph N, run on fresh token ids; columns: replay graph R, replayed on random inputs in N's "
    "break before N's own; cells: N's outputs against eager, bit-exact or the largest difference"
)


def _how_line(df: pd.DataFrame) -> str:
    """What the rows, columns and cells are: a recording's stress pairings were forced, or (older) an adversary's."""
    return HOW_ADVERSARY if "how" in df and (df["how"] == "adversary").any() else HOW_FORCED


def json_pairs(pairs: list[dict]) -> list[dict]:
    """A recording's pairs with `power` and `power_reason` on each: "power not recorded" where it was not."""
    return [p if "power" in p else {**p, "power": None, "power_reason": NOT_RECORDED} for p in pairs]


def safety_invariant_lines(data: dict, readwrite: dict | None) -> list[str]:
    """Per scenario of the pairings: the structural invariant's verdict and list, the obligation beside it."""
    found = invariant_by_scenario(readwrite)
    source = (readwrite or {}).get("source", "no read/write recording at this preset")
    lines = [f"the structural invariant ({source}): {INVARIANT}"]
    for scenario in pairs_frame(data)["scenario"].unique():
        mine = found.get(scenario)
        if mine is None or not mine["invariant_recorded"]:
            lines.append(f"{scenario}: invariant {INVARIANT_NOT_RECORDED}")
        else:
            lines.append(verdict_line(scenario, mine["invariant_holds"], mine["invariant"]))
            lines += [f"  {line}" for line in mine["invariant_verdicts"]]
        if mine is not None and mine["obligation"]:
            obligation = mine["obligation"].removeprefix(OBLIGATION).strip()
            lines.append(f"  beside it, the byte-overlap obligation: {obligation}")
    return lines


def safety_json(data: dict, readwrite: dict | None = None) -> dict:
    """`kit safety --json`: the pairings, each with the invariant's `graph_pool_carried_bytes` (early aux apart in
    `early_aux_carried_bytes`) and `invariant_holds` (None: not recorded), and per scenario the invariant's
    verdict beside the obligation, from `readwrite`, the read/write recording at the same preset."""
    df = pairs_frame(data)
    found = invariant_of_pairs(readwrite)
    pairs = []
    for pair in with_dispatch(data):
        row = found.get((pair["scenario"], int(pair["model_size"]), int(pair["replay_size"]))) or {}
        figures = {k: row.get(k) for k in (*INVARIANT_PAIR_KEYS, "readwrite_holds")}
        pairs.append({**pair, **figures, "policy": pair["scenario"]})  # `policy`: the key the contract names
    return {
        "pairs": json_pairs(pairs),
        "pcp_sizes": list(PCP_SIZES),
        "source": data.get("source"),
        "provenance": data.get("provenance"),
        "rule": data.get("rule", DISPATCH_RULE),
        "dispatch_rule": DISPATCH_RULE,  # the rule `dispatchable_under` and `dispatch_pcp` follow (the kit's now)
        "verdicts": pair_verdicts(df),
        "invariant": INVARIANT,
        "invariant_source": (readwrite or {}).get("source"),
        "scenarios": invariant_by_scenario(readwrite),
    }

"""The read/write experiment's result: the read/write and lifetime analyses side by side per pairing, the
structural invariant beside them, and a recording read back (`load_recording`) and summarized. Nothing here needs
torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from kit.analysis.invariant import (
    INVARIANT,
    INVARIANT_PAIR_KEYS,
    NOT_RECORDED,
    early_aux_count,
    invariant_result,
    verdict_line,
)
from kit.analysis.liveness import BREAK_INPUT, HELD, RELEASED, Liveness, liveness_table
from kit.analysis.readwrite import (
    MODEL,
    REPLAY,
    Ranges,
    ReadWriteRecording,
    capture_names,
    carried_reads,
    readwrite_table,
)
from kit.experiments import recorded
from kit.recordings import RECORDINGS
from kit.units import format_bytes

RECORDINGS_DIR = RECORDINGS / "readwrite"


OUTPUTS_READ = "the forward's caller"  # the op name of the reads of a model graph's outputs


PAIR_KEYS = ("scenario", "model_size", "replay_size", "dispatchable", "readwrite_holds", "lifetime_conflict", "agree")


def _without_break_reads(raw: dict) -> dict:
    return {**raw, "kit": {k: v for k, v in raw["kit"].items() if k != "break_reads"}}


def lifetime_pair(liveness: Liveness, model_capture: str, replay_capture: str) -> dict:
    """The lifetime analysis's verdict on one pairing: the held blocks of N that R allocates over."""
    rows = liveness.rows[liveness.rows["capture"] == model_capture]
    over = rows[rows["overlapping_replay"].map(lambda names: replay_capture in names).astype(bool)]
    hits = over[over["class"] == HELD]
    return {
        "conflict": bool(len(hits)),
        "conflict_bytes": int(hits["bytes"].sum()),
        "blocks": [
            {"addr": int(r["addr"]), "bytes": int(r["bytes"]), "class": r["class"], "alloc_frame": r["alloc_frame"]}
            for _, r in over.iterrows()
        ],
    }


def _block_of(liveness: Liveness, model_capture: str, addr: int) -> pd.Series | None:
    rows = liveness.rows[liveness.rows["capture"] == model_capture]
    inside = rows[(rows["addr"] <= addr) & (addr < rows["addr"] + rows["bytes"])]
    return None if inside.empty else inside.iloc[0]


def explain(row: dict, lifetime: dict, liveness: Liveness, model_capture: str, carried: Ranges) -> str | None:
    """Why the lifetime analysis and the read/write analysis disagree on a pairing; None when they agree."""
    if lifetime["conflict"] == (not row["holds"]):
        return None
    replay = f"replay graph {row['replay_size']}"
    if lifetime["conflict"]:
        held = [b for b in lifetime["blocks"] if b["class"] == HELD]
        unread = [b for b in held if not carried.intersects(b["addr"], b["addr"] + b["bytes"])]
        if len(unread) == len(held):
            why = (
                "what the break read was not given to the lifetime analysis, so it could not call them break inputs"
                if not liveness.break_reads_known
                else "not even the break reads them"
            )
            return (
                f"the lifetime analysis flags {format_bytes(sum(b['bytes'] for b in held))} in {len(held)} block(s) "
                f"held across the break that {replay} allocates over, but nothing after the break reads them: the "
                f"forward keeps them bound without reading them (as V4.1 keeps residual, post_mix and res_mix); {why}"
            )
        return (
            f"{replay} allocates over blocks read after the break, but writes none of the bytes that are read "
            "(an allocation it does not fill where the reads are)"
        )
    addr = int(row["first_overlap"])
    block = _block_of(liveness, model_capture, addr)
    ops = ", ".join(row["reading_ops"])
    if block is None:
        return (
            f"the bytes at {addr:#x} that {replay} writes and {ops} reads after the break are in no graph-pool "
            "block the model graph holds across the break in the trace (allocated outside its capture windows)"
        )
    if block["class"] in (BREAK_INPUT, RELEASED):
        return (
            f"the lifetime analysis takes the block at {int(block['addr']):#x} for the break's ({block['class']}), "
            f"but {ops} reads it after the break too: a break input that is also read later"
        )
    return (
        f"the block at {int(block['addr']):#x} is held after the break, but {replay} writes it without an "
        "allocation over it in its capture window"
    )


def compare_analyses(raw: dict, recording: ReadWriteRecording, can_run=None) -> list[dict]:
    """Per pairing: the read/write verdict, the lifetime verdicts (with and without the break's reads), agreement.

    `raw` is the capture recorder's snapshot dict with `kit["break_reads"]`
    attached (`attach_break_reads`), `can_run(model_size, replay_size)` the
    dispatch rule (None: every pairing). `unseen_writer_bytes` (read after R
    starts, written outside the dispatcher, so not carried) and
    `unseen_overlap_bytes` (where that blind spot meets R) say what the
    recorder could not see (`kit.analysis.readwrite.readwrite_table`).
    """
    table = readwrite_table(recording, can_run=can_run)
    names = capture_names(raw["kit"]["captures"])
    with_reads = liveness_table(raw)
    trace_only = liveness_table(_without_break_reads(raw))
    pairs = []
    for _, row in table.iterrows():
        model, replay = names[(MODEL, row["model_size"])], names[(REPLAY, row["replay_size"])]
        carried = Ranges((p.start, p.end) for p in carried_reads(recording, row["model_size"], row["break"]))
        lifetime = lifetime_pair(with_reads, model, replay)
        trace = lifetime_pair(trace_only, model, replay)
        found = row.to_dict()
        pairs.append(
            {
                "model_size": int(row["model_size"]),
                "replay_size": int(row["replay_size"]),
                "break": int(row["break"]),
                "dispatchable": bool(row["can_run"]),
                "readwrite_holds": bool(row["holds"]),
                "overlap_bytes": int(row["overlap_bytes"]),
                "first_overlap": None if row["holds"] else int(row["first_overlap"]),
                "carried_bytes": int(row["carried_bytes"]),
                "replay_write_bytes": int(row["replay_write_bytes"]),
                "reading_ops": list(row["reading_ops"]),
                "writing_ops": list(row["writing_ops"]),
                "unseen_writer_bytes": int(row["unseen_writer_bytes"]),
                "unseen_writer_ops": list(row["unseen_writer_ops"]),
                "unseen_overlap_bytes": int(row["unseen_overlap_bytes"]),
                "lifetime_conflict": lifetime["conflict"],
                "lifetime_conflict_bytes": lifetime["conflict_bytes"],
                "lifetime_blocks": lifetime["blocks"],
                "agree": lifetime["conflict"] == (not row["holds"]),
                "explanation": explain(found, lifetime, with_reads, model, carried),
                "trace_only_conflict": trace["conflict"],
                "trace_only_conflict_bytes": trace["conflict_bytes"],
                "agree_trace_only": trace["conflict"] == (not row["holds"]),
                "explanation_trace_only": explain(found, trace, trace_only, model, carried),
            }
        )
    return pairs


def break_inputs(raw: dict) -> list[dict]:
    """Per model capture and break: the blocks held across it by class, with and without the break's reads."""
    out = []
    for analysis, liveness in (
        ("with_break_reads", liveness_table(raw)),
        ("trace_only", liveness_table(_without_break_reads(raw))),
    ):
        for (capture, j), rows in liveness.rows.groupby(["capture", "break"], sort=False):
            by_class = rows.groupby("class")["bytes"]
            classes = {
                c: {"blocks": int(n), "bytes": int(b)}
                for (c, n), b in zip(by_class.count().items(), by_class.sum(), strict=True)
            }
            out.append({"analysis": analysis, "capture": capture, "break": int(j), "classes": classes})
    return out


def replica_invariant(recording: ReadWriteRecording, raw: dict, config, can_run=None) -> dict:
    """The invariant (`kit.analysis.invariant`) over a replica capture: the graph pool's ranges from `raw`, the
    snapshot recorded in the same process as `recording`; the early aux outputs from `config`."""
    early = early_aux_count(config.aux_hidden_state_layers, config.decoder_replay_start)
    return invariant_result(recording, raw, early, can_run=can_run)


def with_invariant(pairs: list[dict], invariant: dict) -> list[dict]:
    """Each pairing with the invariant's figures for its (model graph, break, replay graph) added."""
    rows = {(r["model_size"], r["break"], r["replay_size"]): r for r in invariant["rows"]}
    out = []
    for pair in pairs:
        row = rows.get((pair["model_size"], pair["break"], pair["replay_size"]))
        out.append({**pair, **{k: (row[k] if row else None) for k in INVARIANT_PAIR_KEYS}})
    return out


def invariant_lines(data: dict) -> list[str]:
    """Per scenario: the invariant's verdict and its list of graph-pool reads, or that the recording lacks it."""
    lines = [INVARIANT]
    for scenario, run in (data.get("scenarios") or {}).items():
        invariant = run.get("invariant") if isinstance(run, dict) else None
        if not invariant:
            lines.append(f"{scenario}: invariant {NOT_RECORDED}")
            continue
        lines.append(verdict_line(scenario, invariant["holds"], invariant["summary"]))
        lines += [f"  {line}" for line in invariant["verdicts"]]
    return lines


def load_recording(preset: str, path: str | Path | None = None) -> dict:
    """A read/write recording (the shipped one for `preset` by default), checked."""
    path = Path(path) if path is not None else RECORDINGS_DIR / f"{preset}.json"
    missing = f"no read/write recording for preset {preset!r} at {path}; record it on a GPU"
    return recorded.read_recording(path, "a read/write recording", missing, _schema_problem, where=str)


def recorded_if_any(preset: str) -> dict | None:
    """The shipped read/write recording at `preset` with its `source` line, or None when there is none."""
    path = RECORDINGS_DIR / f"{preset}.json"
    if not path.is_file():
        return None
    data = load_recording(preset, path)
    data["source"] = recorded.source_line(data, path)
    return data


def _schema_problem(data: Any) -> str | None:
    from kit.experiments.safety_run.result import pairless_preset

    pairs = data.get("pairs") if isinstance(data, dict) else None
    if not isinstance(pairs, list) or not all(isinstance(p, dict) for p in pairs):
        return "no 'pairs' list"
    if not pairs and not pairless_preset(data):
        return "no 'pairs' list"
    missing = sorted({k for p in pairs for k in PAIR_KEYS if k not in p})
    if missing or not isinstance(data.get("provenance"), dict):
        return f"lacks {', '.join(missing) or 'provenance'}"
    return None


def summary_lines(data: dict) -> list[str]:
    """Per scenario: the obligation's result on the dispatchable pairings, and where the analyses agree."""
    from kit.experiments.safety_run.result import no_pairs_line

    if not data["pairs"] or not any(p["dispatchable"] for p in data["pairs"]):
        # Stress pairings only (a replay graph replayed in a model graph's attention break, which vLLM never does):
        # nothing to claim of the obligation, whatever the stress rows say.
        stress = f" ({len(data['pairs'])} stress pairings recorded, none claimed)" if data["pairs"] else ""
        return [no_pairs_line(data) + stress]
    lines = []
    df = pd.DataFrame(data["pairs"])
    for scenario, rows in df.groupby("scenario", sort=False):
        running = rows[rows["dispatchable"]]
        violated = running[~running["readwrite_holds"]]
        agree = int(rows["agree"].sum())
        trace_agree = int(rows["agree_trace_only"].sum())
        lines.append(
            f"{scenario}: obligation {'holds' if violated.empty else 'VIOLATED'} on "
            f"{len(running) - len(violated) if violated.empty else len(violated)} of {len(running)} dispatchable "
            "pairings; the lifetime analysis agrees "
            f"on {agree} of {len(rows)} pairings with the breaks' reads, {trace_agree} from the trace alone"
        )
    return lines

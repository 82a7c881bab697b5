"""PR 63155's safety argument as a structural invariant, checked per pairing beside the byte-overlap obligation.

The PR's argument for capturing the replay graphs on the model graphs' stream,
stated as an invariant (`INVARIANT`): after the replay break nothing reads a
graph-pool value from before it, except early aux. If it holds, a replay graph
R may take any free graph-pool block of model graph N and N cannot tell, for
every R, captured in any order; the byte-overlap obligation
(`kit.analysis.readwrite.OBLIGATION`) only checks the bytes the recorded R
happened to write. On the replica and vLLM's path as recorded, every byte
carried across the break (`readwrite.carried_reads`) is outside the graph pool
(weights, the persistent replay-row index), so the obligation holds whatever R
wrote; the invariant says so instead of passing.

Per model graph N and replay break J (the same for every R that can run there):

- `pool_carried_reads`: the carried reads that fall in the graph pool's
  address ranges (`graph_pool_ranges`: the snapshot's segments whose
  `segment_pool_id` is not (0, 0), recorded in the same process as the reads),
  each with its op, phase, bytes, and whether it lies in an early aux output
  (`early_aux_ranges`: the outputs the caller reads, hidden states first, then
  the aux states in layer order, the first `early_aux` of them made before the
  replay layers): those are the exception, the rest are violations;
- `invariant_table`: per (N, J, R) pairing, `graph_pool_carried_bytes` (the
  violations), `early_aux_carried_bytes` (the exception) and `invariant_holds`;
- `invariant_verdicts`, `invariant_summary`: per model graph break, and in one line;
- `invariant_result`: all of it for one capture, as the recordings keep it;
  `invariant_by_scenario`, `invariant_of_pairs` read it back from a replica
  read/write recording (`kit.experiments.readwrite_run`), "not recorded"
  where it lacks it.

A default-pool byte (pool (0, 0)) is never counted: a block there is not the
graph pool's, so no replay capture can be handed it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import pandas as pd

from kit.allocator.rules import DEFAULT_POOL
from kit.analysis.readwrite import (
    MODEL,
    OUTPUT,
    READ,
    REPLAY,
    Ranges,
    ReadWriteRecording,
    _recording,
    carried_reads,
)
from kit.units import format_bytes

INVARIANT = (
    "After the replay break nothing reads a graph-pool value from before it, except early aux: for every model graph "
    "N that breaks out to a replay graph, no graph-pool byte read after the replay layers start (by the rest of the "
    "break, N's later segments and breaks, or the caller reading N's outputs) holds a value written before they "
    "started, unless it is an early aux hidden state's."
)
NOT_RECORDED = "not recorded: this recording has no graph-pool ranges from its capture (re-record it)"
INVARIANT_PAIR_KEYS = ("graph_pool_carried_bytes", "early_aux_carried_bytes", "invariant_holds")
INVARIANT_COLUMNS = [
    "model_size",
    "break",
    "replay_size",
    "can_run",
    "graph_pool_carried_bytes",
    "early_aux_carried_bytes",
    "invariant_holds",
    "invariant_reads",
]


@dataclass(frozen=True)
class PoolRead:
    """Graph-pool bytes `[start, end)` read after R starts, written before: the op, its phase, early aux or not."""

    start: int
    end: int
    op: str
    phase: str
    early_aux: bool

    @property
    def bytes(self) -> int:
        return self.end - self.start

    def to_record(self) -> dict:
        return {
            "start": self.start,
            "end": self.end,
            "bytes": self.bytes,
            "op": self.op,
            "phase": self.phase,
            "early_aux": self.early_aux,
        }


def graph_pool_ranges(raw: Mapping) -> Ranges:
    """The address ranges of a snapshot's graph-pool segments: those whose `segment_pool_id` is not (0, 0)."""
    return Ranges(
        (int(s["address"]), int(s["address"]) + int(s["total_size"]))
        for s in raw.get("segments") or []
        if tuple(s.get("segment_pool_id", DEFAULT_POOL)) != DEFAULT_POOL
    )


def early_aux_count(aux_hidden_state_layers: Iterable[int], decoder_replay_start: int) -> int:
    """How many aux hidden states are made before the replay layers (layer ids below the replay start)."""
    return sum(1 for i in set(aux_hidden_state_layers) if i < decoder_replay_start)


def output_spans(recording: ReadWriteRecording | Iterable, size: int) -> list[tuple[int, int]]:
    """The bytes of model graph `size`'s outputs as its caller read them, in order (hidden states, then aux)."""
    recording = _recording(recording)
    return [(a.start, a.end) for a in recording.of(MODEL, size) if a.phase.part == OUTPUT and a.kind == READ]


def early_aux_ranges(recording: ReadWriteRecording | Iterable, size: int, early_aux: int) -> Ranges:
    """The bytes of model graph `size`'s early aux outputs: the `early_aux` outputs after the hidden states."""
    return Ranges(output_spans(recording, size)[1 : 1 + early_aux])


def pool_carried_reads(
    recording: ReadWriteRecording | Iterable, size: int, break_index: int, pool: Ranges, early_aux: Ranges
) -> list[PoolRead]:
    """The carried reads of model graph `size`'s replay break that fall in `pool`, split at `early_aux`'s edges."""
    reads = []
    for piece in carried_reads(recording, size, break_index):
        in_pool = Ranges([(piece.start, piece.end)]) & pool
        for parts, is_aux in ((in_pool & early_aux, True), (in_pool - early_aux, False)):
            reads += [PoolRead(s, e, piece.op, piece.phase, is_aux) for s, e in parts]
    return sorted(reads, key=lambda r: (r.start, r.end, r.op))


def invariant_table(
    recording: ReadWriteRecording | Iterable,
    pool: Ranges,
    early_aux: int,
    *,
    can_run: Callable[[int, int], bool] | None = None,
) -> pd.DataFrame:
    """Per (model graph, replay break, replay graph) pairing: the graph-pool bytes carried across, and the verdict.

    `pool` is `graph_pool_ranges` of the snapshot recorded with `recording`;
    `early_aux` how many of the aux outputs are early (`early_aux_count`).
    `graph_pool_carried_bytes` counts the bytes outside early aux (the
    invariant's violations), `early_aux_carried_bytes` those inside (the
    exception); `invariant_reads` lists them all (`PoolRead.to_record`).
    """
    recording = _recording(recording)
    rows = []
    for model_size in recording.sizes(MODEL):
        aux = early_aux_ranges(recording, model_size, early_aux)
        for j in recording.replay_breaks(model_size):
            reads = pool_carried_reads(recording, model_size, j, pool, aux)
            bad = Ranges((r.start, r.end) for r in reads if not r.early_aux)
            allowed = Ranges((r.start, r.end) for r in reads if r.early_aux)
            for replay_size in recording.sizes(REPLAY):
                rows.append(
                    {
                        "model_size": model_size,
                        "break": j,
                        "replay_size": replay_size,
                        "can_run": True if can_run is None else bool(can_run(model_size, replay_size)),
                        "graph_pool_carried_bytes": bad.total,
                        "early_aux_carried_bytes": allowed.total,
                        "invariant_holds": not bad,
                        "invariant_reads": [r.to_record() for r in reads],
                    }
                )
    table = pd.DataFrame(rows, columns=INVARIANT_COLUMNS)
    table.attrs["invariant"] = INVARIANT
    return table


def _read_line(read: Mapping) -> str:
    kind = "early aux, allowed" if read["early_aux"] else "VIOLATION"
    return f"{format_bytes(read['bytes'])} at {read['start']:#x} read by {read['op']} ({read['phase']}): {kind}"


def invariant_verdicts(table: pd.DataFrame) -> list[str]:
    """One line per model graph break some replay graph can run in: holds, holds by the exception, or violated,
    with every graph-pool read listed under it."""
    lines: list[str] = []
    if table.empty:
        return lines
    running = table[table["can_run"].astype(bool)]
    for (size, j), rows in running.groupby(["model_size", "break"], sort=True):
        first = rows.iloc[0]
        where = f"model graph {size} break {j}"
        bad, aux = int(first["graph_pool_carried_bytes"]), int(first["early_aux_carried_bytes"])
        if bad:
            lines.append(
                f"{where}: VIOLATED: {format_bytes(bad)} of graph-pool values from before the replay break are read "
                f"after it (any replay graph that takes those blocks changes N's outputs)"
            )
        elif aux:
            lines.append(f"{where}: holds by the exception: the only graph-pool bytes read after the break are "
                         f"{format_bytes(aux)} of early aux")  # fmt: skip
        else:
            lines.append(f"{where}: holds: no graph-pool byte from before the replay break is read after it")
        lines += [f"  {_read_line(r)}" for r in first["invariant_reads"]]
    return lines


def invariant_holds(table: pd.DataFrame) -> bool | None:
    """Whether the invariant holds on every pairing that can run; None when none can (nothing checked)."""
    if table.empty:
        return None
    running = table[table["can_run"].astype(bool)]
    return bool(running["invariant_holds"].astype(bool).all()) if len(running) else None


def invariant_summary(table: pd.DataFrame) -> str:
    """The invariant and its result in one line."""
    holds = invariant_holds(table)
    if holds is None:
        return f"{INVARIANT} Nothing to check: no pairing can run."
    running = table[table["can_run"].astype(bool)]
    breaks = running.drop_duplicates(["model_size", "break"])
    aux = int(breaks["early_aux_carried_bytes"].sum())
    exception = f" ({format_bytes(aux)} of early aux, the exception)" if aux else ""
    if holds:
        return f"{INVARIANT} Holds on all {len(running)} pairings that can run{exception}."
    bad = breaks[~breaks["invariant_holds"].astype(bool)]
    sizes = ", ".join(str(s) for s in bad["model_size"])
    violated = int((~running["invariant_holds"].astype(bool)).sum())
    return (
        f"{INVARIANT} VIOLATED on {violated} of {len(running)} pairings that can run: model graph(s) {sizes} read "
        f"{format_bytes(int(bad['graph_pool_carried_bytes'].sum()))} of graph-pool values from before the replay "
        f"break after it{exception}."
    )


def invariant_records(table: pd.DataFrame) -> list[dict]:
    """`invariant_table`'s rows as JSON-able records."""
    return [
        {
            "model_size": int(r["model_size"]),
            "break": int(r["break"]),
            "replay_size": int(r["replay_size"]),
            "can_run": bool(r["can_run"]),
            "graph_pool_carried_bytes": int(r["graph_pool_carried_bytes"]),
            "early_aux_carried_bytes": int(r["early_aux_carried_bytes"]),
            "invariant_holds": bool(r["invariant_holds"]),
            "invariant_reads": list(r["invariant_reads"]),
        }
        for r in table.to_dict("records")
    ]


def invariant_result(
    recording: ReadWriteRecording | Iterable,
    raw: Mapping,
    early_aux: int,
    *,
    can_run: Callable[[int, int], bool] | None = None,
) -> dict:
    """The invariant over a capture: the statement, the graph pool's ranges, per-pairing rows, verdicts, summary.

    `raw` is the capture recorder's snapshot dict recorded in the same process
    as `recording`. With no graph-pool segment in it, nothing can be said:
    `holds` is None and the summary says so (never a silent pass).
    """
    pool = graph_pool_ranges(raw)
    if not pool:
        return {"invariant": INVARIANT, "graph_pool": [], "rows": [], "verdicts": [], "holds": None,
                "summary": f"{INVARIANT} Not checked: the snapshot has no graph-pool segment."}  # fmt: skip
    table = invariant_table(recording, pool, early_aux, can_run=can_run)
    return {
        "invariant": INVARIANT,
        "graph_pool": [list(span) for span in pool],
        "early_aux_outputs": early_aux,
        "rows": invariant_records(table),
        "verdicts": invariant_verdicts(table),
        "holds": invariant_holds(table),
        "summary": invariant_summary(table),
    }


# --- reading recordings: the invariant beside the obligation, per scenario and per pairing ---------------


def invariant_by_scenario(data: dict | None) -> dict[str, dict]:
    """Per scenario of a read/write recording: the invariant's verdict (`holds`: True, False, None for not
    recorded), its summary, verdict lines and list, and the obligation's summary beside it."""
    out = {}
    for scenario, run in ((data or {}).get("scenarios") or {}).items():
        invariant = run.get("invariant") if isinstance(run, dict) else None
        out[scenario] = {
            "invariant_recorded": bool(invariant),
            "invariant_holds": invariant["holds"] if invariant else None,
            "invariant": invariant["summary"] if invariant else f"{INVARIANT} {NOT_RECORDED}",
            "invariant_verdicts": invariant["verdicts"] if invariant else [],
            "obligation": run.get("obligation") if isinstance(run, dict) else None,
        }
    return out


def invariant_of_pairs(data: dict | None) -> dict[tuple[str, int, int], dict]:
    """`(scenario, model size, replay size) -> {graph_pool_carried_bytes, early_aux_carried_bytes,
    invariant_holds, readwrite_holds}` from a read/write recording; None values where it lacks the invariant."""
    return {
        (p["scenario"], int(p["model_size"]), int(p["replay_size"])): {
            **{k: p.get(k) for k in INVARIANT_PAIR_KEYS},
            "readwrite_holds": p.get("readwrite_holds"),
        }
        for p in (data or {}).get("pairs") or []
    }


def verdict_line(name: str, holds: bool | None, summary: str) -> str:
    """`<name>: invariant holds|VIOLATED|not checked: <the summary's figures>`, the verdict said once."""
    verdict = {True: "holds", False: "VIOLATED", None: "not checked"}[holds]
    rest = summary.removeprefix(INVARIANT).strip()
    for word in ("Holds ", "VIOLATED "):
        rest = rest.removeprefix(word)
    return f"{name}: invariant {verdict}: {rest}"

"""The answer to "where did my graph-pool memory go", in one paragraph computed from a snapshot.

`python -m kit explain FILE` prints it, and every report opens with it: the
biggest pools (reserved, by stream), how much of each was stranded on which
stream and why (`kit.analysis.trace.reports.stranding_report`), the best map
of the graph pools' streams with the saving it was simulated to make
(`kit.analysis.ranking.rank_maps`; stranded bytes are churn over the trace,
never reported as a saving), and the caveat that moving a capture needs its
own safety argument. Each part is computed on its own: one that cannot be
(no trace, a trace the simulator does not model, one too long to rank) says
why in its place, and the others are still given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kit.allocator.rules import DEFAULT_POOL
from kit.analysis.ranking import SHARING_CAVEAT, rank_maps, saving_text
from kit.analysis.tables import segment_table
from kit.analysis.trace.reports import WHY_STREAM, stranding_report
from kit.errors import KitError
from kit.load.snapshot import Snapshot, load_snapshot
from kit.units import format_bytes

TOP_POOLS = 3
RANK_EVENTS = 500_000  # above this many trace events no map is ranked (each map is one more simulation)


@dataclass
class Answer:
    """The parts of the answer: `pools`, `stranded`, `best_map`, `caveat`; a part that could not be computed is
    None with its reason in `missing` (part name -> why)."""

    source: str
    pools: list[dict]  # the biggest pools: pool, pool_label, reserved, by_stream [(stream_label, reserved)]
    stranded: list[dict] | None  # per graph-pool group that stranded: pool_label, stream_label, bytes, on
    best_map: dict | None  # argument, graph_pool_saved, text; {} where no map saves graph-pool bytes
    caveat: str | None
    missing: dict[str, str] = field(default_factory=dict)

    def paragraph(self) -> str:
        """The answer as one paragraph of plain text."""
        parts = [_pools_sentence(self.pools)]
        if self.stranded is None:
            parts.append(f"Stranding: not computed ({self.missing['stranded']}).")
        elif not self.stranded:
            parts.append("No graph pool stranded memory: every new graph-pool segment was needed on its own stream.")
        else:
            parts += [_stranded_sentence(s) for s in self.stranded[:TOP_POOLS]]
            if len(self.stranded) > TOP_POOLS:
                more = sum(s["bytes"] for s in self.stranded[TOP_POOLS:])
                parts.append(f"{len(self.stranded) - TOP_POOLS} more group(s) stranded {format_bytes(more)}.")
            parts.append(f"Why: {WHY_STREAM}.")
        if self.best_map is None:
            parts.append(f"Best map: not simulated ({self.missing['best_map']}).")
        elif not self.best_map:
            parts.append("No map of the graph pools' streams saves graph-pool bytes (simulated).")
        else:
            parts.append(f"Best map, simulated: --map {self.best_map['argument']}, {self.best_map['text']}.")
        if self.caveat:
            parts.append(f"Caveat: {self.caveat}.")
        return " ".join(parts)

    def to_json(self) -> dict:
        return {
            "answer": self.paragraph(),
            "pools": self.pools,
            "stranded": self.stranded,
            "best_map": self.best_map,
            "caveat": self.caveat,
            "missing": self.missing,
            "source": self.source,
        }


def _pools_sentence(pools: list[dict]) -> str:
    if not pools:
        return "No segments are reserved."
    items = []
    for p in pools:
        streams = ", ".join(f"{label} {format_bytes(b)}" for label, b in p["by_stream"])
        items.append(f"{p['pool_label']} {tuple(p['pool'])} {format_bytes(p['reserved'])} ({streams})")
    return f"Biggest pools, reserved: {'; '.join(items)}."


def _stranded_sentence(s: dict) -> str:
    return (
        f"In {s['pool_label']}, {s['stream_label']} made {format_bytes(s['bytes'])} of new segments while a fitting "
        f"free block of the pool sat on {', '.join(s['on'])} ({format_bytes(s['still_reserved'])} of them still "
        "reserved at the end; churn over the trace, not a saving)."
    )


def biggest_pools(snap: Snapshot, top: int = TOP_POOLS) -> list[dict]:
    """The `top` pools by reserved bytes, each with its streams' shares, largest first."""
    table = segment_table(snap)
    labels = dict(zip(table["pool"], table["pool_label"], strict=True))
    shares: dict[tuple, dict[str, int]] = {}  # one pass: a process with hundreds of private pools has as many groups
    for pool, stream, reserved in zip(table["pool"], table["stream_label"], table["reserved"].tolist(), strict=True):
        by_stream = shares.setdefault(pool, {})
        by_stream[str(stream)] = by_stream.get(str(stream), 0) + int(reserved)
    out = [
        {
            "pool": list(pool),
            "pool_label": str(labels[pool]),
            "reserved": sum(by_stream.values()),
            "by_stream": sorted(by_stream.items(), key=lambda x: -x[1]),
        }
        for pool, by_stream in shares.items()
    ]
    return sorted(out, key=lambda p: -p["reserved"])[:top]


def graph_pool_stranding(snap: Snapshot) -> list[dict]:
    """Per graph-pool group that made segments while a fitting block sat on another stream: where, how much."""
    report = stranding_report(snap, min_bytes=1)
    rows = report[[tuple(p) != DEFAULT_POOL for p in report["pool"]]] if len(report) else report
    return [
        {
            "pool": list(r["pool"]),
            "pool_label": r["pool_label"],
            "stream_label": r["stream_label"],
            "bytes": int(r["stranded_bytes"]),
            "still_reserved": int(r["still_reserved"]),
            "on": list(r["other_labels"]),
        }
        for r in rows.to_dict(orient="records")
        if r["stranded_bytes"]
    ]


def best_map(snap: Snapshot) -> dict:
    """The ranked map that saves the most graph-pool bytes, simulated; {} where none saves any."""
    events = sum(len(columns) for columns in snap.trace_columns.values())
    if events > RANK_EVENTS:
        raise KitError(
            f"the trace has {events:,} events, over {RANK_EVENTS:,}; `python -m kit what-if FILE --rank` ranks "
            "the maps all the same"
        )
    ranked = rank_maps(snap, best_what_if=False)  # the ranking's figures are all the answer states
    if not ranked.saves:
        return {}
    top = ranked.rows.iloc[0]
    return {"argument": top["argument"], "graph_pool_saved": int(top["graph_pool_saved"]), "text": saving_text(top)}


def explain(snapshot: Snapshot | str | dict) -> Answer:
    """The answer for `snapshot`, each part computed on its own (module docstring)."""
    snap = load_snapshot(snapshot)
    found: dict = {}
    missing: dict[str, str] = {}
    for name, compute in (("stranded", graph_pool_stranding), ("best_map", best_map)):
        try:
            snap.check_trace(0)  # without a trace, each part says so
            found[name] = compute(snap)
        except KitError as e:
            missing[name] = str(e).removeprefix(f"{snap.origin}: ")
    best = found.get("best_map")
    caveat = SHARING_CAVEAT if best else None
    return Answer(snap.source_label, biggest_pools(snap), found.get("stranded"), best, caveat, missing)

"""Every stream map of a snapshot's graph pools, simulated and ranked by the graph-pool bytes it saves.

`what-if --map` answers one question: had stream A's work run on stream B. A
verdict that suggests a map must know it is the best one and say what it
saves as simulated, not what was stranded: stranded bytes count the new
segments made over the whole trace while a fitting block sat on another
stream (churn), and a map saves only what the pool would no longer reserve
at the end. On a 300k-op workload a group "132 MiB stranded" saved 48 MiB
when simulated, and the first map a verdict named saved 24 MiB where another
saved 176 MiB.

`rank_maps` tries, for each graph pool, every single move of one of the
streams that hold its segments onto another of them, and the all-in-one maps
(every such stream onto one of them). Each runs the trace again on the
simulator (`kit.analysis.whatif.simulate_trace`, the recording's own
addresses), and the maps are ranked by the bytes saved across all graph pools:
a stream moves with all its work, so one move can change several pools, and
the default pool's change is reported beside it, not counted. The best map
then runs through `what_if` in full, with its placement spread and
corrections. Maps the simulator refuses (a capture moved onto the default
stream) are listed with why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from kit.allocator.rules import DEFAULT_POOL
from kit.analysis.names import DEFAULT_POOL_LABEL, pool_labels, stream_labels
from kit.analysis.tables import pool_label
from kit.analysis.trace.reports import map_argument, stranding_report
from kit.analysis.trace.walk import walk_trace
from kit.analysis.whatif import WhatIf, baseline_table, reserved_by_pool, simulated_reserved, what_if
from kit.errors import KitError
from kit.load.snapshot import Snapshot, load_snapshot
from kit.units import format_bytes

# Said wherever the kit suggests moving a capture onto another stream (the PR's own safety argument, in general).
SHARING_CAVEAT = (
    "a capture moved onto another stream is safe only if nothing captured after it overwrites a graph-pool "
    "value read after it: PR 63155 keeps its replay graphs on their own stream when an aux hidden state is "
    "produced before them for that reason; `python -m kit safety` checks it on the replica and vLLM's path, and "
    "kit.ReadWriteRecorder records what your own model's captures read and write (docs/commands.md#safety)"
)


@dataclass
class RankedMaps:
    """Every map `rank_maps` tried, best first (`rows`), the full what-if of the best (`best`), and the refused."""

    rows: pd.DataFrame  # map, argument, graph_pool_saved, default_pool_saved, saved (pool -> bytes), moves
    best: WhatIf | None  # None where no map saves graph-pool bytes, or where it was not asked for
    refused: list[str] = field(default_factory=list)
    source: str = ""

    @property
    def saves(self) -> bool:
        """Whether the best map saves graph-pool bytes."""
        return len(self.rows) > 0 and self.rows.iloc[0]["graph_pool_saved"] > 0

    def lines(self, limit: int = 10) -> list[str]:
        """The ranking, one line per map (the first `limit`), then the best map, or why there is none."""
        out = [f"ranked by graph-pool bytes saved, each map simulated from the trace ({len(self.rows)} maps):"]
        for rank, row in enumerate(self.rows.head(limit).to_dict(orient="records"), 1):
            out.append(f"  {rank}. --map {row['argument']}: {saving_text(row)}")
        if len(self.rows) > limit:
            out.append(f"  ... {len(self.rows) - limit} more (--json lists them all)")
        out += [f"  refused: {line}" for line in self.refused]
        if not self.saves:
            out.append("no map saves graph-pool bytes: every graph pool is as small as moving streams can make it")
        else:
            top = self.rows.iloc[0]
            out.append(f"best: --map {top['argument']}, {saving_text(top)} (simulated; its what-if follows)")
            out.append(f"caveat: {SHARING_CAVEAT}")
        return out


def saving_text(row: Mapping) -> str:
    """`saves 176.00 MiB of graph pool (graph pool 3 (3, 0): 90.00 MiB, ...); default pool: no change`."""
    graph, default, per_pool = row["graph_pool_saved"], row["default_pool_saved"], row["saved"]
    parts = [f"{pool_name}: {_signed(b)}" for pool_name, b in per_pool.items() if b and pool_name != DEFAULT_POOL_LABEL]
    head = f"{_signed(graph)} of graph pool" if graph else "no graph-pool change"
    return f"{head}{' (' + ', '.join(parts) + ')' if parts else ''}; default pool: {_signed(default) or 'no change'}"


def _signed(saved: int) -> str:
    if not saved:
        return ""
    return f"saves {format_bytes(saved)}" if saved > 0 else f"costs {format_bytes(-saved)}"


def capture_streams(table: pd.DataFrame) -> dict[tuple[int, int], list[int]]:
    """Per graph pool of a `segment_table`, the streams that hold its segments."""
    graph = table[[tuple(p) != DEFAULT_POOL for p in table["pool"]]]
    return {tuple(pool): sorted({int(s) for s in rows["stream"]}) for pool, rows in graph.groupby("pool")}


def candidate_maps(streams_by_pool: Mapping[tuple[int, int], list[int]]) -> list[dict[int, int]]:
    """Each single move of one of a pool's streams onto another, and each all-in-one map; no map twice."""
    maps: dict[frozenset, dict[int, int]] = {}
    for streams in streams_by_pool.values():
        for target in streams:
            for source in streams:
                if source != target:
                    maps.setdefault(frozenset({(source, target)}), {source: target})
            if len(streams) > 2:
                together = {s: target for s in streams if s != target}
                maps.setdefault(frozenset(together.items()), together)
    return list(maps.values())


def rank_maps(snapshot: Snapshot | str | dict, *, best_what_if: bool = True) -> RankedMaps:
    """Every candidate map of the snapshot's graph pools, simulated, best first; with `best_what_if`, the best
    one's full what-if (its corrections and placement spread: several more simulations)."""
    snap = load_snapshot(snapshot)
    walk = walk_trace(snap)
    labels, pools = stream_labels(snap), pool_labels(snap)
    baseline = baseline_table(snap, walk)
    before = reserved_by_pool(baseline)
    rows, refused = [], []
    report = stranding_report(snap, walk, min_bytes=1)
    stranders = {  # the streams that stranded graph-pool bytes
        int(r["stream"]) for r in report.to_dict(orient="records") if r["stranded_bytes"] and r["pool"] != DEFAULT_POOL
    }
    for moves in candidate_maps(capture_streams(baseline)):
        argument = " --map ".join(map_argument(labels[a], a, labels[b], b) for a, b in moves.items())
        try:
            after = simulated_reserved(snap, moves, walk)
        except KitError as e:
            refused.append(f"--map {argument}: {str(e).removeprefix(f'{snap.origin}: ')}")
            continue
        saved = {pool: before.get(pool, 0) - after.get(pool, 0) for pool in sorted(before.keys() | after.keys())}
        rows.append(
            {
                "argument": argument,
                "map": [{"from": a, "from_label": labels[a], "to": b, "to_label": labels[b]} for a, b in moves.items()],
                "graph_pool_saved": sum(b for p, b in saved.items() if p != DEFAULT_POOL),
                "default_pool_saved": saved.get(DEFAULT_POOL, 0),
                "saved": {_pool_name(pools, p): b for p, b in saved.items()},
                "moves": moves,
                "_strander": all(a in stranders for a in moves),
            }
        )
    columns = ["argument", "map", "graph_pool_saved", "default_pool_saved", "saved", "moves", "_strander"]
    table = pd.DataFrame(rows, columns=columns)
    # Ties: the fewer streams moved first, then maps that move only streams that stranded (the PR's direction:
    # the later capture onto the stream holding the free blocks), then the default pool's saving, then the argument.
    table = table.assign(_moved=table["moves"].map(len)).sort_values(
        ["graph_pool_saved", "_moved", "_strander", "default_pool_saved", "argument"],
        ascending=[False, True, False, False, True],
    )
    table = table.drop(columns=["_moved", "_strander"]).reset_index(drop=True)
    source = f"simulator (every map of the trace of {snap.source_label})"
    ranked = RankedMaps(table, None, refused, source)
    if best_what_if and ranked.saves:
        ranked.best = what_if(snap, table.iloc[0]["moves"])
    return ranked


def _pool_name(pools: Mapping[tuple, str], pool: tuple[int, int]) -> str:
    if pool == DEFAULT_POOL:
        return DEFAULT_POOL_LABEL
    return f"{pools.get(pool, pool_label(pool))} {tuple(pool)}"

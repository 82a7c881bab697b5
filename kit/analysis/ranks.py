"""Rank by rank: the segment-by-stream tables of a multi-GPU run, side by side.

Every rank of a tensor- or data-parallel run captures its own graphs into its
own allocator, so each has a graph pool of its own and stream ids of its own.
The ranks' groups are therefore matched by name (pool label, stream label),
as `diff_tables(by="label")` matches two runs. `rank_table` gives one row per
group with one column per rank, the smallest and largest figure, the spread
between them and the rank that reserves most, all among the ranks that have the
group; `rank_verdicts` names the groups where one rank reserves noticeably more
than the others, and the ranks that lack a group.

`load_ranks` reads a folder of per-rank snapshots (`rank0.pickle`,
`rank1.pickle`, ...; the rank is taken from the snapshot's provenance where
it has one, else from the file name), and `kit.record.vllm_ranks.snapshot_all_ranks`
returns the same from a live `LLM`.

A folder the kit's vLLM plugin wrote (`KIT_CAPTURE_DIR`, `kit.vllm_plugin`)
also holds each rank's manifest, `rank{R}.json` (never read as a snapshot):
`rank_summary` sets per rank the graph pool by stream, the bytes stranded in
it, the replay graphs' own stream's share, and vLLM's estimate of graph
memory (`profile_cudagraph_memory`, taken off the KV cache before it is
sized) against the graph pool reserved at the end of capture, with the
KV-cache blocks the difference is worth; `rank_differences` names a rank
whose figures differ from the others'.

    snapshots = kit.load_ranks("capture_dp4/")
    table = kit.rank_table(snapshots)
    kit.rank_verdicts(table)
    summary = rank_summary(snapshots, load_manifests("capture_dp4/"))
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kit.allocator.rules import DEFAULT_POOL
from kit.analysis.tables import FIGURES, segment_table
from kit.errors import KitError, check_one_of
from kit.load.snapshot import Snapshot, load_snapshot
from kit.units import MIB, format_bytes

SNAPSHOT_SUFFIXES = (".pickle", ".pkl", ".json")
PROVENANCE = "PROVENANCE.json"  # a recording folder's provenance, never a rank's snapshot
MANIFEST_VERSION = 1  # kit.vllm_plugin.MANIFEST_VERSION: what `rank{R}.json` holds
REPLAY_STREAM_LABEL = "decoder replay graphs stream"  # the recorder's name for the replay graphs' own stream
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


def rank_of(snapshot: Snapshot, name: str = "") -> int | None:
    """The rank a snapshot was taken on: its provenance's `rank`, else a `rank<N>` in its file name."""
    rank = (snapshot.provenance or {}).get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:
        return rank
    match = _RANK_IN_NAME.search(name)
    return int(match.group(1)) if match else None


def load_ranks(folder: str | os.PathLike) -> dict[int, Snapshot]:
    """One snapshot per rank from `folder`, by rank; a file with no rank, or two with one rank, is an error."""
    folder = Path(folder)
    if not folder.is_dir():
        raise KitError(f"{folder}: not a folder of per-rank snapshots")
    files = sorted(
        p
        for p in folder.iterdir()
        if p.suffix in SNAPSHOT_SUFFIXES and p.is_file() and not _is_manifest(p) and p.name != PROVENANCE
    )
    if not files:
        raise KitError(f"{folder}: no snapshot files ({', '.join(SNAPSHOT_SUFFIXES)})")
    ranks: dict[int, Snapshot] = {}
    for path in files:
        snapshot = load_snapshot(path)
        rank = rank_of(snapshot, path.name)
        if rank is None:
            raise KitError(f"{path}: no rank in its provenance or its name (name it rank<N>{path.suffix})")
        if rank in ranks:
            raise KitError(f"{path}: a second snapshot of rank {rank}")
        ranks[rank] = snapshot
    return dict(sorted(ranks.items()))


def _is_manifest(path: Path) -> bool:
    """`rank{R}.json` beside a `rank{R}` snapshot of another kind: the plugin's manifest, not a snapshot."""
    return path.suffix == ".json" and any(
        path.with_suffix(suffix).is_file() for suffix in SNAPSHOT_SUFFIXES if suffix != ".json"
    )


def load_manifests(folder: str | os.PathLike) -> dict[int, dict]:
    """Each rank's manifest from `folder` (`rank{R}.json` beside its snapshot), by rank; none is no error."""
    manifests = {}
    for path in sorted(Path(folder).glob("rank*.json")):
        if not _is_manifest(path):
            continue
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise KitError(f"{path}: not a readable manifest ({exc})") from None
        rank = manifest.get("rank") if isinstance(manifest, dict) else None
        if not isinstance(manifest, dict) or manifest.get("kit_manifest") != MANIFEST_VERSION or not _count(rank):
            raise KitError(f"{path}: not a kit manifest of version {MANIFEST_VERSION} with a rank")
        manifests[rank] = manifest
    return manifests


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def rank_summary(snapshots: Sequence[Snapshot] | Mapping[int, Snapshot], manifests: Mapping[int, dict] | None = None):
    """One row per rank: graph pool (by stream), stranded, the replay graphs' own stream, estimate against reserved.

    Without a manifest a rank's graph pools are all its non-default pools and
    its estimate columns are empty; with one (the vLLM plugin's), the pools
    its real capture used (not the estimate's throwaway pool). `stranded` is
    None where the snapshot has no trace to walk (`stranded_why` says so).
    """
    from kit.analysis.answer import graph_pool_stranding

    rows = []
    for rank, snapshot in _by_rank(snapshots).items():
        manifest = (manifests or {}).get(rank) or (snapshot.kit or {}).get("vllm_worker") or {}
        table = segment_table(snapshot)
        pools = {tuple(p) for p in manifest.get("graph_pools") or []} or {
            p for p in table["pool"] if tuple(p) != DEFAULT_POOL
        }
        mine = table[[tuple(p) in pools for p in table["pool"]]] if len(table) else table
        by_stream = (
            {str(k): int(v) for k, v in mine.groupby("stream_label")["reserved"].sum().items()} if len(mine) else {}
        )
        try:
            stranded, why = sum(g["bytes"] for g in graph_pool_stranding(snapshot) if tuple(g["pool"]) in pools), None
        except KitError as exc:
            stranded, why = None, str(exc)
        reserved = int(mine["reserved"].sum()) if len(mine) else 0
        estimate, patch = manifest.get("estimate"), manifest.get("patch") or {}
        per_block = (manifest.get("kv_cache") or {}).get("bytes_per_block")
        short = reserved - estimate if isinstance(estimate, int) else None
        rows.append(
            {
                "rank": rank,
                "graph_pool": reserved,
                "by_stream": by_stream,
                "replay_stream": by_stream.get(REPLAY_STREAM_LABEL, 0),
                "stranded": stranded,
                "stranded_why": why,
                "estimate": estimate,
                "estimate_applied": manifest.get("estimate_applied"),
                "beyond_estimate": short,
                "kv_blocks": short / per_block if short is not None and per_block else None,
                "patch": patch.get("asked") if patch.get("applied") else None,
                "vllm": manifest.get("vllm"),
            }
        )
    out = pd.DataFrame(rows, dtype=object)  # None stays None (JSON null), not NaN
    out.attrs["source"] = "; ".join(f"rank {r}: {s.source_label}" for r, s in _by_rank(snapshots).items())
    out.attrs["byte_columns"] = ["graph_pool", "replay_stream", "stranded", "estimate", "beyond_estimate"]
    return out


def rank_differences(summary: pd.DataFrame, *, tolerance: float = 0.05, min_bytes: int = 2 * MIB) -> list[str]:
    """Lines naming the ranks whose graph pool, replay graphs' own stream or stranded bytes differ.

    Two figures agree when they differ by at most `tolerance` of the larger and
    `min_bytes`. Where more than half the ranks agree, each rank outside them
    is named against their figure; where no such majority exists, every
    rank's figure is listed.
    """
    lines = []
    for column, what in (("graph_pool", "graph pool"), ("replay_stream", "replay graphs' own stream"),
                         ("stranded", "stranded")):  # fmt: skip
        known = [(r, int(v)) for r, v in zip(summary["rank"], summary[column], strict=True) if v is not None]
        if len(known) < 2:
            continue

        def agree(a: int, b: int) -> bool:
            return abs(a - b) <= max(tolerance * max(abs(a), abs(b)), min_bytes)

        peers = [[r for r, w in known if agree(v, w)] for _, v in known]
        largest = max(range(len(known)), key=lambda i: len(peers[i]))
        if len(peers[largest]) == len(known):
            continue
        if 2 * len(peers[largest]) > len(known):
            typical = known[largest][1]
            for rank, value in known:
                if rank not in peers[largest]:
                    lines.append(
                        f"rank {rank} differs: {what} {format_bytes(value)}, "
                        f"{format_bytes(typical)} on the other {len(peers[largest])} rank(s)"
                    )
        else:
            listed = ", ".join(f"rank {rank} {format_bytes(value)}" for rank, value in known)
            lines.append(f"the ranks differ in {what}: {listed}")
    return lines


def estimate_lines(summary: pd.DataFrame) -> list[str]:
    """Per rank with an estimate: vLLM's estimate against the graph pool reserved, in KV-cache blocks where known.

    vLLM takes its estimate off the KV cache before sizing it: a graph pool
    above the estimate took memory the KV cache was sized for; below it, the
    KV cache gave up memory the graphs did not take.
    """
    lines = []
    for row in summary.to_dict(orient="records"):
        if row["estimate"] is None:
            continue
        gap, blocks = int(row["beyond_estimate"]), row["kv_blocks"]
        worth = "" if blocks is None else f" ({abs(blocks):,.1f} KV-cache blocks)"
        if gap > 0:
            means = f"{format_bytes(gap)}{worth} more than the estimate: memory the KV cache was sized for"
        elif gap < 0:
            means = (
                f"{format_bytes(-gap)}{worth} less than the estimate: KV cache given up that the graphs did not take"
            )
        else:
            means = "exactly the estimate"
        off = " (not applied: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0)" if row["estimate_applied"] is False else ""
        lines.append(
            f"rank {row['rank']}: vLLM estimated {format_bytes(int(row['estimate']))} of graph memory{off}; "
            f"the graph pool reserved {format_bytes(int(row['graph_pool']))} at the end of capture, {means}"
        )
    return lines


@dataclass
class RankComparison:
    """Everything `kit ranks FOLDER` and the ranks' report say about a folder, computed once."""

    snapshots: dict[int, Snapshot]
    summary: pd.DataFrame  # rank_summary
    groups: pd.DataFrame  # rank_table
    estimates: list[str]
    differences: list[str]
    verdicts: list[str]


def compare_ranks(folder: str | os.PathLike, figure: str = "reserved") -> RankComparison:
    """A folder's ranks read (snapshots and the plugin's manifests) and compared."""
    snapshots = load_ranks(folder)
    summary = rank_summary(snapshots, load_manifests(folder))
    groups = rank_table(snapshots, figure)
    return RankComparison(
        snapshots, summary, groups, estimate_lines(summary), rank_differences(summary), rank_verdicts(groups)
    )


def _by_rank(snapshots: Sequence[Snapshot] | Mapping[int, Snapshot]) -> dict[int, Snapshot]:
    if isinstance(snapshots, Mapping):
        return dict(sorted(snapshots.items()))
    return dict(enumerate(snapshots))


def rank_table(snapshots: Sequence[Snapshot] | Mapping[int, Snapshot], figure: str = "reserved") -> pd.DataFrame:
    """Per (pool label, stream label) group: `figure` on each rank, min, max, spread and the largest rank.

    A rank without the group shows 0 in its column and is listed in
    `missing_on`; min, max, spread and `largest_rank` are taken over the ranks
    that have the group, so a missing rank is never the smallest or largest.
    """
    check_one_of(figure, FIGURES, "figure")
    ranks = _by_rank(snapshots)
    if not ranks:
        raise KitError("no snapshots to compare")
    key = ["pool_label", "stream_label"]
    columns = {}
    for rank, snapshot in ranks.items():
        table = segment_table(snapshot)
        empty = pd.Series([], index=pd.MultiIndex.from_tuples([], names=key), dtype="int64")
        columns[f"rank {rank}"] = table.groupby(key)[figure].sum() if len(table) else empty
    wide = pd.DataFrame(columns)
    present = wide.notna().to_numpy()
    wide = wide.fillna(0).astype("int64")
    rank_columns, rank_numbers = list(columns), list(ranks)
    out = wide.reset_index()
    values = wide.to_numpy()
    # Every group is on at least one rank; a rank without it must not be the smallest or the largest.
    info = np.iinfo(np.int64)
    out["min"] = np.where(present, values, info.max).min(axis=1)
    out["max"] = np.where(present, values, info.min).max(axis=1)
    out["spread"] = out["max"] - out["min"]
    out["largest_rank"] = [rank_numbers[i] for i in np.where(present, values, info.min).argmax(axis=1)]
    out["missing_on"] = [[r for r, has in zip(rank_numbers, row, strict=True) if not has] for row in present]
    out = out.sort_values(["pool_label", "spread"], ascending=[True, False]).reset_index(drop=True)
    out.attrs["source"] = "; ".join(f"rank {r}: {s.source_label}" for r, s in ranks.items())
    out.attrs["figure"] = figure
    if figure != "segments":
        out.attrs["byte_columns"] = [*rank_columns, "min", "max", "spread"]
    return out


def rank_verdicts(table: pd.DataFrame, *, tolerance: float = 0.05, min_bytes: int = 2 * MIB) -> list[str]:
    """One line per group whose ranks differ by more than `tolerance` of the largest and `min_bytes`,
    and one per group some ranks lack ("rank 3 has no <pool> / <stream>")."""
    figure = table.attrs.get("figure", "reserved")

    def amount(value: int) -> str:
        return str(value) if figure == "segments" else format_bytes(value)

    verdicts = []
    for row in table.itertuples(index=False):
        group = f"{row.pool_label} / {row.stream_label}"
        if row.missing_on:
            lacking = ", ".join(str(r) for r in row.missing_on)
            lack = f"rank {lacking} has" if len(row.missing_on) == 1 else f"ranks {lacking} have"
            verdicts.append(f"{lack} no {group} ({amount(row.max)} {figure} on rank {row.largest_rank})")
        if row.spread > max(tolerance * row.max, min_bytes):
            verdicts.append(
                f"{group}: rank {row.largest_rank} has {amount(row.max)} {figure}, "
                f"{amount(row.spread)} more than the smallest rank ({amount(row.min)})"
            )
    return verdicts

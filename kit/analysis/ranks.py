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

    snapshots = kit.load_ranks("capture_dp4/")
    table = kit.rank_table(snapshots)
    kit.rank_verdicts(table)
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from kit.analysis.tables import FIGURES, format_bytes, segment_table
from kit.errors import KitError, check_one_of
from kit.load.snapshot import Snapshot, load_snapshot
from kit.units import MIB

SNAPSHOT_SUFFIXES = (".pickle", ".pkl", ".json")
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
    files = sorted(p for p in folder.iterdir() if p.suffix in SNAPSHOT_SUFFIXES and p.is_file())
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
        columns[f"rank {rank}"] = table.groupby(key)[figure].sum()
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

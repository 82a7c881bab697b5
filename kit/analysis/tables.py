"""Segment-by-stream tables: where a snapshot's memory sits, per pool and stream.

The caching allocator hands a free block only to a request on the stream the
block's segment belongs to, so the natural unit for reading a snapshot is the
group of segments sharing a (segment_pool_id, stream) pair. `segment_table`
makes one row per group; `diff_tables` sets two such tables side by side.

Column contract (`docs/commands.md`): `pool` (two ints), `stream` (int), `segments`,
`reserved`, `allocated`, `active`, `free`, `largest_free` (bytes). The kit adds
`device`, `pool_label` and `stream_label`.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from kit.allocator.rules import DEFAULT_POOL
from kit.analysis.names import generated_labels, pool_labels, stream_labels, trace_stream_order
from kit.load.snapshot import Snapshot, load_snapshot

__all__ = ["generated_labels", "pool_labels", "stream_labels", "trace_stream_order"]

FIGURES = ("segments", "reserved", "allocated", "active", "free", "largest_free")
BYTE_COLUMNS = ("reserved", "allocated", "active", "free", "largest_free")
KEY = ("device", "pool", "stream")


def pool_label(pool: tuple[int, int], names: Mapping | None = None) -> str:
    """A short, stable name for a pool id: named if the caller named it."""
    if names and tuple(pool) in names:
        return names[tuple(pool)]
    if tuple(pool) == DEFAULT_POOL:
        return "default pool"
    a, b = pool
    if a == 0:
        return f"graph pool {b}"  # from torch.cuda.graph_pool_handle()
    return f"private pool {a}"  # a capture's own pool


def segment_table(
    snapshot: Snapshot | str | dict,
    *,
    stream_names: Mapping[int, str] | None = None,
    pool_names: Mapping[tuple[int, int], str] | None = None,
) -> pd.DataFrame:
    """One row per (device, pool, stream) group of segments, largest first within a pool."""
    snapshot = load_snapshot(snapshot)
    c = snapshot.columns
    columns = ["device", "pool", "stream", *FIGURES, "pool_label", "stream_label"]
    if not len(c):
        table = pd.DataFrame(columns=columns)
    else:
        frame = pd.DataFrame(
            {
                "device": c.device,
                "pool_a": c.pool_a,
                "pool_b": c.pool_b,
                "stream": c.stream,
                "reserved": c.total_size,
                "allocated": c.allocated_size,
                "active": c.active_size,
                "free": c.free,
                "largest_free": c.largest_free,
            }
        )
        table = (
            frame.groupby(["device", "pool_a", "pool_b", "stream"], sort=True)
            .agg(
                segments=("reserved", "size"),
                reserved=("reserved", "sum"),
                allocated=("allocated", "sum"),
                active=("active", "sum"),
                free=("free", "sum"),
                largest_free=("largest_free", "max"),
            )
            .reset_index()
        )
        table.insert(1, "pool", list(zip(table.pop("pool_a").tolist(), table.pop("pool_b").tolist(), strict=True)))
    pools = pool_labels(snapshot, pool_names)
    labels = stream_labels(snapshot, stream_names)
    table["pool_label"] = [pools.get(p) or pool_label(p) for p in table["pool"]]
    table["stream_label"] = [labels.get(s, str(s)) for s in table["stream"]]
    table = table[columns].astype({c: "int64" for c in ("device", "stream", *FIGURES)})
    table.attrs["source"] = snapshot.source_label
    made_up = generated_labels(snapshot)
    table.attrs["generated_labels"] = sorted(
        {x for x in (*table["pool_label"], *table["stream_label"]) if x in made_up}
    )
    return table


def diff_tables(before: pd.DataFrame, after: pd.DataFrame, *, by: str = "stream") -> pd.DataFrame:
    """Each group's change from `before` to `after`.

    Groups match on (device, pool, stream) by default: two snapshots of one
    process. Stream and pool ids differ between processes, so to compare two
    runs match on labels instead (`by="label"`): streams by their label,
    graph pools by their role (`kit.analysis.names`: recorder names, or
    "graph pool N" in the order the pools were made). `diff_summary` says
    per pool what the change saved.

    Figures hold the change (after minus before); `<figure>_before` and
    `<figure>_after` hold both sides. `status` is `changed`, `same`, `added`
    (only after) or `removed` (only before).
    """
    if by not in ("stream", "label"):
        raise ValueError(f"by must be 'stream' or 'label', not {by!r}")
    key = ["device", "pool", "stream"] if by == "stream" else ["device", "pool_label", "stream_label"]
    merged = before.merge(after, on=key, how="outer", suffixes=("_before", "_after"), indicator=True)
    out = merged[key].copy()
    for other in ("pool", "stream", "pool_label", "stream_label"):
        if other not in key:
            out[other] = merged[f"{other}_after"].where(merged[f"{other}_after"].notna(), merged[f"{other}_before"])
    out = out[["device", "pool", "stream", "pool_label", "stream_label"]]
    for fig in FIGURES:
        b = merged[f"{fig}_before"].fillna(0).astype("int64")
        a = merged[f"{fig}_after"].fillna(0).astype("int64")
        out[fig] = a - b
        out[f"{fig}_before"] = b
        out[f"{fig}_after"] = a
    changed = (out[list(FIGURES)] != 0).any(axis=1)
    status = pd.Series("same", index=out.index)
    status[changed] = "changed"
    status[merged["_merge"] == "left_only"] = "removed"
    status[merged["_merge"] == "right_only"] = "added"
    out.insert(3, "status", status)
    out["stream"] = out["stream"].astype("int64")
    out.attrs["source"] = f"before: {before.attrs.get('source', '?')}; after: {after.attrs.get('source', '?')}"
    made_up = set(before.attrs.get("generated_labels", ())) | set(after.attrs.get("generated_labels", ()))
    out.attrs["generated_labels"] = sorted(made_up)
    paired = out[out["status"].isin(["changed", "same"])]
    out.attrs["paired_generated"] = sorted(
        {x for x in (*paired["stream_label"], *paired["pool_label"]) if x in made_up} if by == "label" else set()
    )
    return out.sort_values(key).reset_index(drop=True)


def diff_summary(diff: pd.DataFrame) -> list[str]:
    """One line per pool of a `diff_tables` result: reserved before and after, and what the change saved."""
    lines = []
    for label, rows in diff.groupby("pool_label", sort=False):
        before, after = int(rows["reserved_before"].sum()), int(rows["reserved_after"].sum())
        saved = before - after
        change = f"saved {format_bytes(saved)}" if saved > 0 else f"cost {format_bytes(-saved)}" if saved else "same"
        lines.append(f"{label}: {format_bytes(before)} reserved before, {format_bytes(after)} after ({change})")
    return lines


def table_records(table: pd.DataFrame) -> list[dict]:
    """Rows as plain JSON-ready dicts, bytes exact, pool as [a, b]."""
    records = []
    for row in table.to_dict(orient="records"):
        rec = {}
        for k, v in row.items():
            if k == "pool":
                rec[k] = [int(v[0]), int(v[1])]
            elif hasattr(v, "item"):
                rec[k] = v.item()
            else:
                rec[k] = v
        records.append(rec)
    return records


def format_bytes(n: float) -> str:
    """Human-readable bytes, binary units: 5.18 GiB, 20.0 MiB, -2.0 MiB."""
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def byte_columns(table: pd.DataFrame) -> list[str]:
    """The columns that hold bytes, `_before` and `_after` ones of a diff included, and any a table names."""
    named = set(table.attrs.get("byte_columns", ()))
    return [c for c in table.columns if c in named or c.removesuffix("_before").removesuffix("_after") in BYTE_COLUMNS]


def style_table(table: pd.DataFrame):
    """A pandas Styler that renders byte columns human-readable, with its source as caption."""
    styler = table.style.format({c: format_bytes for c in byte_columns(table)}).hide(axis="index")
    source = table.attrs.get("source")
    return styler.set_caption(f"source: {source}") if source else styler

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
from functools import cache

import pandas as pd

from kit.allocator.rules import DEFAULT_POOL
from kit.analysis.names import (
    DEFAULT_POOL_LABEL,
    FrozenMap,
    generated_labels,
    natural_order,
    pool_frames,
    pool_labels,
    stream_labels,
    trace_stream_order,
)
from kit.analysis.pairing import PoolPairing, pair_pools, pairing_reason
from kit.load.snapshot import Snapshot, load_snapshot
from kit.markup import html_text
from kit.units import format_bytes

__all__ = ["generated_labels", "pool_labels", "stream_labels", "trace_stream_order"]

FIGURES = ("segments", "reserved", "allocated", "active", "free", "largest_free")
BYTE_COLUMNS = ("reserved", "allocated", "active", "free", "largest_free")
KEY = ("device", "pool", "stream")


def pool_label(pool: tuple[int, int], names: Mapping | None = None) -> str:
    """A short, stable name for a pool id: named if the caller named it."""
    if names and tuple(pool) in names:
        return names[tuple(pool)]
    if tuple(pool) == DEFAULT_POOL:
        return DEFAULT_POOL_LABEL
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
        {x for x in (*table["pool_label"], *table["stream_label"]) if x in made_up}, key=natural_order
    )
    table.attrs["pool_frames"] = pool_frames(snapshot)  # what went into each graph pool: how `diff` pairs runs
    return table


def diff_tables(before: pd.DataFrame, after: pd.DataFrame, *, by: str = "stream") -> pd.DataFrame:
    """Each group's change from `before` to `after`.

    Graph pools pair first (`kit.analysis.pairing.pair_pools`): by id where
    id, role and content agree, by content where ids moved, never by the
    "graph pool N" the kit numbers them with, which changes between runs as
    soon as work moves between streams. Within a pool pair, groups match on
    stream id by default (`by="stream"`: two snapshots of one process, or
    runs whose stream ids agree), or on stream label (`by="label"`: two
    processes, whose stream ids differ). `diff_summary` and `pool_summary`
    say per pool what the change saved.

    Figures hold the change (after minus before); `<figure>_before` and
    `<figure>_after` hold both sides. `status` is `changed`, `same`, `added`
    (only after) or `removed` (only before). `attrs["pool_pairs"]` says how
    each pool pair was made and `attrs["pairing_notes"]` what a reader should
    be told about it; a pool that cannot be told from another stays on its
    side, with a note.
    """
    if by not in ("stream", "label"):
        raise ValueError(f"by must be 'stream' or 'label', not {by!r}")
    made_up = set(before.attrs.get("generated_labels", ())) | set(after.attrs.get("generated_labels", ()))
    key = ["device", "_pool_key", "stream" if by == "stream" else "stream_label"]
    pairing = pair_pools(before, after)
    before, after, shown, pool_pairs, notes = _keyed_by_pairing(before, after, pairing)
    merged = before.merge(after, on=key, how="outer", suffixes=("_before", "_after"), indicator=True)
    out = merged[["device"]].copy()
    for other in ("pool", "stream", "stream_label"):
        if other not in key:
            out[other] = merged[f"{other}_after"].where(merged[f"{other}_after"].notna(), merged[f"{other}_before"])
        else:
            out[other] = merged[other]
    out["pool_label"] = merged["_pool_key"].map(shown)
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
    out.attrs["generated_labels"] = sorted(made_up, key=natural_order)
    out.attrs["by"] = by
    out.attrs["pool_pairs"] = tuple(pool_pairs)  # read-only: pandas deep-copies attrs at every step
    out.attrs["pairing_notes"] = tuple(notes)
    paired = out[out["status"].isin(["changed", "same"])]
    by_content = [p for p in pool_pairs if p["paired_by"] in ("captures", "streams", "role")]
    pools_paired = {p["label"] for p in by_content if p["before_label"] in made_up or p["after_label"] in made_up}
    out.attrs["paired_generated"] = sorted(
        ({x for x in paired["stream_label"] if x in made_up} | pools_paired) if by == "label" else set()
    )
    out["_order"] = [natural_order(x) for x in out["pool_label"]]
    sort = ["device", "_order", "stream" if by == "stream" else "stream_label"]
    return out.sort_values(sort).drop(columns="_order").reset_index(drop=True)


def pool_summary(diff: pd.DataFrame) -> pd.DataFrame:
    """One row per pool of a `diff_tables` result: how it was paired, reserved before and after, the saving.

    Columns: `device`, `pool_label`, `before` and `after` (the pool's ids on
    each side, None on the side it is missing from), `paired_by` (as in
    `attrs["pool_pairs"]`, or `only before` / `only after`), `reserved_before`,
    `reserved_after` and `saved` (before minus after; 0 for a pool on one
    side only: its bytes are no saving or cost of the change).
    """
    pairs = {(p["device"], p["label"]): p for p in diff.attrs.get("pool_pairs", ())}
    rows = []
    for (device, label), group in diff.groupby(["device", "pool_label"], sort=False):
        before, after = int(group["reserved_before"].sum()), int(group["reserved_after"].sum())
        pair = pairs.get((device, label))
        if pair is not None:
            ids, how, saved = (pair["before"], pair["after"]), pair["paired_by"], before - after
        else:
            only = "after" if (group["status"] == "added").all() else "before"
            pool = tuple(int(x) for x in group["pool"].iloc[0])
            ids, how, saved = ((None, pool) if only == "after" else (pool, None)), f"only {only}", 0
        rows.append((int(device), label, *ids, how, before, after, saved))
    columns = ["device", "pool_label", "before", "after", "paired_by", "reserved_before", "reserved_after", "saved"]
    out = pd.DataFrame(rows, columns=columns)
    out.attrs["source"] = diff.attrs.get("source")
    out.attrs["byte_columns"] = ("saved",)
    return out


def diff_summary(diff: pd.DataFrame) -> list[str]:
    """One line per pool of a `diff_tables` result: reserved before and after, and what the change saved.

    A pool paired with none on the other side says so: its bytes are no
    saving or cost of the change, only a pool one snapshot has.
    """
    lines = []
    for row in pool_summary(diff).itertuples(index=False):
        before, after, saved = row.reserved_before, row.reserved_after, row.saved
        if row.paired_by.startswith("only "):
            change = f"no pool {'before' if row.paired_by == 'only after' else 'after'} pairs with it"
        else:
            change = (
                f"saved {format_bytes(saved)}" if saved > 0 else f"cost {format_bytes(-saved)}" if saved else "same"
            )
        lines.append(
            f"{row.pool_label}: {format_bytes(before)} reserved before, {format_bytes(after)} after ({change})"
        )
    return lines


def _keyed_by_pairing(before: pd.DataFrame, after: pd.DataFrame, pairing: PoolPairing):
    """Both tables with `_pool_key` (one per pool pair, one per unpaired pool), each key's label, and notes."""
    key_b: dict = {}
    key_a: dict = {}
    shown: dict[str, str] = {}
    pool_pairs: list[dict] = []
    notes: list[str] = []
    for n, (b, a, how) in enumerate(pairing.pairs):
        key = f"pair {n}"
        key_b[b.key] = key_a[a.key] = key
        shown[key] = b.label if b.label == a.label else f"{b.label} (after: {a.label})"
        pool_pairs.append(
            FrozenMap(
                {
                    "device": b.device,
                    "before": b.pool,
                    "after": a.pool,
                    "before_label": b.label,
                    "after_label": a.label,
                    "label": shown[key],
                    "paired_by": how,
                }
            )
        )
        if how in ("captures", "streams", "role"):
            notes.append(f"paired before's {b.named()} with after's {a.named()} {pairing_reason(b, a, how)}")
    notes.extend(pairing.notes)
    labels_b = {p.label for p in (*(b for b, _, _ in pairing.pairs), *pairing.only_before)}
    labels_a = {p.label for p in (*(a for _, a, _ in pairing.pairs), *pairing.only_after)}
    sides = (("before", pairing.only_before, key_b, labels_a), ("after", pairing.only_after, key_a, labels_b))
    for side, lonely, keys, others in sides:
        for p in lonely:
            key = f"{side} {p.device} {p.pool}"
            keys[p.key] = key
            shown[key] = p.label if p.label not in others else f"{p.label} (only {side})"
            other = "after" if side == "before" else "before"
            notes.append(f"found no pool {other} to pair with {side}'s {p.named()}: shown as {side} only")
    before, after = before.assign(_pool_key=_keys(before, key_b)), after.assign(_pool_key=_keys(after, key_a))
    return before, after, shown, pool_pairs, notes


def _keys(table: pd.DataFrame, keys: dict) -> list[str]:
    return [keys[int(d), (int(p[0]), int(p[1]))] for d, p in zip(table["device"], table["pool"], strict=True)]


def table_records(table: pd.DataFrame) -> list[dict]:
    """Rows as plain JSON-ready dicts: numpy scalars as Python's, bytes exact, a pool (any tuple) as a list.

    The one way a table becomes JSON (`--json`, the recordings' tables): a value pandas holds as missing
    (None, NaN) is None, never NaN, which JSON has not.
    """
    return [{k: _json_value(v) for k, v in row.items()} for row in table.to_dict(orient="records")]


def _json_value(value):
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if value is None or (isinstance(value, float) and value != value):
        return None
    return value.item() if hasattr(value, "item") else value


def _bytes_or_dash(n: float | None) -> str:
    """`format_bytes`, and "-" for a figure that is not known (None, NaN)."""
    return "-" if n is None or n != n else format_bytes(n)


def byte_columns(table: pd.DataFrame) -> list[str]:
    """The columns that hold bytes, `_before` and `_after` ones of a diff included, and any a table names."""
    named = set(table.attrs.get("byte_columns", ()))
    return [c for c in table.columns if c in named or c.removesuffix("_before").removesuffix("_after") in BYTE_COLUMNS]


HEADERS = {  # a column's name -> its header in a styled table, where words alone would not say it
    "pool": "pool id",
    "stream": "stream id",
    "pool_label": "pool",
    "stream_label": "stream",
    "allocs": "allocations",
    "n_blocks": "blocks",
}


def column_header(name: object) -> str:
    """What a styled table calls a column: `HEADERS`, else its name in words ("largest_free" -> "largest free")."""
    return HEADERS.get(name, str(name).replace("_", " ")) if isinstance(name, str) else str(name)


def style_table(table: pd.DataFrame):
    """A pandas Styler that renders byte columns human-readable, with its source as caption.

    Headers are words (`column_header`); the DataFrame keeps its column names.
    Text cells, column names and the caption are escaped as HTML (`kit.markup`),
    also after a caller's own `format`: labels, frames and sources are the
    snapshot's own text, and a Styler renders them as markup otherwise
    ("stream of <module> (...)" lost its `<module>`).
    """
    styler = _text_styler()(table).format_index(column_header, escape="html", axis=1)
    styler = styler.format({c: _bytes_or_dash for c in byte_columns(table)}).hide(axis="index")
    source = table.attrs.get("source")
    return styler.set_caption(html_text(f"source: {source}")) if source else styler


@cache
def _text_styler() -> type:
    """pandas' Styler, escaping every text cell as HTML whatever `format` is called on it.

    Each `format({column: f})` resets every other column's formatter, so the
    escape is made part of every call (`Styler.__init__` makes one too).
    Imported here, not at the top: pandas' Styler imports jinja2, which only
    styling needs.
    """
    from pandas.io.formats.style import Styler

    class TextStyler(Styler):
        def format(self, formatter=None, subset=None, **kwargs):
            kwargs["escape"] = kwargs.get("escape") or "html"
            return super().format(formatter, subset, **kwargs)

    return TextStyler

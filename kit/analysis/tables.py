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

import re
from collections.abc import Mapping
from dataclasses import dataclass
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
from kit.errors import KitError
from kit.load.snapshot import Snapshot, load_snapshot
from kit.markup import html_text

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

    Groups match on (device, pool, stream) by default: two snapshots of one
    process. Stream and pool ids differ between processes, so to compare two
    runs match on labels instead (`by="label"`): streams by their label, and
    graph pools by role and content (`pair_pools`), never by the "graph pool
    N" the kit numbers them with: a pool left over from an earlier run would
    take another's number. `diff_summary` says per pool what the change saved.

    Figures hold the change (after minus before); `<figure>_before` and
    `<figure>_after` hold both sides. `status` is `changed`, `same`, `added`
    (only after) or `removed` (only before). By label, `attrs["pool_pairs"]`
    says how each pool pair was made and `attrs["pairing_notes"]` what a reader
    should be told about it; a pairing that cannot be told raises `KitError`.
    """
    if by not in ("stream", "label"):
        raise ValueError(f"by must be 'stream' or 'label', not {by!r}")
    made_up = set(before.attrs.get("generated_labels", ())) | set(after.attrs.get("generated_labels", ()))
    notes: list[str] = []
    pool_pairs: list[dict] = []
    if by == "stream":
        key = ["device", "pool", "stream"]
    else:
        key = ["device", "_pool_key", "stream_label"]
        pairs, only_before, only_after = pair_pools(before, after)
        before, after, shown, pool_pairs, notes = _keyed_by_pairing(before, after, pairs, only_before, only_after)
    merged = before.merge(after, on=key, how="outer", suffixes=("_before", "_after"), indicator=True)
    out = merged[[k for k in key if k != "_pool_key"]].copy()
    for other in ("pool", "stream", "pool_label", "stream_label"):
        if other not in key:
            out[other] = merged[f"{other}_after"].where(merged[f"{other}_after"].notna(), merged[f"{other}_before"])
    if by == "label":
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
    pools_paired = {p["label"] for p in pool_pairs if p["before_label"] in made_up or p["after_label"] in made_up}
    out.attrs["paired_generated"] = sorted(
        ({x for x in paired["stream_label"] if x in made_up} | pools_paired) if by == "label" else set()
    )
    order = ["device", "pool", "stream"] if by == "stream" else ["device", "pool_label", "stream_label"]
    return out.sort_values(order).reset_index(drop=True)


def diff_summary(diff: pd.DataFrame) -> list[str]:
    """One line per pool of a `diff_tables` result: reserved before and after, and what the change saved.

    By label, a pool paired with none on the other side says so: its bytes are
    no saving or cost of the change, only a pool one snapshot has.
    """
    lines = []
    for label, rows in diff.groupby("pool_label", sort=False):
        before, after = int(rows["reserved_before"].sum()), int(rows["reserved_after"].sum())
        saved = before - after
        change = f"saved {format_bytes(saved)}" if saved > 0 else f"cost {format_bytes(-saved)}" if saved else "same"
        if diff.attrs.get("by") == "label" and label not in {p["label"] for p in diff.attrs.get("pool_pairs", ())}:
            change = f"no pool {'before' if (rows['status'] == 'added').all() else 'after'} pairs with it"
        lines.append(f"{label}: {format_bytes(before)} reserved before, {format_bytes(after)} after ({change})")
    return lines


# --- pairing pools of two runs (diff by label) -------------------------------------

_ORDINAL = re.compile(r" #\d+$")  # "stream of f (x.py:3) #2": the second stream whose first allocation was there
_LETTER = re.compile(r"stream [A-Z]+")  # a stream with no frame: named by order alone


@dataclass(frozen=True)
class PoolSide:
    """One pool of one table as `pair_pools` sees it."""

    device: int
    pool: tuple[int, int]
    label: str
    generated: bool  # a label the kit made up ("graph pool 2"), not one the snapshot gives
    role: str  # "default"; "handle": (0, n), from graph_pool_handle(); "private": (n, 0), a capture's own
    frames: frozenset[str]  # user frames of the allocations that went into it (`names.pool_frames`)
    streams: frozenset[str]  # the streams holding its segments, as content: no order-made letters or "#2"
    groups: tuple  # its rows, ids and figures: an unchanged pool of one process

    @property
    def key(self) -> tuple[int, tuple[int, int]]:
        return (self.device, self.pool)

    def named(self) -> str:
        where = f" on device {self.device}" if self.device else ""
        return f"{self.label} ({self.pool[0]}, {self.pool[1]}){where}"


def pool_sides(table: pd.DataFrame) -> dict[tuple[int, tuple[int, int]], PoolSide]:
    """Each (device, pool) of a `segment_table` with its role and content."""
    made_up = set(table.attrs.get("generated_labels", ()))
    frames = table.attrs.get("pool_frames") or {}
    rows: dict[tuple[int, tuple[int, int]], list] = {}
    columns = [table[c] for c in ("device", "pool", "pool_label", "stream", "stream_label", *FIGURES)]
    for row in zip(*columns, strict=True):
        pool = (int(row[1][0]), int(row[1][1]))
        rows.setdefault((int(row[0]), pool), []).append(row)
    out = {}
    for (device, pool), group in rows.items():
        label = str(group[0][2])
        role = "default" if pool == DEFAULT_POOL else "handle" if pool[0] == 0 else "private"
        streams = {_stream_content(str(r[4]), made_up) for r in group} - {None}
        ids = tuple(sorted((int(r[3]), str(r[4]), *(int(x) for x in r[5:])) for r in group))
        out[device, pool] = PoolSide(
            device,
            pool,
            label,
            label in made_up,
            role,
            frozenset(frames.get((device, pool), ())),
            frozenset(streams),
            ids,
        )
    return out


def _stream_content(label: str, made_up: set[str]) -> str | None:
    """What a stream label says of the program: a given name as is; a generated one without its order."""
    if label not in made_up:
        return label
    if _LETTER.fullmatch(label):
        return None
    return _ORDINAL.sub("", label)


def _likeness(b: PoolSide, a: PoolSide) -> tuple[int, bool] | None:
    """How well two pools' contents match: (evidence, exact), higher is better; None when they cannot pair.

    Evidence 2: the frames of what went into them (the trace's); 1: the
    streams that hold their segments, where one lacks frames; 0: role alone,
    where neither has frames or a stream told by more than order. Pools of
    another device or role, or whose contents share nothing, never pair.
    """
    if b.device != a.device or b.role != a.role or b.role == "default":
        return None
    for evidence, x, y in ((2, b.frames, a.frames), (1, b.streams, a.streams)):
        if x and y:
            return (evidence, x == y) if x & y else None
    if not (b.frames or b.streams or a.frames or a.streams):
        return (0, True)
    return None


PAIRED_BY = {2: "captures", 1: "streams", 0: "role"}


def pair_pools(
    before: pd.DataFrame, after: pd.DataFrame
) -> tuple[list[tuple[PoolSide, PoolSide, str]], list[PoolSide], list[PoolSide]]:
    """Which pool of `after` is which of `before`: (pairs, each with how it was made; before only; after only).

    In turn: the default pools; pools the snapshots name alike (the kit's
    recorders, `pool_names=`); a pool of one process unchanged (same id, same
    groups); then by content, never by the order pools were made: a pool
    pairs with the one whose content (`_likeness`) matches it best when each
    is the other's only best. Where two match equally, the pairing cannot be
    told, and `KitError` says so rather than guess. A pool matching none is
    on one side only.
    """
    free_b, free_a = pool_sides(before), pool_sides(after)
    pairs: list[tuple[PoolSide, PoolSide, str]] = []

    def take(kb, ka, how: str) -> None:
        pairs.append((free_b.pop(kb), free_a.pop(ka), how))

    for kb, b in list(free_b.items()):
        if b.role == "default":
            if kb in free_a:
                take(kb, kb, "default")
            continue
        if not b.generated:
            alike = [k for k, a in free_a.items() if a.device == b.device and a.label == b.label and not a.generated]
            if len(alike) == 1:
                take(kb, alike[0], "name")
    for kb, b in list(free_b.items()):
        a = free_a.get(kb)
        if a is not None and a.role != "default" and a.groups == b.groups:
            take(kb, kb, "same pool")
    edges = {}
    for kb, b in free_b.items():
        for ka, a in free_a.items():
            score = _likeness(b, a)
            if score is not None:
                edges[kb, ka] = score
    while edges:
        best_b: dict = {}
        best_a: dict = {}
        for (kb, ka), score in edges.items():
            best_b[kb] = max(best_b.get(kb, score), score)
            best_a[ka] = max(best_a.get(ka, score), score)
        tops_b: dict = {}
        tops_a: dict = {}
        for (kb, ka), score in edges.items():
            if score == best_b[kb]:
                tops_b.setdefault(kb, []).append(ka)
            if score == best_a[ka]:
                tops_a.setdefault(ka, []).append(kb)
        mutual = [(kb, ka) for (kb, ka) in edges if tops_b[kb] == [ka] and tops_a[ka] == [kb]]
        if not mutual:
            raise KitError(_ambiguity(edges, tops_b, tops_a, free_b, free_a))
        for kb, ka in mutual:
            take(kb, ka, PAIRED_BY[edges[kb, ka][0]])
        edges = {k: s for k, s in edges.items() if k[0] in free_b and k[1] in free_a}
    return pairs, list(free_b.values()), list(free_a.values())


def _ambiguity(edges: dict, tops_b: dict, tops_a: dict, free_b: dict, free_a: dict) -> str:
    """One line: which pool matches several of the other side equally, on what, and what to do instead."""
    top = max(edges.values())
    tied = [(k, v, "before", "after", free_b, free_a) for k, v in tops_b.items() if len(v) > 1]
    tied += [(k, v, "after", "before", free_a, free_b) for k, v in tops_a.items() if len(v) > 1]
    tied.sort(key=lambda t: -int(edges[(t[0], t[1][0]) if t[2] == "before" else (t[1][0], t[0])] == top))
    key, candidates, side, other, mine, theirs = tied[0]
    score = edges[(key, candidates[0]) if side == "before" else (candidates[0], key)]
    what = {2: "captures (allocation frames)", 1: "streams", 0: "role (no frames or named streams to tell them by)"}
    how = f"{'the same' if score[1] else 'overlapping'} {what[score[0]]}" if score[0] else what[0]
    names = " and ".join(theirs[k].named() for k in candidates)
    return (
        f"diff --by-label cannot tell which pool {other} is {side}'s {mine[key].named()}: {names} match it "
        f"equally ({how}); refusing to guess. Name the pools (the snapshot's kit key 'pools', or "
        "segment_table(pool_names=...)) or diff by pool and stream id (without --by-label)"
    )


def _keyed_by_pairing(before, after, pairs, only_before, only_after):
    """Both tables with `_pool_key` (one per pool pair, one per unpaired pool), each key's label, and notes."""
    key_b: dict = {}
    key_a: dict = {}
    shown: dict[str, str] = {}
    pool_pairs: list[dict] = []
    notes: list[str] = []
    for n, (b, a, how) in enumerate(pairs):
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
        if how in ("captures", "streams", "role", "same pool"):
            reason = _pairing_reason(b, a, how)
            notes.append(f"--by-label paired before's {b.named()} with after's {a.named()} {reason}")
    labels_b = {p.label for p in (*(b for b, _, _ in pairs), *only_before)}
    labels_a = {p.label for p in (*(a for _, a, _ in pairs), *only_after)}
    sides = (("before", only_before, key_b, labels_a), ("after", only_after, key_a, labels_b))
    for side, lonely, keys, others in sides:
        for p in lonely:
            key = f"{side} {p.device} {p.pool}"
            keys[p.key] = key
            shown[key] = p.label if p.label not in others else f"{p.label} (only {side})"
            other = "after" if side == "before" else "before"
            notes.append(f"--by-label found no pool {other} to pair with {side}'s {p.named()}: shown as {side} only")
    before, after = before.assign(_pool_key=_keys(before, key_b)), after.assign(_pool_key=_keys(after, key_a))
    return before, after, shown, pool_pairs, notes


def _keys(table: pd.DataFrame, keys: dict) -> list[str]:
    return [keys[int(d), (int(p[0]), int(p[1]))] for d, p in zip(table["device"], table["pool"], strict=True)]


def _pairing_reason(b: PoolSide, a: PoolSide, how: str) -> str:
    if how == "same pool":
        return "by id: the same pool of one process, unchanged"
    if how == "role":
        return f"by role alone (the only {b.role} pool left on each side; neither has frames or named streams)"
    x, y = (b.frames, a.frames) if how == "captures" else (b.streams, a.streams)
    common = sorted(x & y)
    shown = "; ".join(common[:3]) + (f"; and {len(common) - 3} more" if len(common) > 3 else "")
    what = "captures (allocation frames)" if how == "captures" else "streams"
    extent = "the same" if x == y else f"{len(common)} of {len(x | y)}"
    return f"by content: {extent} {what}: {shown}"


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
    styler = styler.format({c: format_bytes for c in byte_columns(table)}).hide(axis="index")
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

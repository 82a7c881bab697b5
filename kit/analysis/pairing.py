"""Which graph pool of one snapshot is which of another: how `diff` sets two runs side by side.

The kit numbers graph pools in the order a snapshot shows them made ("graph
pool 1", "graph pool 2", ...), and that order changes between two runs of one
program as soon as work moves between streams: the same pool (2, 0) is "graph
pool 1" in one run and "graph pool 2" in the other. Pairing pools by their
number would print a saving and a cost that are one pool. `pair_pools` pairs
them, in turn:

1. the default pools, and pools both snapshots name alike (the `kit` key);
2. by id: the same (device, pool id) and role, with captures (allocation
   frames) that overlap, or that neither side's trace shows (`ids_agree`);
   streams may differ: moving work between streams is what such a diff is
   often about;
3. by content where ids moved: the pool whose captures, else streams, match
   best, when each is the other's only best.

Content that matches two pools equally is never guessed: such a pool stays on
its side, with a note saying which pools it could not tell apart. Every pair
keeps how it was made (`paired_by`), so a reader sees what the saving stands on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from kit.allocator.rules import DEFAULT_POOL

FIGURES = ("segments", "reserved", "allocated", "active", "free", "largest_free")

_ORDINAL = re.compile(r" #\d+$")  # "stream of f (x.py:3) #2": the second stream whose first allocation was there
_LETTER = re.compile(r"stream [A-Z]+")  # a stream with no frame: named by order alone

PAIRED_BY = {2: "captures", 1: "streams", 0: "role"}
WHAT = {2: "captures (allocation frames)", 1: "streams", 0: "role (no frames or named streams to tell them by)"}


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


@dataclass
class PoolPairing:
    """`pair_pools`' answer: the pairs, each with how it was made; the pools on one side only; the notes."""

    pairs: list[tuple[PoolSide, PoolSide, str]] = field(default_factory=list)
    only_before: list[PoolSide] = field(default_factory=list)
    only_after: list[PoolSide] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


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


def likeness(b: PoolSide, a: PoolSide) -> tuple[int, bool] | None:
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


def pair_pools(before: pd.DataFrame, after: pd.DataFrame) -> PoolPairing:
    """Which pool of `after` is which of `before` (the module docstring says in what order)."""
    free_b, free_a = pool_sides(before), pool_sides(after)
    out = PoolPairing()

    def take(kb, ka, how: str) -> None:
        out.pairs.append((free_b.pop(kb), free_a.pop(ka), how))

    for kb, b in list(free_b.items()):
        if b.role == "default":
            if kb in free_a:
                take(kb, kb, "default")
            continue
        if not b.generated:
            alike = [k for k, a in free_a.items() if a.device == b.device and a.label == b.label and not a.generated]
            if len(alike) == 1:
                take(kb, alike[0], "name")
    everyone_b, everyone_a = dict(free_b), dict(free_a)
    by_id_alone = []
    for kb, b in list(free_b.items()):
        a = free_a.get(kb)
        if a is None or a.role == "default" or not ids_agree(b, a):
            continue
        take(kb, kb, "same pool" if a.groups == b.groups else "id")
        if b.frames:
            out.notes.extend(_id_doubts(b, a, everyone_b, everyone_a))
        elif a.groups != b.groups:
            by_id_alone.append(b)
    if by_id_alone:
        shown = ", ".join(f"{b.label} ({b.pool[0]}, {b.pool[1]})" for b in by_id_alone[:5])
        more = f" and {len(by_id_alone) - 5} more" if len(by_id_alone) > 5 else ""
        out.notes.append(
            f"paired {len(by_id_alone)} graph pool(s) by id alone, with no allocation frames on either side to "
            f"confirm it (record with stacks='python' for them): {shown}{more}"
        )
    _pair_by_content(free_b, free_a, take, out.notes)
    out.only_before, out.only_after = list(free_b.values()), list(free_a.values())
    return out


def ids_agree(b: PoolSide, a: PoolSide) -> bool:
    """Whether one id on both sides is one pool: the same role, and captures that overlap or are unknown on both.

    Streams do not count against it: moving work between streams is what a
    diff of two runs is often about. A pool with frames and one without are
    not one pool: one was made within the trace and the other before it.
    """
    if a.role != b.role:
        return False
    if b.frames and a.frames:
        return bool(b.frames & a.frames)
    return not (b.frames or a.frames)


def _id_doubts(b: PoolSide, a: PoolSide, pools_b: dict, pools_a: dict) -> list[str]:
    """A note when another pool's captures match as well as the pool paired by id: only the id told them apart."""
    score = likeness(b, a)
    alike = []
    for mine, side, others, theirs in ((b, "after", pools_a, a), (a, "before", pools_b, b)):
        for other in others.values():
            if other.key == theirs.key or not other.frames:
                continue
            alt = likeness(mine, other) if side == "after" else likeness(other, mine)
            if score is not None and alt is not None and alt >= score:
                alike.append(f"{side}'s {other.named()}")
    if not alike:
        return []
    verb = "matches" if len(alike) == 1 else "match"
    return [
        f"paired before's {b.named()} with after's {a.named()} by id; {' and '.join(alike)} "
        f"{verb} its captures as well: only the id tells them apart"
    ]


def _pair_by_content(free_b: dict, free_a: dict, take, notes: list[str]) -> None:
    """Pair what ids left by content: mutual best matches; a pool matching several equally stays unpaired."""
    edges = {}
    for kb, b in free_b.items():
        for ka, a in free_a.items():
            score = likeness(b, a)
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
        for kb, ka in mutual:
            take(kb, ka, PAIRED_BY[edges[kb, ka][0]])
        if not mutual:
            side, key, note = _least_told(edges, tops_b, tops_a, free_b, free_a)
            notes.append(note)
            edges = {k: s for k, s in edges.items() if k[0 if side == "before" else 1] != key}
        edges = {k: s for k, s in edges.items() if k[0] in free_b and k[1] in free_a}


def _least_told(edges: dict, tops_b: dict, tops_a: dict, free_b: dict, free_a: dict) -> tuple[str, tuple, str]:
    """The pool matching several of the other side best and equally: its side, its key, the note saying so.

    The strongest evidence goes first, so the pools a weaker match would
    confuse are settled by a stronger one before they are given up.
    """
    tied = [(k, v, "before", "after", free_b, free_a) for k, v in tops_b.items() if len(v) > 1]
    tied += [(k, v, "after", "before", free_a, free_b) for k, v in tops_a.items() if len(v) > 1]

    def score(t) -> tuple[int, bool]:
        key, candidates, side = t[0], t[1], t[2]
        return edges[(key, candidates[0]) if side == "before" else (candidates[0], key)]

    key, candidates, side, other, mine, theirs = max(tied, key=score)
    evidence, exact = score((key, candidates, side))
    how = f"{'the same' if exact else 'overlapping'} {WHAT[evidence]}" if evidence else WHAT[0]
    names = " and ".join(theirs[k].named() for k in candidates)
    return (
        side,
        key,
        f"could not tell which pool {other} is {side}'s {mine[key].named()}: {names} match it equally ({how}); "
        f"shown as {side} only. Name the pools (the snapshot's kit key 'pools', or segment_table(pool_names=...))",
    )


def pairing_reason(b: PoolSide, a: PoolSide, how: str) -> str:
    """Why two pools were paired by content or role, in words: "by content: the same captures: ..."."""
    if how == "role":
        return f"by role alone (the only {b.role} pool left on each side; neither has frames or named streams)"
    x, y = (b.frames, a.frames) if how == "captures" else (b.streams, a.streams)
    what = WHAT[2] if how == "captures" else WHAT[1]
    return f"by content: {_extent(x, y)} {what}: {_shown(x & y)}"


def _extent(x: frozenset, y: frozenset) -> str:
    return "the same" if x == y else f"{len(x & y)} of {len(x | y)}"


def _shown(common: frozenset) -> str:
    items = sorted(common)
    return "; ".join(items[:3]) + (f"; and {len(items) - 3} more" if len(items) > 3 else "")

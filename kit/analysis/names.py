"""Names for a snapshot's streams and pools that stay the same across snapshots of one program.

Stream ids and pool ids are addresses and counters of one process: a second
run of the same program gives the same streams other ids. So every table,
verdict and command names them the same way, from what the snapshot itself
shows:

- a name the snapshot gives (the `kit` key of the kit's recorders), as is;
- the default stream (id 0) is "default stream";
- any other stream is named by the first user frame of its first allocation
  in the trace: "stream of capture_b (two_captures.py:41)". Two streams whose
  first allocations come from one frame are told apart by the order they
  first allocated ("... #2"). A stream with no allocation in the trace (or
  none with stack frames) gets a letter in the order the trace first uses it
  ("stream A"): stable only as long as that order is.
- the default pool (0, 0) is "default pool"; every other pool the snapshot
  does not name is a graph pool, numbered densely in the order its first
  segment was made ("graph pool 1", 2, ...; named pools take no number),
  pools older than the trace first, by id.

Lists of labels sort naturally (`natural_order`: "graph pool 2" before
"graph pool 10").

`generated_labels` says which labels the kit made up rather than read from the
snapshot, so output can say so. `resolve_stream` turns what a user typed (an
id as `table` prints it, its hex form, or a label) into a stream id.
"""

from __future__ import annotations

import re
import string
from collections.abc import Collection, Mapping

import numpy as np

from kit.allocator.rules import DEFAULT_POOL, DEFAULT_STREAM
from kit.analysis.frames import frame_line, is_user_frame
from kit.errors import KitError
from kit.load.columns import TraceColumns
from kit.load.rows import TRACE_ACTIONS
from kit.load.snapshot import Snapshot, per_snapshot

DEFAULT_STREAM_LABEL = "default stream"
DEFAULT_POOL_LABEL = "default pool"
# The names the kit's recorder gives vLLM's pool and streams (`kit["pools"]`, `kit["streams"]`), which
# figures and views pick out by name.
GRAPH_POOL_LABEL = "global graph pool"
MODEL_GRAPHS_LABEL = "model graphs"  # the model graphs' manager (CudaGraphManager)
SPECULATOR_GRAPHS_LABEL = "DFlash speculator graphs"  # the speculator's manager (DFlashCudaGraphManager)
MODEL_STREAM_LABEL = f"{MODEL_GRAPHS_LABEL} stream"  # a capture stream is named by its first known manager
REPLAY_STREAM_LABEL = "replay graphs stream"
SPECULATOR_STREAM_LABEL = f"{SPECULATOR_GRAPHS_LABEL} stream"
_ALLOC = TRACE_ACTIONS.index("alloc")
_DIGITS = re.compile(r"(\d+)")
_SEGMENT_ALLOC = TRACE_ACTIONS.index("segment_alloc")


def letters(i: int) -> str:
    """0 -> A, 25 -> Z, 26 -> AA: spreadsheet column names."""
    out = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        out = string.ascii_uppercase[r] + out
    return out


def user_frame(frames: object) -> str | None:
    """The first Python frame outside torch, as `name (file:line)`; None when there is none."""
    if not isinstance(frames, list):
        return None
    for f in frames:
        if is_user_frame(f):
            return frame_line([f])
    return None


def trace_stream_order(snapshot: Snapshot) -> list[int]:
    """The streams in the order the trace first uses them, every device in turn."""
    return list(_trace_stream_order(snapshot))


@per_snapshot
def _trace_stream_order(snapshot: Snapshot) -> tuple[int, ...]:
    order: dict[int, None] = {}
    for _, columns in sorted(snapshot.trace_columns.items()):
        first = np.sort(np.unique(columns.stream, return_index=True)[1])
        order.update(dict.fromkeys(columns.stream[first].tolist()))
    return tuple(order)


@per_snapshot
def _first_alloc_frames(snapshot: Snapshot) -> dict[int, str]:
    """Per stream, the user frame of its first allocation in the trace that has one."""
    out: dict[int, str] = {}
    for _, columns in sorted(snapshot.trace_columns.items()):
        allocs = np.flatnonzero(columns.action == _ALLOC)
        streams = columns.stream[allocs]
        for sid in np.unique(streams).tolist():
            if sid in out or sid == DEFAULT_STREAM:
                continue
            for i in allocs[streams == sid][:64].tolist():  # the first few: a stack-less entry is rare
                frame = user_frame(_frames_at(columns, i))
                if frame:
                    out[sid] = frame
                    break
    return out


def _frames_at(columns: TraceColumns, i: int) -> object:
    """Entry `i`'s frames, by its stack number where the trace has them (not making every entry's list)."""
    if columns.stack is not None and columns.stacks is not None:
        return columns.stacks.lists()[int(columns.stack[i])]
    return columns.frames[i]


def _all_streams(snapshot: Snapshot) -> list[int]:
    order: dict[int, None] = dict.fromkeys(trace_stream_order(snapshot))
    for sid in sorted(set(snapshot.columns.stream.tolist())):
        order.setdefault(sid, None)
    return list(order)


def stream_labels(snapshot: Snapshot, names: Mapping | None = None) -> dict[int, str]:
    """A label per stream of the snapshot: given names, then "default stream", then generated ones."""
    return _stream_labels(snapshot, names)[0]


def _stream_labels(snapshot: Snapshot, names: Mapping | None) -> tuple[dict[int, str], set[str]]:
    given = {**snapshot.stream_names, **(names or {})}
    frames = _first_alloc_frames(snapshot)
    labels: dict[int, str] = {}
    generated: set[str] = set()
    taken = set(given.values()) | {DEFAULT_STREAM_LABEL}
    letter = 0
    for sid in _all_streams(snapshot):
        if sid in given:
            labels[sid] = given[sid]
            continue
        if sid == DEFAULT_STREAM:
            labels[sid] = DEFAULT_STREAM_LABEL
            continue
        if sid in frames:
            label, n = f"stream of {frames[sid]}", 1
            while label in taken:
                n += 1
                label = f"stream of {frames[sid]} #{n}"
        else:
            label = f"stream {letters(letter)}"
            letter += 1
            while label in taken:
                label = f"stream {letters(letter)}"
                letter += 1
        labels[sid] = label
        taken.add(label)
        generated.add(label)
    return labels, generated


def pool_order(snapshot: Snapshot) -> list[tuple[int, int]]:
    """The graph pools in the order their first segment was made: older than the trace first, by id."""
    return list(_pool_order(snapshot))


@per_snapshot
def _pool_order(snapshot: Snapshot) -> tuple[tuple[int, int], ...]:
    c = snapshot.columns
    pools = c.pools()
    graph = [(a, p) for a, p in zip(c.address.tolist(), pools, strict=True) if p != DEFAULT_POOL]
    first_made: dict[tuple[int, int], int] = {}
    if graph:
        pool_at = dict(graph)
        for device, columns in sorted(snapshot.trace_columns.items()):
            made = np.flatnonzero(columns.action == _SEGMENT_ALLOC)
            for i, address in zip(made.tolist(), columns.addr[made].tolist(), strict=True):
                pool = pool_at.get(address)
                if pool is not None and pool not in first_made:
                    first_made[pool] = (device, i)
    before = sorted({p for _, p in graph} - set(first_made))
    return (*before, *sorted(first_made, key=first_made.__getitem__))


class FrozenMap(Mapping):
    """A read-only mapping that copies as itself: pandas deep-copies a table's `attrs` at every step."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping | None = None) -> None:
        self._data = dict(data or {})

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __copy__(self) -> FrozenMap:
        return self

    def __deepcopy__(self, memo: dict) -> FrozenMap:
        return self

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"


def pool_frames(snapshot: Snapshot) -> FrozenMap:
    """Per (device, graph pool): the user frames of the allocations the trace shows going into it, sorted (read-only).

    What went into a pool, as the program's own lines ("capture_first
    (two_captures.py:48)"): the same in two runs of one program whatever the
    pool's id, its place in the order pools were made, or the streams it was
    captured on. An allocation counts when its address lies in one of the
    pool's segments and comes after that segment was made in the trace (an
    earlier one at that address was another segment's). A pool older than the
    trace, or a snapshot without one, has none.
    """
    return _pool_frames(snapshot)


@per_snapshot
def _pool_frames(snapshot: Snapshot) -> FrozenMap:
    c = snapshot.columns
    graph = np.flatnonzero((c.pool_a != 0) | (c.pool_b != 0)) if len(c) else np.zeros(0, dtype=np.int64)
    found: dict[tuple[int, tuple[int, int]], set[str]] = {}
    for device, columns in sorted(snapshot.trace_columns.items()):
        mine = graph[c.device[graph] == device]
        if not len(mine) or not len(columns) or object in (c.address.dtype, columns.addr.dtype):
            continue  # an address past int64 (no allocator's): no frames rather than a slow walk
        mine = mine[np.argsort(c.address[mine], kind="stable")]
        starts = c.address[mine].astype(np.int64)
        ends = starts + c.total_size[mine].astype(np.int64)
        made_at = np.full(len(mine), -1, dtype=np.int64)  # the last segment_alloc of each segment's address
        made = np.flatnonzero(columns.action == _SEGMENT_ALLOC)
        at = np.searchsorted(starts, columns.addr[made].astype(np.int64))
        hit = at < len(starts)
        hit[hit] = starts[at[hit]] == columns.addr[made][hit]
        np.maximum.at(made_at, at[hit], made[hit])
        allocs = np.flatnonzero(columns.action == _ALLOC)
        addr = columns.addr[allocs].astype(np.int64)
        seg = np.searchsorted(starts, addr, side="right") - 1
        inside = seg >= 0
        inside[inside] = addr[inside] < ends[seg[inside]]
        inside[inside] = allocs[inside] > made_at[seg[inside]]
        entries = allocs[inside]
        if not len(entries):
            continue
        pools, pool_of = np.unique(np.stack([c.pool_a[mine], c.pool_b[mine]], axis=1), axis=0, return_inverse=True)
        codes = pool_of.reshape(-1)[seg[inside]]
        # One look per (pool, stack), not per allocation: a trace repeats a few stacks millions of times.
        if columns.stack is not None:  # numbered from 0
            stacks = np.asarray(columns.stack[entries], dtype=np.int64)
            n_stacks = int(stacks.max()) + 1 if stacks.min() >= 0 else 0
        else:  # entries of one stack share one list of frames
            stacks = np.fromiter(map(id, map(columns.frames.__getitem__, entries.tolist())), np.int64, len(entries))
            n_stacks = 0
        if 0 < n_stacks and len(pools) * n_stacks <= 1 << 24:  # no sort: one slot per (pool, stack)
            slots = np.full(len(pools) * n_stacks, -1, dtype=np.int64)
            slots[codes.astype(np.int64) * n_stacks + stacks] = np.arange(len(entries))
            first = slots[slots >= 0]
        else:
            distinct, stack_of = np.unique(stacks, return_inverse=True)
            _, first = np.unique(codes.astype(np.int64) * len(distinct) + stack_of.reshape(-1), return_index=True)
        lines: dict[int, str | None] = {}
        for i, code, stack in zip(entries[first].tolist(), codes[first].tolist(), stacks[first].tolist(), strict=True):
            if stack not in lines:
                lines[stack] = user_frame(_frames_at(columns, i))
            if lines[stack]:
                pool = (int(pools[code][0]), int(pools[code][1]))
                found.setdefault((device, pool), set()).add(lines[stack])
    return FrozenMap({key: tuple(sorted(lines)) for key, lines in sorted(found.items())})


def pool_labels(snapshot: Snapshot, names: Mapping | None = None) -> dict[tuple[int, int], str]:
    """A label per pool of the snapshot: given names, "default pool", then "graph pool 1", 2, ..."""
    return _pool_labels(snapshot, names)[0]


def _pool_labels(snapshot: Snapshot, names: Mapping | None) -> tuple[dict[tuple[int, int], str], set[str]]:
    given = {**snapshot.pool_names, **(names or {})}
    labels: dict[tuple[int, int], str] = {DEFAULT_POOL: given.get(DEFAULT_POOL, DEFAULT_POOL_LABEL)}
    generated: set[str] = set()
    n = 0
    for pool in pool_order(snapshot):
        if pool in given:
            labels[pool] = given[pool]
            continue
        n += 1  # counted over the unnamed graph pools only: numbers without gaps, in creation order
        labels[pool] = f"graph pool {n}"
        generated.add(labels[pool])
    return labels, generated


def natural_order(label: str) -> tuple:
    """A sort key that orders the numbers inside labels by value: "graph pool 2" before "graph pool 10"."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part.casefold()) for part in _DIGITS.split(label))


LETTERED = re.compile(r"stream [A-Z]+")  # a stream named by the order it appears: no frame to name it by


def naming_hint(labels: Collection[str]) -> str | None:
    """What to do when some streams are only lettered ("stream A"): record frames; None when none is."""
    lettered = sorted((x for x in labels if LETTERED.fullmatch(x)), key=natural_order)
    if not lettered:
        return None
    shown = ", ".join(lettered[:4]) + (f" and {len(lettered) - 4} more" if len(lettered) > 4 else "")
    return (
        f"{shown}: no stack frame in the trace names {'it' if len(lettered) == 1 else 'them'}; record with "
        "torch.cuda.memory._record_memory_history(stacks='python') from before the streams first allocate, and "
        "each is named by its first allocation's frame"
    )


def generated_labels(snapshot: Snapshot) -> set[str]:
    """The stream and pool labels the kit made up (the rest the snapshot itself gives, or are fixed)."""
    return _stream_labels(snapshot, None)[1] | _pool_labels(snapshot, None)[1]


def resolve_stream(snapshot: Snapshot, text: str, labels: Mapping[int, str] | None = None) -> int:
    """The stream id a user means: an id as `table` prints it, its hex form, or a label as `table` prints it."""
    labels = labels if labels is not None else stream_labels(snapshot)
    wanted = text.strip()
    by_label = {label.casefold(): sid for sid, label in labels.items()}
    if wanted.casefold() in by_label:
        return by_label[wanted.casefold()]
    if wanted.casefold() in ("default", "0"):
        return DEFAULT_STREAM
    for base in (10, 16):
        try:
            sid = int(wanted, base) if base == 10 else int(wanted.removeprefix("0x").removeprefix("0X"), 16)
        except ValueError:
            continue
        if sid in labels:
            return sid
    known = "; ".join(f"{label} ({sid}, {sid:#x})" for sid, label in labels.items())
    raise KitError(f"{snapshot.origin}: no stream {text!r}; give an id or a label as `table` prints it: {known}")

"""Columnar views of a snapshot: one numpy array per field of the segments, blocks and trace entries.

A DeepSeek-scale snapshot holds tens of thousands of segments, hundreds of
thousands of blocks and millions of trace entries. Building a `Segment`, a
`Block` or a `TraceEntry` object per row costs seconds; the tables, the trace
analysis and the pictures read these columns instead, and the typed records
are built only when someone asks for them.

Each builder checks the raw rows in bulk (types, signs, that blocks tile their
segment) with C-speed passes (`map`, `set`, numpy). Whatever those checks do
not accept goes row by row through the parsers of `kit.load.rows`, which raise
the same one-line `KitError` as always: the columns accept exactly what the
records accept, and hold the same values.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, repeat
from operator import itemgetter, methodcaller
from typing import Any, NamedTuple

import numpy as np

from kit.allocator.rules import DEFAULT_POOL, DEFAULT_STREAM, is_small_segment
from kit.errors import KitError
from kit.load.rows import (
    BLOCK_STATES,
    INT64_MAX,
    INT64_MIN,
    MAX_BYTES,
    MAX_DEVICE,
    MAX_DEVICE_BYTES,
    TRACE_ACTIONS,
    Segment,
    TraceEntry,
    check_no_overlap,
    parse_segment,
    parse_trace_entry,
)
from kit.load.unpickle import gc_paused

STATE_CODE = {s: i for i, s in enumerate(BLOCK_STATES)}  # 0 allocated, 1 pending free, 2 inactive
ACTION_CODE = {a: i for i, a in enumerate(TRACE_ACTIONS)}
ALLOCATED, PENDING, INACTIVE = 0, 1, 2


def _ints(values: list, *, minimum: int | None = 0, maximum: int | None = MAX_DEVICE_BYTES) -> np.ndarray | None:
    """`values` as int64 if every one is a plain int (no bool) in range; else None."""
    if values and set(map(type, values)) != {int}:
        return None
    try:
        out = np.fromiter(values, dtype=np.int64, count=len(values))
    except OverflowError:
        return None
    if out.size and ((minimum is not None and out.min() < minimum) or (maximum is not None and out.max() > maximum)):
        return None
    return out


def ints_or_objects(values: list) -> np.ndarray:
    """Python ints as int64, or as objects when one does not fit (an address beyond int64)."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array(values, dtype=object)


def _group_sums(values: np.ndarray, first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per group of consecutive rows (`first` row, `counts` rows): the sum, exactly, in int64."""
    csum = np.concatenate(([0], np.cumsum(values, dtype=np.int64)))
    return csum[first + counts] - csum[first]


class SegmentColumns:
    """The segments of a snapshot as arrays, and their blocks as arrays, in snapshot order.

    Per segment: `device`, `address`, `total_size`, `allocated_size`,
    `active_size`, `requested_size`, `stream`, `pool_a`, `pool_b` (the two ints
    of `segment_pool_id`), `small`, `expandable` (`is_expandable`), `free` and `largest_free` (as
    `Segment.free_size` and `Segment.largest_free`), `first_block`, `n_blocks`.
    Per block: `block_segment` (its segment's row), `block_address`,
    `block_size`, `block_requested`, `block_state` (0 allocated, 1 pending
    free, 2 inactive).
    """

    def __init__(self, fields: dict[str, np.ndarray], records: tuple[Segment, ...] | None = None) -> None:
        for name, value in fields.items():
            setattr(self, name, value)
        self.records = records  # set when the rows went through the row parser

    def __len__(self) -> int:
        return len(self.address)

    def pools(self) -> list[tuple[int, int]]:
        """`segment_pool_id` of each segment, as tuples."""
        return list(zip(self.pool_a.tolist(), self.pool_b.tolist(), strict=True))

    @classmethod
    def from_raw(cls, segments: list, origin: str) -> SegmentColumns:
        """Check and convert the raw segment dicts; errors are those of `kit.load.rows`."""
        with gc_paused():
            fast = _fast_segment_columns(segments)
            if fast is not None:
                return cls(fast)
            records = tuple(parse_segment(s, f"{origin}: segment {i}") for i, s in enumerate(segments))
            check_no_overlap(records, origin)
            return cls(_record_columns(records), records)


class _Missing:
    """Marks a key a dict does not have (None may be a present, wrong value)."""


_MISSING = _Missing()
_BLOCK_KEYS = itemgetter("address", "size", "requested_size", "state")


def _column(
    rows: list,
    key: str,
    default: np.ndarray | int | None,
    *,
    minimum: int | None = 0,
    maximum: int | None = MAX_DEVICE_BYTES,
) -> np.ndarray | None:
    """An int column of dicts `rows`; a missing key takes `default` (None: required)."""
    values = list(map(methodcaller("get", key, _MISSING), rows))
    kinds = set(map(type, values))
    if _Missing not in kinds:
        return _ints(values, minimum=minimum, maximum=maximum)
    if default is None or kinds - {int, _Missing}:
        return None
    missing = np.fromiter((type(v) is _Missing for v in values), dtype=bool, count=len(values))
    present = _ints(
        [0 if m else v for v, m in zip(values, missing.tolist(), strict=True)], minimum=minimum, maximum=maximum
    )
    if present is None:
        return None
    return np.where(missing, default, present)


def _fast_segment_columns(segments: list) -> dict[str, np.ndarray] | None:
    """Columns for well-formed torch segments, or None for anything unusual (the row parser decides)."""
    if segments and set(map(type, segments)) != {dict}:
        return None
    address, total = _column(segments, "address", None, maximum=None), _column(segments, "total_size", None)
    if address is None or total is None:
        return None
    blocks = _block_columns(segments, address, total)
    if blocks is None:
        return None
    fields = _segment_fields(segments, address, total, blocks)
    if fields is None:
        return None
    pools = _pool_columns(segments)
    if pools is None or _overlap(fields["device"], address, total):
        return None
    free, largest_free = _free_space(blocks, total, fields["active_size"])
    return {
        **fields,
        "pool_a": pools[0],
        "pool_b": pools[1],
        "small": _size_classes(segments, total),
        "expandable": np.fromiter((d.get("is_expandable") is True for d in segments), dtype=bool, count=len(segments)),
        "free": free,
        "largest_free": largest_free,
        "first_block": blocks.first,
        "n_blocks": blocks.counts,
        "block_segment": blocks.segment,
        "block_address": blocks.address,
        "block_size": blocks.size,
        "block_requested": blocks.requested,
        "block_state": blocks.state,
    }


class _Blocks(NamedTuple):
    """Every segment's blocks as columns, checked, in snapshot order."""

    counts: np.ndarray  # blocks per segment
    first: np.ndarray  # each segment's first block
    segment: np.ndarray  # each block's segment
    address: np.ndarray
    size: np.ndarray
    requested: np.ndarray
    state: np.ndarray  # a `STATE_CODE`


def _block_columns(segments: list, address: np.ndarray, total: np.ndarray) -> _Blocks | None:
    """The blocks as columns if every one is well-formed and they tile their segments; else None."""
    listed = _block_lists(segments)
    if listed is None:
        return None
    counts, blocks = listed
    fields = _block_fields(blocks)
    if fields is None:
        return None
    addresses, sizes, requested, states = fields
    size = _ints(sizes)
    try:
        codes = list(map(STATE_CODE.get, states))
    except TypeError:  # a state that is not even hashable
        return None
    if size is None or None in codes:
        return None
    first = np.zeros(len(segments), dtype=np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    segment = np.repeat(np.arange(len(segments), dtype=np.int64), counts)
    block_address = _tiled_addresses(addresses, address, total, size, first, counts, segment)
    block_requested = _requested_sizes(requested, sizes)
    if block_address is None or block_requested is None:
        return None
    state = np.array(codes, dtype=np.int8)
    return _Blocks(counts, first, segment, block_address, size, block_requested, state)


def _block_lists(segments: list) -> tuple[np.ndarray, list[dict]] | None:
    """How many blocks each segment lists, and all the block dicts in one list; None if not lists of dicts."""
    blocks_of = list(map(methodcaller("get", "blocks", _MISSING), segments))
    if set(map(type, blocks_of)) - {list}:
        return None  # missing, None or tuples: the row parser reads those
    counts = np.fromiter(map(len, blocks_of), dtype=np.int64, count=len(segments))
    blocks = list(chain.from_iterable(blocks_of))
    if blocks and set(map(type, blocks)) != {dict}:
        return None
    return counts, blocks


def _block_fields(blocks: list[dict]) -> tuple[list, list, list, list] | None:
    """Each block's address, size, requested size and state, as read (`_MISSING` or None where absent)."""
    try:  # one pass over the block dicts when they have every key, as torch writes them
        flat = list(chain.from_iterable(map(_BLOCK_KEYS, blocks)))
        return flat[0::4], flat[1::4], flat[2::4], flat[3::4]
    except KeyError:
        try:
            sizes, states = list(map(itemgetter("size"), blocks)), list(map(itemgetter("state"), blocks))
        except KeyError:
            return None
        addresses = list(map(methodcaller("get", "address", _MISSING), blocks))
        return addresses, sizes, list(map(methodcaller("get", "requested_size"), blocks)), states


def _tiled_addresses(
    addresses: list,
    address: np.ndarray,
    total: np.ndarray,
    size: np.ndarray,
    first: np.ndarray,
    counts: np.ndarray,
    segment: np.ndarray,
) -> np.ndarray | None:
    """The blocks' addresses if blocks tile their segments, else None; blocks listed without one get theirs."""
    # Each block starts where the one before it in its segment ended, and together they fill the segment.
    before = np.cumsum(size, dtype=np.int64) - size
    expected = address[segment] + before - before[first[segment]]
    if addresses and set(map(type, addresses)) == {_Missing}:
        block_address = expected
    else:
        block_address = _ints(addresses, maximum=None)
        if block_address is None or not np.array_equal(block_address, expected):
            return None
    with_blocks = counts > 0
    if not np.array_equal(_group_sums(size, first, counts)[with_blocks], total[with_blocks]):
        return None
    return block_address


def _requested_sizes(requested: list, sizes: list) -> np.ndarray | None:
    """The blocks' requested sizes; as the row parser, anything but an int means "the block's size"."""
    out = _ints(requested)
    if out is None:
        out = _ints([r if type(r) is int else s for r, s in zip(requested, sizes, strict=True)])
    return out


def _segment_fields(
    segments: list, address: np.ndarray, total: np.ndarray, blocks: _Blocks
) -> dict[str, np.ndarray] | None:
    """The segments' int fields; sizes torch leaves out are summed from the blocks. None if one is malformed."""
    allocated = _group_sums(np.where(blocks.state == ALLOCATED, blocks.size, 0), blocks.first, blocks.counts)
    pending = _group_sums(np.where(blocks.state == PENDING, blocks.size, 0), blocks.first, blocks.counts)
    fields = {
        "device": _column(segments, "device", 0, maximum=MAX_DEVICE),
        "address": address,
        "total_size": total,
        "allocated_size": _column(segments, "allocated_size", allocated),
        "active_size": _column(segments, "active_size", allocated + pending),
        "requested_size": _column(segments, "requested_size", 0),
        "stream": _column(segments, "stream", DEFAULT_STREAM, minimum=None, maximum=None),
    }
    return None if any(v is None for v in fields.values()) else fields


def _pool_columns(segments: list) -> tuple[np.ndarray, np.ndarray] | None:
    """The two ints of every segment's `segment_pool_id`, as two columns; None if one is not a pair of ints."""
    pools = list(map(methodcaller("get", "segment_pool_id", DEFAULT_POOL), segments))
    if set(map(type, pools)) - {tuple, list} or set(map(len, pools)) - {2}:
        return None
    pool_a, pool_b = _ints([p[0] for p in pools], maximum=None), _ints([p[1] for p in pools], maximum=None)
    return None if pool_a is None or pool_b is None else (pool_a, pool_b)


_SEGMENT_TYPES = ("small", "large")


def _size_classes(segments: list, total: np.ndarray) -> np.ndarray:
    """Whether each segment is a small one: its `segment_type`, or its size where that is missing or odd."""
    types = list(map(methodcaller("get", "segment_type"), segments))
    return np.fromiter(
        (
            t == "small" if t in _SEGMENT_TYPES else is_small_segment(size)
            for t, size in zip(types, total.tolist(), strict=True)
        ),
        dtype=bool,
        count=len(segments),
    )


def _free_space(blocks: _Blocks, total: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per segment: its free bytes and its largest free block (`Segment.free_size`, `Segment.largest_free`)."""
    inactive_size = np.where(blocks.state == INACTIVE, blocks.size, 0)
    with_blocks = blocks.counts > 0
    unblocked = total - active  # a segment listed without its blocks
    largest = unblocked.copy()
    if blocks.size.size:
        largest[with_blocks] = np.maximum.reduceat(inactive_size, blocks.first[with_blocks])
    free = np.where(with_blocks, _group_sums(inactive_size, blocks.first, blocks.counts), unblocked)
    return free, largest


def _overlap(device: np.ndarray, address: np.ndarray, total: np.ndarray) -> bool:
    """Whether two segments of one device share an address, or all of them reserve more than anything holds."""
    order = np.lexsort((address, device))
    d, a, t = device[order], address[order], total[order]
    return bool(np.any((d[1:] == d[:-1]) & (a[:-1] + t[:-1] > a[1:]))) or sum(total.tolist()) > MAX_BYTES


def _record_columns(records: tuple[Segment, ...]) -> dict[str, np.ndarray]:
    """The same columns, from parsed records (the path for unusual input)."""
    counts = np.array([len(s.blocks) for s in records], dtype=np.int64)
    blocks = [b for s in records for b in s.blocks]
    return {
        "device": ints_or_objects([s.device for s in records]),
        "address": ints_or_objects([s.address for s in records]),
        "total_size": ints_or_objects([s.total_size for s in records]),
        "allocated_size": ints_or_objects([s.allocated_size for s in records]),
        "active_size": ints_or_objects([s.active_size for s in records]),
        "requested_size": ints_or_objects([s.requested_size for s in records]),
        "stream": ints_or_objects([s.stream for s in records]),
        "pool_a": ints_or_objects([s.segment_pool_id[0] for s in records]),
        "pool_b": ints_or_objects([s.segment_pool_id[1] for s in records]),
        "small": np.array([s.segment_type == "small" for s in records], dtype=bool),
        "expandable": np.array([s.is_expandable for s in records], dtype=bool),
        "free": ints_or_objects([s.free_size for s in records]),
        "largest_free": ints_or_objects([s.largest_free for s in records]),
        "first_block": np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64) if len(counts) else counts,
        "n_blocks": counts,
        "block_segment": np.repeat(np.arange(len(records), dtype=np.int64), counts),
        "block_address": ints_or_objects([b.address for b in blocks]),
        "block_size": ints_or_objects([b.size for b in blocks]),
        "block_requested": ints_or_objects([b.requested_size for b in blocks]),
        "block_state": np.array([STATE_CODE[b.state] for b in blocks], dtype=np.int8),
    }


class Stacks:
    """Every distinct frame and every distinct stack (a list of frames) of a trace, each kept once.

    A trace of millions of entries names a few thousand call stacks, built of
    a few hundred frames that torch shares between them. An entry keeps only
    the number of its stack. Stacks are recognised by the frame objects they
    hold (torch shares frame dicts, and the unpickler keeps that sharing), so
    telling an entry's stack costs no look at a frame's contents; frames of
    equal contents are then stored once all the same. Stacks and frames are
    read back (`lists`) as lists of the frame objects, one list per stack,
    shared by every entry with that stack.
    """

    MAX_FRAME_OBJECTS = 1_000_000  # past this many distinct frame objects, frames are not shared: give up

    def __init__(self, frames: list | None = None, stacks: list[tuple[int, ...]] | None = None) -> None:
        self.frames: list = frames if frames is not None else []  # the distinct frames
        self.stacks: list[tuple[int, ...]] = stacks if stacks is not None else [()]  # frame numbers; 0: none
        self._lists: list[list] | None = None
        # Look-ups while a trace is read: frame objects by id (kept alive, so no id is reused), stacks by contents.
        self._kept: list = []
        self._frame_of_id: dict[int, int] = {}
        self._frame_of_value: dict = {}
        self._stack_of_ids: dict[bytes, int] = {b"": 0}
        self._stack_of_frames: dict[tuple[int, ...], int] = {stack: i for i, stack in enumerate(self.stacks)}

    def numbers(self, frames: list) -> np.ndarray | None:
        """The stack number of each entry's frames (anything but a list reads as none); None: too many frames."""
        if frames and set(map(type, frames)) != {list}:
            frames = [f if type(f) is list else [] for f in frames]
        # Each entry's key: the ids of its frame objects, as bytes (made for all entries at once, then sliced).
        lengths = np.fromiter(map(len, frames), dtype=np.int64, count=len(frames))
        ends = np.cumsum(lengths) * 8
        ids = _ids(chain.from_iterable(frames), int(ends[-1]) // 8 if len(ends) else 0)
        keys = list(map(ids.__getitem__, map(slice, (ends - lengths * 8).tolist(), ends.tolist())))
        known = self._stack_of_ids
        numbers = list(map(known.get, keys))
        if None in numbers:
            for key, stack in zip(keys, frames, strict=True):
                if key not in known:
                    number = self._add(stack)
                    if number is None:
                        return None
                    known[key] = number
            numbers = list(map(known.__getitem__, keys))
        return np.array(numbers, dtype=np.int32)

    def _add(self, stack: list) -> int | None:
        """The number of a stack whose frame objects come together for the first time; None: too many frames."""
        indices = []
        for frame in stack:
            index = self._frame_of_id.get(id(frame))
            if index is None:
                if len(self._kept) >= self.MAX_FRAME_OBJECTS:
                    return None
                index = self._frame_of_value.setdefault(_frame_key(frame), len(self.frames))
                if index == len(self.frames):
                    self.frames.append(frame)
                self._frame_of_id[id(frame)] = index
                self._kept.append(frame)
            indices.append(index)
        key = tuple(indices)
        number = self._stack_of_frames.get(key)
        if number is None:
            number = self._stack_of_frames[key] = len(self.stacks)
            self.stacks.append(key)
        return number

    def finish(self) -> None:
        """Drop the look-ups of `numbers` and the frame objects they kept alive: the table is complete."""
        self._kept, self._frame_of_id, self._frame_of_value, self._stack_of_ids = [], {}, {}, {b"": 0}

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The stacks as two arrays: where each stack's frame numbers start in the second, and all of them."""
        if "_stored" in self.__dict__:
            return self._stored[1], self._stored[2]
        lengths = np.fromiter(map(len, self.stacks), dtype=np.int64, count=len(self.stacks))
        starts = np.zeros(len(self.stacks) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        flat = np.fromiter(chain.from_iterable(self.stacks), dtype=np.int32, count=int(starts[-1]))
        return starts, flat

    @classmethod
    def from_arrays(cls, frames: Any, starts: np.ndarray, flat: np.ndarray, decode: Callable[[Any], list]) -> Stacks:
        """Stacks read back from `arrays()` and the frames as stored (`decode(frames)` gives the list on first use)."""
        stacks = cls.__new__(cls)
        stacks._lists = None
        stacks._stored = (frames, starts, flat, decode)
        return stacks

    def lists(self) -> list[list]:
        """Each stack as a list of its frames (made once, shared by the entries that have it)."""
        if self._lists is None:
            stored = self.__dict__.pop("_stored", None)
            if stored is not None:
                encoded, starts, flat, decode = stored
                frames = decode(encoded)
                numbers, ends = flat.tolist(), starts.tolist()
                if any(not 0 <= i < len(frames) for i in set(numbers)):
                    raise KitError("a cached stack names a frame the cache does not hold")
                self.frames = frames
                self.stacks = [tuple(numbers[a:b]) for a, b in zip(ends[:-1], ends[1:], strict=True)]
            frames = self.frames
            self._lists = [[frames[i] for i in stack] for stack in self.stacks]
        return self._lists


def _ids(objects: Iterable, count: int) -> bytes:
    """`id()` of each of `count` objects, as 8-byte integers, in one bytes object.

    In CPython an object's id is its address, and a numpy array of objects
    holds exactly those addresses: read them at once rather than calling
    `id()` tens of millions of times (a third of the time).
    """
    if sys.implementation.name != "cpython" or np.dtype(np.intp).itemsize != 8:
        return np.fromiter(map(id, objects), dtype=np.int64, count=count).tobytes()
    held = np.fromiter(objects, dtype=object, count=count)
    return bytes((ctypes.c_char * (8 * count)).from_address(held.ctypes.data)) if count else b""


def _frame_key(frame: object) -> object:
    """What makes two frames equal: their type and contents; a frame that cannot be hashed stands alone."""
    try:
        if type(frame) is dict:
            key = (dict, tuple((k, type(v), v) for k, v in frame.items()))
        else:
            key = (type(frame), frame)
        hash(key)
    except TypeError:
        return ("unhashable", id(frame))
    return key


class TraceView(Sequence):
    """One device's trace read off its columns as `TraceEntry` records, each made when it is read.

    For the simulations that step through a trace (what-if, the rewind): the
    typed records of `Snapshot.traces` parse every entry from the file again
    and keep them all, several times the columns' memory. An action the kit
    does not know reads as "" (every walk skips it); `device_free`,
    `compile_context` and `user_metadata` read as None.
    """

    __slots__ = ("_acts", "_addr", "_device", "_frames", "_size", "_stream", "_time")

    def __init__(self, columns: TraceColumns) -> None:
        names = (*TRACE_ACTIONS, "")  # index -1: an action the kit does not know
        self._device = columns.device
        self._acts = [names[a] for a in columns.action.tolist()]
        self._addr, self._size = columns.addr.tolist(), columns.size.tolist()
        self._stream, self._time = columns.stream.tolist(), columns.time_us.tolist()
        frames = columns.frames
        self._frames = frames if set(map(type, frames)) <= {list} else [f if type(f) is list else [] for f in frames]

    def __len__(self) -> int:
        return len(self._acts)

    def fields(self) -> tuple[list[str], list[int], list[int], list[int]]:
        """Every entry's action, address, size and stream, as four lists: for a hot loop that makes no record."""
        return self._acts, self._addr, self._size, self._stream

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return TraceEntry(
            self._device, self._acts[i], self._addr[i], self._size[i], self._stream[i], self._time[i], self._frames[i]
        )

    def __iter__(self) -> Iterator[TraceEntry]:
        device = repeat(self._device)
        fields = (device, self._acts, self._addr, self._size, self._stream, self._time, self._frames)
        return map(TraceEntry, *fields)


class TraceColumns:
    """One device's trace as arrays: `action` (an index into `TRACE_ACTIONS`, -1 for another), `addr`, `size`,
    `stream`, `time_us`, and each entry's `frames`.

    `time_us` is int64, or objects when some entries have none. `frames` is a
    list of each entry's frames as stored (a list, or anything else where
    `TraceEntry.frames` reads `[]`). A trace read from a file (streamed, or
    from the cache) keeps instead each entry's stack number (`stack`) and its
    `Stacks`; `frames` is then made on first use, every entry with one stack
    sharing one list, and anything but a list reads as `[]`.
    """

    def __init__(self, device: int, fields: dict, stacks: Stacks | None = None) -> None:
        self.device = device
        self.action: np.ndarray = fields["action"]
        self.addr: np.ndarray = fields["addr"]
        self.size: np.ndarray = fields["size"]
        self.stream: np.ndarray = fields["stream"]
        self.time_us: np.ndarray = fields["time_us"]
        self.stack: np.ndarray | None = fields.get("stack")
        self.stacks = stacks
        self._frames: list | None = fields.get("frames")

    @property
    def frames(self) -> list:
        if self._frames is None:
            self._frames = list(map(self.stacks.lists().__getitem__, self.stack.tolist()))
        return self._frames

    def __len__(self) -> int:
        return len(self.action)


_GET_ACTION = methodcaller("get", "action")
_GET_ADDR = methodcaller("get", "addr", 0)
_GET_SIZE = methodcaller("get", "size", 0)
_GET_STREAM = methodcaller("get", "stream", DEFAULT_STREAM)
_GET_TIME = methodcaller("get", "time_us")
_GET_FRAMES = methodcaller("get", "frames")
_GET_FREE = methodcaller("get", "device_free")
_TRACE_KEYS = itemgetter("action", "addr", "size", "stream", "time_us", "frames")


def _trace_fields(entries: list) -> tuple[list, ...]:
    """The six fields of every entry, read in one pass over the dicts (they are scattered in memory)."""
    try:
        flat = list(chain.from_iterable(map(_TRACE_KEYS, entries)))
    except KeyError:  # an older torch leaves some keys out: read each with its default
        return tuple(
            list(map(get, entries)) for get in (_GET_ACTION, _GET_ADDR, _GET_SIZE, _GET_STREAM, _GET_TIME, _GET_FRAMES)
        )
    return tuple(flat[k::6] for k in range(6))


def _fast_trace_columns(entries: list, *, newer_actions: bool = False) -> dict | None:
    """Columns when every entry is a well-formed dict (`kit.load.rows.parse_trace_entry`'s fast path); else None.

    `device_free` (only `oom` entries carry it) is not a column, but it is
    checked as the row parser checks it. With `newer_actions`, an action
    this kit does not know (a name) reads as -1, as the row parser reads it.
    """
    if not entries:
        empty = np.zeros(0, dtype=np.int64)
        return {
            "action": np.zeros(0, dtype=np.int8),
            "addr": empty,
            "size": empty,
            "stream": empty,
            "time_us": empty,
            "frames": [],
        }
    if set(map(type, entries)) != {dict}:
        return None
    actions, addrs, sizes, streams, times, frames = _trace_fields(entries)
    try:
        codes = list(map(ACTION_CODE.get, actions))
    except TypeError:  # an action that is not even hashable: the row parser says what it is
        return None
    if None in codes and newer_actions:
        codes = [-1 if c is None and type(a) is str and a else c for c, a in zip(codes, actions, strict=True)]
    if None in codes:
        return None
    action = np.array(codes, dtype=np.int8)
    free = list(map(_GET_FREE, entries))
    if free.count(None) != len(free):
        if _ints([f for f in free if f is not None], minimum=INT64_MIN, maximum=INT64_MAX) is None:
            return None
    addr, size = _ints(addrs, maximum=None), _ints(sizes)
    stream = _ints(streams, minimum=None, maximum=None)
    time_us = _time_column(times)
    if addr is None or size is None or stream is None or time_us is None:
        return None
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": time_us, "frames": frames}


def incremental_trace_columns(entries: list, stacks: Stacks) -> dict | None:
    """A batch of a trace read from a file, as columns and each entry's stack number in `stacks`; None if unusual.

    The checks are `_fast_trace_columns`'s, and an action this kit does not
    know reads as -1 (the row parser's reading): the batches of a trace
    together give the columns `trace_columns_of` gives the whole trace.
    """
    fields = _fast_trace_columns(entries, newer_actions=True)
    if fields is None:
        return None
    stack = stacks.numbers(fields.pop("frames"))
    if stack is None:
        return None
    fields["stack"] = stack
    return fields


def _time_column(times: list) -> np.ndarray | None:
    """The entries' times: int64, or objects when some entries have none; None if one is not an int64."""
    kinds = set(map(type, times))
    if kinds == {int}:
        return _ints(times, minimum=None, maximum=None)
    if not kinds <= {int, type(None)} or _ints([t for t in times if t is not None], minimum=None, maximum=None) is None:
        return None
    return np.array(times, dtype=object)


def _entry_columns(entries: tuple[TraceEntry, ...]) -> dict:
    """The same columns, from parsed entries (the path for unusual input)."""
    times = [e.time_us for e in entries]
    return {
        "action": np.array([ACTION_CODE.get(e.action, -1) for e in entries], dtype=np.int8),
        "addr": ints_or_objects([e.addr for e in entries]),
        "size": ints_or_objects([e.size for e in entries]),
        "stream": ints_or_objects([e.stream for e in entries]),
        "time_us": ints_or_objects(times) if None not in times else np.array(times, dtype=object),
        "frames": [e.frames for e in entries],
    }


def trace_columns_of(
    traces: list, origin: str, *, done: dict[int, TraceColumns] | None = None
) -> dict[int, TraceColumns]:
    """Every device's trace as columns; a malformed entry raises the row parser's one-line error.

    `done`: devices whose columns were made already (streamed from the file: `kit.load.incremental`).
    """
    out = {}
    with gc_paused():
        for device, entries in enumerate(traces):
            if done and device in done:
                out[device] = done[device]
                continue
            fields = _fast_trace_columns(entries)
            if fields is None:  # the row parser raises the one-line error, or reads what it can
                fields = _entry_columns(tuple(parse_trace_entry(e, device, origin, i) for i, e in enumerate(entries)))
            out[device] = TraceColumns(device, fields)
    return out

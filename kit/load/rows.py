"""The snapshot format, row by row: its field names and limits, typed records, and the row parsers.

A snapshot is the dict `torch.cuda.memory._snapshot()` returns: the segments
the caching allocator holds (each with its blocks), and, when memory history
was recorded, one trace of allocator events per device. The parsers here turn
one raw row (a segment dict, a trace entry dict, a capture window of the
kit's own metadata) into a `Segment`, `Block`, `TraceEntry` or checked dict,
and raise a one-line `KitError` naming the row for anything a GPU could not
have written: a segment, block or trace entry larger than any GPU holds
(`MAX_DEVICE_BYTES`), addresses past 64 bits, blocks that do not tile their
segment, segments that overlap.

Snapshots from every torch since 2.0 read: keys that older versions lack
(`device_traces`, `allocator_settings`, `external_annotations`, a trace
entry's `stream`, `time_us`, `compile_context`, `user_metadata`, `pool_id`, a
block's `address`, a segment's `is_expandable`) are optional, keys a newer
torch adds are ignored, and so are trace actions a newer torch adds
(`annotate` in 2.14).

`kit.load.columns` checks whole snapshots in bulk and falls back to these
parsers for any row its bulk checks do not take, so both accept exactly the
same input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kit.allocator.rules import DEFAULT_POOL, DEFAULT_STREAM, is_small_segment
from kit.errors import KitError, describe

BLOCK_STATES = ("active_allocated", "active_pending_free", "inactive")
STATE_ALIASES = {"active_awaiting_free": "active_pending_free"}  # the name torch's docstring uses
TRACE_ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
    "annotate",
)
# One size above 4 TiB is corruption: far above any GPU's memory (an H200 holds 141 GB),
# with room for years of larger parts.
MAX_DEVICE_BYTES = 4 << 40
MAX_BYTES = 1 << 50  # the segments of all devices together: above 1 PiB is corruption
MAX_ADDRESS = (1 << 64) - 1
MAX_DEVICE = 1 << 10
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # torch writes stream ids and times as int64


@dataclass(frozen=True, slots=True)
class Block:
    address: int
    size: int
    requested_size: int
    state: str
    frames: list = field(default_factory=list, repr=False)

    @property
    def is_free(self) -> bool:
        return self.state == "inactive"


@dataclass(frozen=True, slots=True)
class Segment:
    device: int
    address: int
    total_size: int
    allocated_size: int
    active_size: int
    requested_size: int
    stream: int
    segment_type: str
    segment_pool_id: tuple[int, int]
    is_expandable: bool
    blocks: tuple[Block, ...]
    frames: list = field(default_factory=list, repr=False)

    @property
    def free_size(self) -> int:
        """Bytes in inactive blocks: reserved but neither allocated nor pending."""
        if not self.blocks:
            return self.total_size - self.active_size
        return sum(b.size for b in self.blocks if b.state == "inactive")

    @property
    def largest_free(self) -> int:
        sizes = [b.size for b in self.blocks if b.state == "inactive"]
        if not self.blocks:
            return self.total_size - self.active_size
        return max(sizes, default=0)


class TraceEntry(NamedTuple):
    """One allocator event. A NamedTuple: traces run to millions of entries."""

    device: int
    action: str
    addr: int
    size: int
    stream: int
    time_us: int | None
    frames: list = []  # noqa: RUF012 - never mutated; a NamedTuple default
    device_free: int | None = None
    compile_context: Any = None
    user_metadata: Any = None


def _int(
    d: dict,
    key: str,
    where: str,
    default: int | None = None,
    *,
    minimum: int | None = 0,
    maximum: int = MAX_DEVICE_BYTES,
) -> int:
    value = d.get(key, default)
    if value is None and default is None and key not in d:
        raise KitError(f"{where}: missing '{key}'")
    if isinstance(value, bool) or not isinstance(value, int):
        raise KitError(f"{where}: '{key}' is {describe(value)}, expected an integer")
    if minimum is not None and value < minimum:
        what = "negative" if minimum == 0 else f"below {minimum}"
        raise KitError(f"{where}: '{key}' is {what} ({describe(value)})")
    if value > maximum:
        if maximum == MAX_DEVICE_BYTES:
            raise KitError(too_large(where, key, value))
        raise KitError(f"{where}: '{key}' is {describe(value)}, above the largest possible ({maximum})")
    return value


def too_large(where: str, key: str, value: int) -> str:
    """The one-line refusal of a size in bytes above `MAX_DEVICE_BYTES`."""
    return f"{where}: {key} {describe(value)} is more than any GPU holds (limit {MAX_DEVICE_BYTES >> 40} TiB)"


def _stream(d: dict, key: str, where: str) -> int:
    return _int(d, key, where, default=DEFAULT_STREAM, minimum=INT64_MIN, maximum=INT64_MAX)


def _list(d: dict, key: str, where: str) -> list:
    value = d.get(key, [])
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise KitError(f"{where}: '{key}' is {describe(value)}, expected a list")
    return list(value)


def is_pool(pool: Any) -> bool:
    return (
        isinstance(pool, list | tuple)
        and len(pool) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_ADDRESS for x in pool)
    )


def _pool_id(seg: dict, where: str) -> tuple[int, int]:
    pool = seg.get("segment_pool_id", DEFAULT_POOL)
    if not is_pool(pool):
        raise KitError(f"{where}: 'segment_pool_id' is {describe(pool)}, expected two integers")
    return (pool[0], pool[1])


def _frames(d: dict) -> list:
    frames = d.get("frames")
    return frames if isinstance(frames, list) else []


def _parse_block(b: Any, offset_address: int, where: str) -> Block:
    if not isinstance(b, dict):
        raise KitError(f"{where}: is {describe(b)}, expected a dict")
    size = _int(b, "size", where)
    state = b.get("state")
    state = STATE_ALIASES.get(state, state) if isinstance(state, str) else state
    if state not in BLOCK_STATES:
        raise KitError(f"{where}: unknown block state {describe(state)}")
    address = _int(b, "address", where, default=offset_address, maximum=MAX_ADDRESS)
    requested = b.get("requested_size", size)
    if isinstance(requested, bool) or not isinstance(requested, int) or not 0 <= requested <= MAX_DEVICE_BYTES:
        requested = size
    return Block(address, size, requested, state, _frames(b))


def parse_segment(s: Any, where: str) -> Segment:
    if not isinstance(s, dict):
        raise KitError(f"{where}: is {describe(s)}, expected a dict")
    address = _int(s, "address", where, maximum=MAX_ADDRESS)
    total = _int(s, "total_size", where)
    if address + total > MAX_ADDRESS + 1:
        raise KitError(f"{where}: runs past the end of the address space")
    blocks = []
    cursor = address
    for j, b in enumerate(_list(s, "blocks", where)):
        block = _parse_block(b, cursor, f"{where} block {j}")
        if block.address != cursor:
            raise KitError(f"{where} block {j}: starts at {block.address:#x}, expected {cursor:#x}")
        cursor += block.size
        if cursor > address + total:
            raise KitError(f"{where} block {j}: ends {cursor - address - total} bytes past its {total}-byte segment")
        blocks.append(block)
    if blocks and cursor != address + total:
        raise KitError(f"{where}: blocks cover {cursor - address} bytes of a {total}-byte segment")
    allocated = sum(b.size for b in blocks if b.state == "active_allocated")
    active = allocated + sum(b.size for b in blocks if b.state == "active_pending_free")
    segment_type = s.get("segment_type")
    if segment_type not in ("small", "large"):
        segment_type = "small" if is_small_segment(total) else "large"
    return Segment(
        device=_int(s, "device", where, default=0, maximum=MAX_DEVICE),
        address=address,
        total_size=total,
        allocated_size=_int(s, "allocated_size", where, default=allocated),
        active_size=_int(s, "active_size", where, default=active),
        requested_size=_int(s, "requested_size", where, default=0),
        stream=_stream(s, "stream", where),
        segment_type=segment_type,
        segment_pool_id=_pool_id(s, where),
        is_expandable=s.get("is_expandable") is True,
        blocks=tuple(blocks),
        frames=_frames(s),
    )


def check_no_overlap(segments: tuple[Segment, ...], origin: str) -> None:
    """Segments of one device never share an address: the allocator's reservations are disjoint."""
    order = sorted(range(len(segments)), key=lambda i: (segments[i].device, segments[i].address))
    for before, after in zip(order, order[1:], strict=False):
        a, b = segments[before], segments[after]
        if a.device == b.device and a.address + a.total_size > b.address:
            raise KitError(f"{origin}: segment {after} ({b.address:#x}) overlaps segment {before} ({a.address:#x})")
    total = sum(s.total_size for s in segments)
    if total > MAX_BYTES:
        raise KitError(f"{origin}: its segments reserve {total} bytes in all, more than any GPU holds")


def _optional_int(d: dict, key: str, where: str) -> int | None:
    if d.get(key) is None:
        return None
    return _int(d, key, where, minimum=INT64_MIN, maximum=INT64_MAX)


_ACTIONS = frozenset(TRACE_ACTIONS)


def parse_trace_entry(e: Any, device: int, origin: str, index: int) -> TraceEntry:
    if type(e) is dict:  # the fast path: a well-formed entry, checked field by field
        action, addr, size = e.get("action"), e.get("addr", 0), e.get("size", 0)
        stream, time_us, frames = e.get("stream", DEFAULT_STREAM), e.get("time_us"), e.get("frames")
        if (
            type(action) is str
            and action in _ACTIONS
            and type(addr) is int
            and type(size) is int
            and type(stream) is int
            and 0 <= addr <= MAX_ADDRESS
            and 0 <= size <= MAX_DEVICE_BYTES
            and INT64_MIN <= stream <= INT64_MAX
            and (time_us is None or (type(time_us) is int and INT64_MIN <= time_us <= INT64_MAX))
            and "device_free" not in e
        ):
            return TraceEntry(
                device,
                action,
                addr,
                size,
                stream,
                time_us,
                frames if type(frames) is list else [],
                None,
                e.get("compile_context"),
                e.get("user_metadata"),
            )
    return _parse_trace_entry_checked(e, device, f"{origin}: trace {device} entry {index}")


def _parse_trace_entry_checked(e: Any, device: int, where: str) -> TraceEntry:
    if not isinstance(e, dict):
        raise KitError(f"{where}: is {describe(e)}, expected a dict")
    action = e.get("action")
    if not isinstance(action, str) or not action:
        raise KitError(f"{where}: action is {describe(action)}, expected a name such as 'alloc'")
    # An action this kit does not know is a newer torch's: kept, and skipped by the analyses.
    return TraceEntry(
        device=device,
        action=action,
        addr=_int(e, "addr", where, default=0, maximum=MAX_ADDRESS),
        size=_int(e, "size", where, default=0),
        stream=_stream(e, "stream", where),
        time_us=_optional_int(e, "time_us", where),
        frames=_frames(e),
        device_free=_optional_int(e, "device_free", where),
        compile_context=e.get("compile_context"),
        user_metadata=e.get("user_metadata"),
    )


def capture_window(c: Any, where: str) -> dict:
    """One graph's capture window from the `captures` list of the snapshot's `kit` key, checked."""
    if not isinstance(c, dict):
        raise KitError(f"{where}: is {describe(c)}, expected a dict")
    graph = c.get("graph")
    if not isinstance(graph, str) or not graph:
        raise KitError(f"{where}: 'graph' is {describe(graph)}, expected a name")
    begin = _int(c, "trace_begin", where, maximum=INT64_MAX)
    end = _int(c, "trace_end", where, maximum=INT64_MAX)
    if end < begin:
        raise KitError(f"{where}: ends (trace index {end}) before it begins ({begin})")
    pool = c.get("pool")
    if not is_pool(pool):
        raise KitError(f"{where}: 'pool' is {describe(pool)}, expected two integers")
    window = {
        **c,
        "graph": graph,
        "trace_begin": begin,
        "trace_end": end,
        "pool": [pool[0], pool[1]],
        "stream": _stream(c, "stream", where),
    }
    for key in ("capture", "manager"):
        if not isinstance(window.get(key, graph), str):
            raise KitError(f"{where}: '{key}' is {describe(window[key])}, expected a name")
    size = window.get("size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int)):
        raise KitError(f"{where}: 'size' is {describe(size)}, expected an integer or null")
    return window

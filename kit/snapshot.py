"""Allocator snapshots: loading them safely and reading them as typed records.

A snapshot is the dict `torch.cuda.memory._snapshot()` returns: the segments
the caching allocator holds (each with its blocks), and, when memory history
was recorded, one trace of allocator events per device. This module loads one
from three places and normalises it into `Segment`, `Block` and `TraceEntry`
records, keeping the raw dict beside them:

- the live process (`load_snapshot("live")`), when CUDA is available;
- a pickle written by `torch.cuda.memory._dump_snapshot`, through an
  unpickler that admits no global at all, so loading never runs code;
- JSON (the same dict; pool ids become lists, which are read back as tuples).

Snapshots from every torch since 2.0 load: keys that older versions lack
(`device_traces`, `allocator_settings`, `external_annotations`, a trace
entry's `stream`, `time_us`, `compile_context`, `user_metadata`, `pool_id`, a
block's `address`, a segment's `is_expandable`) are optional, keys a newer
torch adds are kept in `raw` and ignored, and so are trace actions a newer
torch adds (`annotate` in 2.14). Expandable segments (one segment per mapped
range, `segment_map`/`segment_unmap` in the trace) load like any other.
`Snapshot.history` says whether the trace is usable: "all", "state" (history
recorded with `enabled="state"` keeps a one-entry trace) or "none".

Everything read from a file is checked before it is used: sizes and
addresses within what a GPU can hold, blocks that tile their segment exactly,
segments that do not overlap, and no pickle whose shared references expand a
small file into millions of records. A violation is a one-line `KitError`.
A snapshot may carry a top-level `kit` key written by the kit's own tools:
names for streams, pools and graphs, capture windows, and the provenance of a
recording; malformed names are ignored, malformed capture windows refused.

At DeepSeek scale (tens of thousands of segments, millions of trace entries)
a record per row costs seconds: a `Snapshot` checks its rows in bulk and
keeps them as numpy columns (`kit.columns`), which the tables, the trace
analysis and the pictures read; what the bulk checks do not take goes
through the row parsers here. `segments`, `traces` and `trace` are made on
first use.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import IO, Any, NamedTuple

from kit.errors import KitError, as_text, describe

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
DEFAULT_POOL = (0, 0)
DEFAULT_STREAM = 0
MAX_BYTES = 1 << 50  # one size above 1 PiB is corruption: no GPU holds that
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


class _SnapshotUnpickler(pickle.Unpickler):
    """Unpickles plain data only: any global (class, function) is refused.

    Snapshots hold nothing but dicts, lists, tuples, str, int, float, bool and
    None, which pickle encodes without naming a single global, so refusing
    every global refuses every way a pickle can call code.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise KitError(f"refused to load global '{module}.{name}': a snapshot holds plain data only")

    def persistent_load(self, pid: Any) -> Any:
        raise KitError("refused a persistent id: a snapshot holds plain data only")

    def load(self) -> Any:
        from kit.columns import FREEZE_ABOVE, gc_paused  # the collector's passes double a large load's time

        with gc_paused(freeze_above=FREEZE_ABOVE):
            return super().load()


def safe_unpickle(data: bytes | IO[bytes], where: str = "pickle") -> Any:
    """Unpickle `data` (bytes or a binary file) admitting only plain built-in types."""
    try:
        return _SnapshotUnpickler(data if hasattr(data, "read") else io.BytesIO(data)).load()
    except KitError as e:
        raise KitError(f"{where}: {e}") from None
    except RecursionError:
        raise KitError(f"{where}: pickle nests too deeply") from None
    except MemoryError:
        raise KitError(f"{where}: pickle too large to load into memory") from None
    except Exception as e:  # noqa: BLE001 - every unpickling failure is the input's fault
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise KitError(f"{where}: not a readable pickle ({detail})") from None


def _read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise KitError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise KitError(f"{path}: is a folder, not a snapshot file") from None
    except OSError as e:
        raise KitError(f"{path}: cannot read ({e.strerror or e})") from None


def _decode(data: bytes, where: str) -> dict:
    if not data:
        raise KitError(f"{where}: empty file")
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark before JSON
        data = data[3:]
    if data.lstrip()[:1] in (b"{", b"["):
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as e:
            detail = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise KitError(f"{where}: not readable JSON ({detail})") from None
    raw = safe_unpickle(data, where)
    _check_expansion(raw, len(data), where)
    return raw


def _check_expansion(raw: Any, size: int, where: str) -> None:
    """Refuse a pickle whose records outnumber its bytes: shared references, which torch never writes.

    A pickle can reference one object many times (a list of the same block a
    million times, in a segment listed a million times) and so expand a few
    kilobytes into billions of records. Every real record takes well over two
    bytes of the file.
    """
    if not isinstance(raw, dict):
        return
    records = 0
    for key in ("segments", "device_traces"):
        outer = raw.get(key)
        if isinstance(outer, list | tuple):
            records += len(outer)
            for inner in outer:
                if isinstance(inner, list | tuple):
                    records += len(inner)
                elif isinstance(inner, dict) and isinstance(inner.get("blocks"), list | tuple):
                    records += len(inner["blocks"])
    if records > size // 2:
        raise KitError(
            f"{where}: {records} records in a {size}-byte pickle: it repeats shared references "
            "(torch never writes those), refused rather than expanded"
        )


def live_snapshot() -> dict:
    """This process's allocator state, with its trace if history is recorded."""
    import torch

    if not torch.cuda.is_available():
        raise KitError("live snapshot: CUDA is not available in this process")
    return torch.cuda.memory._snapshot()


def load_snapshot(source: str | os.PathLike | dict | Snapshot, *, label: str | None = None) -> Snapshot:
    """Load a snapshot from a path (pickle or JSON), a dict, or "live".

    Raises `KitError` with a one-line message for anything that is not a
    snapshot: a missing or unreadable file, a corrupt or truncated pickle, a
    pickle that names a global, or a dict of the wrong shape.
    """
    if isinstance(source, Snapshot):
        return source
    if not isinstance(source, str | os.PathLike):
        return Snapshot(source, origin=label or f"in-memory {type(source).__name__}")
    if isinstance(source, str) and source == "live":
        return Snapshot(live_snapshot(), origin=label or "live", live=True)
    path = Path(source)
    return Snapshot(_load_file(path), origin=label or str(path))


def _load_file(path: Path) -> Any:
    """A snapshot file's contents; a pickle streams from the file, so its bytes are never all in memory."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if not head or head.lstrip()[:1] in (b"{", b"[") or head[:1] != b"\x80":
                return _decode(head + f.read(), str(path))  # JSON, or not a pickle: as before
            f.seek(0)
            raw = safe_unpickle(f, str(path))
            _check_expansion(raw, os.fstat(f.fileno()).st_size, str(path))
            return raw
    except OSError:
        return _decode(_read_file(path), str(path))  # _read_file names what went wrong


def snapshot_from_bytes(data: bytes, origin: str = "snapshot bytes") -> Snapshot:
    """A snapshot from the bytes of a pickle or JSON file, as `load_snapshot` reads one."""
    return Snapshot(_decode(data, origin), origin=origin)


def _int(
    d: dict,
    key: str,
    where: str,
    default: int | None = None,
    *,
    minimum: int | None = 0,
    maximum: int = MAX_BYTES,
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
        raise KitError(f"{where}: '{key}' is {describe(value)}, above the largest possible ({maximum})")
    return value


def _stream(d: dict, key: str, where: str) -> int:
    return _int(d, key, where, default=DEFAULT_STREAM, minimum=INT64_MIN, maximum=INT64_MAX)


def _list(d: dict, key: str, where: str) -> list:
    value = d.get(key, [])
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise KitError(f"{where}: '{key}' is {describe(value)}, expected a list")
    return list(value)


def _is_pool(pool: Any) -> bool:
    return (
        isinstance(pool, list | tuple)
        and len(pool) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_ADDRESS for x in pool)
    )


def _pool_id(seg: dict, where: str) -> tuple[int, int]:
    pool = seg.get("segment_pool_id", DEFAULT_POOL)
    if not _is_pool(pool):
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
    if isinstance(requested, bool) or not isinstance(requested, int) or not 0 <= requested <= MAX_BYTES:
        requested = size
    return Block(address, size, requested, state, _frames(b))


def _parse_segment(s: Any, where: str) -> Segment:
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
        segment_type = "small" if total <= 2 * 1024 * 1024 else "large"
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


def _check_no_overlap(segments: tuple[Segment, ...], origin: str) -> None:
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


def _parse_trace_entry(e: Any, device: int, origin: str, index: int) -> TraceEntry:
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
            and 0 <= size <= MAX_BYTES
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


def _capture_window(c: Any, where: str) -> dict:
    """One graph's capture window from the `kit.captures` list, checked."""
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
    if not _is_pool(pool):
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


class Snapshot:
    """A normalised allocator snapshot; `raw` is the dict it was read from."""

    def __init__(self, raw: Any, *, origin: str = "in-memory dict", live: bool = False) -> None:
        if not isinstance(raw, dict):
            raise KitError(f"{origin}: not a snapshot (top level is {type(raw).__name__}, expected a dict)")
        if "segments" not in raw:
            raise KitError(f"{origin}: not a snapshot (no 'segments' key)")
        if not isinstance(raw["segments"], list | tuple):
            raise KitError(f"{origin}: not a snapshot ('segments' is {type(raw['segments']).__name__})")
        traces = raw.get("device_traces", [])
        if traces is not None and not (
            isinstance(traces, list | tuple)
            and len(traces) <= MAX_DEVICE
            and all(isinstance(t, list | tuple) for t in traces)
        ):
            raise KitError(f"{origin}: 'device_traces' is not a list of lists")
        kit_meta = raw.get("kit", {})
        if kit_meta is not None and not isinstance(kit_meta, dict):
            raise KitError(f"{origin}: 'kit' is {describe(kit_meta)}, expected a dict")
        self.raw = raw
        self.origin = origin
        self.live = live
        from kit.columns import SegmentColumns, trace_columns_of

        # Checked here, as arrays: a bad segment or trace entry fails the load; records are made on first use.
        self.columns = SegmentColumns.from_raw(raw["segments"], origin)
        self.trace_columns = trace_columns_of(traces or [], origin)

    @cached_property
    def segments(self) -> tuple[Segment, ...]:
        """The segments as typed records, with their blocks."""
        if self.columns.records is not None:
            return self.columns.records
        return tuple(_parse_segment(s, f"{self.origin}: segment {i}") for i, s in enumerate(self.raw["segments"]))

    @property
    def kit(self) -> dict:
        """The kit's own metadata: stream, pool and graph names, provenance."""
        return self.raw.get("kit") or {}

    @property
    def provenance(self) -> dict | None:
        prov = self.kit.get("provenance")
        return prov if isinstance(prov, dict) else None

    @property
    def data_source(self) -> str:
        """Which of the three data sources this snapshot is: live GPU, simulator or recorded."""
        if self.live:
            return "live GPU"
        if self.kit.get("source") == "simulator":
            return "simulator"
        return "recorded"

    @property
    def source_label(self) -> str:
        """One line naming where these numbers came from, for every table and figure."""
        prov = self.provenance
        if self.live:
            if prov and isinstance(prov.get("rank"), int) and not isinstance(prov.get("rank"), bool):
                return f"live GPU (vLLM rank {as_text(prov['rank'])}'s allocator, {as_text(prov.get('gpu', '?'))})"
            return "live GPU (this process's allocator)"
        if self.data_source == "simulator":
            return f"simulator ({self.origin})"
        if prov:
            return (
                f"recorded on {as_text(prov.get('gpu', '?'))}, torch {as_text(prov.get('torch', '?'))}, "
                f"{as_text(prov.get('date', '?'))} ({self.origin})"
            )
        return f"recorded snapshot ({self.origin})"

    @cached_property
    def traces(self) -> dict[int, tuple[TraceEntry, ...]]:
        """Trace entries per device; empty when history was not recorded."""
        out = {}
        for device, entries in enumerate(self.raw.get("device_traces") or []):
            out[device] = tuple(_parse_trace_entry(e, device, self.origin, i) for i, e in enumerate(entries))
        return out

    @cached_property
    def trace(self) -> tuple[TraceEntry, ...]:
        """All devices' trace entries, device by device."""
        return tuple(e for entries in self.traces.values() for e in entries)

    @property
    def history(self) -> str:
        """What memory history recorded: "all" (a trace), "state" (one entry at most: `enabled="state"`) or "none"."""
        lengths = [len(t) for t in self.raw.get("device_traces") or []]
        if any(n > 1 for n in lengths):
            return "all"
        return "state" if any(lengths) else "none"

    @property
    def has_trace(self) -> bool:
        """Whether there is a trace to analyse (history recorded with enabled="all")."""
        return self.history == "all"

    def require_trace(self, device: int = 0) -> tuple[TraceEntry, ...]:
        """The device's trace, or a one-line `KitError` saying why there is none to analyse."""
        if self.history == "none":
            raise KitError(
                f"{self.origin}: no trace recorded (memory history was off); this needs one: record with "
                "torch.cuda.memory._record_memory_history() before the code you look at"
            )
        if self.history == "state":
            raise KitError(
                f"{self.origin}: memory history was recorded with enabled='state', which keeps no trace; "
                "this needs one: record with enabled='all' (the default)"
            )
        entries = self.traces.get(device, ())
        if len(entries) < 2:
            raise KitError(f"{self.origin}: no trace recorded on device {device}")
        return entries

    @property
    def stream_names(self) -> dict[int, str]:
        """Names the snapshot itself gives its streams (its `kit` key); malformed entries are ignored."""
        names = self.kit.get("streams")
        if not isinstance(names, dict):
            return {}
        return {
            sid: name
            for name, sid in names.items()
            if isinstance(name, str)
            and isinstance(sid, int)
            and not isinstance(sid, bool)
            and INT64_MIN <= sid <= INT64_MAX
        }

    @property
    def pool_names(self) -> dict[tuple[int, int], str]:
        names = self.kit.get("pools")
        if not isinstance(names, dict):
            return {}
        return {(pid[0], pid[1]): name for name, pid in names.items() if isinstance(name, str) and _is_pool(pid)}

    @cached_property
    def captures(self) -> list[dict]:
        """The capture windows of the kit's recorders (`kit.captures`), one per graph, checked."""
        windows = self.kit.get("captures") or []
        if not isinstance(windows, list | tuple):
            raise KitError(f"{self.origin}: 'kit.captures' is {describe(windows)}, expected a list")
        return [_capture_window(c, f"{self.origin}: capture window {i}") for i, c in enumerate(windows)]

    def __repr__(self) -> str:
        events = sum(len(t) for t in self.raw.get("device_traces") or [])
        return f"<Snapshot {self.origin}: {len(self.columns)} segments, {events} trace entries>"

"""A cache of a snapshot's columns beside its file, memory-mapped when the file is opened again.

A debugging session opens one large snapshot again and again: each notebook
kernel, each `python -m kit` command. The first load writes what it made
(the segment and block columns, each device's trace columns, every distinct
frame and stack once, and the snapshot's `kit` key) to one file,
`<snapshot>.kitcache` beside the snapshot; every later load maps that file
into memory (`numpy.memmap`) and reads nothing else, in a fraction of a
second whatever the snapshot's size.

Where: beside the snapshot when its folder is writable, else in the user's
cache folder (`$XDG_CACHE_HOME/kit`, or `~/.cache/kit`); `KIT_CACHE_DIR`
puts every cache in that folder instead. Files under `MIN_BYTES` load in
milliseconds and are not cached. `python -m kit --no-cache`, or
`load_snapshot(path, cache=False)`, neither reads nor writes one.

A cache is never trusted: it names the snapshot it was made from (its size,
modification time and a SHA-256 of its first and last MiB), the kit and the
cache format that wrote it, and checksums of its header and its data
(CRC-32), all checked on every open. A cache of another file, of the file
before it changed, from another kit, truncated or damaged is named in one
line on stderr and made again. Reading one runs no code: a fixed header, JSON,
and arrays of the few integer types the columns use; nothing is unpickled.
Writing goes through `kit.fileio.atomic_write` (a temporary file renamed over
the target), so two processes opening one snapshot at once each read either
no cache or a whole one.

File layout: `MAGIC`, the header's length (8 bytes) and CRC-32 (4), 4 spare
bytes, the header (JSON), then the arrays, each at an offset (from the end of
the header, rounded up to `ALIGN`) the header gives with its dtype and shape.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from kit.fileio import atomic_write
from kit.load.columns import SegmentColumns, Stacks, TraceColumns

FORMAT = 2  # bumped whenever what a cache holds, or how the loader makes it, changes
MIN_BYTES = 4 << 20  # smaller snapshots load in milliseconds: no cache
SUFFIX = ".kitcache"
MAGIC = b"KITCACHE"
PREFIX = struct.Struct("<8sQI4x")  # magic, header length, header CRC-32
ALIGN = 64
HASHED_BYTES = 1 << 20  # of the snapshot's head and of its tail
DTYPES = {"|i1", "|b1", "<i4", "<i8"}  # the only array types a cache holds
TRACE_FIELDS = ("action", "addr", "size", "stream", "time_us", "stack")

T = TypeVar("T")

_enabled = True


def set_enabled(enabled: bool) -> None:
    """Read and write caches in this process (the default), or not (`python -m kit --no-cache`)."""
    global _enabled
    _enabled = enabled


def enabled() -> bool:
    return _enabled


def note(text: str) -> None:
    """One line on stderr about a cache."""
    print(f"kit: note: {text}", file=sys.stderr)


class Rejected(Exception):
    """A cache that cannot be used; the message says why, in a few words."""


class Unencodable(Exception):
    """A snapshot whose columns or `kit` key a cache cannot hold exactly (it is then not cached)."""


# -- which file a cache is for ----------------------------------------------------------------------


@dataclass(frozen=True)
class Stamp:
    """What identifies one version of a snapshot file: its size, modification time, and a hash of its ends."""

    size: int
    mtime_ns: int
    sha256: str


def stamp_of(fd: int) -> Stamp:
    """The stamp of the open file `fd`: `os.fstat`, and SHA-256 of its first and last `HASHED_BYTES`."""
    st = os.fstat(fd)
    digest = hashlib.sha256(st.st_size.to_bytes(8, "little"))
    digest.update(os.pread(fd, HASHED_BYTES, 0))
    digest.update(os.pread(fd, HASHED_BYTES, max(0, st.st_size - HASHED_BYTES)))
    return Stamp(st.st_size, st.st_mtime_ns, digest.hexdigest())


def user_folder() -> Path:
    """The cache folder for snapshots in folders the kit cannot write: `KIT_CACHE_DIR`, else the user's."""
    if os.environ.get("KIT_CACHE_DIR"):
        return Path(os.environ["KIT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kit"


def _in_folder(path: Path) -> Path:
    """The cache's name in a cache folder: the snapshot's name and a hash of its full path."""
    where = hashlib.sha256(str(path.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return user_folder() / f"{path.name}-{where}{SUFFIX}"


def beside(path: Path) -> Path:
    return path.with_name(path.name + SUFFIX)


def places(path: Path) -> list[Path]:
    """Where a cache of `path` may be, in the order they are tried."""
    if os.environ.get("KIT_CACHE_DIR"):
        return [_in_folder(path)]
    return [beside(path), _in_folder(path)]


def target(path: Path) -> Path:
    """Where a new cache of `path` goes: beside it if its folder is writable, else in the cache folder."""
    if not os.environ.get("KIT_CACHE_DIR") and os.access(path.parent, os.W_OK):
        return beside(path)
    folder = user_folder()
    folder.mkdir(parents=True, exist_ok=True)
    return _in_folder(path)


def kit_version() -> str:
    try:
        from importlib.metadata import version

        return version("kit")
    except Exception:  # noqa: BLE001 - not installed: the format number still tells caches apart
        return "unknown"


# -- plain data as JSON, exactly (tuples stay tuples, keys keep their type) ------------------------


def encode(value: Any) -> Any:
    """`value` (plain data) as JSON, every container tagged so that `decode` gives back an equal value."""
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return value if value == value and abs(value) != float("inf") else {"f": repr(value)}
    if kind is list:
        return {"l": [encode(v) for v in value]}
    if kind is tuple:
        return {"t": [encode(v) for v in value]}
    if kind is dict:
        return {"d": [[encode(k), encode(v)] for k, v in value.items()]}
    raise Unencodable(f"a {kind.__name__} in the snapshot")


def decode(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    ((tag, inner),) = value.items()
    if tag == "l":
        return [decode(v) for v in inner]
    if tag == "t":
        return tuple(decode(v) for v in inner)
    if tag == "d":
        return {decode(k): decode(v) for k, v in inner}
    if tag == "f":
        return float(inner)
    raise ValueError(f"unknown tag {tag!r}")


# -- writing ------------------------------------------------------------------------------------------


def _array(name: str, value: Any) -> np.ndarray:
    if not isinstance(value, np.ndarray) or value.dtype.str not in DTYPES or value.ndim != 1:
        raise Unencodable(f"column {name} is {getattr(value, 'dtype', type(value).__name__)}")
    return np.ascontiguousarray(value)


def _trace_arrays(device: int, tc: TraceColumns) -> tuple[dict[str, np.ndarray], dict]:
    """One device's trace as arrays, and what the header says of it (its frames, whether times are missing)."""
    arrays = {}
    time_us = tc.time_us
    missing = None
    if time_us.dtype == object:  # entries without a time: zeros, and a mask of the missing ones
        missing = np.array([t is None for t in time_us.tolist()], dtype=bool)
        time_us = np.array([0 if t is None else t for t in time_us.tolist()], dtype=np.int64)
    stacks, stack = tc.stacks, tc.stack
    if stack is None:  # read from a dict: its frames as lists, made into stacks now
        stacks = Stacks()
        stack = stacks.numbers(tc.frames)
        if stack is None:
            raise Unencodable("frames not shared between entries")
        stacks.finish()
    for name, value in (("action", tc.action), ("addr", tc.addr), ("size", tc.size), ("stream", tc.stream)):
        arrays[f"trace{device}.{name}"] = _array(name, value)
    arrays[f"trace{device}.time_us"] = _array("time_us", time_us)
    arrays[f"trace{device}.stack"] = _array("stack", stack.astype(np.int32, copy=False))
    if missing is not None:
        arrays[f"trace{device}.time_missing"] = missing
    starts, flat = stacks.arrays()
    arrays[f"trace{device}.stack_starts"] = starts
    arrays[f"trace{device}.stack_frames"] = flat
    meta = {"device": device, "time_missing": missing is not None, "frames": encode(list(stacks.frames))}
    return arrays, meta


def _contents(columns: SegmentColumns, traces: dict[int, TraceColumns], kit_key: Any) -> tuple[dict, dict]:
    """Every array a cache holds, by name, and the header's description of the rest."""
    arrays = {}
    for name, value in vars(columns).items():
        if name != "records":
            arrays[f"segments.{name}"] = _array(name, value)
    devices = []
    for device, tc in sorted(traces.items()):
        trace_arrays, meta = _trace_arrays(device, tc)
        arrays.update(trace_arrays)
        devices.append(meta)
    return arrays, {"traces": devices, "kit_key": encode(kit_key)}


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def write(path: Path, stamp: Stamp, columns: SegmentColumns, traces: dict[int, TraceColumns], kit_key: Any) -> Path:
    """Write the cache of snapshot `path` (as `stamp` identifies it); returns where. Raises `Unencodable`, OSError."""
    arrays, described = _contents(columns, traces, kit_key)
    return _write_file(target(path), stamp, arrays, described)


def _write_file(where: Path, stamp: Stamp, arrays: dict[str, np.ndarray], described: dict) -> Path:
    """One cache file: the header (`described` in it) and `arrays`, written atomically to `where`."""
    layout, offset, crc = {}, 0, 0
    for name, value in arrays.items():
        start = _aligned(offset)
        crc = zlib.crc32(bytes(start - offset), crc)
        crc = zlib.crc32(memoryview(value).cast("B"), crc)
        layout[name] = {"dtype": value.dtype.str, "shape": list(value.shape), "offset": start}
        offset = start + value.nbytes
    header = {
        "format": FORMAT,
        "kit": kit_version(),
        "source": asdict(stamp),
        "data_bytes": offset,
        "data_crc32": crc,
        "arrays": layout,
        **described,
    }
    text = json.dumps(header, separators=(",", ":")).encode()
    with atomic_write(where, "wb") as f:
        f.write(PREFIX.pack(MAGIC, len(text), zlib.crc32(text)))
        f.write(text)
        f.write(bytes(_aligned(PREFIX.size + len(text)) - PREFIX.size - len(text)))
        written = 0
        for name, value in arrays.items():
            f.write(bytes(layout[name]["offset"] - written))
            f.write(memoryview(value).cast("B"))
            written = layout[name]["offset"] + value.nbytes
    return where


# -- reading ------------------------------------------------------------------------------------------


@dataclass
class Cached:
    """What a cache holds: the columns, the traces and the snapshot's `kit` key (None when it has none)."""

    columns: SegmentColumns
    traces: dict[int, TraceColumns]
    kit_key: Any
    path: Path


def _header(f: Any, size: int) -> tuple[dict, int]:
    """The header of an open cache file, and where its data starts; `Rejected` for anything amiss."""
    prefix = f.read(PREFIX.size)
    if len(prefix) < PREFIX.size or prefix[:8] != MAGIC:
        raise Rejected("not a kit cache" if len(prefix) == PREFIX.size else "truncated")
    _, length, crc = PREFIX.unpack(prefix)
    if PREFIX.size + length > size:
        raise Rejected("truncated")
    text = f.read(length)
    if zlib.crc32(text) != crc:
        raise Rejected("damaged (its header's checksum does not match)")
    try:
        header = json.loads(text)
    except ValueError:
        raise Rejected("damaged (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise Rejected("damaged (its header is not an object)")
    return header, _aligned(PREFIX.size + length)


def _check(header: dict, stamp: Stamp, size: int, start: int) -> None:
    if header.get("format") != FORMAT or header.get("kit") != kit_version():
        raise Rejected(
            f"written by another kit (kit {header.get('kit')}, cache format {header.get('format')}; "
            f"this is kit {kit_version()}, format {FORMAT})"
        )
    if header.get("source") != asdict(stamp):
        raise Rejected("made from another file, or from this one before it changed")
    if start + header.get("data_bytes", -1) != size:
        raise Rejected("truncated" if start + header.get("data_bytes", 0) > size else "longer than its header says")


def _arrays(header: dict, data: np.ndarray) -> dict[str, np.ndarray]:
    out = {}
    for name, spec in header["arrays"].items():
        dtype = np.dtype(spec["dtype"]) if spec["dtype"] in DTYPES else None
        (n,) = spec["shape"]
        if dtype is None or not 0 <= spec["offset"] <= spec["offset"] + n * dtype.itemsize <= len(data):
            raise Rejected(f"damaged (array {name})")
        out[name] = data[spec["offset"] : spec["offset"] + n * dtype.itemsize].view(dtype)
    return out


def _trace(meta: dict, arrays: dict[str, np.ndarray]) -> TraceColumns:
    device = meta["device"]
    fields = {name: arrays[f"trace{device}.{name}"] for name in TRACE_FIELDS}
    if meta["time_missing"]:
        times = fields["time_us"].astype(object)
        times[arrays[f"trace{device}.time_missing"]] = None
        fields["time_us"] = times
    starts, flat = arrays[f"trace{device}.stack_starts"], arrays[f"trace{device}.stack_frames"]
    n = len(fields["action"])
    if any(len(fields[name]) != n for name in TRACE_FIELDS) or len(starts) < 1 or starts[-1] != len(flat):
        raise Rejected(f"damaged (trace of device {device})")
    if n and not 0 <= fields["stack"].min() <= fields["stack"].max() < len(starts) - 1:
        raise Rejected(f"damaged (stacks of device {device})")
    return TraceColumns(device, fields, Stacks.from_arrays(meta["frames"], starts, flat, decode))


def _read_file(cache: Path, stamp: Stamp) -> tuple[dict, dict[str, np.ndarray]]:
    """A cache file's header and arrays (memory-mapped), every check passed; `Rejected` otherwise."""
    with open(cache, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header, start = _header(f, size)
    try:
        _check(header, stamp, size, start)
        data = np.memmap(cache, dtype=np.uint8, mode="r", offset=start) if size > start else np.zeros(0, np.uint8)
        if zlib.crc32(data) != header["data_crc32"]:
            raise Rejected("damaged (its data's checksum does not match)")
        return header, _arrays(header, data)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise Rejected(f"damaged ({type(e).__name__} reading it)") from None


def read(cache: Path, stamp: Stamp) -> Cached:
    """The cache at `cache` of the snapshot `stamp` identifies, memory-mapped; `Rejected` if it is not usable."""
    header, arrays = _read_file(cache, stamp)
    try:
        fields = {k.removeprefix("segments."): v for k, v in arrays.items() if k.startswith("segments.")}
        columns = SegmentColumns(fields)
        if len({len(v) for k, v in fields.items() if not k.startswith("block_")}) > 1:
            raise Rejected("damaged (segment columns)")
        traces = {meta["device"]: _trace(meta, arrays) for meta in header["traces"]}
        return Cached(columns, traces, decode(header["kit_key"]), cache)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise Rejected(f"damaged ({type(e).__name__} reading it)") from None


def open_cached(path: Path, stamp: Stamp) -> Cached | None:
    """The first usable cache of `path`; a cache found unusable is named on stderr (it will be made again)."""
    return _first_usable(places(path), lambda cache: read(cache, stamp))


def _first_usable(candidates: list[Path], read_one: Callable[[Path], T]) -> T | None:
    """What `read_one` makes of the first candidate that exists and reads; each unusable one named on stderr."""
    for cache in candidates:
        try:
            return read_one(cache)
        except FileNotFoundError:
            continue
        except (Rejected, OSError) as e:
            reason = e if isinstance(e, Rejected) else f"unreadable ({e.strerror or e})"
            note(f"cache {cache} is {reason}; making it again")
    return None


def save(path: Path, stamp: Stamp, columns: SegmentColumns, traces: dict[int, TraceColumns], kit_key: Any) -> None:
    """Write the cache of `path`; a snapshot the cache cannot hold, or a folder it cannot go in, is left uncached."""
    try:
        write(path, stamp, columns, traces, kit_key)
    except Unencodable:
        pass  # an unusual snapshot (a set in its kit key, frames not shared): loaded in full each time
    except OSError as e:
        note(f"no cache for {path}: {e.strerror or e}")


# -- what an analysis derived from a snapshot, kept beside its cache -------------------------------


def _extra(cache: Path, kind: str) -> Path:
    """The `kind` cache that goes where the columns' cache `cache` goes: `<snapshot>.kit<kind>`."""
    return cache.with_name(cache.name.removesuffix(SUFFIX) + f".kit{kind}")


def save_extra(path: Path, stamp: Stamp, kind: str, arrays: dict[str, np.ndarray], described: dict) -> None:
    """Keep what an analysis derived from snapshot `path` (integer arrays and plain JSON); never raises.

    Checked as the columns' cache is when read again (`open_extra`): the same
    stamp, kit and format, checksums, and its `kind`.
    """
    try:
        arrays = {k: _array(k, v) for k, v in arrays.items()}
        _write_file(_extra(target(path), kind), stamp, arrays, {"kind": kind, **described})
    except Unencodable:
        pass
    except OSError as e:
        note(f"no {kind} cache for {path}: {e.strerror or e}")


def open_extra(path: Path, stamp: Stamp, kind: str) -> tuple[dict, dict[str, np.ndarray]] | None:
    """The header and arrays `save_extra` kept for `path`, if a usable one is found (an unusable one is named)."""

    def read_kind(cache: Path) -> tuple[dict, dict[str, np.ndarray]]:
        header, arrays = _read_file(cache, stamp)
        if header.get("kind") != kind:
            raise Rejected(f"not a {kind} cache")
        return header, arrays

    return _first_usable([_extra(cache, kind) for cache in places(path)], read_kind)

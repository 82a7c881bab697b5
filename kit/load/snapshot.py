"""`Snapshot` and `load_snapshot`: an allocator snapshot from a file, a dict or this process, checked.

`load_snapshot` reads from three places: the live process (`"live"`, when
CUDA is available), a file (a pickle through `kit.load.unpickle`, which runs
no code, or JSON), or a dict already in memory. `Snapshot` checks every row
in bulk and keeps the segments, blocks and traces as numpy columns
(`kit.load.columns`), which the tables, the trace walks and the pictures
read; the typed records of `kit.load.rows` (`segments`, `traces`, `trace`)
are made on first use. The layers go one way: rows, then columns, then this.

A file is opened from its cache when it has a valid one (`kit.load.cache`);
else a pickle's trace is streamed into columns as it is unpickled
(`kit.load.incremental`), and the cache is written. Such a snapshot keeps only its
columns: `raw` (and the records made from it) reads the file again on first
use, and refuses if the file changed since.

A snapshot may carry a top-level `kit` key written by the kit's own tools:
names for streams, pools and graphs, capture windows, and the provenance of a
recording; malformed names are ignored, malformed capture windows refused.
`Snapshot.history` says whether the trace is usable: "all", "state" (history
recorded with `enabled="state"` keeps a one-entry trace) or "none".
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from functools import cached_property, wraps
from pathlib import Path
from typing import Any, TypeVar
from weakref import WeakKeyDictionary

import numpy as np

from kit import progress
from kit.errors import KitError, as_text, describe
from kit.load import cache as caches
from kit.load.columns import SegmentColumns, TraceColumns, TraceView, trace_columns_of
from kit.load.incremental import read_incremental
from kit.load.rows import (
    INT64_MAX,
    INT64_MIN,
    MAX_DEVICE,
    TRACE_ACTIONS,
    Segment,
    TraceEntry,
    capture_window,
    is_pool,
    parse_segment,
    parse_trace_entry,
)
from kit.load.unpickle import decode_snapshot, load_file


def live_snapshot() -> dict:
    """This process's allocator state, with its trace if history is recorded."""
    import torch

    if not torch.cuda.is_available():
        raise KitError("live snapshot: CUDA is not available in this process")
    return torch.cuda.memory._snapshot()


def load_snapshot(
    source: str | os.PathLike | dict | Snapshot, *, label: str | None = None, cache: bool | None = None
) -> Snapshot:
    """Load a snapshot from a path (pickle or JSON), a dict, or "live".

    A file of `kit.load.cache.MIN_BYTES` or more is opened from its cache when
    it has a valid one, and its cache is written when not (`kit.load.cache`);
    `cache=False` neither reads nor writes one (`None`: as
    `kit.load.cache.set_enabled` says, on by default). Raises `KitError` with
    a one-line message for anything that is not a snapshot: a missing or
    unreadable file, a corrupt or truncated pickle, a pickle that names a
    global, or a dict of the wrong shape.
    """
    if isinstance(source, Snapshot):
        return source
    if not isinstance(source, str | os.PathLike):
        return Snapshot(source, origin=label or f"in-memory {type(source).__name__}")
    if isinstance(source, str) and source == "live":
        return Snapshot(live_snapshot(), origin=label or "live", live=True)
    path = Path(source)
    return open_file(path, label or str(path), caches.enabled() if cache is None else cache)


def open_file(path: Path, origin: str, cache: bool) -> Snapshot:
    """A snapshot file: from its cache, or read (its trace streamed into columns) and then cached."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return Snapshot(load_file(path), origin=origin)  # load_file names what is wrong with the path
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return Snapshot(load_file(path), origin=origin)
        stamp = caches.stamp_of(fd)
        cached = stamp.size >= caches.MIN_BYTES and cache
        if cached:
            found = caches.open_cached(path, stamp)
            if found is not None:
                snap = Snapshot.from_columns(
                    found.columns, found.traces, found.kit_key, origin=origin, reread=_rereader(path, stamp)
                )
                snap.cache_source = (path, stamp)
                return snap
        snap = _read(path, fd, stamp, origin)
        if cached:
            caches.save(path, stamp, snap.columns, snap.trace_columns, snap.kit_key)
            snap.cache_source = (path, stamp)
        return snap
    finally:
        os.close(fd)


def _read(path: Path, fd: int, stamp: caches.Stamp, origin: str) -> Snapshot:
    """Read a snapshot file; a pickle's trace is streamed into columns where it can be (`kit.load.incremental`)."""
    if os.pread(fd, 1, 0) == b"\x80":  # a pickle; anything else (JSON, a compressed file) is read plainly
        with progress.bar(f"loading {path.name}", total=stamp.size, unit="B") as shown:
            streamed = read_incremental(path, fd, shown.update)
        if streamed is not None:
            raw, device, trace = streamed
            snap = Snapshot(raw, origin=origin, traces={device: trace})
            snap._forget_raw(_rereader(path, stamp))
            return snap
    with progress.bar(f"loading {path.name}", total=stamp.size, unit="B") as shown:
        return Snapshot(load_file(path, on_read=shown.update), origin=origin)


def _rereader(path: Path, stamp: caches.Stamp):
    """Reads the whole file again (for `Snapshot.raw`), if it is still the file that was loaded."""

    def reread() -> dict:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise KitError(f"{path}: cannot read it again ({e.strerror or e}); its raw data is not kept") from None
        try:
            if caches.stamp_of(fd) != stamp:
                raise KitError(f"{path}: changed since it was loaded; load it again")
        finally:
            os.close(fd)
        return load_file(path)

    return reread


def snapshot_from_bytes(data: bytes, origin: str = "snapshot bytes") -> Snapshot:
    """A snapshot from the bytes of a pickle or JSON file, as `load_snapshot` reads one."""
    return Snapshot(decode_snapshot(data, origin), origin=origin)


def _check_top_level(raw: Any, origin: str) -> None:
    """Raise a one-line `KitError` unless `raw` has a snapshot's shape: segments, device traces, the kit's key."""
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


class Snapshot:
    """A normalised allocator snapshot; `raw` is the dict it was read from.

    A snapshot loaded from a file keeps only its columns (a large file's raw
    dicts would double its memory): `raw`, and the records made from it
    (`segments`, `traces`, `trace`), read the file again on first use.
    `cache_source` is the file and its stamp where the snapshot may be cached
    (`kit.load.cache`); None where it is not (a small file, `cache=False`, a dict).
    """

    cache_source: tuple[Path, caches.Stamp] | None = None

    def __init__(
        self,
        raw: Any,
        *,
        origin: str = "in-memory dict",
        live: bool = False,
        traces: dict[int, TraceColumns] | None = None,
    ) -> None:
        _check_top_level(raw, origin)
        self._raw = raw
        self._reread = None
        self._kit = raw.get("kit")
        self.origin = origin
        self.live = live
        # Checked here, as arrays: a bad segment or trace entry fails the load; records are made on first use.
        self.columns = SegmentColumns.from_raw(raw["segments"], origin)
        self.trace_columns = trace_columns_of(raw.get("device_traces") or [], origin, done=traces)

    @classmethod
    def from_columns(
        cls,
        columns: SegmentColumns,
        trace_columns: dict[int, TraceColumns],
        kit_key: dict | None,
        *,
        origin: str,
        reread: Callable[[], dict],
    ) -> Snapshot:
        """A snapshot of columns already checked (a cache's), whose raw data `reread` reads on first use."""
        snap = cls.__new__(cls)
        snap._raw, snap._reread, snap._kit = None, reread, kit_key
        snap.origin, snap.live = origin, False
        snap.columns, snap.trace_columns = columns, trace_columns
        return snap

    def _forget_raw(self, reread: Callable[[], dict]) -> None:
        """Keep the columns only; `raw` reads the file again on first use."""
        self._raw, self._reread = None, reread

    @property
    def raw(self) -> dict:
        """The dict the snapshot was read from (for a file: read again on first use, if the file is unchanged)."""
        if self._raw is None:
            raw = self._reread()
            _check_top_level(raw, self.origin)
            self._raw = raw
        return self._raw

    @property
    def kit_key(self) -> dict | None:
        """The snapshot's top-level `kit` key as read (None when it has none)."""
        return self._raw.get("kit") if self._raw is not None else self._kit

    @cached_property
    def segments(self) -> tuple[Segment, ...]:
        """The segments as typed records, with their blocks."""
        if self.columns.records is not None:
            return self.columns.records
        return tuple(parse_segment(s, f"{self.origin}: segment {i}") for i, s in enumerate(self.raw["segments"]))

    @property
    def kit(self) -> dict:
        """The kit's own metadata: stream, pool and graph names, provenance."""
        return self.kit_key or {}

    @property
    def provenance(self) -> dict | None:
        """Where the kit's recorder made this snapshot (GPU, torch, date, ...), when it says."""
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
            if self.origin in ("live", "capture recorder"):
                return "live GPU (this process's allocator)"
            return f"live GPU ({as_text(prov.get('gpu', '?')) if prov else '?'}: {self.origin})"
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
            out[device] = tuple(parse_trace_entry(e, device, self.origin, i) for i, e in enumerate(entries))
        return out

    @cached_property
    def trace(self) -> tuple[TraceEntry, ...]:
        """All devices' trace entries, device by device."""
        return tuple(e for entries in self.traces.values() for e in entries)

    @cached_property
    def expandable(self) -> bool:
        """Whether it was recorded with `expandable_segments:True`: segments mapped and unmapped page by page."""
        if self.columns.expandable.any():  # the columns: typed segments would read the whole file again
            return True
        mapping = [TRACE_ACTIONS.index(a) for a in ("segment_map", "segment_unmap")]
        return any(np.isin(c.action, mapping).any() for c in self.trace_columns.values())

    @property
    def history(self) -> str:
        """What memory history recorded: "all" (a trace), "state" (one entry at most: `enabled="state"`) or "none"."""
        lengths = [len(t) for t in self.trace_columns.values()]
        if any(n > 1 for n in lengths):
            return "all"
        return "state" if any(lengths) else "none"

    @property
    def has_trace(self) -> bool:
        """Whether there is a trace to analyse (history recorded with enabled="all")."""
        return self.history == "all"

    def require_trace(self, device: int = 0) -> tuple[TraceEntry, ...]:
        """The device's trace, or a one-line `KitError` saying why there is none to analyse."""
        self.check_trace(device)
        return self.traces[device]

    def trace_view(self, device: int = 0) -> TraceView:
        """The device's trace as `TraceEntry` records made from its columns when read (`require_trace`'s errors):
        for a pass over the trace that needs no more than action, address, size, stream, time and frames."""
        self.check_trace(device)
        return _trace_view(self, device)

    def check_trace(self, device: int = 0) -> int:
        """The device's trace length, or `require_trace`'s error; read off the columns, no entry parsed."""
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
        columns = self.trace_columns.get(device)
        if columns is None or len(columns) < 2:
            raise KitError(f"{self.origin}: no trace recorded on device {device}")
        return len(columns)

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
        """Names the snapshot itself gives its pools (its `kit` key); malformed entries are ignored."""
        names = self.kit.get("pools")
        if not isinstance(names, dict):
            return {}
        return {(pid[0], pid[1]): name for name, pid in names.items() if isinstance(name, str) and is_pool(pid)}

    @cached_property
    def captures(self) -> list[dict]:
        """The capture windows of the kit's recorders (the `kit` key's `captures`), one per graph, checked."""
        windows = self.kit.get("captures") or []
        if not isinstance(windows, list | tuple):
            raise KitError(f"{self.origin}: the kit key's 'captures' is {describe(windows)}, expected a list")
        return [capture_window(c, f"{self.origin}: capture window {i}") for i, c in enumerate(windows)]

    def __repr__(self) -> str:
        events = sum(len(t) for t in self.trace_columns.values())
        return f"<Snapshot {self.origin}: {len(self.columns)} segments, {events} trace entries>"


T = TypeVar("T")


def per_snapshot(compute: Callable[..., T]) -> Callable[..., T]:
    """`compute(snapshot, *args)` once per snapshot and arguments, while the snapshot lives.

    A loaded snapshot is read-only, and every table, verdict and command of
    one session asks the same questions of it again. `args` must be hashable
    (a device number, say).
    """
    done: WeakKeyDictionary[Snapshot, dict[tuple, T]] = WeakKeyDictionary()

    @wraps(compute)
    def cached(snapshot: Snapshot, *args) -> T:
        mine = done.setdefault(snapshot, {})
        if args not in mine:
            mine[args] = compute(snapshot, *args)
        return mine[args]

    return cached


@per_snapshot
def _trace_view(snapshot: Snapshot, device: int) -> TraceView:
    return TraceView(snapshot.trace_columns[device])

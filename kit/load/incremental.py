"""Reading a snapshot pickle with its trace turned into columns while it is unpickled.

A large snapshot is mostly its trace: millions of entry dicts, each with its
own ints. `pickle.load` holds all of them at once; a loader that then builds
columns from them holds both, and peaks above `pickle.load`. Here the trace
never exists whole: the unpickler (`kit.load.unpickle`'s, which admits no
global the file names and so runs no code from it) hands the trace's entries
over in the batches the pickle is written in (`APPENDS`, up to 1,000
entries), and every `TraceSink.GROUP` entries become columns
(`kit.load.columns.incremental_trace_columns`, the same checks as for a whole
trace) before their dicts are emptied.

How the batches reach the kit: the unpickler calls `extend` on a list
being filled whenever that "list" is not a real one. So the file is read
through `Spliced`, which gives the unpickler the file's bytes with one
change: the opcode that makes the first non-empty trace list (found by its
key, `device_traces`, and checked opcode by opcode from the start of the
frame it lies in) is replaced by opcodes that make a `TraceSink` instead,
named by a random token made for this load alone (`find_class` admits that
one name; every global the file names is still refused), and the length of
that frame is patched to match. The sink keeps the columns; the emptied dicts
(the unpickler's memo keeps them, and each entry's list of frames, until the
load ends) weigh a fraction of full ones: on the benchmark's snapshot the
load peaks at two thirds of `pickle.load`'s memory (docs/scale.md).

Whatever does not fit (a pickle before protocol 4, which has no frames; a
trace entry the bulk checks do not take; an entry that comes twice; a sink
found anywhere but in `device_traces`, or referenced from elsewhere; frames
not shared as torch shares them) makes `read_incremental` return None, and the
file is read again the plain way, which gives exactly the result and the
error it always gave.
"""

from __future__ import annotations

import collections
import io
import mmap
import os
import pickletools
import secrets
import sys
from pathlib import Path
from typing import Any

import numpy as np

from kit.errors import KitError
from kit.load.columns import Stacks, TraceColumns, incremental_trace_columns
from kit.load.rows import MAX_DEVICE
from kit.load.unpickle import check_expansion, refuse_legacy_torch_save, snapshot_unpickler

TRACES_KEY = b"\x8c\x0ddevice_traces"  # SHORT_BINUNICODE "device_traces", as protocol 4 and 5 write the key
FRAME = 0x95
FRAME_HEADER = 9  # the FRAME opcode and its 8-byte length
SINK_NAME = "TraceSink"
LOOK_AHEAD = 1 << 20  # bytes read after a frame's start to check the opcodes around the key
# Opcodes the writer leaves outside frames: payloads of a frame's size or more (length in 4 or 8 bytes) ...
_LARGE = {ord("X"): 4, ord("B"): 4, ord("T"): 4, 0x8D: 8, 0x8E: 8, 0x96: 8}
# ... and the few opcodes of a frame too short to be framed (under 4 bytes): argument bytes per opcode.
_SMALL = {**dict.fromkeys(b"\x94.(aeus)]}NtR\x85\x86\x87\x88\x89\x93\x90\x91b0", 0), **{ord("h"): 1, ord("q"): 1}}


class TraceSink:
    """Stands in for one device's trace list while it is unpickled, and turns its entries into columns.

    The unpickler calls `extend` with each batch; every `GROUP` entries or so
    become columns (fewer, larger numpy calls than batch by batch) and their
    dicts are emptied (`dict.clear`: the unpickler's memo keeps the empty
    dicts until the load ends). Entries the bulk checks do not take mark the
    sink `failed`, and the load falls back to the plain one.
    """

    GROUP = 16_384
    __slots__ = ("chunks", "failed", "length", "pending", "shells", "stacks")

    def __init__(self) -> None:
        self.chunks: list[dict] = []
        self.shells: list[np.ndarray] = []  # ids of the emptied dicts
        self.pending: list = []
        self.stacks = Stacks()
        self.length = 0
        self.failed = False

    def extend(self, entries: list) -> None:
        self.length += len(entries)
        if not self.failed:
            self.pending.extend(entries)
            if len(self.pending) >= self.GROUP:
                self.flush()

    def flush(self) -> None:
        """Turn the entries received so far into columns."""
        entries, self.pending = self.pending, []
        if self.failed or not entries:
            return
        # An entry emptied before and listed again has no action: the bulk checks refuse it, as anything unusual.
        fields = incremental_trace_columns(entries, self.stacks)
        if fields is None:
            self.failed = True
            self.chunks, self.shells = [], []
            return
        self.chunks.append(fields)
        self.shells.append(np.fromiter(map(id, entries), dtype=np.int64, count=len(entries)))
        collections.deque(map(dict.clear, entries), maxlen=0)

    def append(self, entry: Any) -> None:
        self.extend([entry])

    def __len__(self) -> int:
        return self.length

    def __setstate__(self, state: Any) -> None:
        raise KitError("refused to set the state of the kit's trace sink: a snapshot holds plain data only")

    def columns(self, device: int) -> TraceColumns:
        """The batches' columns as one device's `TraceColumns` (the batches are dropped as they are joined)."""
        fields: dict = {}
        for key in ("action", "addr", "size", "stream", "time_us", "stack"):
            parts = [chunk.pop(key) for chunk in self.chunks]
            if not parts:
                fields[key] = np.zeros(0, dtype=np.int8 if key == "action" else np.int64)
            else:
                fields[key] = np.concatenate(parts) if len(parts) > 1 else parts[0]
        if fields["stack"].dtype != np.int32:
            fields["stack"] = fields["stack"].astype(np.int32)
        self.chunks = []
        self.stacks.finish()
        return TraceColumns(device, fields, self.stacks)


class Spliced(io.RawIOBase):
    """A file as the unpickler reads it: ranges of the file and inserted bytes, in order (read, readline, peek).

    `on_read(n)` is told how many bytes of the file each read consumed (for a progress bar).
    """

    def __init__(self, fd: int, pieces: list[tuple[int, int] | bytes], on_read=None) -> None:
        super().__init__()
        self._fd = fd
        self._pieces = [p for p in pieces if (len(p) if isinstance(p, bytes) else p[1] - p[0]) > 0]
        self._i = 0  # the piece being read
        self._at = 0  # bytes of it read
        self._on_read = on_read

    def readable(self) -> bool:
        return True

    def _piece(self, i: int, start: int, n: int) -> bytes:
        piece = self._pieces[i]
        if isinstance(piece, bytes):
            return piece[start : start + n]
        begin, end = piece
        return os.pread(self._fd, min(n, end - begin - start), begin + start)

    def _length(self, i: int) -> int:
        piece = self._pieces[i]
        return len(piece) if isinstance(piece, bytes) else piece[1] - piece[0]

    def peek(self, n: int = 1) -> bytes:
        if self._i >= len(self._pieces):
            return b""
        return self._piece(self._i, self._at, max(n, 1))

    def read(self, n: int = -1) -> bytes:
        out = []
        want = sys.maxsize if n is None or n < 0 else n
        while want > 0 and self._i < len(self._pieces):
            data = self._piece(self._i, self._at, want)
            if not data:
                raise OSError("the snapshot file became shorter while it was read")
            out.append(data)
            want -= len(data)
            self._advance(len(data))
        data = b"".join(out)
        if self._on_read is not None:
            self._on_read(len(data))
        return data

    def _advance(self, n: int) -> None:
        self._at += n
        if self._at >= self._length(self._i):
            self._i, self._at = self._i + 1, 0

    def readline(self, limit: int = -1) -> bytes:
        out = []
        while self._i < len(self._pieces):
            data = self._piece(self._i, self._at, 1 << 16)
            end = data.find(b"\n")
            if end >= 0:
                data = data[: end + 1]
            out.append(data)
            self._advance(len(data))
            if end >= 0:
                break
        data = b"".join(out)
        if self._on_read is not None:
            self._on_read(len(data))
        return data


def _frame_around(mm: mmap.mmap, offset: int) -> tuple[int, int] | None:
    """The frame (its header's offset, its length) holding byte `offset`; None where the walk meets the unexpected."""
    pos = 2  # after PROTO
    while pos < offset:
        op = mm[pos]
        if op == FRAME:
            length = int.from_bytes(mm[pos + 1 : pos + FRAME_HEADER], "little")
            if pos + FRAME_HEADER <= offset < pos + FRAME_HEADER + length:
                return pos, length
            pos += FRAME_HEADER + length
        elif op in _LARGE:
            width = _LARGE[op]
            pos += 1 + width + int.from_bytes(mm[pos + 1 : pos + 1 + width], "little")
        elif op in _SMALL:
            pos += 1 + _SMALL[op]
        else:
            return None
    return None


_SKIPPED = {"FRAME", "MEMOIZE", "BINPUT", "LONG_BINPUT"}


def _trace_list_at(mm: mmap.mmap, key: int) -> int | None:
    """The offset of the EMPTY_LIST opcode that makes the first non-empty trace list, for the key at `key`; or None.

    The key must be an opcode of its frame (read opcode by opcode from the
    frame's start), followed by the outer list, then one inner list per
    device: the first inner list that an entry follows is the one returned.
    """
    frame = _frame_around(mm, key)
    if frame is None:
        return None
    start = frame[0]
    ops = pickletools.genops(io.BytesIO(mm[start : min(len(mm), start + FRAME_HEADER + frame[1] + LOOK_AHEAD)]))
    try:
        op, arg, pos = next(ops)
        while start + pos < key:
            op, arg, pos = next(ops)
        if start + pos != key or op.name != "SHORT_BINUNICODE" or arg != "device_traces":
            return None
        names = ((o.name, start + p) for o, _, p in ops if o.name not in _SKIPPED)
        if next(names)[0] != "EMPTY_LIST":  # the list of devices
            return None
        name, at = next(names)
        if name == "MARK":  # more than one device
            name, at = next(names)
        for _ in range(MAX_DEVICE + 1):
            if name != "EMPTY_LIST":
                return None
            following, after = next(names)
            if following in ("MARK", "EMPTY_DICT"):  # this device's trace has entries
                return at
            name, at = following, after  # an empty trace: the next device's list follows
    except (ValueError, StopIteration):  # ran past what was read, or an opcode pickletools does not know
        return None
    return None


def _splice(mm: mmap.mmap, at: int, inserted: bytes) -> list[tuple[int, int] | bytes] | None:
    """The file's pieces with the one-byte opcode at `at` replaced by `inserted`, its frame's length patched."""
    frame = _frame_around(mm, at)
    if frame is None:
        return None
    start, length = frame
    header = bytes([FRAME]) + (length - 1 + len(inserted)).to_bytes(8, "little")
    return [(0, start), header, (start + FRAME_HEADER, at), inserted, (at + 1, len(mm))]


def _injection(token: str) -> bytes:
    """Opcodes that call the sink factory, named by `token`: STACK_GLOBAL, then REDUCE with no arguments."""
    module, name = token.encode(), SINK_NAME.encode()
    return b"\x8c" + bytes([len(module)]) + module + b"\x8c" + bytes([len(name)]) + name + b"\x93)R"


def _find_trace_list(mm: mmap.mmap) -> int | None:
    """Where the first non-empty trace list is made, for the first `device_traces` key that checks out."""
    if mm[:2] not in (b"\x80\x04", b"\x80\x05") or len(mm) < 12 or mm[2] != FRAME:
        return None
    key = mm.find(TRACES_KEY)
    for _ in range(8):  # a key inside other data (a string, a nested dict) is passed over
        if key < 0:
            return None
        found = _trace_list_at(mm, key)
        if found is not None:
            return found
        key = mm.find(TRACES_KEY, key + 1)
    return None


def _referenced_twice(holder: list) -> bool:
    """Whether `holder[0]` is referenced from `holder` and one other slot, and nowhere else (no name binds it)."""
    twin = [object()]
    slot = [twin[0]]  # noqa: F841 - the second slot the twin is compared with
    return sys.getrefcount(holder[0]) == sys.getrefcount(twin[0])


def _empty_dicts_in(values: list) -> list[int]:
    """The ids of every empty dict anywhere inside `values` (dicts, lists and tuples, walked without recursion)."""
    found, todo, seen = [], list(values), set()
    while todo:
        value = todo.pop()
        if type(value) in (dict, list, tuple) and id(value) not in seen:
            seen.add(id(value))
            if type(value) is dict:
                if not value:
                    found.append(id(value))
                todo.extend(value.keys())
                todo.extend(value.values())
            else:
                todo.extend(value)
    return found


def _sink_in_place(raw: Any, made: list[TraceSink]) -> int | None:
    """The device whose trace the sink `made[0]` is, if it is in `device_traces` only and what it emptied is
    nowhere else."""
    if type(raw) is not dict or type(raw.get("device_traces")) is not list:
        return None
    keys = list(raw)
    if "segments" in keys and keys.index("segments") > keys.index("device_traces"):
        return None  # segments after the trace could list an entry the sink emptied
    places = [i for i, trace in enumerate(raw["device_traces"]) if trace is made[0]]
    if len(places) != 1 or not _referenced_twice(made):
        return None
    rest = [value for key, value in raw.items() if key not in ("segments", "device_traces")]
    empty = _empty_dicts_in(rest)
    shells = made[0].shells
    if empty and shells and np.isin(np.array(empty, dtype=np.int64), np.concatenate(shells)).any():
        return None
    raw["device_traces"][places[0]] = []
    return places[0]


def read_incremental(path: Path, fd: int, on_read=None) -> tuple[Any, int, TraceColumns] | None:
    """Unpickle the snapshot file `fd` with its first non-empty trace streamed into columns.

    Returns the unpickled data (that trace replaced by an empty list), the
    device, and the device's columns; None where streaming does not apply or
    did not work out (read the file the plain way).
    """
    size = os.fstat(fd).st_size
    if size < 16:
        return None
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
        at = _find_trace_list(mm)
        token = "kit-sink-" + secrets.token_hex(16)
        pieces = None if at is None else _splice(mm, at, _injection(token))
    if pieces is None:
        return None
    made: list[TraceSink] = []

    def make_sink() -> TraceSink:
        if made:
            raise KitError("refused a second trace sink: a snapshot holds plain data only")
        made.append(TraceSink())
        return made[0]

    reader = Spliced(fd, pieces, on_read)
    try:
        raw = snapshot_unpickler(reader, sink=(token, SINK_NAME, make_sink)).load()
    except Exception:  # noqa: BLE001 - the plain load reads the file again and names what is wrong
        return None
    if not made:
        return None
    made[0].flush()
    if made[0].failed:
        return None
    device = _sink_in_place(raw, made)
    if device is None:
        return None
    sink = made.pop()
    refuse_legacy_torch_save(raw, str(path))
    check_expansion(raw, size, str(path), streamed=sink.length)
    return raw, device, sink.columns(device)

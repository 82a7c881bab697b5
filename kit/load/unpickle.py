"""Reading a snapshot file safely: pickles that run no code and cannot expand, JSON, and a paused collector.

`torch.cuda.memory._dump_snapshot` writes a pickle, and loading a pickle can
run code. A snapshot holds nothing but dicts, lists, tuples, str, int, float,
bool and None, which pickle encodes without naming a single global, so the
unpickler here refuses every global and every persistent id. It also refuses
a pickle whose shared references would expand a small file into millions of
records (torch never writes those). JSON files (the same dict; pool ids as
lists) are read too, and so is either compressed with gzip (`.pickle.gz`, as
snapshots are often kept) or bzip2 (`.pickle.bz2`), decompressed in memory up
to `GZIP_MAX_RATIO` times its size (at least `GZIP_FLOOR_BYTES`), which no real
snapshot reaches and a decompression bomb does at once. Every failure is a
one-line `KitError` naming the file, and a file of another kind is named as
such from its first bytes: xz, zstd or lz4 compression ("unxz it first"), a
`torch.save` archive, or another zip archive. Nothing in such a file is
decompressed or run.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import pickle
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from kit.errors import KitError

FREEZE_ABOVE = 1_000_000  # containers made by one load past which they leave the collector's view
HEAD_BYTES = 64  # enough of a file's start to tell its kind

GZIP_MAGIC = b"\x1f\x8b"
GZIP_MAX_RATIO = 100  # a snapshot's pickle compresses 10 to 30 times; gzip's own ceiling is about 1000
GZIP_FLOOR_BYTES = 256 << 20
# (magic bytes at the start, the format, the command that undoes it): refused, named
COMPRESSIONS = (
    (b"\xfd7zXZ\x00", "xz", "unxz"),
    (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
    (b"\x04\x22\x4d\x18", "lz4", "unlz4"),
)
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a zip's first entry, or an empty zip
# The first pickle in a file of torch.save(..., _use_new_zipfile_serialization=False).
TORCH_SAVE_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


@contextlib.contextmanager
def gc_paused(*, freeze_above: int | None = None) -> Iterator[None]:
    """Pause the cyclic garbage collector while millions of containers are made.

    Every 700 new containers the collector runs, and its full passes walk
    everything made so far: unpickling a large snapshot takes twice as long
    with it running. Paused, the passes are only put off: the first ones after
    it walk the new containers all the same, seconds each for a snapshot of
    millions. With `freeze_above`, when more containers than that were made,
    `gc.freeze()` moves everything then alive out of the collector's view for
    good. A snapshot is plain data that holds no reference cycle, and frozen
    objects are still freed when the last reference to them goes; what the
    collector no longer sees are cycles among objects that already existed
    (`gc.unfreeze()` hands them back).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        if freeze_above is not None and gc.get_count()[0] > freeze_above:
            gc.freeze()
    finally:
        if was_enabled:
            gc.enable()


class _SnapshotUnpickler(pickle.Unpickler):
    """Unpickles plain data only: any global (class, function) is refused.

    Snapshots hold nothing but dicts, lists, tuples, str, int, float, bool and
    None, which pickle encodes without naming a single global, so refusing
    every global refuses every way a pickle can call code. The one exception
    is the kit's own trace sink (`kit.load.incremental`), which the kit splices into
    the bytes it reads under a random token made for that one load: a file
    cannot name it.
    """

    def __init__(self, file: IO[bytes], *, sink: tuple[str, str, Callable[[], Any]] | None = None) -> None:
        super().__init__(file)
        self._sink = sink

    def find_class(self, module: str, name: str) -> Any:
        if self._sink is not None and (module, name) == self._sink[:2]:
            return self._sink[2]
        raise KitError(f"refused to load global '{module}.{name}': a snapshot holds plain data only")

    def persistent_load(self, pid: Any) -> Any:
        raise KitError("refused a persistent id: a snapshot holds plain data only")

    def load(self) -> Any:
        # The collector's passes over millions of new containers double a large load's time.
        with gc_paused(freeze_above=FREEZE_ABOVE):
            return super().load()


def snapshot_unpickler(file: IO[bytes], *, sink: tuple[str, str, Callable[[], Any]] | None = None) -> pickle.Unpickler:
    """The safe unpickler over `file`; `sink` (token, name, factory) admits the kit's spliced trace sink."""
    return _SnapshotUnpickler(file, sink=sink)


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


def read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise KitError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise KitError(f"{path}: is a folder, not a snapshot file") from None
    except OSError as e:
        raise KitError(f"{path}: cannot read ({e.strerror or e})") from None


def _compression(head: bytes) -> tuple[str, str] | None:
    """The compression the kit refuses that a file's first bytes announce, and the command that undoes it."""
    for magic, name, command in COMPRESSIONS:
        if head.startswith(magic):
            return name, command
    return None


def readable_compression(head: bytes) -> str | None:
    """`gzip` or `bzip2` where a file's first bytes announce one the kit reads (decompressed, bounded); else None."""
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    # bzip2: "BZh", a block size digit, then a block's or the end's magic
    if head[:3] == b"BZh" and head[3:4] in b"123456789" and head[4:10] in (b"1AY&SY", b"\x17rE8P\x90"):
        return "bzip2"
    return None


def _zip_kind(archive: bytes | IO[bytes]) -> str:
    """What a zip archive is: `torch.save`'s (a data.pkl and a version record inside) or some other."""
    try:
        with zipfile.ZipFile(io.BytesIO(archive) if isinstance(archive, bytes) else archive) as z:
            names = [name.rsplit("/", 1)[-1] for name in z.namelist()]
    except Exception:  # noqa: BLE001 - a damaged zip is still a zip
        return "a zip archive"
    return "this is a torch.save archive" if "data.pkl" in names and "version" in names else "a zip archive"


def refuse_other_formats(head: bytes, where: str, archive: bytes | IO[bytes]) -> None:
    """A one-line `KitError` naming the format when `head` starts a compressed file or a zip archive.

    `archive` is the whole file (bytes, or a seekable binary file), read only
    for a zip's list of names; nothing is decompressed or unpickled.
    """
    compression = _compression(head)
    if compression:
        name, command = compression
        raise KitError(f"{where}: compressed with {name}: {command} it first")
    if head.startswith(ZIP_MAGIC):
        raise KitError(f"{where}: {_zip_kind(archive)}, not a memory snapshot")


def refuse_legacy_torch_save(raw: Any, where: str) -> None:
    if type(raw) is int and raw == TORCH_SAVE_LEGACY_MAGIC:
        raise KitError(f"{where}: this is a torch.save file (its legacy format), not a memory snapshot")


def gunzip_bounded(source: bytes | IO[bytes], compressed_bytes: int, where: str) -> bytes:
    """A gzip file's contents, decompressed in memory (`decompress_bounded`)."""
    return decompress_bounded(source, compressed_bytes, where, "gzip")


def decompress_bounded(source: bytes | IO[bytes], compressed_bytes: int, where: str, kind: str) -> bytes:
    """A `gzip` or `bzip2` file's contents, decompressed in memory; a one-line `KitError` if it is damaged,
    expands past `GZIP_MAX_RATIO` times its size (at least `GZIP_FLOOR_BYTES`), or holds a compressed file."""
    import bz2
    import gzip
    import zlib

    opener = {"gzip": lambda f: gzip.GzipFile(fileobj=f), "bzip2": bz2.BZ2File}[kind]
    limit = max(GZIP_FLOOR_BYTES, GZIP_MAX_RATIO * compressed_bytes)
    chunks, total = [], 0
    try:
        with opener(io.BytesIO(source) if isinstance(source, bytes) else source) as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
                if total > limit:
                    raise KitError(
                        f"{where}: {kind} expands past {limit >> 20} MiB ({GZIP_MAX_RATIO} times its size): not a "
                        "snapshot the kit reads compressed; decompress it yourself if it is one"
                    )
                chunks.append(chunk)
    except (OSError, EOFError, ValueError, zlib.error) as e:
        raise KitError(
            f"{where}: a damaged {kind} file ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
        ) from None
    data = b"".join(chunks)
    head = data[:HEAD_BYTES]
    inner = readable_compression(head) or next(iter(_compression(head) or ()), None)
    if inner:
        raise KitError(f"{where}: {inner} inside {kind}; not a snapshot")
    return data


def decode_snapshot(data: bytes, where: str) -> dict:
    if not data:
        raise KitError(f"{where}: empty file")
    kind = readable_compression(data[:HEAD_BYTES])
    if kind:
        data = decompress_bounded(data, len(data), where, kind)
        if not data:
            raise KitError(f"{where}: empty once decompressed")
    refuse_other_formats(data[:HEAD_BYTES], where, data)
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark before JSON
        data = data[3:]
    if data.lstrip()[:1] in (b"{", b"["):
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as e:
            detail = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise KitError(f"{where}: not readable JSON ({detail})") from None
    raw = safe_unpickle(data, where)
    refuse_legacy_torch_save(raw, where)
    check_expansion(raw, len(data), where)
    return raw


def check_expansion(raw: Any, size: int, where: str, *, streamed: int = 0) -> None:
    """Refuse a pickle whose records outnumber its bytes: shared references, which torch never writes.

    A pickle can reference one object many times (a list of the same block a
    million times, in a segment listed a million times) and so expand a few
    kilobytes into billions of records. Every real record takes well over two
    bytes of the file. `streamed`: trace entries read into columns as they came
    (`kit.load.incremental`), no longer in `raw`.
    """
    if not isinstance(raw, dict):
        return
    records = streamed
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


class _Counted:
    """A binary file whose reads are counted (`on_read(n)`, for a progress bar) as the unpickler makes them."""

    def __init__(self, f: IO[bytes], on_read: Callable[[int], object]) -> None:
        self._f, self._on_read = f, on_read

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._on_read(len(data))
        return data

    def readline(self) -> bytes:
        data = self._f.readline()
        self._on_read(len(data))
        return data

    def readinto(self, buffer) -> int:
        n = self._f.readinto(buffer)
        self._on_read(n or 0)
        return n

    def peek(self, n: int = 1) -> bytes:
        return self._f.peek(n)


def load_file(path: Path, on_read: Callable[[int], object] | None = None) -> Any:
    """A snapshot file's contents; a pickle streams from the file, so its bytes are never all in memory.

    `on_read(n)` is told of the bytes of a pickle as they are read (a progress bar).
    """
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
            if readable_compression(head):  # decompressed in memory, bounded, by the same path as bytes
                return decode_snapshot(head + f.read(), str(path))
            refuse_other_formats(head, str(path), f)
            if not head or head.lstrip()[:1] in (b"{", b"[") or head[:1] != b"\x80":
                return decode_snapshot(head + f.read(), str(path))  # JSON, or not a pickle at all
            f.seek(0)
            raw = safe_unpickle(f if on_read is None else _Counted(f, on_read), str(path))
            refuse_legacy_torch_save(raw, str(path))
            check_expansion(raw, os.fstat(f.fileno()).st_size, str(path))
            return raw
    except OSError:
        return decode_snapshot(read_file(path), str(path))  # read_file names what went wrong

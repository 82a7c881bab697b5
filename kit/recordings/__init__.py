"""The H200 recordings shipped with the kit, and the choice between running live and reading them.

Each file here was recorded on an NVIDIA H200 with torch 2.11; `PROVENANCE.json`
beside it names the GPU, the torch and CUDA versions, the date, the command
that made it and its sha256. They let every notebook, command and test run
on a machine without a GPU, and they are what the simulator was checked
against. `docs/recordings.md` lists them, what each holds and the script that
records it; `make recordings` records them all again on a CUDA machine.

`recording(name)` is the path of one, `default_source()` chooses between a
live GPU and the recordings.

The few recordings of many megabytes (vLLM's default presets, with every
model graph's reads and writes) are shipped gzip-compressed, as `NAME.gz`
beside where `NAME` would be; `shipped(path)` finds either and
`shipped_bytes(path)` reads either, the compressed one decompressed in
memory (bounded: `MAX_SHIPPED_BYTES`). Their `PROVENANCE.json` entries (sha256,
bytes) are of the file the command wrote, before compression
(`scripts/ship_recording.py` compresses one).
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from kit.errors import KitError

RECORDINGS = Path(__file__).resolve().parent
LIVE, RECORDED = "live GPU", "recorded"
GZ = ".gz"
MAX_SHIPPED_BYTES = 256 << 20  # no shipped recording comes near this decompressed; a bigger one is refused


def shipped(path: Path) -> Path | None:
    """`path` if it is a file, else `path.gz` if that is (a recording shipped compressed), else None."""
    path = Path(path)
    for found in (path, path.with_name(path.name + GZ)):
        if found.is_file():
            return found
    return None


def shipped_bytes(path: Path) -> bytes:
    """The bytes of the recording at `path` (or of `path.gz`, decompressed); KitError if neither is there, or if
    the compressed one is corrupt or would expand past `MAX_SHIPPED_BYTES`."""
    found = shipped(path)
    if found is None:
        raise KitError(f"{path}: no such recording (nor {path.name}{GZ})")
    if found.suffix != GZ:
        return found.read_bytes()
    try:
        with gzip.open(found, "rb") as f:
            data = f.read(MAX_SHIPPED_BYTES + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise KitError(f"{found}: not a readable gzip file ({e})") from None
    if len(data) > MAX_SHIPPED_BYTES:
        raise KitError(f"{found}: expands past {MAX_SHIPPED_BYTES >> 20} MiB; not a recording the kit shipped")
    return data


def recording(name: str) -> Path:
    """The path of a shipped recording, e.g. `recording("replica/small_patched.pickle")`."""
    path = RECORDINGS / name
    if not path.is_file():
        raise KitError(f"no shipped recording {name!r} (they are in {RECORDINGS})")
    return path


def default_source() -> str:
    """`live GPU` where this process has CUDA, else `recorded` (the shipped H200 recordings)."""
    import torch

    return LIVE if torch.cuda.is_available() else RECORDED


def check_source(source: str) -> str:
    if source not in (LIVE, RECORDED):
        raise KitError(f"unknown data source {source!r}: use {LIVE!r} or {RECORDED!r}")
    return source

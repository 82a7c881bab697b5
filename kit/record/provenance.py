"""Where a recording was made, and the `PROVENANCE.json` that lists each recorded file with its sha256.

Every recorder of the kit (`CaptureRecorder`, `run_on_gpu`, the per-rank
snapshots of `vllm_ranks`, the experiments in `kit.experiments`, and the
recording scripts, `scripts/record_plain.py` and the others) takes its
provenance and writes its manifest here, so a recording says the same things
the same way wherever it was made:

- `provenance(command)`: the GPU, torch and CUDA versions (`machine`), the
  date (`utc_now`) and the command that made it;
- `read_manifest`, `write_manifest` (atomically, `kit.fileio.atomic_write`)
  and `add_entry`, which puts one file's entry with its sha256 into a
  folder's manifest; `sha256` and `file_hashes` for the layouts that keep
  hashes on their own (`docs/recordings.md` describes both layouts);
- `require_cuda(message)`: the one-line refusal of a live run without CUDA.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import platform
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kit.errors import KitError
from kit.fileio import atomic_write

MANIFEST = "PROVENANCE.json"


def require_cuda(message: str) -> None:
    """KitError `message` where this process sees no CUDA GPU (checked before any folder or process is made)."""
    import torch

    if not torch.cuda.is_available():
        raise KitError(message)


def utc_now() -> str:
    """The date a recording is stamped with: UTC, to the second, ISO 8601."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def machine(*, python: bool = False) -> dict[str, Any]:
    """The GPU ("none" without CUDA), torch's and CUDA's versions, and with `python` Python's."""
    import torch

    try:
        gpu = torch.cuda.get_device_name()
    except (AssertionError, RuntimeError):  # torch without CUDA, or no GPU
        gpu = "none"
    found = {
        "gpu": gpu,
        "torch": str(torch.__version__),  # a TorchVersion would pickle as a global
        "cuda": torch.version.cuda,
    }
    if python:
        found["python"] = platform.python_version()
    return found


def provenance(command: str, *, python: bool = False) -> dict[str, Any]:
    """Where and when a run was made: `machine()`, the date, `command`."""
    return {**machine(python=python), "date": utc_now(), "command": command}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_hashes(paths: Iterable[Path]) -> dict[str, str]:
    """`{file name: sha256}` of each of `paths` (the one-session-for-many-files layout)."""
    return {p.name: sha256(p.read_bytes()) for p in paths}


def read_manifest(folder: str | Path) -> dict:
    """The folder's `PROVENANCE.json`, or `{}` where it has none."""
    path = Path(folder) / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {}


def write_manifest(folder: str | Path, manifest: dict) -> Path:
    """`manifest` as the folder's `PROVENANCE.json`, atomically."""
    path = Path(folder) / MANIFEST
    with atomic_write(path) as f:
        f.write(json.dumps(manifest, indent=1, default=str) + "\n")
    return path


def add_entry(folder: str | Path, name: str, entry: dict, data: bytes | None = None, *, size: bool = False) -> dict:
    """Put `name`'s entry into the folder's manifest, keeping the others; the manifest as written.

    With `data` (the file's bytes) the entry gets their `sha256`, and with
    `size` their length as `bytes`; an entry without data (a run that failed)
    is kept as given.
    """
    manifest = read_manifest(folder)
    manifest[name] = entry_with_hash(entry, data, size=size) if data is not None else entry
    write_manifest(folder, manifest)
    return manifest


def entry_with_hash(entry: dict, data: bytes, *, size: bool = False) -> dict:
    """`entry` with the `sha256` of `data` (and with `size` its length as `bytes`) after its own keys."""
    return {**entry, "sha256": sha256(data), **({"bytes": len(data)} if size else {})}

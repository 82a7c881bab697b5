"""The H200 recordings shipped with the kit, and the choice between running live and reading them.

Each file here was recorded on an NVIDIA H200 with torch 2.11; `PROVENANCE.json`
beside it names the GPU, the torch and CUDA versions, the date, the command
that made it and its sha256. They let every notebook, command and test run
on a machine without a GPU, and they are what the simulator was checked
against. `docs/recordings.md` lists them, what each holds and the script that
records it; `make recordings` records them all again on a CUDA machine.

`recording(name)` is the path of one, `default_source()` chooses between a
live GPU and the recordings.
"""

from __future__ import annotations

from pathlib import Path

from kit.errors import KitError

RECORDINGS = Path(__file__).resolve().parent
LIVE, RECORDED = "live GPU", "recorded"


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

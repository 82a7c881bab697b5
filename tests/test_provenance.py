"""Every shipped recording is the file its provenance describes: each PROVENANCE.json's hashes are checked.

A `PROVENANCE.json` names, per file of its folder, the GPU, the torch version,
the date, the command that made it and the file's sha256 (`docs/recordings.md`).
Two layouts exist: one entry per file (`{"name": {..., "sha256": ...}}`), and
the corpus's one session for many files (`{"gpu": ..., "command": ...,
"files": {"name": sha256}}`, with the sessions recorded later on their own under
`added`). Here every PROVENANCE.json under kit/recordings and tests/fixtures is
read both ways: every file it names exists and hashes to what it says, and
every recording in its folder is named by it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kit.recordings import RECORDINGS

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted([*RECORDINGS.rglob("PROVENANCE.json"), *(ROOT / "tests" / "fixtures").rglob("PROVENANCE.json")])
RECORDING_SUFFIXES = (".pickle", ".json")


def entries(manifest: Path) -> dict[str, dict]:
    """file name -> its provenance (gpu, torch, date, command, sha256, ...), in either layout."""
    data = json.loads(manifest.read_text())
    if "files" not in data and "added" not in data:
        return data
    out = {}
    for session in [data, *data.get("added", [])]:
        shared = {k: v for k, v in session.items() if k not in ("files", "added")}
        out.update({name: {**shared, "sha256": sha} for name, sha in session.get("files", {}).items()})
    return out


def _cases() -> list[tuple[Path, str]]:
    return [(manifest, name) for manifest in MANIFESTS for name in sorted(entries(manifest))]


def test_every_recording_folder_has_its_provenance():
    folders = {p.parent for p in RECORDINGS.rglob("*") if p.suffix in RECORDING_SUFFIXES}
    assert folders == {m.parent for m in MANIFESTS if m.is_relative_to(RECORDINGS)}
    assert len(MANIFESTS) >= 7 and all(entries(m) for m in MANIFESTS)


@pytest.mark.parametrize("manifest,name", _cases(), ids=[f"{m.parent.relative_to(ROOT)}/{n}" for m, n in _cases()])
def test_each_file_is_the_one_its_provenance_describes(manifest, name):
    entry = entries(manifest)[name]
    path = manifest.parent / name
    assert path.is_file(), f"{manifest} names {name}, which is not there"
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == entry["sha256"], f"{path} is not the file {manifest} describes"
    if "bytes" in entry:
        assert len(data) == entry["bytes"]
    assert entry["gpu"].startswith("NVIDIA") and entry["torch"] and entry["date"] and entry["command"]


@pytest.mark.parametrize("manifest", MANIFESTS, ids=[str(m.parent.relative_to(ROOT)) for m in MANIFESTS])
def test_every_recording_in_a_folder_is_named_by_its_provenance(manifest):
    present = {p.name for p in manifest.parent.iterdir() if p.suffix in RECORDING_SUFFIXES}
    assert present - {"PROVENANCE.json"} <= set(entries(manifest))

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

from kit.recordings import RECORDINGS, shipped, shipped_bytes

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
    assert shipped(path) is not None, f"{manifest} names {name}, which is not there"
    data = shipped_bytes(path)  # as recorded: a file shipped compressed (NAME.gz) is read back decompressed
    assert hashlib.sha256(data).hexdigest() == entry["sha256"], f"{path} is not the file {manifest} describes"
    if "bytes" in entry:
        assert len(data) == entry["bytes"]
    assert entry["gpu"].startswith("NVIDIA") and entry["torch"] and entry["date"] and entry["command"]


@pytest.mark.parametrize("manifest", MANIFESTS, ids=[str(m.parent.relative_to(ROOT)) for m in MANIFESTS])
def test_every_recording_in_a_folder_is_named_by_its_provenance(manifest):
    names = [p.name.removesuffix(".gz") for p in manifest.parent.iterdir()]  # NAME.gz: NAME, shipped compressed
    present = {name for name in names if Path(name).suffix in RECORDING_SUFFIXES}
    assert present - {"PROVENANCE.json"} <= set(entries(manifest))


# --- one place builds provenance and writes manifests (kit.record.provenance) ---------------------


def test_provenance_has_the_keys_every_shipped_entry_has():
    from kit.record.provenance import provenance

    made = provenance("python -m something")
    assert list(made) == ["gpu", "torch", "cuda", "date", "command"] and made["command"] == "python -m something"
    assert list(provenance("x", python=True)) == ["gpu", "torch", "cuda", "python", "date", "command"]
    for manifest in MANIFESTS:
        for name, entry in entries(manifest).items():
            assert {"gpu", "torch", "date", "command"} <= set(entry), f"{manifest}: {name}"


def test_add_entry_keeps_the_other_entries_and_hashes_the_file(tmp_path):
    from kit.record.provenance import add_entry, read_manifest

    add_entry(tmp_path, "a.json", {"gpu": "NVIDIA H200", "command": "one"}, b"first")
    add_entry(tmp_path, "b.pickle", {"gpu": "NVIDIA H200", "command": "two"}, b"second", size=True)
    add_entry(tmp_path, "c.pickle", {"failed": ["it broke"]})  # a failed run: no file, no hash
    manifest = read_manifest(tmp_path)
    assert manifest == json.loads((tmp_path / "PROVENANCE.json").read_text())
    first, second = (hashlib.sha256(data).hexdigest() for data in (b"first", b"second"))
    assert manifest["a.json"] == {"gpu": "NVIDIA H200", "command": "one", "sha256": first}
    assert manifest["b.pickle"]["sha256"] == second and manifest["b.pickle"]["bytes"] == 6
    assert manifest["c.pickle"] == {"failed": ["it broke"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["PROVENANCE.json"]  # written atomically: no temporary left


def test_no_module_builds_its_own_provenance_or_manifest():
    """The GPU's name, the date and a PROVENANCE.json are made in kit/record/provenance.py alone."""
    own = ROOT / "kit" / "record" / "provenance.py"
    sources = [p for p in [*(ROOT / "kit").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")] if p != own]
    for path in sources:
        text = path.read_text()
        for made_here in ("get_device_name(", "datetime.now(", '/ "PROVENANCE.json"'):
            assert made_here not in text, f"{path.relative_to(ROOT)} builds provenance itself ({made_here})"

"""Recordings shipped gzip-compressed (`kit.recordings.shipped_bytes`): found beside their name, read back
exactly, and refused in one line when corrupt, truncated or expanding past the bound."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys

import pytest

from kit import recordings
from kit.errors import KitError
from kit.recordings import GZ, RECORDINGS, shipped, shipped_bytes

from .test_provenance import entries


def test_a_plain_file_wins_and_a_gz_beside_it_is_read_back_exactly(tmp_path):
    plain, packed = tmp_path / "a.json", tmp_path / "b.json"
    plain.write_bytes(b'{"a": 1}')
    (tmp_path / ("b.json" + GZ)).write_bytes(gzip.compress(b'{"b": 2}', mtime=0))
    assert shipped(plain) == plain and shipped_bytes(plain) == b'{"a": 1}'
    assert shipped(packed) == tmp_path / "b.json.gz" and shipped_bytes(packed) == b'{"b": 2}'
    assert shipped(tmp_path / "c.json") is None
    with pytest.raises(KitError, match="no such recording"):
        shipped_bytes(tmp_path / "c.json")


@pytest.mark.parametrize("damage", ["corrupt", "truncated"])
def test_a_damaged_gz_is_one_line_error(tmp_path, damage):
    data = gzip.compress(b"x" * 100_000, mtime=0)
    data = data[:10] + b"\x00" * 20 + data[30:] if damage == "corrupt" else data[: len(data) // 2]
    (tmp_path / "r.json.gz").write_bytes(data)
    with pytest.raises(KitError, match="not a readable gzip file") as e:
        shipped_bytes(tmp_path / "r.json")
    assert "\n" not in str(e.value)


def test_a_gz_expanding_past_the_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(recordings, "MAX_SHIPPED_BYTES", 1000)
    (tmp_path / "r.json.gz").write_bytes(gzip.compress(b"0" * 1001, mtime=0))
    with pytest.raises(KitError, match="expands past"):
        shipped_bytes(tmp_path / "r.json")
    (tmp_path / "s.json.gz").write_bytes(gzip.compress(b"0" * 1000, mtime=0))
    assert len(shipped_bytes(tmp_path / "s.json")) == 1000


def test_every_shipped_gz_gives_back_the_file_its_provenance_describes():
    packed = sorted(RECORDINGS.rglob("*" + GZ))
    assert packed, "the kit ships its largest recordings compressed"
    for path in packed:
        name = path.name.removesuffix(GZ)
        entry = entries(path.parent / "PROVENANCE.json")[name]
        data = shipped_bytes(path.with_name(name))
        assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry.get("bytes", len(data)), path
        stem = name.split(".")[0]  # a folder packed whole says it once: "NAME.pickle.gz for each NAME.pickle"
        assert entry["shipped_as"].replace("NAME", stem, 1).startswith(path.name)


def test_ship_recording_replaces_the_file_by_a_gz_that_gives_it_back(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"pairs": list(range(5000))}))
    (tmp_path / "PROVENANCE.json").write_text(json.dumps({"big.json": {"sha256": "x"}}))
    before = path.read_bytes()
    done = subprocess.run(
        [sys.executable, "scripts/ship_recording.py", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert not path.exists() and (tmp_path / "big.json.gz").is_file() and shipped_bytes(path) == before
    entry = json.loads((tmp_path / "PROVENANCE.json").read_text())["big.json"]
    assert entry["sha256"] == "x" and entry["shipped_as"].startswith("big.json.gz ")
    again = tmp_path / "again.json"
    again.write_bytes(before)
    subprocess.run([sys.executable, "scripts/ship_recording.py", str(again)], check=True, capture_output=True)
    assert (tmp_path / "again.json.gz").read_bytes() == (tmp_path / "big.json.gz").read_bytes()  # deterministic

"""Compress a recording of many megabytes for shipping: `NAME` -> `NAME.gz` beside it, the original removed.

    python scripts/ship_recording.py kit/recordings/<folder>/<name>

The kit reads `NAME.gz` wherever it would read `NAME` (`kit.recordings.shipped_bytes`).
The output is deterministic (gzip level 9, no name, mtime 0), so the same recording
gives the same bytes; PROVENANCE.json keeps the sha256 and size of the uncompressed
file, which `shipped_bytes` gives back, and its entry for the file (where it has one)
gains `shipped_as`, naming the compressed file.
"""

from __future__ import annotations

import argparse
import gzip
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kit.fileio import atomic_write  # noqa: E402
from kit.record.provenance import read_manifest, write_manifest  # noqa: E402
from kit.recordings import GZ, shipped_bytes  # noqa: E402


def ship(path: Path) -> Path:
    """Write `path.gz`, check it gives `path`'s bytes back, then remove `path`; the compressed file's path."""
    data = path.read_bytes()
    out = path.with_name(path.name + GZ)
    with atomic_write(out, "wb") as f:
        f.write(gzip.compress(data, compresslevel=9, mtime=0))
    if gzip.decompress(out.read_bytes()) != data:
        out.unlink()
        raise SystemExit(f"{out}: does not give {path.name} back; {path} kept")
    path.unlink()
    if shipped_bytes(path) != data:  # what the kit reads now
        raise SystemExit(f"{out}: the kit does not read {path.name} back from it")
    note_shipped(path, out)
    return out


def note_shipped(path: Path, out: Path) -> None:
    """`shipped_as` on `path`'s entry in the PROVENANCE.json beside it, if it has one."""
    manifest = read_manifest(path.parent)
    if isinstance(manifest.get(path.name), dict):
        how = f"python scripts/ship_recording.py; sha256 and bytes are of {path.name}, what the command wrote"
        manifest[path.name]["shipped_as"] = f"{out.name} ({how})"
        write_manifest(path.parent, manifest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Compress recordings for shipping (NAME -> NAME.gz).")
    parser.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for path in args.paths:
        size = path.stat().st_size
        out = ship(path)
        print(f"{path} -> {out.name} ({size} -> {out.stat().st_size} B)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

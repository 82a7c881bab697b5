"""Record workloads twice on a real GPU, as written and with one stream merged into another: what-if's ground truth.

    python scripts/record_merged.py --out kit/recordings/merged        # or: make merged-recordings
    python scripts/record_merged.py --set spread --out DIR              # longer, mostly eager work

`what-if SNAPSHOT --map s2=s1` predicts what the process would have reserved
had stream s2's work run on s1. This script makes the answer to check it
against: each seeded workload (`kit.allocator.workload.generate_workload`:
captures into shared and private pools on two side streams, frees inside and
outside captures, `empty_cache` runs that free segments) is written as
`NAME.json` and, with every op of stream `s2` moved onto `s1`, as
`NAME_merged.json`; each runs with `python -m kit run-workload` in a fresh
process and its snapshot is written beside it as `NAME.pickle` and
`NAME_merged.pickle`. Trace frames are dropped (the workload's names are in the
snapshot's `kit` key, and the files ship with the kit). `PROVENANCE.json` holds
the GPU, the versions, the date, the command, and per file its trace length,
segment frees and sha256. The spread set's snapshots are long: they ship gzipped
(`NAME.pickle.gz`, which every command reads) without their workloads, which
`workloads("spread")` makes again from the seeds. A workload whose recording frees no segment is an
error: these pairs exist to exercise `empty_cache`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import json
import pickle
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kit.allocator.workload import generate_workload  # noqa: E402
from kit.errors import KitError  # noqa: E402
from kit.experiments.recorded import trim_frames  # noqa: E402
from kit.fileio import atomic_write  # noqa: E402
from kit.load.unpickle import safe_unpickle  # noqa: E402
from kit.record.provenance import file_hashes, provenance, require_cuda, write_manifest  # noqa: E402

MOVED, ONTO = "s2", "s1"
# Per set, (seed, ops, capture rate, streams): "merged", a dozen small and middling workloads and
# one long one; "spread", longer ones with a third side stream and few captures, so that most of
# what moves is eager work in the default pool, where cudaMalloc's choice of address decides ties.
SETS = {
    "merged": [(100 + i, 400 + 150 * i, 0.04, 3) for i in range(12)] + [(200, 12000, 0.004, 3)],
    "spread": [(300 + i, 3000 + 1500 * i, 0.006, 4) for i in range(12)],
}
PACKED = {"spread"}  # sets shipped as NAME.pickle.gz, workloads left to the seeds
PACKED_AS = "NAME.pickle.gz for each NAME.pickle (gzip, no time stamp); sha256 is of NAME.pickle, what the run wrote"


def command(which: str) -> str:
    """The one command that records a set into its shipped folder."""
    folder = "merged" if which == "merged" else f"merged_{which}"
    return (
        f"python scripts/record_merged.py{'' if which == 'merged' else f' --set {which}'} --out kit/recordings/{folder}"
    )


def merged(workload: dict, moved: str = MOVED, onto: str = ONTO) -> dict:
    """`workload` with every op of stream `moved` made on `onto` (a capture's stream, an allocation's)."""
    ops = [dict(op, stream=onto) if op.get("stream") == moved else op for op in workload["ops"]]
    return {"version": 1, "ops": ops}


def workloads(which: str = "merged") -> dict[str, dict]:
    """NAME -> workload, for every pair of a set: `SET_SEED` as generated and `SET_SEED_merged`."""
    out = {}
    for seed, n_ops, rate, streams in SETS[which]:
        w = generate_workload(seed, n_ops=n_ops, n_streams=streams, capture_rate=rate, max_live_bytes=8 << 30)
        out[f"{which}_{seed}"] = w
        out[f"{which}_{seed}_merged"] = merged(w)
    return out


def record(name: str, out: Path) -> dict:
    """Run one workload in a fresh process; its file's provenance entry."""
    pickle_path = out / f"{name}.pickle"
    command = [sys.executable, "-m", "kit", "run-workload", str(out / f"{name}.json"), "-o", str(pickle_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{name}: run-workload failed: {done.stderr.strip()[-2000:]}")
    raw = safe_unpickle(pickle_path.read_bytes(), pickle_path.name)
    trim_frames(raw, keep=0)

    with atomic_write(pickle_path, "wb") as f:
        pickle.dump(raw, f)
    trace = raw["device_traces"][0]
    frees = sum(e["action"] == "segment_free" for e in trace)
    if not frees:
        raise RuntimeError(f"{name}: its recording frees no segment; pick another seed")
    return {"trace_entries": len(trace), "segment_frees": frees}


def pack(out: Path, names: list[str]) -> None:
    """Each `NAME.pickle` gzipped into `NAME.pickle.gz` (no time stamp, so the bytes repeat), its workload removed."""
    for name in names:
        plain = out / f"{name}.pickle"
        with atomic_write(out / f"{name}.pickle.gz", "wb") as f:
            f.write(gzip.compress(plain.read_bytes(), compresslevel=9, mtime=0))
        plain.unlink()
        (out / f"{name}.json").unlink()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="which", choices=sorted(SETS), default="merged", help="which workloads")
    parser.add_argument("--out", type=Path, default=ROOT / "kit" / "recordings" / "merged")
    parser.add_argument("--jobs", type=int, default=8, help="processes at once (each one fresh)")
    args = parser.parse_args()
    try:
        require_cuda("recording needs CUDA; nothing was written")
    except KitError as e:
        print(f"record_merged.py: error: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    pairs = workloads(args.which)
    for name, workload in pairs.items():
        with atomic_write(args.out / f"{name}.json") as f:
            f.write(json.dumps(workload) + "\n")
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        facts = dict(zip(pairs, pool.map(lambda n: record(n, args.out), pairs), strict=True))
    shipped = (".pickle",) if args.which in PACKED else (".json", ".pickle")
    files = file_hashes(args.out / f"{name}{suffix}" for name in sorted(pairs) for suffix in shipped)
    for name in sorted(pairs):
        print(f"{name}: {facts[name]['trace_entries']} trace entries, {facts[name]['segment_frees']} segment frees")
    manifest = {
        **provenance(command(args.which)),
        "what": f"each workload as generated and with stream {MOVED!r} merged onto {ONTO!r}; trace frames dropped",
        "runs": facts,
        "files": files,
    }
    if args.which in PACKED:
        pack(args.out, sorted(pairs))
        manifest["shipped_as"] = PACKED_AS
    write_manifest(args.out, manifest)
    print(f"recorded {len(pairs)} workloads ({len(pairs) // 2} pairs) into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

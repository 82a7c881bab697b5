"""Check what-if against the real allocator: each recorded pair (as written, one stream merged), pool by pool.

    python scripts/whatif_vs_merged.py kit/recordings/merged            # the shipped pairs
    python scripts/whatif_vs_merged.py DIR --json                       # one JSON object as the last line

For every `NAME.pickle` beside a `NAME_merged.pickle` (`scripts/record_merged.py`
writes both; `.pickle.gz` too), it runs `what_if(NAME.pickle, {s2: s1})` and sets
each pool's predicted reserved bytes beside what the merged run reserved on the
GPU, and beside the kit's own simulator running the merged workload
(`NAME_merged.json`, or the seeded set's). A pool the prediction misses is
listed with how far outside its stated range it fell. Exit 1 when a graph pool
is wrong, or a pool falls farther outside its range than the share the
what-if's correction line states (`SPREAD_SEEN_OUTSIDE`); else 0. With `--record N` (needs CUDA)
it first records a generated workload of N ops and its merged twin into DIR,
for traces too long to ship (the 300,000-op check in docs/commands.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from record_merged import MOVED, ONTO, SETS, merged, workloads  # noqa: E402

from kit.allocator.simulator import simulate  # noqa: E402
from kit.allocator.workload import generate_workload, load_workload, parse_workload  # noqa: E402
from kit.analysis.tables import segment_table  # noqa: E402
from kit.analysis.whatif import SPREAD_SEEN_OUTSIDE, reserved_by_pool, what_if, within_seen_spread  # noqa: E402
from kit.fileio import atomic_write  # noqa: E402
from kit.load.snapshot import Snapshot, load_snapshot  # noqa: E402

SUFFIXES = (".pickle", ".pickle.gz")


def stem(path: Path) -> str:
    """`NAME` of `NAME.pickle` or `NAME.pickle.gz`."""
    return path.name.removesuffix(".gz").removesuffix(".pickle")


def twin_of(original: Path) -> Path | None:
    """The merged run beside `original` (`NAME_merged.pickle` or `.pickle.gz`), or None."""
    found = [original.with_name(f"{stem(original)}_merged{s}") for s in SUFFIXES]
    return next((p for p in found if p.is_file()), None)


def merged_workload(twin: Path) -> list | None:
    """The workload the merged run ran: its `NAME_merged.json`, else the seeded set it belongs to."""
    path = twin.with_name(f"{stem(twin)}.json")
    if path.is_file():
        return load_workload(str(path))
    which = stem(twin).split("_")[0]
    workload = workloads(which).get(stem(twin)) if which in SETS else None
    return None if workload is None else parse_workload(workload, stem(twin))


def compare(original: Path) -> list[dict]:
    """One row per pool of the pair at `original`: recorded, predicted, measured merged, simulated merged."""
    twin = twin_of(original)
    snap = load_snapshot(str(original))
    streams = snap.kit["streams"]
    result = what_if(snap, {streams[MOVED]: streams[ONTO]})
    measured = reserved_by_pool(segment_table(load_snapshot(str(twin))))
    workload = merged_workload(twin)
    simulated = {}
    if workload is not None:
        sim = simulate(workload).snapshot()
        simulated = reserved_by_pool(segment_table(Snapshot(sim, origin="simulator")))
    recorded, predicted = reserved_by_pool(segment_table(snap)), reserved_by_pool(result.predicted)
    rows = []
    for pool in sorted(recorded.keys() | predicted.keys() | measured.keys()):
        rows.append(
            {
                "pair": stem(original),
                "pool": list(pool),
                "recorded": recorded.get(pool, 0),
                "predicted": predicted.get(pool, 0),
                "measured_merged": measured.get(pool, 0),
                "simulated_merged": simulated.get(pool) if simulated else None,
                "range": list(result.spread[pool]) if result.spread and pool in result.spread else None,
                "corrections": result.corrections,
            }
        )
    return rows


def record_pair(out: Path, n_ops: int, seed: int) -> Path:
    """Record a generated workload of `n_ops` and its merged twin into `out` (fresh processes)."""
    out.mkdir(parents=True, exist_ok=True)
    w = generate_workload(seed, n_ops=n_ops, n_streams=3, capture_rate=0.001, max_live_bytes=8 << 30)
    name = f"long_{n_ops}"
    for stem, workload in ((name, w), (f"{name}_merged", merged(w))):
        with atomic_write(out / f"{stem}.json") as f:
            f.write(json.dumps(workload) + "\n")
        command = [sys.executable, "-m", "kit", "run-workload", str(out / f"{stem}.json"), "-o"]
        subprocess.run([*command, str(out / f"{stem}.pickle")], cwd=ROOT, check=True)
    return out / f"{name}.pickle"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--record", type=int, metavar="N", help="first record an N-op pair into FOLDER (CUDA)")
    parser.add_argument("--seed", type=int, default=300)
    args = parser.parse_args()
    if args.record:
        record_pair(args.folder, args.record, args.seed)
    candidates = [p for suffix in SUFFIXES for p in args.folder.glob(f"*{suffix}")]
    originals = sorted(p for p in candidates if not stem(p).endswith("_merged") and twin_of(p))
    if not originals:
        print(f"whatif_vs_merged.py: error: no NAME.pickle with NAME_merged.pickle in {args.folder}", file=sys.stderr)
        return 2
    rows = [row for p in originals for row in compare(p)]
    wrong = [r for r in rows if r["predicted"] != r["measured_merged"]]
    mib = 2**20
    for r in rows:
        sim = "" if r["simulated_merged"] is None else f"{r['simulated_merged'] / mib:10.2f}"
        mark = "" if r["predicted"] == r["measured_merged"] else "   <-- differs"
        if r["range"]:
            low, high = r["range"]
            inside = low <= r["measured_merged"] <= high
            mark += f"  range {low / mib:.2f} to {high / mib:.2f}{'' if inside else ' MISSED'}"
        print(
            f"{r['pair']:>22} {tuple(r['pool'])!s:>8}  recorded {r['recorded'] / mib:10.2f}  predicted "
            f"{r['predicted'] / mib:10.2f}  GPU merged {r['measured_merged'] / mib:10.2f}  sim merged {sim}{mark}"
        )
    missed = [r for r in wrong if not (r["range"] and r["range"][0] <= r["measured_merged"] <= r["range"][1])]
    beyond = [r for r in missed if not (r["range"] and within_seen_spread(r["measured_merged"], *r["range"]))]
    graph = [r for r in wrong if tuple(r["pool"]) != (0, 0)]
    print(f"{len(rows) - len(wrong)} of {len(rows)} pools predicted exactly, over {len(originals)} pairs (MiB)")
    print(f"{len(wrong) - len(missed)} of the {len(wrong)} others inside their stated range, {len(missed)} outside")
    for r in missed:
        low, high = r["range"] or (r["predicted"], r["predicted"])
        off = low - r["measured_merged"] if r["measured_merged"] < low else r["measured_merged"] - high
        share = off / r["measured_merged"]
        print(f"  {r['pair']} {tuple(r['pool'])}: {off / mib:.2f} MiB outside, {share:.1%} of the pool")
    print(
        f"{len(graph)} graph pools wrong; {len(beyond)} pools farther outside their range than the "
        f"{SPREAD_SEEN_OUTSIDE:.0%} the correction line states (kit.analysis.whatif.SPREAD_SEEN_OUTSIDE)"
    )
    if args.json:
        print(json.dumps({"pools": rows, "exact": len(rows) - len(wrong), "total": len(rows)}))
    return 1 if graph or beyond else 0


if __name__ == "__main__":
    sys.exit(main())

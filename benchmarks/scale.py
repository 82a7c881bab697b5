"""The kit against PyTorch's own snapshot tools, on the same large files.

    python -m kit.scale --out build/scale [--big]   # the generated files (git-ignored)
    python benchmarks/scale.py [FILE ...] [--repeat 3] [--only load,table]

Default files: build/scale/scale.pickle and the largest recorded fixture. Each
side runs in a fresh process per repeat, so every peak memory (the process's
maximum resident set) is its own:

- floor: a plain `pickle.load` of the file, the least any pickle reader can do;
- kit: `load_snapshot`; then, each on a fresh `Snapshot` of the loaded dict
  (its construction is part of loading): the segment-by-stream table, the
  reuse analysis (`python -m kit reuse`: `replay_trace`, `reuse_table`,
  `stranding_report`) and the HTML report (`render_report`);
- PyTorch (`torch.cuda._memory_viz`, which reads a file with `pickle.load`):
  `segsum`, and `trace_plot` and `segment_plot` up to their HTML template
  (the template is swapped for its `$SNAPSHOT` placeholder alone: what is
  timed is PyTorch's Python processing, the pickling and base64/JSON
  encoding of the whole snapshot that its page then parses in the browser),
  and `trace_plot(filter_freed=True)`'s pass over the trace.

Pairs and their ratio (kit / other, below 1: the kit is faster): loading /
pickle.load; table / segsum; reuse analysis / trace_plot; report /
segment_plot. The best of `--repeat` runs is printed for each figure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pickle
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_FILES = [ROOT / "build/scale/scale.pickle", ROOT / "kit/recordings/replica/large_unpatched.pickle"]
PAIRS = [  # (kit figure, what it is set against)
    ("load", "pickle.load"),
    ("segment table", "segsum"),
    ("reuse analysis", "trace_plot"),
    ("HTML report", "segment_plot"),
]


def peak_gib() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def timed(fn):
    """`fn()` and its time; a call under 50 ms is repeated (up to 20 times) and the best time kept."""
    start = time.perf_counter()
    result = fn()
    best = time.perf_counter() - start
    for _ in range(20 if best < 0.05 else 0):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return result, best


def load_plainly(path: str):
    with open(path, "rb") as f:
        return pickle.load(f)


def run_floor(path: str, only: set[str]) -> dict:
    _, seconds = timed(lambda: load_plainly(path))
    return {"pickle.load": seconds, "peak pickle.load": peak_gib()}


def run_kit(path: str, only: set[str]) -> dict:
    from kit.analysis.tables import segment_table
    from kit.analysis.trace.replay import replay_trace
    from kit.analysis.trace.reports import reuse_table, stranding_report
    from kit.load.snapshot import Snapshot, load_snapshot
    from kit.show.report import render_report

    snap, seconds = timed(lambda: load_snapshot(path))
    out = {"load": seconds, "peak load": peak_gib()}
    raw = snap.raw
    out["counts"] = {
        "segments": len(snap.columns),
        "blocks": len(snap.columns.block_size),
        "events": sum(len(t) for t in raw.get("device_traces") or []),
    }

    def reuse(s: Snapshot) -> None:
        replay = replay_trace(s)
        reuse_table(s, replay)
        stranding_report(s, replay)

    steps = {"segment table": segment_table, "reuse analysis": reuse, "HTML report": render_report}
    for name, step in steps.items():
        if name in only:
            fresh = Snapshot(raw, origin=path)
            _, out[name] = timed(lambda step=step, fresh=fresh: step(fresh))
            out[f"peak {name}"] = peak_gib()
    return out


def run_torch(path: str, only: set[str]) -> dict:
    import torch.cuda._memory_viz as viz

    viz._memory_viz_template = "$SNAPSHOT"  # time the Python processing, not the page around it
    data = load_plainly(path)
    out = {}
    if "segment table" in only:
        _, out["segsum"] = timed(lambda: viz.segsum(data))
    if "reuse analysis" in only:
        _, out["trace_plot"] = timed(lambda: viz.trace_plot(data))

        def filtered() -> str:
            copy = {**data, "device_traces": list(data["device_traces"])}  # filter_freed replaces the traces
            return viz.trace_plot(copy, filter_freed=True)

        with contextlib.redirect_stdout(io.StringIO()):
            _, out["trace_plot filter_freed"] = timed(filtered)
    if "HTML report" in only:
        _, out["segment_plot"] = timed(lambda: viz.segment_plot(data))
    out["peak torch"] = peak_gib()
    return out


SIDES = {"floor": run_floor, "kit": run_kit, "torch": run_torch}


def child(side: str, path: str, only: str) -> int:
    print(json.dumps(SIDES[side](path, set(only.split(",")))))
    return 0


def measure(path: Path, repeat: int, only: str) -> dict:
    """Best time and highest peak of each figure over `repeat` rounds of fresh processes."""
    best: dict = {}
    for _ in range(repeat):
        for side in SIDES:
            done = subprocess.run(
                [sys.executable, __file__, "--child", side, str(path), "--only", only],
                capture_output=True,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            if done.returncode:
                raise SystemExit(f"{side} on {path} failed:\n{done.stderr}")
            for key, value in json.loads(done.stdout.splitlines()[-1]).items():
                if key == "counts":
                    best[key] = value
                elif key.startswith("peak"):
                    best[key] = max(best.get(key, 0.0), value)
                else:
                    best[key] = min(best.get(key, float("inf")), value)
    return best


def seconds(value: float | None) -> str:
    if value is None:
        return f"{'-':>9}"
    return f"{value:>9.2f}" if value >= 1 else f"{value:>9.4f}"


def report(path: Path, best: dict) -> None:
    counts = best.get("counts", {})
    print(
        f"\n{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {path.stat().st_size / 2**20:,.0f} MiB, "
        + ", ".join(f"{v:,} {k}" for k, v in counts.items())
    )
    print(f"  {'kit':<16}{'seconds':>9}   {'set against':<24}{'seconds':>9}   {'kit / other':>11}")
    for mine, theirs in PAIRS:
        if mine not in best:
            continue
        ratio = best[mine] / best[theirs] if best.get(theirs) else float("nan")
        print(f"  {mine:<16}{seconds(best[mine])}   {theirs:<24}{seconds(best.get(theirs))}   {ratio:>10.2f}x")
    if "trace_plot filter_freed" in best:
        print(f"  {'':<16}{'':>9}   {'trace_plot filter_freed':<24}{seconds(best['trace_plot filter_freed'])}")
    peaks = {k.removeprefix("peak "): v for k, v in best.items() if k.startswith("peak")}
    print("  peak memory (GiB, whole process): " + ", ".join(f"{k} {v:.2f}" for k, v in peaks.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, default=DEFAULT_FILES)
    parser.add_argument("--repeat", type=int, default=1, help="rounds of fresh processes; the best time is printed")
    parser.add_argument("--only", default="load,segment table,reuse analysis,HTML report", help="kit figures to run")
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], args.only)
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} at the start")
    for path in args.files:
        if not path.exists():
            print(f"\n{path}: missing (python -m kit.scale --out build/scale makes it)")
            continue
        report(path, measure(path, args.repeat, args.only))
    load = os.getloadavg()
    print(f"\nload average {load[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())

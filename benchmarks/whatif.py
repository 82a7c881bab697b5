"""What-if and the report against their peers, on one 300k-event trace: time and peak memory.

    python benchmarks/whatif.py [FILE --map A=B] [--repeat 2] [--json]

Default file: build/bench/whatif_300k.pickle, made here when missing by the
simulator (`generate_workload(301, n_ops=205_000, n_streams=3,
capture_rate=0.001)`: 302,023 trace events, three streams, captures into
shared and private pools, `empty_cache` runs), mapped `s2=s1`. Each figure is
taken in a fresh process that opens the file from the kit's cache (written by
one warm-up open before the rounds), so every peak memory (the process's
maximum resident set, or a forked child's where that is larger) is its own;
beside each time, the processor seconds of the process and its children (the
what-if's spread runs its tries in forked processes where it can):

- pickle.load: a plain `pickle.load` of the file, the least any reader can do;
- one simulation: the trace simulated once as recorded
  (`kit.analysis.whatif.simulate_trace`, segments only), the unit what-if is
  made of;
- what-if: `what_if(snapshot, map)` with its baseline and its placement
  spread (`python -m kit what-if FILE --map A=B`);
- report: `render_report(snapshot, stream_map=map)` (`python -m kit report
  FILE --map A=B`: the answer, with every map ranked, tables, figures,
  verdicts, attribution and the what-if).

Ratios, best of `--repeat` rounds (highest peak): what-if / one simulation
(target at most 3), report / what-if (at most 2), and each peak / pickle.load's
peak (at most 2). `--json` prints, last, one JSON object with the seconds,
the peaks (GiB), the ratios, the file, its event count and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from scale import peak_gib  # noqa: E402  (this process's peak resident memory, as the scale benchmark reads it)

DEFAULT_FILE = ROOT / "build" / "bench" / "whatif_300k.pickle"
DEFAULT_MAP = "s2=s1"
SIDES = ("pickle.load", "one simulation", "what-if", "report")
TARGETS = {  # ratio -> (numerator, denominator, at most)
    "what-if / one simulation": ("what-if", "one simulation", 3.0),
    "report / what-if": ("report", "what-if", 2.0),
    "peak what-if / pickle.load": ("peak what-if", "peak pickle.load", 2.0),
    "peak report / pickle.load": ("peak report", "peak pickle.load", 2.0),
}


def make_default_file(path: Path) -> None:
    """The 300k-event trace: a generated workload run on the simulator, written as torch writes a snapshot."""
    from kit.allocator.simulator import simulate
    from kit.allocator.workload import generate_workload, parse_workload
    from kit.fileio import atomic_write

    workload = generate_workload(301, n_ops=205_000, n_streams=3, capture_rate=0.001, max_live_bytes=8 << 30)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "wb") as f:
        pickle.dump(simulate(parse_workload(workload)).snapshot(), f)


def stream_map(text: str) -> dict[str, str]:
    source, _, target = text.partition("=")
    return {source: target}


def run_side(side: str, path: str, mapping: str) -> dict:
    """One figure in this (fresh) process: its seconds and the process's peak memory."""
    if side == "pickle.load":
        start = time.perf_counter()
        with open(path, "rb") as f:
            pickle.load(f)
        return {side: time.perf_counter() - start, f"peak {side}": peak_gib()}
    from kit.analysis.trace.walk import walk_trace
    from kit.analysis.whatif import simulate_trace, what_if
    from kit.load.snapshot import load_snapshot
    from kit.show.report import render_report

    snap = load_snapshot(path)
    steps = {
        "one simulation": lambda: simulate_trace(snap, {}, walk=walk_trace(snap), trace=False),
        "what-if": lambda: what_if(snap, stream_map(mapping)),
        "report": lambda: render_report(snap, stream_map=stream_map(mapping)),
    }
    cpu, start = cpu_seconds(), time.perf_counter()
    steps[side]()
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    peak = max(peak_gib(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20)  # a forked try's too
    return {side: seconds, f"cpu {side}": cpu, f"peak {side}": peak, "events": len(snap.require_trace(0))}


def cpu_seconds() -> float:
    """Processor seconds of this process and of its children that have ended (the what-if's forked tries)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(path: Path, mapping: str, repeat: int) -> dict:
    """Best time and highest peak of each figure over `repeat` rounds of fresh processes."""
    caches = Path(tempfile.mkdtemp(prefix="kit-bench-cache-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KIT_CACHE_DIR": str(caches), "KIT_QUIET": "1"}
    best: dict = {}
    try:
        warm = [sys.executable, "-c", f"from kit.load.snapshot import load_snapshot; load_snapshot({str(path)!r})"]
        subprocess.run(warm, env=env, check=True)  # the cache every side opens the file from
        for _ in range(repeat):
            for side in SIDES:
                command = [sys.executable, __file__, "--child", side, str(path), "--map", mapping]
                done = subprocess.run(command, capture_output=True, text=True, env=env)
                if done.returncode:
                    raise SystemExit(f"whatif.py: {side} on {path} failed:\n{done.stderr[-3000:]}")
                for key, value in json.loads(done.stdout.splitlines()[-1]).items():
                    if key.startswith("peak"):
                        best[key] = max(best.get(key, 0.0), value)
                    elif key == "events":
                        best[key] = value
                    else:
                        best[key] = min(best.get(key, float("inf")), value)
    finally:
        shutil.rmtree(caches, ignore_errors=True)
    return best


def ratios(best: dict) -> dict[str, float]:
    return {name: best[top] / best[bottom] for name, (top, bottom, _) in TARGETS.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", type=Path)
    parser.add_argument("--map", help=f"the stream map, A=B (the default file: {DEFAULT_MAP})")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_side(args.child, str(args.file), args.map)))
        return 0
    if args.file is None:
        if not DEFAULT_FILE.is_file():
            print(f"making {DEFAULT_FILE.relative_to(ROOT)} (the simulator, about a minute)", file=sys.stderr)
            make_default_file(DEFAULT_FILE)
        args.file, args.map = DEFAULT_FILE, args.map or DEFAULT_MAP
    elif not args.map:
        parser.error("a FILE of your own needs --map A=B (the streams as `python -m kit table` prints them)")
    best = measure(args.file, args.map, args.repeat)
    got = ratios(best)
    print(f"file: {args.file} ({best['events']:,} trace events), map {args.map}; best of {args.repeat}")
    for side in SIDES:
        cpu = f"   cpu {best[f'cpu {side}']:6.2f} s" if f"cpu {side}" in best else ""
        print(f"  {side:<16} {best[side]:8.2f} s{cpu}   peak {best[f'peak {side}']:6.2f} GiB")
    for name, (_, _, limit) in TARGETS.items():
        verdict = "ok" if got[name] <= limit else "OVER"
        print(f"  {name:<28} {got[name]:5.2f}x  (target at most {limit:g}x: {verdict})")
    if args.json:
        machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
        print(json.dumps({**best, "ratios": got, "file": str(args.file), "machine": machine}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The kit against PyTorch's own snapshot tools, on the same large files.

    python -m kit.scale --out build/scale [--big]   # the generated files (git-ignored)
    python benchmarks/scale.py [FILE ...] [--repeat 3] [--only load,table] [--json]

Default files: build/scale/scale.pickle and the largest recorded fixture. Each
side runs in a fresh process per repeat, so every peak memory (the process's
maximum resident set) is its own:

- floor: a plain `pickle.load` of the file, the least any pickle reader can do;
- kit, first load: `load_snapshot` with no cache yet (it streams the trace into
  columns and writes the cache, `kit.load.cache`; the caches go to a temporary
  `KIT_CACHE_DIR`, emptied before every first load);
- kit, reopen: `load_snapshot` again in a fresh process, from the cache; then,
  each on a snapshot just opened the same way: the segment-by-stream table,
  the reuse analysis (`python -m kit reuse`: `walk_trace`, `reuse_table`,
  `stranding_report`), which walks the trace and keeps the walk beside the
  cache; the reuse analysis again, as a later command on the file runs it
  (the walk read back); and the HTML report (`render_report`, the walk read
  back);
- PyTorch (`torch.cuda._memory_viz`, which reads a file with `pickle.load`):
  `segsum`, and `trace_plot` and `segment_plot` up to their HTML template
  (the template is swapped for its `$SNAPSHOT` placeholder alone: what is
  timed is PyTorch's Python processing, the pickling and base64/JSON
  encoding of the whole snapshot that its page then parses in the browser),
  and `trace_plot(filter_freed=True)`'s pass over the trace.

Pairs and their ratio (kit / other, below 1: the kit is faster): first load /
pickle.load; reopen / pickle.load; table / segsum; reuse analysis (first
walk, and walk kept) / trace_plot; report / segment_plot. The best of `--repeat` runs is printed for
each figure, and the highest peak. `--json` prints, last, one JSON object:
`{"load": {"kit", "pickle"}, "reopen": {"kit"}, "table": {"kit", "segsum"},
"reuse": {"kit", "trace_plot"}, "reuse_walk_kept": {"kit", "trace_plot"},
"report": {"kit", "segment_plot"},
"peak_gib": {"pickle", "load", "reopen", "table", "reuse", "report", "torch"}}`
for the first file (seconds and GiB), with its `file`, `counts` and `machine`,
and the other files' objects under `more`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
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
DEFAULT_FILES = [ROOT / "build/scale/scale.pickle", ROOT / "kit/recordings/replica/large_unpatched.pickle"]
PAIRS = [  # (kit figure, what it is set against)
    ("load", "pickle.load"),
    ("reopen", "pickle.load"),
    ("segment table", "segsum"),
    ("reuse analysis", "trace_plot"),
    ("reuse, walk kept", "trace_plot"),
    ("HTML report", "segment_plot"),
]
STEPS = ("segment table", "reuse analysis", "HTML report")


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


def run_load(path: str, only: set[str]) -> dict:
    """The first load: no cache yet, so the file is read (its trace streamed) and the cache written."""
    from kit.load.snapshot import load_snapshot

    start = time.perf_counter()
    snap = load_snapshot(path)
    out = {"load": time.perf_counter() - start, "peak load": peak_gib()}
    out["counts"] = {
        "segments": len(snap.columns),
        "blocks": len(snap.columns.block_size),
        "events": sum(len(t) for t in snap.trace_columns.values()),
    }
    return out


def run_reopen(path: str, only: set[str]) -> dict:
    """Opening the file again, from its cache; then each kit figure on a snapshot opened the same way."""
    from kit.analysis.tables import segment_table
    from kit.analysis.trace.reports import reuse_table, stranding_report
    from kit.analysis.trace.walk import walk_trace
    from kit.load.snapshot import Snapshot, load_snapshot
    from kit.show.report import render_report

    _, seconds = timed(lambda: load_snapshot(path))
    out = {"reopen": seconds, "peak reopen": peak_gib()}

    def reuse(s: Snapshot) -> None:
        walk = walk_trace(s)
        reuse_table(s, walk)
        stranding_report(s, walk)

    steps = {
        "segment table": segment_table,
        "reuse analysis": reuse,  # the first walk of the file: it keeps the walk beside the cache
        "reuse, walk kept": reuse,  # a later command on the same file reads it back
        "HTML report": render_report,
    }
    for name, step in steps.items():
        if name in only or (name == "reuse, walk kept" and "reuse analysis" in only):
            fresh = load_snapshot(path)
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


SIDES = {"floor": run_floor, "load": run_load, "reopen": run_reopen, "torch": run_torch}


def child(side: str, path: str, only: str) -> int:
    print(json.dumps(SIDES[side](path, set(only.split(",")))))
    return 0


def measure(path: Path, repeat: int, only: str) -> dict:
    """Best time and highest peak of each figure over `repeat` rounds of fresh processes."""
    best: dict = {}
    caches = Path(tempfile.mkdtemp(prefix="kit-bench-cache-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KIT_CACHE_DIR": str(caches), "KIT_QUIET": "1"}
    try:
        for _ in range(repeat):
            for side in SIDES:
                if side == "load":  # the first load finds no cache
                    shutil.rmtree(caches)
                    caches.mkdir()
                done = subprocess.run(
                    [sys.executable, __file__, "--child", side, str(path), "--only", only],
                    capture_output=True,
                    text=True,
                    env=env,
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
    finally:
        shutil.rmtree(caches, ignore_errors=True)
    return best


def seconds(value: float | None) -> str:
    if value is None:
        return f"{'-':>9}"
    return f"{value:>9.2f}" if value >= 1 else f"{value:>9.4f}"


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def report(path: Path, best: dict) -> None:
    counts = best.get("counts", {})
    sizes = ", ".join(f"{v:,} {k}" for k, v in counts.items())
    print(f"\n{shown(path)}: {path.stat().st_size / 2**20:,.0f} MiB, {sizes}")
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


def as_json(path: Path, best: dict) -> dict:
    """The figures of one file in the shape `--json` prints."""
    peaks = {
        "pickle": "peak pickle.load",
        "load": "peak load",
        "reopen": "peak reopen",
        "table": "peak segment table",
        "reuse": "peak reuse analysis",
        "report": "peak HTML report",
        "torch": "peak torch",
    }
    out = {
        "file": shown(path),
        "bytes": path.stat().st_size,
        "counts": best.get("counts", {}),
        "load": {"kit": best.get("load"), "pickle": best.get("pickle.load")},
        "reopen": {"kit": best.get("reopen")},
        "table": {"kit": best.get("segment table"), "segsum": best.get("segsum")},
        "reuse": {"kit": best.get("reuse analysis"), "trace_plot": best.get("trace_plot")},
        "reuse_walk_kept": {"kit": best.get("reuse, walk kept"), "trace_plot": best.get("trace_plot")},
        "report": {"kit": best.get("HTML report"), "segment_plot": best.get("segment_plot")},
        "peak_gib": {name: best[key] for name, key in peaks.items() if key in best},
    }
    return out


def machine() -> dict:
    """The machine the figures were measured on."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu": model, "cores": os.cpu_count(), "memory_gib": round(memory, 1), "python": platform.python_version()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, default=DEFAULT_FILES)
    parser.add_argument("--repeat", type=int, default=1, help="rounds of fresh processes; the best time is printed")
    parser.add_argument("--only", default=",".join(STEPS), help="kit figures to run after loading")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object, last")
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], args.only)
    host = machine()
    start_load = os.getloadavg()[0]
    print(f"machine: {host['cpu']}, {host['cores']} cores, {host['memory_gib']} GiB; load average {start_load:.2f}")
    results = []
    for path in args.files:
        if not path.exists():
            print(f"\n{path}: missing (python -m kit.scale --out build/scale makes it)")
            continue
        best = measure(path, args.repeat, args.only)
        report(path, best)
        results.append(as_json(path, best))
    end_load = os.getloadavg()[0]
    print(f"\nload average {end_load:.2f} at the end")
    if args.json and results:
        host["load_average"] = [round(start_load, 2), round(end_load, 2)]
        print(json.dumps({**results[0], "machine": host, "more": results[1:]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Record workloads with and without `expandable_segments:True` on a real GPU: the expandable model's ground truth.

    python scripts/record_expandable.py --out kit/recordings/expandable

Many vLLM deployments run with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`:
the allocator then maps one segment per (pool, stream) and grows or shrinks it by
pages (`segment_map` / `segment_unmap` in the trace) instead of asking cudaMalloc
for a new segment. This script records what the real allocator does under both
settings for the same workloads, so the kit's model of expandable segments can
be held to it. Each seeded workload (the generator `kit.allocator.workload.
generate_workload` with captures into shared and private pools on two side
streams, as `record_merged.py` uses) is written as `NAME.json` and, with every op
of stream `s2` moved onto `s1`, as `NAME_merged.json` (what-if's ground truth).
Each of the four runs (as written, merged; with the setting and without) happens
in a fresh `python -m kit run-workload` process, its snapshot written beside the
workload as `NAME.pickle`, `NAME_expandable.pickle`, `NAME_merged.pickle` and
`NAME_merged_expandable.pickle`. Trace frames are dropped. `PROVENANCE.json`
holds the GPU, versions, date, command, the allocator setting of each run and
per file its trace length, its segment maps and unmaps, and its sha256.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from record_merged import MOVED, ONTO, merged  # noqa: E402  (the same merge as what-if's ground truth)

from kit.allocator.workload import generate_workload  # noqa: E402
from kit.errors import KitError  # noqa: E402
from kit.experiments.recorded import trim_frames  # noqa: E402
from kit.fileio import atomic_write  # noqa: E402
from kit.load.unpickle import safe_unpickle  # noqa: E402
from kit.record.provenance import file_hashes, provenance, require_cuda, write_manifest  # noqa: E402

COMMAND = "python scripts/record_expandable.py --out kit/recordings/expandable"
EXPANDABLE = "expandable_segments:True"
# (seed, ops, capture rate): a dozen small and middling workloads, each with captures.
WORKLOADS = [(300 + i, 300 + 120 * i, 0.05) for i in range(12)]
SETTINGS = {"": None, "_expandable": EXPANDABLE}  # file suffix -> PYTORCH_CUDA_ALLOC_CONF (None: unset)


def workloads() -> dict[str, dict]:
    """NAME -> workload: `expandable_SEED` as generated and `expandable_SEED_merged`."""
    out = {}
    for seed, n_ops, rate in WORKLOADS:
        w = generate_workload(seed, n_ops=n_ops, n_streams=3, capture_rate=rate, max_live_bytes=8 << 30)
        out[f"expandable_{seed}"] = w
        out[f"expandable_{seed}_merged"] = merged(w)
    return out


def record(name: str, suffix: str, out: Path) -> dict:
    """Run workload `name` in a fresh process under the setting of `suffix`; its file's provenance entry."""
    pickle_path = out / f"{name}{suffix}.pickle"
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    if SETTINGS[suffix]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = SETTINGS[suffix]
    command = [sys.executable, "-m", "kit", "run-workload", str(out / f"{name}.json"), "-o", str(pickle_path)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(f"{name}{suffix}: run-workload failed: {done.stderr.strip()[-2000:]}")
    raw = safe_unpickle(pickle_path.read_bytes(), pickle_path.name)
    trim_frames(raw, keep=0)
    with atomic_write(pickle_path, "wb") as f:
        pickle.dump(raw, f)
    trace = raw["device_traces"][0]
    actions = [e["action"] for e in trace]
    expandable = any(s.get("is_expandable") for s in raw["segments"])
    if expandable != bool(SETTINGS[suffix]):
        raise RuntimeError(f"{name}{suffix}: segments expandable={expandable}, not what the setting asks")
    return {
        "PYTORCH_CUDA_ALLOC_CONF": SETTINGS[suffix],
        "trace_entries": len(trace),
        "segment_allocs": actions.count("segment_alloc"),
        "segment_frees": actions.count("segment_free"),
        "segment_maps": actions.count("segment_map"),
        "segment_unmaps": actions.count("segment_unmap"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "kit" / "recordings" / "expandable")
    parser.add_argument("--jobs", type=int, default=8, help="processes at once (each one fresh)")
    args = parser.parse_args()
    try:
        require_cuda("recording needs CUDA; nothing was written")
    except KitError as e:
        print(f"record_expandable.py: error: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    runs = workloads()
    for name, workload in runs.items():
        with atomic_write(args.out / f"{name}.json") as f:
            f.write(json.dumps(workload) + "\n")
    jobs = [(name, suffix) for name in runs for suffix in SETTINGS]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        done = list(pool.map(lambda job: record(*job, args.out), jobs))
    facts = {f"{name}{suffix}": fact for (name, suffix), fact in zip(jobs, done, strict=True)}
    for name, fact in sorted(facts.items()):
        print(f"{name}: {json.dumps(fact)}")
    files = [args.out / f"{name}.json" for name in sorted(runs)] + [args.out / f"{n}.pickle" for n in sorted(facts)]
    manifest = {
        **provenance(COMMAND),
        "what": (
            f"each workload as generated and with stream {MOVED!r} merged onto {ONTO!r}, each run with "
            f"PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE} (NAME_expandable.pickle) and unset (NAME.pickle); trace frames "
            "dropped"
        ),
        "runs": facts,
        "files": file_hashes(files),
    }
    write_manifest(args.out, manifest)
    print(f"recorded {len(runs)} workloads under {len(SETTINGS)} settings into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

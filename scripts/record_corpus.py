"""Record the simulator's fidelity corpus on a real GPU: workloads and their snapshots.

Run on a machine with a CUDA GPU (one command re-records everything):

    python scripts/record_corpus.py --out kit/recordings/corpus

It writes each workload (seeded random ones from `kit.allocator.workload.generate_workload`
and the PR's two scenarios) as `NAME.json`, runs it with
`python -m kit run-workload` in a fresh process (several at once), and writes
`NAME.pickle` beside it, plus `PROVENANCE.json` (GPU, torch, date, command and
the sha256 of every file).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kit.allocator.workload import generate_workload, pr_scenario  # noqa: E402
from kit.fileio import atomic_write  # noqa: E402

COMMAND = "python scripts/record_corpus.py --out kit/recordings/corpus"


def workloads(n_random: int) -> dict[str, dict]:
    out = {"pr_two_streams": pr_scenario(False), "pr_shared_stream": pr_scenario(True)}
    for seed in range(n_random):
        out[f"random_{seed:03d}"] = generate_workload(seed, n_ops=100 + 10 * (seed % 30), n_streams=2 + seed % 3)
    return out


def record(name: str, out: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "kit", "run-workload", str(out / f"{name}.json"), "-o", str(out / f"{name}.pickle")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"{name}: {done.stderr.strip()[-2000:]}")
    return name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "kit" / "recordings" / "corpus")
    parser.add_argument("--random", type=int, default=62, help="how many random workloads")
    parser.add_argument("--jobs", type=int, default=8, help="processes at once (each one fresh)")
    args = parser.parse_args()
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    corpus = workloads(args.random)
    for name, workload in corpus.items():
        with atomic_write(args.out / f"{name}.json") as f:
            f.write(json.dumps(workload) + "\n")
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for name in pool.map(lambda n: record(n, args.out), corpus):
            print(name, flush=True)
    manifest = {
        "gpu": torch.cuda.get_device_name(),
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": COMMAND,
        "files": {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(args.out.glob("*.*"))
            if p.suffix in (".json", ".pickle") and p.name != "PROVENANCE.json"
        },
    }
    with atomic_write(args.out / "PROVENANCE.json") as f:
        f.write(json.dumps(manifest, indent=1) + "\n")
    print(f"recorded {len(corpus)} workloads into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

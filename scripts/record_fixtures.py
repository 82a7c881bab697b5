"""Record the kit's real-GPU fixtures: two captures into one graph pool.

Run on a machine with a CUDA GPU (one command re-records everything):

    python scripts/record_fixtures.py --out kit/recordings      # or: make recordings

Each scenario runs `kit.experiments.model_and_replay.run_model_and_replay` in a fresh process, so its
allocator starts empty, with memory history recorded from the first allocation:

- `two_streams`: the replay capture on a new stream, as vLLM 0.33 does;
- `shared_stream`: the replay capture on the model capture's stream, as PR 63155 does.

Each snapshot's `kit` key gets its provenance (GPU, torch, date, command);
`PROVENANCE.json` beside the files lists them with their sha256.
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kit.experiments.model_and_replay import run_model_and_replay  # noqa: E402
from kit.fileio import atomic_write  # noqa: E402
from kit.load.snapshot import load_snapshot  # noqa: E402
from kit.load.unpickle import safe_unpickle  # noqa: E402
from kit.record.provenance import entry_with_hash, provenance, write_manifest  # noqa: E402

SCENARIOS = {
    "two_streams": "replay capture on a new stream (vLLM 0.33)",
    "shared_stream": "replay capture on the model capture's stream (PR 63155)",
}
COMMAND = "python scripts/record_fixtures.py --out kit/recordings"


def record(scenario: str, path: Path, sizes: dict) -> dict:

    snap = run_model_and_replay(scenario == "shared_stream", **sizes)
    snap["kit"]["provenance"] = {
        "scenario": scenario,
        "description": SCENARIOS[scenario],
        **provenance(COMMAND, python=True),
    }
    data = pickle.dumps(snap)
    load_snapshot(safe_unpickle(data, str(path)))  # a fixture must be plain data the kit accepts
    with atomic_write(path, "wb") as f:
        f.write(data)
    return snap["kit"]["provenance"] | {"workload": snap["kit"]["workload"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("kit/recordings"))
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), help="record one scenario in this process")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--replay-tokens", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = {"hidden": args.hidden, "tokens": args.tokens, "replay_tokens": args.replay_tokens, "layers": args.layers}
    if args.scenario:
        print(json.dumps(record(args.scenario, args.out / f"{args.scenario}.pickle", sizes)))
        return 0
    manifest = {}
    for scenario in SCENARIOS:
        # A fresh process per scenario: each starts from an empty allocator.
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--out",
                str(args.out),
                "--scenario",
                scenario,
                *(f"--{k.replace('_', '-')}={v}" for k, v in sizes.items()),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        path = args.out / f"{scenario}.pickle"
        manifest[path.name] = entry_with_hash(json.loads(done.stdout.strip().splitlines()[-1]), path.read_bytes())
    write_manifest(args.out, manifest)
    print(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Record the replica's experiments on a CUDA GPU as fixtures the CPU tests replay.

    python scripts/record_replica.py --out kit/recordings/replica

Runs every scenario of `kit.experiments.scenarios` at the small preset and the
unpatched and patched ones at the large preset, each in a fresh process; then
the small unpatched and patched ones again with the DSpark drafter on
(`<preset>_<name>_drafter.pickle`: the PR's configuration for `kit check`).
Stack frames are cut to the innermost few per entry to keep the files small;
everything else is the allocator's snapshot as torch returned it, with the
capture windows, the scenario and the graph-versus-eager check in its `kit`
key. `PROVENANCE.json` lists each file with its provenance, figures and sha256.
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kit.experiments.recorded import child_error, trim_frames  # noqa: E402
from kit.experiments.scenarios import SCENARIOS, run_all, scenario_lines  # noqa: E402
from kit.experiments.summary import summarize  # noqa: E402
from kit.fileio import atomic_write  # noqa: E402
from kit.load.snapshot import load_snapshot  # noqa: E402
from kit.load.unpickle import safe_unpickle  # noqa: E402
from kit.record.provenance import read_manifest, sha256, write_manifest  # noqa: E402

RUNS = {"small": tuple(SCENARIOS), "large": ("unpatched", "patched")}
DRAFTER_RUNS = {"small": ("unpatched", "patched")}
COMMAND = "python scripts/record_replica.py --out kit/recordings/replica"


def ship(path: Path, summary: dict, command: str) -> dict:
    """Trim the recording at `path` in place, check it still loads and gives `summary`; its manifest entry."""
    raw = safe_unpickle(path.read_bytes(), str(path))
    trim_frames(raw)
    raw["kit"]["provenance"]["command"] = command
    data = pickle.dumps(raw)
    load_snapshot(safe_unpickle(data, str(path)))  # a fixture must be plain data the kit accepts
    with atomic_write(path, "wb") as f:
        f.write(data)
    again = summarize(raw)
    assert again == summary | {"source": again["source"]}, "trimming frames changed the figures"
    print("\n".join(scenario_lines(summary)), flush=True)
    return {
        **raw["kit"]["provenance"],
        "scenario": raw["kit"]["scenario"],
        "figures": summary,
        "sha256": sha256(data),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("kit/recordings/replica"))
    parser.add_argument("--preset", choices=sorted(RUNS), action="append", help="only these presets")
    args = parser.parse_args()
    manifest = {}
    for preset in args.preset or RUNS:
        for name, summary in run_all(preset, args.out, RUNS[preset]).items():
            path = args.out / f"{preset}_{name}.pickle"
            manifest[path.name] = ship(path, summary, COMMAND)
    for preset in args.preset or DRAFTER_RUNS:
        for name in DRAFTER_RUNS.get(preset, ()):
            path = args.out / f"{preset}_{name}_drafter.pickle"
            command = [sys.executable, "-m", "kit.experiments.scenarios", name, "--preset", preset, "--speculator"]
            done = subprocess.run([*command, "-o", str(path)], capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"{path.name}: {child_error(done.stderr or done.stdout)}")
            summary = json.loads(done.stdout.strip().splitlines()[-1])
            manifest[path.name] = ship(path, summary, f"{COMMAND} (with --speculator: {' '.join(command[1:])})")
    write_manifest(args.out, read_manifest(args.out) | manifest)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run the replica's scenarios on this GPU and compare them with the shipped H200 recordings.

    python scripts/compare_replica_live.py OUT_DIR     # needs CUDA; exit 0 when every run matches

Each scenario runs in a fresh process (`kit.experiments.scenarios.run_all`),
at the presets the recordings have. A run matches its recording when its
summary figures (`summarize`, without the source line), the action and size
of every trace entry, and the early-aux flag are the same. On the same GPU
and torch, a change to the replica or to `kit.patch` that keeps behaviour
keeps every run identical to its recording.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kit.experiments.scenarios import run_all  # noqa: E402
from kit.load.snapshot import load_snapshot  # noqa: E402
from kit.record.provenance import read_manifest  # noqa: E402
from kit.recordings import RECORDINGS  # noqa: E402

RECORDED = {"small": ("unpatched", "patched", "early_aux_pr", "early_aux_shared"), "large": ("unpatched", "patched")}


def trace_and_scenario(path: Path) -> tuple[list[tuple[str, int]], dict]:
    snap = load_snapshot(path)
    return [(e.action, e.size) for e in snap.traces[0]], snap.kit["scenario"]


def compare(name: str, live_summary: dict, live_path: Path, manifest: dict) -> bool:
    recorded_path = RECORDINGS / "replica" / name
    recorded = {k: v for k, v in manifest[name]["figures"].items() if k != "source"}
    figures = {k: live_summary.get(k) for k in recorded}  # the figures the recording has (the summary has grown)
    (live_trace, live_scenario), (recorded_trace, recorded_scenario) = (
        trace_and_scenario(live_path),
        trace_and_scenario(recorded_path),
    )
    same_aux = live_scenario["has_early_aux"] == recorded_scenario["has_early_aux"]
    print(
        f"{name}: figures {'same' if figures == recorded else 'DIFFER'}, trace entries "
        f"{'same' if live_trace == recorded_trace else 'DIFFER'} ({len(live_trace)} live, {len(recorded_trace)} "
        f"recorded), early aux {'same' if same_aux else 'DIFFERS'}"
    )
    if figures != recorded:
        print(f"  live     {figures}\n  recorded {recorded}")
    return figures == recorded and live_trace == recorded_trace and same_aux


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the live snapshots")
    args = parser.parse_args(argv)
    manifest = read_manifest(RECORDINGS / "replica")
    ok = True
    for preset, names in RECORDED.items():
        for name, summary in run_all(preset, args.out, names).items():
            ok &= compare(f"{preset}_{name}.pickle", summary, args.out / f"{preset}_{name}.pickle", manifest)
    print("every run matches its recording" if ok else "some runs differ from their recordings")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

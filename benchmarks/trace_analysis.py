"""Rewind plus reuse analysis on a large trace, timed.

    python benchmarks/trace_analysis.py [--ops 700000] [--seed 3]

The trace comes from the simulator (a generated workload of `--ops` ops makes
about 1.5 events per op), written and read back the way a user's snapshot
would be. Prints the event count, the load time and the analysis time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kit.allocator.simulator import simulate  # noqa: E402
from kit.allocator.workload import generate_workload, parse_workload  # noqa: E402
from kit.analysis.trace.reports import reuse_table  # noqa: E402
from kit.load.snapshot import Snapshot  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=700_000)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    raw = simulate(parse_workload(generate_workload(args.seed, args.ops, capture_rate=0.0005))).snapshot()
    events = len(raw["device_traces"][0])
    start = time.perf_counter()
    snap = Snapshot(raw, origin="generated")
    table = reuse_table(snap)
    elapsed = time.perf_counter() - start
    print(f"trace: {events:,} events, {len(raw['segments']):,} segments at the end")
    print(f"rewind + forward walk + reuse table: {elapsed:.2f} s ({events / elapsed:,.0f} events/s)")
    print(f"forward walk ends at the snapshot: {not table.attrs['mismatches']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

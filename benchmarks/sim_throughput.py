"""Simulator throughput against the real allocator, on one generated workload.

    python benchmarks/sim_throughput.py [--ops 1000000] [--seed 2] [--gpu]

Prints ops/s for validating the workload, for the simulator, and (with --gpu,
on a CUDA machine) for the real allocator driven by `kit.record.workload.run_on_gpu`
from Python on the same ops, with the ratio simulator / real.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kit.allocator.simulator import simulate  # noqa: E402
from kit.allocator.workload import generate_workload, parse_workload  # noqa: E402


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--gpu", action="store_true", help="also drive the real allocator (needs CUDA)")
    args = parser.parse_args()
    # Few captures: every graph pool stays reserved to the end, and the real GPU must hold them.
    workload, t_gen = timed(lambda: generate_workload(args.seed, args.ops, capture_rate=0.0005))
    ops, t_parse = timed(lambda: parse_workload(workload))
    sim, t_sim = timed(lambda: simulate(ops))
    n = len(ops)
    print(f"workload: {n} ops (seed {args.seed}), generated in {t_gen:.2f} s")
    print(f"validate : {t_parse:8.2f} s  {n / t_parse:12,.0f} ops/s")
    print(f"simulator: {t_sim:8.2f} s  {n / t_sim:12,.0f} ops/s  ({len(sim.segments)} segments at the end)")
    if args.gpu:
        from kit.record.workload import run_on_gpu

        _, t_gpu = timed(lambda: run_on_gpu(ops))
        print(f"real GPU : {t_gpu:8.2f} s  {n / t_gpu:12,.0f} ops/s  (torch.empty/del from Python, history recorded)")
        print(f"ratio simulator/real: {t_gpu / t_sim:.2f}x the real allocator's ops/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A replica scenario on several GPUs: one process per rank, one snapshot per rank.

Real deployments capture graphs on every rank, each into its own allocator.
`run_ranks` spawns one process per GPU, joins them into the tensor-parallel
group over NCCL (NVLink multicast kept off), and in each runs the scenario as
`kit.experiments.scenarios.run_scenario` does on one GPU: capture under the
recorder, the graph-versus-eager check, and the snapshot, written as
`rank<N>.pickle` with the rank in its provenance. `kit.analysis.ranks` compares them.

    python -m kit.experiments.tensor_parallel unpatched --tp 2 -o ranks_unpatched/
    python -m kit ranks ranks_unpatched/
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import sys
from pathlib import Path

from kit.errors import KitError

# Multicast over NVLink can take a shared host's GPUs down: never let NCCL, PyTorch or NVSHMEM use it.
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_rank(rank: int, world_size: int, name: str, preset: str, out_dir: str, init_method: str) -> None:
    import torch
    import torch.distributed as dist

    from kit.experiments.scenarios import run_scenario
    from kit.fileio import atomic_write
    from kit.replica.parallel_state import init_distributed_environment

    torch.cuda.set_device(rank)
    init_distributed_environment(world_size, rank, init_method)
    try:
        raw = run_scenario(name, preset)
        raw["kit"]["provenance"].update(
            rank=rank,
            world_size=world_size,
            command=f"python -m kit.experiments.tensor_parallel {name} --preset {preset} --tp {world_size}",
        )
        with atomic_write(Path(out_dir) / f"rank{rank}.pickle", "wb") as f:
            pickle.dump(raw, f)
    finally:
        dist.destroy_process_group()


def run_ranks(name: str, preset: str, world_size: int, out_dir: str | os.PathLike) -> list[Path]:
    """Run scenario `name` on `world_size` GPUs; the per-rank snapshot files, in rank order."""
    import torch
    import torch.multiprocessing as mp

    if world_size < 1:
        raise KitError(f"--tp must be at least 1, not {world_size}")
    if torch.cuda.device_count() < world_size:
        raise KitError(f"tensor parallelism over {world_size} GPUs, but this machine has {torch.cuda.device_count()}")
    os.environ.update(NO_MULTICAST)  # the spawned ranks inherit it
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    mp.spawn(_run_rank, args=(world_size, name, preset, str(out_dir), init_method), nprocs=world_size)
    return [out_dir / f"rank{rank}.pickle" for rank in range(world_size)]


def main(argv: list[str] | None = None) -> int:
    from kit.experiments.scenarios import SCENARIOS, scenario_lines
    from kit.experiments.summary import summarize

    parser = argparse.ArgumentParser(
        description="Run one replica scenario with tensor parallelism, a snapshot per rank."
    )
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--preset", default="small")
    parser.add_argument("--tp", type=int, default=2, help="ranks, one GPU each")
    parser.add_argument("-o", "--out", required=True, help="folder for rank<N>.pickle")
    args = parser.parse_args(argv)
    try:
        paths = run_ranks(args.scenario, args.preset, args.tp, args.out)
    except KitError as e:
        print(f"kit: error: {e}", file=sys.stderr)
        return 2
    for rank, path in enumerate(paths):
        print(f"rank {rank}: {path}")
        print("\n".join(scenario_lines(summarize(path))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

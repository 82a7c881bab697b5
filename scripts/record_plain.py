"""Record plain allocator snapshots from programs the kit did not write, on a CUDA GPU.

    python scripts/record_plain.py --out kit/recordings/plain      # or: make plain-recordings

The programs in scripts/plain_programs/ are plain torch: they import nothing
of the kit, make their models from torch's own modules, turn memory history on
mid-process and dump the snapshot with `torch.cuda.memory._dump_snapshot`, as
an engineer in a debugging session would. Each program and stream choice runs in a
fresh process, so its stream ids and pools are its own, as a user's would be:

- `two_captures_{separate,shared}.pickle`: two captures into one graph pool, on
  two streams or on one (`two_captures.py`);
- `compile_reduce_overhead.pickle`: torch.compile(mode="reduce-overhead") at
  three shapes: cudagraph trees (`compile_reduce_overhead.py`);
- `record_stream_{separate,shared}.pickle`: producer and consumer streams with
  `record_stream` and pending frees, then two captures into one pool on two
  streams or on one (`record_stream.py`);
- `replay_graphs_{separate,shared}.pickle`: vLLM's capture order (model graphs,
  then replay graphs into the same pool) with matrix multiplies, so each
  capture stream's cuBLAS workspace lands in the pool (`replay_graphs.py`).

The files are shipped as torch wrote them: no `kit` key, traces that start
mid-process. `PROVENANCE.json` beside them lists, per file, the GPU, the torch
and CUDA versions, the date (UTC), the command that made it (this script's and
the program's), what it is, the bytes reserved per (pool, stream) as torch
reported them, and its sha256. Without CUDA it stops with a one-line error.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kit.errors import KitError  # noqa: E402
from kit.experiments.recorded import child_error  # noqa: E402
from kit.fileio import atomic_write  # noqa: E402
from kit.load.snapshot import load_snapshot  # noqa: E402
from kit.load.unpickle import safe_unpickle  # noqa: E402
from kit.record.provenance import provenance, read_manifest, require_cuda, sha256, write_manifest  # noqa: E402

PROGRAMS = ROOT / "scripts" / "plain_programs"
RUNS = {
    "two_captures_separate.pickle": (
        "two_captures.py",
        ("--stream", "separate"),
        "two captures into one graph pool on two streams, tensors made before history began",
    ),
    "two_captures_shared.pickle": (
        "two_captures.py",
        ("--stream", "shared"),
        "two captures into one graph pool on one stream, tensors made before history began",
    ),
    "compile_reduce_overhead.pickle": (
        "compile_reduce_overhead.py",
        (),
        'torch.compile(mode="reduce-overhead") at three shapes: one cudagraph-trees graph per shape',
    ),
    "record_stream_separate.pickle": (
        "record_stream.py",
        ("--stream", "separate"),
        "producer/consumer with record_stream and pending frees, then two captures into one pool on two streams",
    ),
    "record_stream_shared.pickle": (
        "record_stream.py",
        ("--stream", "shared"),
        "producer/consumer with record_stream and pending frees, then two captures into one pool on one stream",
    ),
    "replay_graphs_separate.pickle": (
        "replay_graphs.py",
        ("--stream", "separate"),
        "vLLM's capture order: model graphs on one stream, then replay graphs into the same pool on another "
        "(matmuls: each capture stream's cuBLAS workspace lands in the pool; C++ frames recorded)",
    ),
    "replay_graphs_shared.pickle": (
        "replay_graphs.py",
        ("--stream", "shared"),
        "vLLM's capture order with PR 63155: model graphs, then replay graphs on the model graphs' stream "
        "(matmuls; C++ frames recorded)",
    ),
}


def fail(message: str) -> SystemExit:
    return SystemExit(f"record_plain.py: error: {message}")


def cuda_torch():
    """torch, with a CUDA GPU; a one-line error otherwise."""
    try:
        import torch
    except ImportError:
        raise fail("torch is not installed; the programs need torch with a CUDA GPU") from None
    try:
        require_cuda("no CUDA GPU here (torch.cuda.is_available() is False); run it on a machine with one")
    except KitError as e:
        raise fail(str(e)) from None
    return torch


def reserved_by_pool_stream(raw: dict) -> list[dict]:
    """Per (pool, stream): segments, reserved and allocated bytes, from the snapshot's segments."""
    groups: dict[tuple, dict] = {}
    for seg in raw["segments"]:
        key = (tuple(seg["segment_pool_id"]), seg["stream"])
        g = groups.setdefault(
            key, {"pool": list(key[0]), "stream": key[1], "segments": 0, "reserved": 0, "allocated": 0}
        )
        g["segments"] += 1
        g["reserved"] += seg["total_size"]
        g["allocated"] += seg["allocated_size"]
    return [groups[k] for k in sorted(groups)]


def run_program(name: str, command: list[str], tmp: Path) -> bytes:
    """Run one program in a fresh process; the snapshot it dumped, as bytes."""
    out = tmp / name
    done = subprocess.run([*command, "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0 or not out.is_file():
        sys.stderr.write(done.stderr)
        raise fail(f"{shlex.join(command)} failed (exit {done.returncode}): {child_error(done.stderr)}")
    return out.read_bytes()


def record(name: str, out_dir: Path, torch, extra: list[str], command: str) -> dict:
    program, variant, description = RUNS[name]
    args = [str(Path("scripts") / "plain_programs" / program), *variant, *extra]
    with tempfile.TemporaryDirectory(prefix="record_plain.") as tmp:
        data = run_program(name, [sys.executable, *args], Path(tmp))
    raw = safe_unpickle(data, name)
    load_snapshot(raw)  # a fixture must be plain data the kit accepts
    if "kit" in raw:
        raise fail(f"{name}: a plain snapshot must have no `kit` key")
    with atomic_write(out_dir / name, "wb") as f:
        f.write(data)
    groups = reserved_by_pool_stream(raw)
    trace = sum(len(t) for t in raw.get("device_traces") or [])
    print(f"{name}: {len(data) / 2**20:.2f} MiB, {trace} trace entries")
    for g in groups:
        print(
            f"  pool {tuple(g['pool'])} stream {g['stream']}: {g['segments']} segments, "
            f"reserved {g['reserved']} B ({g['reserved'] / 2**20:.2f} MiB), allocated {g['allocated']} B"
        )
    return {
        "description": description,
        **provenance(command, python=True),
        "program": shlex.join(["python", *args, "--out", name]),
        "trace_entries": trace,
        "reserved_by_pool_stream": groups,
        "sha256": sha256(data),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("kit/recordings/plain"))
    parser.add_argument("--only", choices=sorted(RUNS), action="append", help="record only these files")
    parser.add_argument("--hidden", type=int, help="the programs' model width (smaller for a quick try)")
    args = parser.parse_args()
    torch = cuda_torch()
    command = shlex.join(["python", "scripts/record_plain.py", *sys.argv[1:]])
    extra = ["--hidden", str(args.hidden)] if args.hidden else []
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = {name: record(name, args.out, torch, extra, command) for name in args.only or RUNS}
    previous = read_manifest(args.out) if args.only else {}
    write_manifest(args.out, previous | manifest)
    return 0


if __name__ == "__main__":
    sys.exit(main())

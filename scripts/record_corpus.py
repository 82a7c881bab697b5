"""Record the simulator's fidelity corpus on a real GPU: workloads and their snapshots.

Run on a machine with a CUDA GPU (one command re-records everything):

    python scripts/record_corpus.py --out kit/recordings/corpus

It writes each workload (seeded random ones from `kit.allocator.workload.generate_workload`,
the PR's two scenarios and the boundary workloads below) as `NAME.json`, runs it with
`python -m kit run-workload` in a fresh process (several at once), and writes
`NAME.pickle` beside it, plus `PROVENANCE.json` (GPU, torch, date, command and
the sha256 of every file).

The boundary workloads (`boundary_workloads`) put one allocation on each side
of every split rule: a request that leaves 0, 511, 512, 513 bytes, 1 MiB - 1,
1 MiB and 1 MiB + 512 bytes of its block before rounding (0, 0, 512, 512,
1 MiB - 512, 1 MiB and 1 MiB + 512 after it), in the small and the large pool,
outside captures and inside them; and a request on each side of "a fitting free
block on another stream" (`boundary_stranded*`). Each case runs on a stream of
its own, so that no case's free blocks serve another's. `--boundary-only`
records just those into a folder that already holds the corpus and adds their
provenance to its `PROVENANCE.json` under `added` (the other workloads keep
theirs).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kit.allocator.workload import generate_workload, pr_scenario  # noqa: E402
from kit.errors import KitError  # noqa: E402
from kit.fileio import atomic_write  # noqa: E402
from kit.record.provenance import file_hashes, provenance, read_manifest, require_cuda, write_manifest  # noqa: E402

COMMAND = "python scripts/record_corpus.py --out kit/recordings/corpus"
BOUNDARY_COMMAND = "python scripts/record_corpus.py --boundary-only --out kit/recordings/corpus"
KIB, MIB = 1024, 1024 * 1024
# What a request leaves of its block before rounding; rounding up to 512 bytes makes these
# 0, 0, 512, 512, 1 MiB - 512, 1 MiB, 1 MiB + 512 after it. A small-pool block is split when
# 512 bytes or more are left, a large-pool block only when more than 1 MiB is.
LEFT = (0, 511, 512, 513, MIB - 1, MIB, MIB + 512)
# The free block each case's request lands in, made of pieces its pool takes (small: at most
# 1 MiB each), behind pieces that fill the rest of the segment: (free block pieces, guard pieces).
SMALL_BLOCK = {"near 512 B": ([64 * KIB], [MIB, 960 * KIB]), "near 1 MiB": ([MIB, 512 * KIB], [512 * KIB])}
LARGE_BLOCK = ([4 * MIB], [16 * MIB])  # a 20 MiB segment: 4 MiB free, 16 MiB held
FRESH_SEGMENT = 12 * MIB  # a request of 10 MiB or more gets a segment rounded up to 2 MiB


def workloads(n_random: int) -> dict[str, dict]:
    out = {"pr_two_streams": pr_scenario(False), "pr_shared_stream": pr_scenario(True)}
    for seed in range(n_random):
        out[f"random_{seed:03d}"] = generate_workload(seed, n_ops=100 + 10 * (seed % 30), n_streams=2 + seed % 3)
    return out


def case_name(pool: str, left: int, fresh: bool = False) -> str:
    """The name of one boundary case, also its stream's: `small_left_512`, `large_fresh_left_1048576`."""
    return f"{pool}{'_fresh' if fresh else ''}_left_{left}"


def small_block(left: int) -> tuple[list[int], list[int]]:
    """The small-pool block a request leaving `left` bytes lands in: 64 KiB, or 1.5 MiB for the 1 MiB cases."""
    return SMALL_BLOCK["near 512 B" if left <= 513 else "near 1 MiB"]


def _rounded(n: int) -> int:
    """A request rounded up to 512 bytes; written out here, so that the workloads do not rest on the kit's rules."""
    return max(512, -(-n // 512) * 512)


def _case(name: str, pieces: list[int], guard: list[int], left: int, small: bool) -> list[dict]:
    """One case on its own stream: the pieces and the guard, the pieces freed, the request, and a probe.

    The pieces merge into one free block at the segment's start, held in place
    by the guard, so the request can only land there. The probe asks for what
    a split leaves (at most 1 MiB in the small pool; only above 1 MiB in the
    large one): it takes that remainder when the request's block was split and
    needs a new segment when it was not. Nothing is freed afterwards, so no
    remainder merges away.
    """
    ops = []
    held = [f"{name}:piece{i}" for i in range(len(pieces))]
    for tid, size in [*zip(held, pieces, strict=True), *((f"{name}:guard{i}", g) for i, g in enumerate(guard))]:
        ops.append({"op": "alloc", "id": tid, "bytes": size, "stream": name})
    ops += [{"op": "free", "id": tid} for tid in held]
    block = sum(pieces)
    ops.append({"op": "alloc", "id": f"{name}:request", "bytes": block - left, "stream": name})
    ops += _probe(name, block - _rounded(block - left), small)
    return ops


def _probe(name: str, remainder: int, small: bool) -> list[dict]:
    """An allocation of what a split leaves, where it is a request of the same pool; none otherwise."""
    probe = min(remainder, MIB) if small else (remainder if remainder > MIB else 0)
    return [{"op": "alloc", "id": f"{name}:probe", "bytes": probe, "stream": name}] if probe else []


def _fresh_case(name: str, left: int) -> list[dict]:
    """A request for a new segment that leaves `left` bytes of it (the segment is rounded up to 2 MiB)."""
    request = FRESH_SEGMENT - left
    ops = [{"op": "alloc", "id": f"{name}:request", "bytes": request, "stream": name}]
    return ops + _probe(name, FRESH_SEGMENT - _rounded(request), small=False)


def _captured(ops: list[dict], name: str, pool: str | None = None) -> list[dict]:
    """`ops` (all on stream `name`) inside a capture of their own on that stream."""
    begin = {"op": "capture_begin", "graph": f"graph {name}", "pool": pool, "stream": name}
    return [begin, *ops, {"op": "capture_end", "graph": f"graph {name}"}]


def boundary_cases(pool: str) -> dict[str, list[dict]]:
    """Every case of one pool (`small` or `large`): name -> its ops, each on a stream named after it."""
    cases = {}
    for left in LEFT:
        name = case_name(pool, left)
        pieces, guard = small_block(left) if pool == "small" else LARGE_BLOCK
        cases[name] = _case(name, pieces, guard, left, small=pool == "small")
    if pool == "large":
        for left in LEFT:
            cases[case_name(pool, left, fresh=True)] = _fresh_case(case_name(pool, left, fresh=True), left)
    return cases


def stranded_cases(pool: str) -> list[tuple[str, list[dict]]]:
    """A free block on stream `...:holder`, a request one step too large for it on `...:over`, one exactly its size.

    The first needs a new segment with nothing on another stream to fit it (not
    stranded); the second needs one while the holder's block fits it exactly
    (stranded). The first fills its new segment before the second asks, so
    that only the holder's block can fit. (stream, its ops) per stream, in order.
    """
    if pool == "small":
        block, guard, over_guard = MIB - 512, [MIB, 512], [MIB]  # a 2 MiB segment, the block at its start
    else:
        block, guard, over_guard = 12 * MIB, [], [2 * MIB - 512]  # a 12 MiB segment, all of it the block
    holder, over, exact = (f"{pool}_stranded:{role}" for role in ("holder", "over", "exact"))

    def alloc(stream: str, tid: str, size: int) -> dict:
        return {"op": "alloc", "id": f"{stream}:{tid}", "bytes": size, "stream": stream}

    holding = [alloc(holder, "block", block), *(alloc(holder, f"guard{i}", g) for i, g in enumerate(guard))]
    holding.append({"op": "free", "id": f"{holder}:block"})
    asking = [alloc(over, "request", block + 1), *(alloc(over, f"guard{i}", g) for i, g in enumerate(over_guard))]
    return [(holder, holding), (over, asking), (exact, [alloc(exact, "request", block)])]


def boundary_workloads() -> dict[str, dict]:
    """The boundary workloads: each pool's split cases and the stranding cases, outside captures and inside them.

    In the capture workloads every case is its own capture on its own stream:
    the split cases into a private pool each, the stranding cases into one
    shared pool (the PR's situation).
    """
    out = {}
    for pool in ("small", "large"):
        cases = boundary_cases(pool)
        out[f"boundary_{pool}"] = [op for ops in cases.values() for op in ops]
        out[f"boundary_{pool}_capture"] = [op for name, ops in cases.items() for op in _captured(ops, name)]
    stranded = [case for pool in ("small", "large") for case in stranded_cases(pool)]
    out["boundary_stranded"] = [op for _, ops in stranded for op in ops]
    out["boundary_stranded_capture"] = [op for name, ops in stranded for op in _captured(ops, name, "shared")]
    return {name: {"version": 1, "ops": ops} for name, ops in out.items()}


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


def _session(command: str, out: Path, names: list[str]) -> dict:
    """One recording session's provenance: the GPU, the versions, the date, the command, each file's sha256."""
    files = [out / f"{name}{suffix}" for name in sorted(names) for suffix in (".json", ".pickle")]
    return {**provenance(command), "files": file_hashes(files)}


def _manifest(out: Path, session: dict, boundary_only: bool) -> dict:
    """The folder's PROVENANCE.json with `session` in it: the whole of it, or under `added` beside the corpus's."""
    if not boundary_only:
        return session
    manifest = read_manifest(out)
    added = [s for s in manifest.get("added", []) if not set(s["files"]) & set(session["files"])]
    return {**manifest, "added": [*added, session]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "kit" / "recordings" / "corpus")
    parser.add_argument("--random", type=int, default=62, help="how many random workloads")
    parser.add_argument("--jobs", type=int, default=8, help="processes at once (each one fresh)")
    parser.add_argument(
        "--boundary-only", action="store_true", help="record only the boundary workloads; add them to PROVENANCE.json"
    )
    args = parser.parse_args()
    try:
        require_cuda("recording needs CUDA, which this process has none of; nothing was written")
    except KitError as e:
        print(f"record_corpus.py: error: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    corpus = boundary_workloads() if args.boundary_only else {**workloads(args.random), **boundary_workloads()}
    for name, workload in corpus.items():
        with atomic_write(args.out / f"{name}.json") as f:
            f.write(json.dumps(workload) + "\n")
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for name in pool.map(lambda n: record(n, args.out), corpus):
            print(name, flush=True)
    session = _session(BOUNDARY_COMMAND if args.boundary_only else COMMAND, args.out, list(corpus))
    write_manifest(args.out, _manifest(args.out, session, args.boundary_only))
    print(f"recorded {len(corpus)} workloads into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Large, realistic snapshots for the scale benchmark, made by the simulator.

A DeepSeek-scale vLLM process leaves snapshots with tens of thousands of
segments and traces of millions of events. `scale_workload` writes such a
process as a workload, in the order vLLM does things:

- weights loaded on the default stream, then the KV cache;
- eager steps (profiling and warm-up): per layer, activations allocated and
  freed on the default stream, all-reduce buffers on a communication stream,
  and `empty_cache` now and then;
- CUDA-graph capture, largest batch size first: the model graphs on their own
  stream into the global graph pool, keeping each piece's static outputs;
  the decoder replay graphs on a second stream into the same pool (PR 63155's
  case); the sampler's graphs in private pools on a third stream;
- serving steps: long-lived request metadata (block tables, sampling state)
  allocated on the default stream and freed as requests finish.

`scale_snapshot` runs it on the simulator and dresses the result the way
torch 2.11 writes a snapshot: stack frames per block and trace entry (a few
hundred distinct frame dicts, shared, as torch shares them), `compile_context`,
`user_metadata` and microsecond time stamps. Everything is seeded.

    python -m kit.scale --out build/scale            # the benchmark's files
    python -m kit.scale --out build/scale --big      # and a snapshot pickle of 1 GiB or more

At `scale=1` the snapshot has at least 50,000 segments, 500,000 blocks and a
2,000,000-event trace; sizes scale linearly with `scale`.
"""

from __future__ import annotations

import argparse
import pickle
import random
import sys
import time
from pathlib import Path

from kit import progress
from kit.allocator.simulator import simulate
from kit.allocator.workload import DEFAULT, Op
from kit.analysis.names import GRAPH_POOL_LABEL, MODEL_STREAM_LABEL, REPLAY_STREAM_LABEL
from kit.fileio import atomic_write
from kit.units import GIB, KIB, MIB

STREAMS = {
    "model": MODEL_STREAM_LABEL,
    "replay": REPLAY_STREAM_LABEL,
    "comm": "comm stream",
    "sampler": "sampler stream",
}
TIME_ZERO_US = 1_796_243_795_000_000  # a plausible time stamp, as torch writes them
# vLLM's default capture sizes: 1, 2, 4, then every 8 up to 512.
CAPTURE_SIZES = (1, 2, 4, *range(8, 513, 8))


class _Builder:
    """Appends validated `Op`s; keeps track of what is live so every free is legal."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.ops: list[Op] = []
        self.n = 0

    def alloc(self, size: int, stream: str = DEFAULT) -> str:
        tid = f"t{self.n}"
        self.n += 1
        self.ops.append(Op("alloc", tid, max(1, int(size)), stream))
        return tid

    def free(self, tid: str) -> None:
        self.ops.append(Op("free", tid))

    def capture(self, graph: str, pool: str | None, stream: str) -> None:
        self.ops.append(Op("capture_begin", stream=stream, graph=graph, pool=pool))

    def end(self, graph: str) -> None:
        self.ops.append(Op("capture_end", graph=graph))

    def empty_cache(self) -> None:
        self.ops.append(Op("empty_cache"))


def _n(x: float, scale: float) -> int:
    return max(1, round(x * scale))


def scale_workload(seed: int = 0, scale: float = 1.0, *, layers: int = 61, hidden: int = 7168) -> list[Op]:
    """The ops of a vLLM-shaped process; `scale=1` gives the benchmark's 2,000,000-event trace."""
    rng = random.Random(seed)
    b = _Builder(rng)
    # Weights: per layer a few large matrices (experts, attention) and many small ones (norms, scales, biases).
    for _layer in range(_n(layers * 2, scale)):
        for _ in range(4):
            b.alloc(rng.randint(8, 64) * MIB)
        for _ in range(60):
            b.alloc(rng.choice((hidden * 2, hidden * 4, rng.randint(1, 256) * KIB)))
    for _ in range(4):  # the KV cache
        b.alloc(4 * GIB)
    for _ in range(16):  # registered all-reduce buffers
        b.alloc(rng.choice((8, 16, 32)) * MIB, STREAMS["comm"])
    # Eager steps: activations come and go; the communication stream has its own buffers.
    for step in range(_n(400, scale)):
        tokens = rng.choice((256, 512, 1024, 2048, 4096))
        live: list[str] = []
        for layer in range(layers):
            live.append(b.alloc(tokens * hidden * 2))
            tmp = [b.alloc(tokens * rng.choice((hidden // 4, hidden // 2, hidden * 2)) * 2) for _ in range(3)]
            comm = b.alloc(tokens * hidden * 2, STREAMS["comm"]) if layer % 4 == 0 else None
            for t in tmp:
                b.free(t)
            if comm:
                b.free(comm)
            if len(live) > 2:
                b.free(live.pop(0))
        for t in live:
            b.free(t)
        if step % 40 == 39:
            b.empty_cache()
    # Graph capture, largest size first: model graphs, then replay graphs into the same pool on a new stream.
    sizes = sorted(CAPTURE_SIZES, reverse=True)
    graphs = _n(len(sizes) * 7, scale)
    for g in range(graphs):
        size = sizes[g % len(sizes)]
        for kind, n_layers in (("model", layers), ("replay", layers // 4)):
            stream = STREAMS[kind]
            graph = f"{kind} graphs {size} #{g}"
            b.capture(graph, GRAPH_POOL_LABEL, stream)
            hidden_state = b.alloc(size * hidden * 2, stream)
            for _layer in range(n_layers):
                tmp = [b.alloc(size * rng.choice((hidden // 8, hidden, hidden * 4)) * 2, stream) for _ in range(3)]
                # Static outputs of each piece stay in the pool as long as the graph lives.
                for _ in range(rng.randint(1, 3)):
                    b.alloc(rng.choice((size * 64, size * 576, rng.randint(1, 64) * KIB)), stream)
                new_state = b.alloc(size * hidden * 2, stream)
                for t in tmp:
                    b.free(t)
                b.free(hidden_state)
                hidden_state = new_state
            b.end(graph)
        graph = f"sampler graph {size} #{g}"
        b.capture(graph, None, STREAMS["sampler"])
        for _ in range(rng.randint(4, 12)):
            b.alloc(rng.randint(1, 512) * KIB, STREAMS["sampler"])
        b.end(graph)
    # Serving: request metadata lives for a while; most of it is still there at the end.
    live_meta: list[str] = []
    for _step in range(_n(62_000, scale)):
        for _ in range(rng.randint(8, 16)):
            size = rng.choice((512, 4 * KIB, *(rng.randint(64, 1000) * KIB for _ in range(3))))
            live_meta.append(b.alloc(size))
        for _ in range(rng.randint(4, 8)):
            if live_meta:
                b.free(live_meta.pop(rng.randrange(len(live_meta))))
    return b.ops


def _stacks(rng: random.Random, n_frames: int = 400, n_stacks: int = 3000) -> list[tuple[dict, ...]]:
    """Distinct call stacks built from a few hundred shared frame dicts, as torch shares them."""
    files = [
        f"/opt/vllm/.venv/lib/python3.12/site-packages/vllm/{p}.py"
        for p in (
            "v1/worker/gpu/model_runner",
            "v1/worker/gpu/cudagraph_utils",
            "model_executor/layers/linear",
            "model_executor/layers/fused_moe/layer",
            "attention/backends/mla/common",
            "distributed/parallel_state",
            "models/deepseek_v41/model",
            "v1/sample/sampler",
            "compilation/breakable_cudagraph",
        )
    ]
    frames = [
        {"name": f"fn_{i}", "filename": files[i % len(files)], "line": rng.randint(10, 3000)} for i in range(n_frames)
    ]
    return [tuple(rng.choice(frames) for _ in range(rng.randint(4, 16))) for _ in range(n_stacks)]


def dress_like_torch(snapshot: dict, seed: int = 0) -> dict:
    """Add what a torch 2.11 snapshot carries and the simulator leaves out: frames, time stamps, metadata."""
    rng = random.Random(seed)
    stacks = _stacks(rng)
    n = len(stacks)
    for seg in progress.track(snapshot["segments"], "dressing the segments like torch's", every=1024):
        seg["frames"] = []
        for blk in seg["blocks"]:
            blk["frames"] = list(stacks[(blk["address"] >> 9) % n]) if blk["state"] != "inactive" else []
    for trace in snapshot["device_traces"]:
        for i, e in enumerate(progress.track(trace, "dressing the trace like torch's", every=4096)):
            e["time_us"] = TIME_ZERO_US + 3 * i
            e["compile_context"] = "N/A"
            e["user_metadata"] = ""
            e["frames"] = list(stacks[(e["addr"] >> 9) % n]) if e["action"] in ("alloc", "free_requested") else []
    snapshot["external_annotations"] = []
    snapshot["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": "", "expandable_segments": False}
    return snapshot


def scale_snapshot(seed: int = 0, scale: float = 1.0) -> dict:
    """The simulated snapshot of `scale_workload(seed, scale)`, dressed like torch's."""
    ops = scale_workload(seed, scale)
    sim = simulate(ops)  # its own bar: "simulating the workload"
    del ops
    raw = sim.snapshot()
    del sim
    return dress_like_torch(raw, seed)


def summary(snapshot: dict) -> dict:
    """Counts the benchmark states for a generated file."""
    return {
        "segments": len(snapshot["segments"]),
        "blocks": sum(len(s["blocks"]) for s in snapshot["segments"]),
        "events": sum(len(t) for t in snapshot["device_traces"]),
        "streams": len({s["stream"] for s in snapshot["segments"]}),
        "pools": len({tuple(s["segment_pool_id"]) for s in snapshot["segments"]}),
        "reserved_gib": round(sum(s["total_size"] for s in snapshot["segments"]) / GIB, 1),
    }


class _Counted:
    """A binary file whose writes are counted (for a progress bar)."""

    def __init__(self, f, on_write) -> None:
        self._f, self._on_write = f, on_write

    def write(self, data) -> int:
        self._on_write(len(data))
        return self._f.write(data)


def write_scale_snapshot(path: str | Path, seed: int = 0, scale: float = 1.0) -> dict:
    """Generate and write one snapshot pickle (as `torch.cuda.memory._dump_snapshot` does); return its summary."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = scale_snapshot(seed, scale)
    with atomic_write(path, "wb") as f, progress.bar(f"writing {path.name}", unit="B") as shown:
        pickle.dump(raw, _Counted(f, shown.update))
    return {**summary(raw), "bytes": path.stat().st_size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kit.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/scale", help="folder for the generated files (git-ignored)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scale", type=float, default=1.0, help="1: 2,000,000 events, 50,000 segments")
    parser.add_argument("--big", action="store_true", help="also write big.pickle, a snapshot of 1 GiB or more")
    args = parser.parse_args(argv)
    jobs = [("scale.pickle", args.scale)] + ([("big.pickle", 4.0 * args.scale)] if args.big else [])
    for name, scale in jobs:
        start = time.perf_counter()
        info = write_scale_snapshot(Path(args.out) / name, args.seed, scale)
        print(f"{Path(args.out) / name}: {info} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Two CUDA graph captures into one graph pool, on two streams or on one: a plain torch program.

    python scripts/plain_programs/two_captures.py --stream separate --out two_captures_separate.pickle

What an engineer debugging graph memory would write, with torch alone (no kit):
the model (two `nn.TransformerEncoderLayer`s and an `nn.Linear` head), its static
inputs and a few other buffers are made first, and only then is memory history
turned on, so the trace starts mid-process. Graph 1 (2048 tokens) is captured
on stream s1 into a `graph_pool_handle()` pool; its intermediates are freed
inside the capture, its output kept. Graph 2 (1024 tokens) is captured into
the same pool on stream s2: a second `torch.cuda.Stream()` (`--stream separate`)
or s1 itself (`--stream shared`). Its allocations fit the blocks graph 1 freed,
which sit on s1: the shared run reuses them, the separate one makes new
pool segments on s2 beside them. Apart from the stream, both runs allocate
the same sizes in the same order, warm-up included.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

HIDDEN, HEADS, FFN, LAYERS, SEQ = 1024, 16, 4096, 2, 128
FIRST_BATCH, SECOND_BATCH = 16, 8  # 2048 and 1024 tokens
WARMUP = 3
MAX_ENTRIES = 20000


def build_model(hidden: int) -> nn.Module:
    layers = [
        nn.TransformerEncoderLayer(hidden, HEADS, FFN * hidden // HIDDEN, dropout=0.0, batch_first=True)
        for _ in range(LAYERS)
    ]
    return nn.Sequential(*layers, nn.Linear(hidden, hidden)).cuda().to(torch.bfloat16).eval()


def capture_first(model: nn.Module, x: torch.Tensor, pool, stream: torch.cuda.Stream):
    """Warm up on `stream`, then capture graph 1 on it; the intermediates die inside the capture."""
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP):
            model(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        out = model(x)
    return graph, out


def capture_second(model: nn.Module, x: torch.Tensor, pool, stream: torch.cuda.Stream):
    """Warm up on `stream`, then capture graph 2 on it into graph 1's pool.

    The same steps as `capture_first`, in a function of its own: a stream is
    told apart by the frame of its first allocation, as a user's would be.
    """
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP):
            model(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        out = model(x)
    return graph, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to dump the snapshot (a pickle)")
    parser.add_argument("--stream", "--variant", choices=("separate", "shared"), required=True)
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="model width (smaller for a quick try)")
    args = parser.parse_args()
    torch.manual_seed(0)
    with torch.no_grad():
        # Before history: the model, its static inputs and some other buffers.
        model = build_model(args.hidden)
        x1 = torch.randn(FIRST_BATCH, SEQ, args.hidden, device="cuda", dtype=torch.bfloat16)
        x2 = torch.randn(SECOND_BATCH, SEQ, args.hidden, device="cuda", dtype=torch.bfloat16)
        cache = torch.zeros(64 * 2**20, device="cuda", dtype=torch.uint8)
        scratch = [torch.empty(n * 2**18, device="cuda", dtype=torch.uint8) for n in (1, 3, 12)]
        torch.cuda.synchronize()

        torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
        pool = torch.cuda.graph_pool_handle()
        s1 = torch.cuda.Stream()
        s2 = torch.cuda.Stream() if args.stream == "separate" else s1
        g1, out1 = capture_first(model, x1, pool, s1)
        g2, out2 = capture_second(model, x2, pool, s2)
        g1.replay()
        g2.replay()
        torch.cuda.synchronize()
        print(f"outputs {tuple(out1.shape)} {tuple(out2.shape)}; kept alive: {cache.numel() + len(scratch)}")
        torch.cuda.memory._dump_snapshot(args.out)
        torch.cuda.memory._record_memory_history(enabled=None)


if __name__ == "__main__":
    main()

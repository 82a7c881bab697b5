"""Model graphs, then decoder replay graphs, into one graph pool: vLLM's capture order in plain torch.

    python scripts/plain_programs/replay_graphs.py --stream separate --out replay_graphs_separate.pickle

The shape of vLLM 0.33's `capture_model()` on DeepSeek-V4.1, written with torch
alone (no kit): the model graphs are captured largest batch first on one
stream (`graph_capture()`'s), each after a warm-up on the default stream, into
a `graph_pool_handle()` pool; then the replay graphs (a smaller stack of the
same layers) are captured into the same pool, on a stream of their own
(`--stream separate`, vLLM 0.33) or on the model graphs' stream (`--stream
shared`, PR 63155). Every layer is a matrix multiply, so the first capture on
each stream makes that stream's cuBLAS workspace inside the capture, in the
graph pool; `torch.cuda.graph` empties the cache on entry, so the warm-ups'
segments are freed in the trace. Memory history records C++ frames too
(`stacks="all"`), as `_record_memory_history()` does by default.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

HIDDEN, LAYERS, REPLAY_LAYERS = 2048, 4, 2
MODEL_SIZES = (512, 256, 128)
REPLAY_SIZES = (256, 128, 64)
MAX_ENTRIES = 50000


def build_layers(hidden: int, n: int) -> nn.Module:
    """`n` MLP blocks (up, GELU, down), bf16: each capture's allocations are matmul outputs."""
    blocks = [nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)) for _ in range(n)]
    return nn.Sequential(*blocks).cuda().to(torch.bfloat16).eval()


def capture_model_graphs(model: nn.Module, x: torch.Tensor, pool, stream: torch.cuda.Stream) -> list:
    """One graph per batch size, largest first, each warmed up on the default stream."""
    graphs = []
    for size in MODEL_SIZES:
        model(x[:size])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            out = model(x[:size])
        graphs.append((graph, out))
    return graphs


def capture_replay_graphs(layers: nn.Module, x: torch.Tensor, pool, stream: torch.cuda.Stream) -> list:
    """The replay graphs, the same way, on `stream`: a function of its own so its stream gets its own label."""
    graphs = []
    for size in REPLAY_SIZES:
        layers(x[:size])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            out = layers(x[:size])
        graphs.append((graph, out))
    return graphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to dump the snapshot (a pickle)")
    parser.add_argument("--stream", "--variant", choices=("separate", "shared"), required=True)
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="model width (smaller for a quick try)")
    args = parser.parse_args()
    torch.manual_seed(0)
    with torch.no_grad():
        model = build_layers(args.hidden, LAYERS)
        replay_layers = build_layers(args.hidden, REPLAY_LAYERS)
        x = torch.randn(MODEL_SIZES[0], args.hidden, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()

        torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)
        pool = torch.cuda.graph_pool_handle()
        model_stream = torch.cuda.Stream()
        model_graphs = capture_model_graphs(model, x, pool, model_stream)
        replay_stream = torch.cuda.Stream() if args.stream == "separate" else model_stream
        replay_graphs = capture_replay_graphs(replay_layers, x, pool, replay_stream)
        for graph, _ in model_graphs + replay_graphs:
            graph.replay()
        torch.cuda.synchronize()
        print(f"{len(model_graphs)} model graphs, {len(replay_graphs)} replay graphs ({args.stream})")
        torch.cuda.memory._dump_snapshot(args.out)
        torch.cuda.memory._record_memory_history(enabled=None)


if __name__ == "__main__":
    main()

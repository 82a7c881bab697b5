"""Producer and consumer streams with record_stream, then two graph captures into one pool: a plain torch program.

    python scripts/plain_programs/record_stream.py --stream separate --out record_stream_separate.pickle

What an engineer overlapping work on streams would write, with torch alone (no
kit). Memory history is turned on after the models are made (the trace starts
mid-process). Then:

1. Producer and consumer: each step allocates an input and a projection on a
   producer stream; a consumer stream waits for it, is kept busy by
   `torch.cuda._sleep`, and reads the projection, which is marked with
   `record_stream(consumer)` and deleted at once. Its free stays pending until
   the consumer's work is done (`free_requested` long before
   `free_completed` in the trace), while the next steps allocate new
   projections beside it.
2. Two graphs in one pool: graph 1 (an `nn.MultiheadAttention` block, 2048
   tokens) is captured on stream s1 into a `graph_pool_handle()` pool, its
   intermediates freed inside the capture; graph 2 (1024 tokens) into the same
   pool on a second stream (`--stream separate`) or on s1 (`--stream shared`).
   The separate run makes new pool segments while graph 1's freed blocks
   sit on s1; the shared one reuses them. Both variants do the same thing apart
   from that stream.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

HIDDEN, HEADS, SEQ = 1024, 16, 128
STEP_TOKENS, STEPS = 8192, 4  # 16 MiB projections at hidden 1024
SLEEP_CYCLES = 200_000_000  # about 0.1 s of a busy consumer per step
FIRST_BATCH, SECOND_BATCH = 16, 8
WARMUP = 3
MAX_ENTRIES = 20000


class AttentionBlock(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(hidden, HEADS, batch_first=True)
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        y, _ = self.attn(y, y, y, need_weights=False)
        return self.out(x + y)


def consume(head: nn.Module, h: torch.Tensor, producer, consumer, results: list) -> None:
    """Queue a long wait on the consumer, then read `h` there."""
    consumer.wait_stream(producer)
    with torch.cuda.stream(consumer):
        torch.cuda._sleep(SLEEP_CYCLES)
        results.append(head(h).float().sum())


def produce(proj: nn.Module, head: nn.Module, hidden: int, producer, consumer) -> list:
    """Each step: allocate on the producer, hand to the consumer, free while the consumer is busy."""
    results = []
    for _ in range(STEPS):
        with torch.cuda.stream(producer):
            x = torch.randn(STEP_TOKENS, hidden, device="cuda", dtype=torch.bfloat16)
            h = proj(x)
        consume(head, h, producer, consumer, results)
        h.record_stream(consumer)
        del x, h  # x is free at once; h waits for the consumer
    return results


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
    """The same steps as `capture_first` for graph 2, in a function of its own (its own first frame)."""
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
        proj = nn.Linear(args.hidden, args.hidden).cuda().to(torch.bfloat16)
        head = nn.Linear(args.hidden, args.hidden).cuda().to(torch.bfloat16)
        model = nn.Sequential(AttentionBlock(args.hidden), AttentionBlock(args.hidden)).cuda().to(torch.bfloat16)
        model.eval()
        x1 = torch.randn(FIRST_BATCH, SEQ, args.hidden, device="cuda", dtype=torch.bfloat16)
        x2 = torch.randn(SECOND_BATCH, SEQ, args.hidden, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()

        torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
        producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
        results = produce(proj, head, args.hidden, producer, consumer)
        torch.cuda.synchronize()
        total = sum(r.item() for r in results)  # the pending frees complete at the next allocation, below

        pool = torch.cuda.graph_pool_handle()
        s1 = torch.cuda.Stream()
        s2 = torch.cuda.Stream() if args.stream == "separate" else s1
        g1, out1 = capture_first(model, x1, pool, s1)
        g2, out2 = capture_second(model, x2, pool, s2)
        g1.replay()
        g2.replay()
        torch.cuda.synchronize()
        print(f"{len(results)} steps (sum {total:.1f}); outputs {tuple(out1.shape)} {tuple(out2.shape)}")
        torch.cuda.memory._dump_snapshot(args.out)
        torch.cuda.memory._record_memory_history(enabled=None)


if __name__ == "__main__":
    main()

"""A small model under torch.compile(mode="reduce-overhead"), called at three shapes: a plain torch program.

    python scripts/plain_programs/compile_reduce_overhead.py --out compile_reduce_overhead.pickle

What an engineer trying torch.compile's CUDA graphs would write, with torch
alone (no kit): a model of `nn.Linear`, `nn.GELU` and `nn.LayerNorm` is made,
then memory history is turned on (the trace starts mid-process), then the
compiled model is called a few times at each of three token counts. Inductor
compiles one graph per shape (`dynamic=False`) and cudagraph trees record one
CUDA graph per shape, all in cudagraph trees' one private pool, after a
warm-up run; later calls replay it.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

HIDDEN, LAYERS = 1024, 2
TOKENS = (512, 1024, 2048)
CALLS = 4  # per shape: warm-up, record, then replays
MAX_ENTRIES = 20000


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(self.norm(x))))


def build_model(hidden: int) -> nn.Module:
    blocks = [Block(hidden) for _ in range(LAYERS)]
    return nn.Sequential(*blocks, nn.Linear(hidden, hidden)).cuda().to(torch.bfloat16).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to dump the snapshot (a pickle)")
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="model width (smaller for a quick try)")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = build_model(args.hidden)
    inputs = {n: torch.randn(n, args.hidden, device="cuda", dtype=torch.bfloat16) for n in TOKENS}
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
    torch.cuda.synchronize()

    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")
    sums = []
    with torch.no_grad():
        for n in TOKENS:
            for _ in range(CALLS):
                torch.compiler.cudagraph_mark_step_begin()
                sums.append(compiled(inputs[n]).float().sum().item())
    torch.cuda.synchronize()
    print(f"{len(sums)} calls at {len(TOKENS)} shapes; last sum {sums[-1]:.3f}")
    torch.cuda.memory._dump_snapshot(args.out)
    torch.cuda.memory._record_memory_history(enabled=None)


if __name__ == "__main__":
    main()

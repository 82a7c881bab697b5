"""Record the kit's real-GPU fixtures: two captures into one graph pool.

Run on a machine with a CUDA GPU (one command re-records everything):

    python scripts/record_fixtures.py --out tests/fixtures

Each scenario runs in a fresh process, so its allocator starts empty, with
memory history recorded from the first allocation:

- `two_streams`: a model-like capture (real matmuls, intermediates freed) into
  a `graph_pool_handle()` pool on one stream, then a smaller "replay" capture
  into the same pool on a *new* stream, as vLLM 0.33's `graph_capture()` does.
- `shared_stream`: the same two captures, the second on the *same* stream, as
  PR 63155 does.

Each snapshot carries a `kit` key naming its streams, pool and graphs, the
trace index range of each capture, and its provenance (GPU, torch, date,
command). `PROVENANCE.json` beside the files lists them with their sha256.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import pickle
import platform
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kit.snapshot import load_snapshot, safe_unpickle  # noqa: E402

SCENARIOS = {
    "two_streams": "second capture on a new stream (vLLM 0.33)",
    "shared_stream": "second capture on the first capture's stream (PR 63155)",
}
COMMAND = "python scripts/record_fixtures.py --out tests/fixtures"


def forward(x, layers):
    """A decoder-shaped forward: per layer an MLP with a residual and a norm."""
    import torch.nn.functional as F

    h = x
    for w_up, w_down in layers:
        a = F.gelu(h @ w_up)  # 4x-wide intermediate, freed after the layer
        h = F.layer_norm(h + a @ w_down, h.shape[-1:])
    return h


def trace_length() -> int:
    import torch

    traces = torch.cuda.memory._snapshot()["device_traces"]
    return len(traces[torch.cuda.current_device()])


def capture(name, pool, stream, x, layers, captures):
    """Warm up on `stream`, then capture `forward` into `pool` on it."""
    import torch

    with torch.cuda.stream(stream):
        forward(x, layers)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    begin = trace_length()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        out = forward(x, layers)
    torch.cuda.synchronize()
    captures.append(
        {"graph": name, "stream": stream.cuda_stream, "pool": list(pool), "trace_begin": begin, "trace_end": trace_length()}
    )
    return graph, out


def record(scenario: str, path: Path, hidden: int, tokens: int, replay_tokens: int, n_layers: int) -> None:
    import torch

    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    layers = [
        (torch.randn(hidden, 4 * hidden, device=dev, dtype=torch.bfloat16) / hidden**0.5,
         torch.randn(4 * hidden, hidden, device=dev, dtype=torch.bfloat16) / (4 * hidden) ** 0.5)
        for _ in range(n_layers)
    ]
    x = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16)
    x_replay = torch.randn(replay_tokens, hidden, device=dev, dtype=torch.bfloat16)
    pool = torch.cuda.graph_pool_handle()
    model_stream = torch.cuda.Stream()
    replay_stream = torch.cuda.Stream() if scenario == "two_streams" else model_stream
    captures: list[dict] = []
    graphs = [
        capture("model graph", pool, model_stream, x, layers, captures),
        capture("replay graph", pool, replay_stream, x_replay, layers[: n_layers // 2], captures),
    ]
    for g, _ in graphs:
        g.replay()
    torch.cuda.synchronize()

    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    props = torch.cuda.get_device_properties(dev)
    snap["kit"] = {
        "streams": {"model graphs stream": model_stream.cuda_stream}
        | ({"replay graphs stream": replay_stream.cuda_stream} if scenario == "two_streams" else {}),
        "pools": {"global graph pool": list(pool)},
        "graphs": {c["graph"]: c["pool"] for c in captures},
        "captures": captures,
        "provenance": {
            "scenario": scenario,
            "description": SCENARIOS[scenario],
            "gpu": props.name,
            "torch": str(torch.__version__),  # TorchVersion would pickle as a global
            "cuda": torch.version.cuda,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": COMMAND,
            "workload": {"hidden": hidden, "tokens": tokens, "replay_tokens": replay_tokens,
                         "layers": n_layers, "dtype": "bfloat16"},
            "python": platform.python_version(),
        },
    }
    data = pickle.dumps(snap)
    load_snapshot(snap)  # a fixture must be plain data the kit's safe loader accepts
    safe_unpickle(data, str(path))
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    print(json.dumps(snap["kit"]["provenance"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures"))
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), help="record one scenario in this process")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--replay-tokens", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = [f"--hidden={args.hidden}", f"--tokens={args.tokens}",
             f"--replay-tokens={args.replay_tokens}", f"--layers={args.layers}"]
    if args.scenario:
        record(args.scenario, args.out / f"{args.scenario}.pickle", args.hidden, args.tokens,
               args.replay_tokens, args.layers)
        return 0
    manifest = {}
    for scenario in SCENARIOS:
        # A fresh process per scenario: each starts from an empty allocator.
        done = subprocess.run(
            [sys.executable, __file__, "--out", str(args.out), "--scenario", scenario, *sizes],
            check=True, capture_output=True, text=True,
        )
        prov = json.loads(done.stdout.strip().splitlines()[-1])
        path = args.out / f"{scenario}.pickle"
        manifest[path.name] = prov | {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    (args.out / "PROVENANCE.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

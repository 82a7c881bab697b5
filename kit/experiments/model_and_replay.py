"""The model-and-replay experiment: the PR's root cause in a dozen lines of torch.

A model-like graph (real matmuls, intermediates freed as it goes) is captured
into a `graph_pool_handle()` pool, then a smaller "replay" graph is captured
into the same pool, either on a new stream (what vLLM 0.33's
`graph_capture()` does for every capture) or on the first capture's stream
(what PR 63155 does for the decoder replay graphs). The returned snapshot
carries a `kit` key naming the streams, the pool, the graphs, and the trace
index range of each capture. Needs CUDA; `scripts/record_fixtures.py` records
it for machines without one (`kit.recordings`).
"""

from __future__ import annotations

from typing import Any

from kit.analysis.names import GRAPH_POOL_LABEL, MODEL_STREAM_LABEL, REPLAY_STREAM_LABEL
from kit.errors import KitError
from kit.load.snapshot import Snapshot, load_snapshot
from kit.record.history import recording_history, trace_length
from kit.recordings import LIVE, check_source, default_source, recording


def forward(x, layers):
    """A decoder-shaped forward: per layer an MLP with a residual and a norm."""
    import torch.nn.functional as F

    h = x
    for w_up, w_down in layers:
        a = F.gelu(h @ w_up)  # 4x-wide intermediate, freed after the layer
        h = F.layer_norm(h + a @ w_down, h.shape[-1:])
    return h


def capture(name: str, pool, stream, x, layers, captures: list[dict]):
    """Warm up on `stream`, then capture `forward` into `pool` on it; log the trace window."""
    import torch

    with torch.cuda.stream(stream):
        forward(x, layers)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    begin = trace_length(torch)
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        out = forward(x, layers)
    torch.cuda.synchronize()
    captures.append(
        {
            "graph": name,
            "stream": stream.cuda_stream,
            "pool": list(pool),
            "trace_begin": begin,
            "trace_end": trace_length(torch),
        }
    )
    return graph, out


def run_model_and_replay(
    shared_stream: bool, *, hidden: int = 2048, tokens: int = 1024, replay_tokens: int = 512, layers: int = 4
) -> dict[str, Any]:
    """Capture the model graph and then the replay graph; return the snapshot dict.

    Memory history is recorded from the first allocation to the snapshot, and
    the graphs are kept alive until the snapshot is taken.
    """
    import torch

    if not torch.cuda.is_available():
        raise KitError("the model-and-replay experiment needs CUDA; load its recording instead")
    with recording_history(max_entries=1_000_000, stacks="python"):
        dev = torch.device("cuda")
        gen = torch.Generator(device=dev).manual_seed(0)
        weights = [
            (
                torch.randn(hidden, 4 * hidden, device=dev, dtype=torch.bfloat16, generator=gen) / hidden**0.5,
                torch.randn(4 * hidden, hidden, device=dev, dtype=torch.bfloat16, generator=gen) / (4 * hidden) ** 0.5,
            )
            for _ in range(layers)
        ]
        x = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16, generator=gen)
        x_replay = torch.randn(replay_tokens, hidden, device=dev, dtype=torch.bfloat16, generator=gen)
        pool = torch.cuda.graph_pool_handle()
        model_stream = torch.cuda.Stream()
        replay_stream = model_stream if shared_stream else torch.cuda.Stream()
        captures: list[dict] = []
        graphs = [
            capture("model graph", pool, model_stream, x, weights, captures),
            capture("replay graph", pool, replay_stream, x_replay, weights[: max(1, layers // 2)], captures),
        ]
        for g, _ in graphs:
            g.replay()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
    streams = {MODEL_STREAM_LABEL: model_stream.cuda_stream}
    if not shared_stream:
        streams[REPLAY_STREAM_LABEL] = replay_stream.cuda_stream
    snap["kit"] = {
        "streams": streams,
        "pools": {GRAPH_POOL_LABEL: list(pool)},
        "graphs": {c["graph"]: c["pool"] for c in captures},
        "captures": captures,
        "workload": {
            "hidden": hidden,
            "tokens": tokens,
            "replay_tokens": replay_tokens,
            "layers": layers,
            "dtype": "bfloat16",
        },
    }
    del graphs  # the snapshot was taken while they lived; now their pool may go
    return snap


RECORDED_AS = {False: "two_streams.pickle", True: "shared_stream.pickle"}


def model_and_replay(shared_stream: bool, source: str | None = None) -> Snapshot:
    """The model-and-replay experiment from `source`: run live, or its H200 recording."""
    source = check_source(source or default_source())
    if source == LIVE:
        label = f"model-and-replay experiment, replay on {'shared' if shared_stream else 'new'} stream"
        return Snapshot(run_model_and_replay(shared_stream), origin=label, live=True)
    return load_snapshot(recording(RECORDED_AS[shared_stream]))

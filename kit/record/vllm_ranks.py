"""Allocator snapshots from every worker of a vLLM `LLM`.

`snapshot_all_ranks(llm)` sends `worker_snapshot` to each worker through
vLLM's `collective_rpc` (cloudpickled for workers in other processes) and
returns one `Snapshot` per rank, in rank order, each with its provenance
(rank, GPU, torch and vLLM versions, date). The worker pickles its snapshot
to bytes, so any executor can carry it, and the driver reads the bytes with
the kit's safe loader: a worker's reply is data, never code.

If a `CaptureRecorder` ran in the worker's process (an in-process engine,
`VLLM_ENABLE_V1_MULTIPROCESSING=0`), the snapshot names its streams and pools
as the recorder did; `recorded=True` returns the recorder's own snapshot
instead (taken when it stopped, with its trace and one window per graph).

    llm = LLM(model, ...)
    for snapshot in kit.record.vllm_ranks.snapshot_all_ranks(llm):
        kit.segment_table(snapshot)
"""

from __future__ import annotations

import pickle
from typing import Any

from kit.errors import KitError
from kit.load.snapshot import Snapshot
from kit.load.unpickle import safe_unpickle
from kit.record.provenance import machine, utc_now


def worker_snapshot(worker: Any, recorded: bool = False) -> dict:
    """Run on a vLLM worker: its allocator snapshot (or its last recording), pickled, and who took it."""
    import torch

    import kit.record.recorder

    recording = kit.record.recorder.last_recording()
    if recorded:
        if recording is None:
            return {"error": "no CaptureRecorder has recorded in this worker's process"}
        raw = recording
    else:
        raw = torch.cuda.memory._snapshot()
        if recording is not None:  # stream ids outlive the recording; its trace windows do not
            raw["kit"] = {k: recording["kit"][k] for k in ("streams", "pools") if k in recording["kit"]}
    found = machine()
    return {
        "rank": getattr(worker, "rank", None),
        "local_rank": getattr(worker, "local_rank", None),
        "gpu": found["gpu"],
        "torch": found["torch"],
        "snapshot": pickle.dumps(raw, protocol=pickle.HIGHEST_PROTOCOL),
    }


def snapshot_all_ranks(llm: Any, *, recorded: bool = False, timeout: float | None = 300) -> list[Snapshot]:
    """One snapshot per worker of `llm`, in rank order, with provenance."""
    import vllm

    rpc = getattr(llm, "collective_rpc", None)
    if rpc is None:
        raise KitError(f"{type(llm).__name__} has no collective_rpc: pass a vllm.LLM")
    replies = rpc(worker_snapshot, timeout=timeout, args=(recorded,))
    date = utc_now()
    snapshots = []
    for i, reply in enumerate(replies):
        if isinstance(reply, dict) and isinstance(reply.get("error"), str):
            raise KitError(f"worker {i}: {reply['error']}")
        if not isinstance(reply, dict) or not isinstance(reply.get("snapshot"), bytes):
            raise KitError(f"worker {i}: no snapshot in its reply ({type(reply).__name__})")
        rank = reply["rank"] if isinstance(reply.get("rank"), int) else i
        raw = safe_unpickle(reply["snapshot"], f"worker {rank}")
        if not isinstance(raw, dict):
            raise KitError(f"worker {rank}: its snapshot is a {type(raw).__name__}, not a dict")
        meta = raw.setdefault("kit", {})
        meta.setdefault("source", "live GPU")
        meta["provenance"] = {
            **(meta.get("provenance") or {}),
            "gpu": reply.get("gpu"),
            "torch": reply.get("torch"),
            "vllm": vllm.__version__,
            "rank": rank,
            "local_rank": reply.get("local_rank"),
            "date": date,
            "command": "kit.record.vllm_ranks.snapshot_all_ranks",
        }
        snapshots.append((rank, Snapshot(raw, origin=f"vLLM rank {rank}", live=True)))
    return [s for _, s in sorted(snapshots, key=lambda pair: pair[0])]

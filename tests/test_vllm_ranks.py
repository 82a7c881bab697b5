"""`kit.record.vllm_ranks.snapshot_all_ranks`: one snapshot per worker through vLLM's own `collective_rpc` machinery.

The workers' RPC runs as vLLM runs it for workers in other processes: the
function is cloudpickled and called by `vllm.v1.serial_utils.run_method`.
Only the GPU is stood in for: each worker's `torch.cuda.memory._snapshot()`
returns an H200 recording of the replica.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace

import cloudpickle
import pandas as pd
import pytest
import torch
import vllm
from vllm.v1.serial_utils import run_method

import kit.record.recorder
from kit.analysis.tables import segment_table
from kit.errors import KitError
from kit.load.unpickle import safe_unpickle
from kit.record.vllm_ranks import snapshot_all_ranks
from kit.recordings import RECORDINGS

REPLICA = RECORDINGS / "replica"


def _raw(name: str) -> dict:
    return safe_unpickle((REPLICA / f"{name}.pickle").read_bytes())


@pytest.fixture
def two_gpus(monkeypatch):
    """Rank 1's worker answers first; each worker's GPU holds one recording."""
    by_rank = {0: _raw("small_unpatched"), 1: _raw("small_patched")}
    current = {}

    def snapshot():
        return pickle.loads(pickle.dumps(by_rank[current["rank"]]))

    workers = [SimpleNamespace(rank=1, local_rank=1), SimpleNamespace(rank=0, local_rank=0)]

    def collective_rpc(method, timeout=None, args=(), kwargs=None):
        """`LLM.collective_rpc` as the multiprocess executor runs a callable on each worker."""
        replies = []
        for worker in workers:
            current["rank"] = worker.rank
            replies.append(run_method(worker, cloudpickle.dumps(method), args, kwargs or {}))
        return replies

    monkeypatch.setattr(torch.cuda.memory, "_snapshot", snapshot)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(kit.record.recorder, "_last_recording", [None])
    return SimpleNamespace(collective_rpc=collective_rpc), by_rank


def test_one_snapshot_per_rank_in_rank_order_with_provenance(two_gpus):
    llm, by_rank = two_gpus
    snapshots = snapshot_all_ranks(llm)
    assert [s.provenance["rank"] for s in snapshots] == [0, 1]
    for rank, snapshot in enumerate(snapshots):
        prov = snapshot.provenance
        assert (prov["gpu"], prov["vllm"], prov["command"]) == (
            "NVIDIA H200",
            vllm.__version__,
            "kit.record.vllm_ranks.snapshot_all_ranks",
        )
        assert prov["torch"] == str(torch.__version__) and prov["local_rank"] == rank
        assert snapshot.data_source == "live GPU"
        assert snapshot.source_label == f"live GPU (vLLM rank {rank}'s allocator, NVIDIA H200)"
        expected = segment_table(by_rank[rank])
        pd.testing.assert_frame_equal(
            segment_table(snapshot).drop(columns=["pool_label", "stream_label"]),
            expected.drop(columns=["pool_label", "stream_label"]),
        )
    # The ranks differ as the recordings do: rank 0 (unpatched) has the replay stream's two groups,
    # its eager warm-ups in the default pool and its graphs in the graph pool.
    assert len(segment_table(snapshots[0])) == len(segment_table(snapshots[1])) + 2


def test_a_recorders_stream_names_come_along_but_not_its_windows(two_gpus, monkeypatch):
    llm, by_rank = two_gpus
    monkeypatch.setattr(kit.record.recorder, "_last_recording", [by_rank[0]])
    snapshot = snapshot_all_ranks(llm)[0]
    assert snapshot.kit["streams"] == by_rank[0]["kit"]["streams"]
    assert "captures" not in snapshot.kit
    recorded = snapshot_all_ranks(llm, recorded=True)[0]
    assert recorded.kit["captures"] == by_rank[0]["kit"]["captures"]


def test_no_recording_in_a_worker_is_a_one_line_error(two_gpus):
    llm, _ = two_gpus
    with pytest.raises(KitError, match="worker 0: no CaptureRecorder has recorded"):
        snapshot_all_ranks(llm, recorded=True)


def test_a_hostile_worker_reply_is_refused_without_running_it(two_gpus, tmp_path):
    class Boom:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "ran",))

    llm = SimpleNamespace(collective_rpc=lambda *a, **k: [{"rank": 0, "snapshot": pickle.dumps(Boom())}])
    with pytest.raises(KitError, match="worker 0: .*global"):
        snapshot_all_ranks(llm)
    assert not (tmp_path / "ran").exists()
    llm = SimpleNamespace(collective_rpc=lambda *a, **k: ["not a reply"])
    with pytest.raises(KitError, match="worker 0: no snapshot in its reply"):
        snapshot_all_ranks(llm)
    with pytest.raises(KitError, match="has no collective_rpc"):
        snapshot_all_ranks(object())

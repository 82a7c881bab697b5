"""The replica under tensor parallelism, eagerly on the CPU over gloo: sharded layers equal the whole ones.

The experiment itself (`kit.experiments.tensor_parallel`) runs on several GPUs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.multiprocessing as mp

from kit.replica.model import PRESETS
from kit.replica.model_runner import GPUModelRunner
from kit.replica.parallel_state import get_tensor_model_parallel_world_size, init_distributed_environment

from .servers import free_port

CONFIG = dataclasses.replace(PRESETS["small"], hidden_size=64, dtype="float32", cudagraph_capture_sizes=(8,))


def _outputs() -> torch.Tensor:
    runner = GPUModelRunner(CONFIG, device="cpu")
    input_ids = torch.arange(8) * 37 % CONFIG.vocab_size
    hidden_states, aux = runner.run(input_ids, use_cudagraph=False)
    return torch.cat([hidden_states, *aux])


def _rank(rank: int, world_size: int, init_method: str, results) -> None:
    init_distributed_environment(world_size, rank, init_method, backend="gloo")
    try:
        shard = GPUModelRunner(CONFIG, device="cpu").model.layers[0].up_proj.weight.shape[0]
        results[rank] = (get_tensor_model_parallel_world_size(), shard, _outputs())
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.timeout(300)
def test_two_ranks_compute_what_one_does():
    whole = _outputs()
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(2, f"tcp://127.0.0.1:{free_port()}", results), nprocs=2)
        results = dict(results)
    assert [results[r][:2] for r in (0, 1)] == [(2, CONFIG.ffn_size // 2)] * 2
    assert torch.equal(results[0][2], results[1][2])  # the all-reduce gives every rank the same sum
    torch.testing.assert_close(results[0][2], whole, rtol=1e-4, atol=1e-4)
    assert get_tensor_model_parallel_world_size() == 1  # this process never joined a group

"""vLLM 0.33's dispatch rule (kit.experiments.dispatch) and the replica's sizing and dispatch that follow it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kit import KitError
from kit.experiments.dispatch import (
    can_run,
    dispatch_replay_size,
    dispatchable_replay_sizes,
    rows_for,
)
from kit.experiments.safety_run.result import enumerate_pairs, no_break_sizes
from kit.replica.model import PRESETS, ReplicaConfig, default_replay_capture_sizes
from kit.replica.model_runner import GPUModelRunner


def test_dispatch_pads_rows_to_the_next_replay_size_and_runs_eagerly_above_the_largest():
    sizes = [64, 128, 256]
    padded = [dispatch_replay_size(r, sizes) for r in (1, 64, 65, 128, 200, 256, 257)]
    assert padded == [64, 64, 128, 128, 256, 256, None]


def test_a_model_graph_at_the_threshold_can_dispatch_every_replay_size_up_to_the_one_its_own_size_pads_to():
    sizes = [96, 192, 288, 384, 480, 512]
    assert dispatchable_replay_sizes(128, sizes, 128) == {96, 192}  # R > N: 128 rows pad to 192
    assert dispatchable_replay_sizes(512, sizes, 128) == set(sizes)  # R = N
    assert dispatchable_replay_sizes(1024, [64], 0) == {64}  # rows past the largest run eagerly
    assert dispatchable_replay_sizes(127, sizes, 128) == set()  # below the threshold: no break, no replay graph


def test_rows_for_gives_a_row_count_a_step_can_hold_that_dispatches_to_the_replay_size():
    sizes = [96, 192, 288]
    assert rows_for(128, 96, sizes) == 96 and rows_for(128, 192, sizes) == 128
    assert rows_for(128, 288, sizes) is None  # no count of at most 128 rows pads to 288
    for n in (128, 256):
        for r in dispatchable_replay_sizes(n, sizes, 128):
            rows = rows_for(n, r, sizes)
            assert rows is not None and 1 <= rows <= n and dispatch_replay_size(rows, sizes) == r


def test_vllm_default_replay_sizes_step_by_the_window_then_by_an_eighth_of_the_power_of_two_interval():
    # vLLM's own words: "step by window, or by 1/8 of the power-of-two interval once wider (256 in [2048, 4096))".
    sizes = default_replay_capture_sizes(8192, 128, 128)
    assert sizes[:16] == list(range(128, 2049, 128))
    assert sizes[15:24] == list(range(2048, 4097, 256)) and sizes[23:] == list(range(4096, 8193, 512))
    assert default_replay_capture_sizes(8192, 4, 128) == [128, 256, 384, 512]  # bounded by max_num_seqs * window
    assert default_replay_capture_sizes(512, 128, 96) == [96, 192, 288, 384, 480, 512]  # the bound itself is a size


def test_presets_use_vllms_sizing_and_keep_n_over_2_as_a_variant():
    assert PRESETS["small"].decoder_replay_cudagraph_capture_sizes == [96, 192, 288, 384, 480, 512]
    assert PRESETS["small_half"].decoder_replay_cudagraph_capture_sizes == [64, 128, 256]
    assert PRESETS["large"].decoder_replay_cudagraph_capture_sizes[-1] == 8192
    assert PRESETS["large_half"].decoder_replay_cudagraph_capture_sizes == [256, 512, 1024, 2048, 4096]
    with pytest.raises(KitError, match="must exceed the replay window"):
        ReplicaConfig(window=128, decoder_replay_trim_threshold=128)
    with pytest.raises(KitError, match="replay_sizing"):
        ReplicaConfig(replay_sizing="third")


@pytest.mark.parametrize("preset", ["small", "large"])
def test_every_pair_of_a_breaking_model_graph_is_enumerated_with_vllms_rule(preset):
    config = PRESETS[preset]
    found = enumerate_pairs(config)
    check = can_run(config)
    replay_sizes = config.decoder_replay_cudagraph_capture_sizes
    breaking = [n for n in config.cudagraph_capture_sizes if n >= config.decoder_replay_trim_threshold]
    assert {(n, r) for n, r, _ in found} == {(n, r) for n in breaking for r in replay_sizes}
    assert all(d == check(n, r) for n, r, d in found)
    assert any(d and r == n for n, r, d in found)  # R = N can run
    assert no_break_sizes(config) == [n for n in sorted(config.cudagraph_capture_sizes) if n not in breaking]


def test_small_preset_dispatches_a_replay_graph_larger_than_its_model_graph():
    assert any(d and r > n for n, r, d in enumerate_pairs(PRESETS["small"]))
    assert no_break_sizes(PRESETS["large"]) == [512]  # vLLM's threshold of 768 keeps 512 whole


# --- the replica follows the rule ------------------------------------------------------------


class LoggingReplayGraphs:
    """The replay manager's dispatch over fixed sizes, captured; `run` logs the padded size and the rows."""

    def __init__(self, sizes) -> None:
        self.capture_sizes = sorted(sizes, reverse=True)
        self.graphs_captured = True
        self.log: list[tuple[int, int]] = []

    def dispatch(self, num_rows):
        from kit.replica.cudagraph_utils import CudaGraphManager

        return CudaGraphManager.dispatch(self, num_rows)

    def run(self, rows, inputs):
        from kit.replica.forward_context import get_forward_context

        self.log.append((get_forward_context().num_tokens, rows.numel()))
        (hidden,) = inputs
        return (hidden.index_select(0, rows) * 0,)


def tiny_runner(replay_sizes: list[int]):
    """A CPU replica (model graphs 8 and 16, threshold 16, window 2) whose replay graphs log what they run."""
    config = ReplicaConfig(
        hidden_size=16, num_layers=2, decoder_replay_start=1, aux_hidden_state_layers=(),
        cudagraph_capture_sizes=(8, 16), window=2, decoder_replay_trim_threshold=16, vocab_size=11,
    )  # fmt: skip
    runner = GPUModelRunner(config, device="cpu")
    runner.model_state.replay_cudagraphs = graphs = LoggingReplayGraphs(replay_sizes)
    return runner, graphs


def test_the_replica_pads_replay_rows_to_the_dispatched_graph_and_keeps_small_graphs_whole():
    runner, graphs = tiny_runner([6, 10])
    state = runner.model_state
    state.prepare_replay_batch(16, use_replay_graphs=True, piecewise=True, num_rows=7)
    batch = state.decoder_replay_layers.replay_batch
    assert (batch.forward_context.num_tokens, batch.rows.tolist()) == (10, list(range(9, 16)))
    state.prepare_replay_batch(8, use_replay_graphs=True, piecewise=True)  # below the threshold: no replay batch
    assert state.decoder_replay_layers.replay_batch is None
    state.prepare_replay_batch(16, use_replay_graphs=True, piecewise=True, num_rows=11)  # above 10: eager
    assert state.decoder_replay_layers.replay_batch.run_graph is None
    state.prepare_replay_batch(16, use_replay_graphs=True, piecewise=True, num_rows=5)
    state.decoder_replay_layers(torch.zeros(16, 16))
    assert graphs.log == [(6, 5)]
    # eagerly, the same rows padded to the graph's 6 (the graph's GEMM shapes), the padding's outputs dropped
    state.prepare_replay_batch(16, use_replay_graphs=False, num_rows=5)
    assert state.decoder_replay_layers.replay_batch.num_padded == 6
    seen = []
    state.decoder_replay_layers.run_layers = lambda x: seen.append(x.shape[0]) or (x,)
    (out,) = state.decoder_replay_layers(torch.ones(16, 16))
    assert seen == [6] and out[11:].eq(1).all() and out[:11].eq(0).all()


# --- PCP, the lower bound on rows, the DP dummy batch ---------------------------------------------


def test_under_pcp_the_rows_are_counted_over_the_global_batch_up_to_pcp_size_times_n():
    from kit.experiments.dispatch import row_range

    sizes = PRESETS["large"].decoder_replay_cudagraph_capture_sizes  # ..., 2048, 2304, ..., 4096, 4608, ...
    bounds = {"window": 128, "model_sizes": (512, 1024, 2048, 4096, 8192)}
    # pcp = 2: 64 untrimmed 64-token prefills are 4096 rows, local N = 2048
    assert row_range(2048, pcp_size=2, **bounds) == (128, 4096)
    assert 4096 in dispatchable_replay_sizes(2048, sizes, 768, pcp_size=2, **bounds)
    assert max(dispatchable_replay_sizes(2048, sizes, 768, **bounds)) == 2048  # without PCP, R <= dispatch(N)
    assert max(dispatchable_replay_sizes(2048, sizes, 768, pcp_size=4, **bounds)) == 8192
    assert 4608 not in dispatchable_replay_sizes(2048, sizes, 768, pcp_size=2, **bounds)  # 4097 rows: none has them
    assert rows_for(2048, 4096, sizes, pcp_size=2, **bounds) == 4096
    assert rows_for(2048, 4096, sizes, **bounds) is None
    assert rows_for(1024, 2304, sizes, pcp_size=4, **bounds) == 2304  # more rows than the step's 1024 tokens
    assert dispatchable_replay_sizes(512, sizes, 768, pcp_size=8, **bounds) == set()  # no break, whatever the PCP
    with pytest.raises(ValueError, match="pcp_size"):
        row_range(2048, pcp_size=0)


def test_every_request_keeps_min_t_window_rows_so_a_step_has_at_least_min_p_plus_1_window():
    from kit.experiments.dispatch import row_range

    sizes = [32, 64, 128, 256]
    # N = 256 holds at least 129 tokens (128 would pad to 128): one request keeps 64 (the window), never 32
    assert row_range(256, window=64, model_sizes=(64, 128, 256)) == (64, 256)
    assert dispatchable_replay_sizes(256, sizes, 100, window=64, model_sizes=(64, 128, 256)) == {64, 128, 256}
    assert rows_for(256, 32, sizes, window=64, model_sizes=(64, 128, 256)) is None
    # the next smaller model graph of 16 lets a step of 17 tokens keep 17 rows: replay graph 32
    assert row_range(256, window=64, model_sizes=(16, 256)) == (17, 256)
    assert 32 in dispatchable_replay_sizes(256, sizes, 100, window=64, model_sizes=(16, 256))
    # the smallest model graph holds from one token
    assert row_range(64, window=64, model_sizes=(64, 128)) == (1, 64)
    # the replica's N/2 sizing at window 96: model graph 256 (from 129 tokens) keeps >= 96 rows, never replay graph 64
    half = PRESETS["small_half"]
    assert not can_run(half)(256, 64) and can_run(half)(128, 64) and can_run(half)(256, 128)


def test_a_dp_dummy_batch_keeps_one_row_but_runs_the_largest_ranks_replay_graph():
    from kit.experiments.dispatch import DP_DUMMY_ROWS, dp_replay_size

    sizes = [128, 256, 384]
    assert DP_DUMMY_ROWS == 1
    assert dp_replay_size([None, 300], sizes) == 384  # the idle rank runs replay graph 384 on its one row
    assert dp_replay_size([None, None], sizes) == 128
    assert dp_replay_size([129, 40], sizes) == 256
    assert dp_replay_size([None, 500], sizes) is None  # the largest rank's rows run eagerly: every rank does


def test_dispatchable_under_reports_each_pcp_size_and_the_smallest_that_reaches_a_pairing():
    from kit.experiments.dispatch import dispatchable_under, smallest_pcp

    small = PRESETS["small"]
    assert dispatchable_under(small, 128, 288) == {"pcp1": False, "pcp2": True, "pcp4": True, "pcp8": True}
    assert dispatchable_under(small, 128, 192) == {"pcp1": True, "pcp2": True, "pcp4": True, "pcp8": True}
    assert [smallest_pcp(small, 128, r) for r in (96, 288, 384, 512)] == [1, 2, 4, 4]
    assert smallest_pcp(small, 128, 288, pcp_sizes=(1,)) is None


def test_the_replica_runs_more_replay_rows_than_tokens_as_a_pcp_steps_global_count():
    runner, graphs = tiny_runner([6, 10, 24])
    state = runner.model_state
    state.prepare_replay_batch(16, use_replay_graphs=True, piecewise=True, num_rows=20)  # pcp 2: up to 32 rows
    batch = state.decoder_replay_layers.replay_batch
    assert (batch.forward_context.num_tokens, batch.rows.tolist()) == (24, list(range(16)))
    state.decoder_replay_layers(torch.zeros(16, 16))
    assert graphs.log == [(24, 16)]  # replay graph 24 on the step's 16 rows, the rest padding
    state.prepare_replay_batch(16, use_replay_graphs=False, num_rows=20)
    assert state.decoder_replay_layers.replay_batch.num_padded == 24  # eagerly, the same graph's shapes
    state.prepare_replay_batch(16, use_replay_graphs=True, num_rows=30)  # above every graph: eager, padded to 30
    assert state.decoder_replay_layers.replay_batch.run_graph is None
    assert state.decoder_replay_layers.replay_batch.num_padded == 30
    with pytest.raises(KitError, match="at least one row"):
        state.prepare_replay_batch(16, use_replay_graphs=True, num_rows=0)
    ids = torch.arange(16) % 11
    hidden, _ = runner.run(ids, use_cudagraph=False, num_replay_rows=40)  # eagerly end to end, 40 > 16 rows
    assert hidden.shape == (16, 16) and torch.isfinite(hidden).all()


@pytest.mark.parametrize("preset", ["small", "large", "gb200-default"])
def test_every_pairing_vllm_dispatches_under_some_pcp_size_runs_its_replay_graph_in_the_replica(preset):
    """What run_pairs asks of the replica on the H200, with the replay manager's dispatch stood in on the CPU."""
    from kit.experiments.dispatch import config_rows_for, smallest_pcp
    from kit.experiments.safety_run.result import safety_config

    config = safety_config("patched", preset)
    runner = GPUModelRunner(dataclasses.replace(config, hidden_size=16, num_layers=2, decoder_replay_start=1,
                                                aux_hidden_state_layers=(), vocab_size=11), device="cpu")  # fmt: skip
    state = runner.model_state
    state.replay_cudagraphs = LoggingReplayGraphs(config.decoder_replay_cudagraph_capture_sizes)
    ran = 0
    for n, r, dispatchable in enumerate_pairs(config):
        pcp = smallest_pcp(config, n, r)
        assert (pcp == 1) == dispatchable
        if pcp is None:
            continue
        rows = config_rows_for(config, n, r, pcp)
        state.prepare_replay_batch(n, use_replay_graphs=True, piecewise=True, num_rows=rows)
        assert state.decoder_replay_layers.replay_batch.forward_context.num_tokens == r
        ran += 1
    assert ran == sum(smallest_pcp(config, n, r) is not None for n, r, _ in enumerate_pairs(config)) > 0


def test_gb200_default_builds_small_and_runs_a_breaking_step_eagerly_on_the_cpu():
    config = PRESETS["gb200-default"]
    runner = GPUModelRunner(config, device="cpu")
    params = sum(p.numel() for p in runner.model.parameters())
    assert config.hidden_size == 256 and params < 10_000_000  # 83 model graphs: each must capture fast
    ids = torch.arange(784) % config.vocab_size
    hidden, _ = runner.run(ids, use_cudagraph=False, num_replay_rows=784)  # R = 896 > N = 784 on the GPU
    assert hidden.shape == (784, 256) and torch.isfinite(hidden.float()).all()

"""PR 63155's alternatives on the CPU: the speculator, alternative (a)'s patch, caps, the KV cache, the command.

The scenarios run on a GPU (tests/gpu/test_alternatives_live.py); here the
speculator runs eagerly against a reference computed by hand, the capture path
runs on tests/test_faults.py's `FakeCuda`, the KV-cache figures are checked
against numbers worked out by hand, the sweep of alternative (b) (caps and kept
sets) is derived from configs with their sizing stated (the N/2 sizing and vLLM's
default), the text that says whether dropping intermediate sizes saved anything is
read from recordings assembled from fake runs, and such a recording in tmp_path
stands in for the shipped one. The command, `kit.experiments.alternatives.__main__`,
runs in fresh processes. The last section reads the shipped H200 recordings
themselves (`kit/recordings/` `alternatives/<preset>.json`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import kit.patch.replica as replica_patch
from kit import CaptureRecorder, KitError
from kit.analysis.kv_cache import (
    DEEPSEEK_V3_MLA,
    DEEPSEEK_V41_FLASH,
    PR_SAVED_BYTES,
    SWA_BYTES_PER_REQUEST,
    kv_cache_bought,
    kv_cache_section,
    replica_layout,
    swa_requests,
)
from kit.cli import main as kit_main
from kit.experiments import recorded
from kit.experiments.alternatives import result, run, scenarios
from kit.experiments.alternatives.result import replay_group_lines
from kit.experiments.alternatives.run import SHARE_ALL, assemble, pool_figures, safety_verdict
from kit.experiments.alternatives.scenarios import (
    cap_scenario,
    cap_sweep,
    capped_replay_sizes,
    dropped_replay_sizes,
    eager_replay_sizes,
    keep_scenario,
    keep_sweep,
    kept_eager_replay_sizes,
    padded_replay_sizes,
    parse_scenario,
    scenario_replay_sizes,
    scenarios_to_run,
    steps_with_eager_replay,
)
from kit.replica import model_runner, speculator
from kit.replica.model import PRESETS, ReplicaConfig, default_replay_capture_sizes
from kit.replica.model_runner import GPUModelRunner
from kit.replica.speculator import DFlashCudaGraphManager, speculator_capture_sizes
from tests import helpers
from tests.helpers import MIB


def _one_line_error(capsys, argv) -> str:
    assert kit_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and captured.err.startswith("kit: error: ")
    return captured.err.removeprefix("kit: error: ").strip()


def sized(replay_sizes, model_sizes=(128, 256, 512), **fields):
    """A stand-in config for the sweep: the sizes the alternatives read, nothing else (the presets' sizing changes)."""
    return SimpleNamespace(
        decoder_replay_cudagraph_capture_sizes=list(replay_sizes), cudagraph_capture_sizes=tuple(model_sizes), **fields
    )


# vLLM's default replay sizing for the small preset's shape (window 96, model graphs up to 512), and the old N/2 one.
VLLM_SMALL = sized([96, 192, 288, 384, 480, 512])
HALF_SMALL = sized([64, 128, 256])
TINY = dataclasses.replace(helpers.TINY, dtype="float32", speculator=True)
PROVENANCE = {
    "gpu": "NVIDIA H200",
    "torch": "2.11.0+cu130",
    "cuda": "13.0",
    "date": "2026-12-10T00:00:00+00:00",
    "command": "python -m kit.experiments.alternatives --preset small --out kit/recordings/alternatives",
}


# --- the KV cache, by hand -------------------------------------------------------------------


def test_the_replicas_kv_layout_and_what_24_mib_buys():
    # small preset with the speculator: 6 target + 2 drafter layers, K and V of 1024 bf16 values each.
    layout = replica_layout(1024, 8, "bfloat16")
    assert layout.bytes_per_token_per_layer == 2 * 1024 * 2 == 4096
    assert layout.bytes_per_token == 32_768 and layout.block_size == 16
    assert layout.bytes_per_block == 524_288  # half a MiB
    assert kv_cache_bought(24 * MIB, layout) == {"bytes": 25_165_824, "blocks": 48, "tokens": 768}
    assert kv_cache_bought(24 * MIB + 524_287, layout)["blocks"] == 48  # whole blocks only
    assert kv_cache_bought(-MIB, layout) == {"bytes": -MIB, "blocks": -2, "tokens": -32}
    assert scenarios.kv_layout(scenarios.alternatives_config("small")) == layout
    with pytest.raises(KitError, match="unknown dtype"):
        replica_layout(1024, 8, "int4")


def test_what_the_prs_5_18_gib_buys_on_deepseek():
    assert PR_SAVED_BYTES == 5_561_982_648  # 5.18 * 2**30, rounded
    # V4.1-Flash, assumed: 4 kv sources x (528 B record + 132 B indexer K), blocks of 64.
    assert DEEPSEEK_V41_FLASH.bytes_per_token == 2_640 and DEEPSEEK_V41_FLASH.bytes_per_block == 168_960
    # 168,960 x 32,918 = 5,561,825,280 <= 5,561,982,648 < 168,960 x 32,919
    assert kv_cache_bought(PR_SAVED_BYTES, DEEPSEEK_V41_FLASH) == {
        "bytes": PR_SAVED_BYTES,
        "blocks": 32_918,
        "tokens": 2_106_752,
    }
    # Or sliding windows: 40 layers x 128 tokens x 528 B = 2,703,360 B a request; x 2,057 = 5,560,811,520.
    assert SWA_BYTES_PER_REQUEST == 2_703_360 and swa_requests(PR_SAVED_BYTES) == 2_057
    # DeepSeek-V3 MLA, bf16: 61 layers x 1,152 B = 70,272 B a token, x 64 = 4,497,408 B a block;
    # x 1,236 = 5,558,796,288.
    assert DEEPSEEK_V3_MLA.bytes_per_token == 70_272 and DEEPSEEK_V3_MLA.bytes_per_block == 4_497_408
    assert kv_cache_bought(PR_SAVED_BYTES, DEEPSEEK_V3_MLA) == {
        "bytes": PR_SAVED_BYTES,
        "blocks": 1_236,
        "tokens": 79_104,
    }


@pytest.mark.parametrize("saved", [1, 524_287, 524_288, 524_289, 24 * MIB + 524_287, PR_SAVED_BYTES])
def test_a_negative_saving_costs_what_the_same_positive_saving_buys(saved):
    """Budget lost costs the whole blocks the same bytes saved would buy, never a block gained; no request gained."""
    for layout in (replica_layout(1024, 8, "bfloat16"), DEEPSEEK_V41_FLASH, DEEPSEEK_V3_MLA):
        gained, lost = kv_cache_bought(saved, layout), kv_cache_bought(-saved, layout)
        assert gained["blocks"] >= 0 and lost["blocks"] <= 0
        assert lost == {"bytes": -saved, "blocks": -gained["blocks"], "tokens": -gained["tokens"]}
    assert swa_requests(-saved) == 0 <= swa_requests(saved)
    assert swa_requests(-PR_SAVED_BYTES) == 0
    layout = replica_layout(1024, 8, "bfloat16")
    section = kv_cache_section({"unpatched": 100 * MIB, "worse": 100 * MIB + saved}, layout, saved_bytes=-saved)
    assert section["replica"]["freed"]["worse"] == kv_cache_bought(-saved, layout)
    assert section["deepseek_v41_flash"]["or_swa_requests"] == 0 and section["deepseek_v41_flash"]["blocks"] <= 0


def test_the_kv_cache_section_frees_the_drop_in_each_estimate():
    layout = replica_layout(1024, 8, "bfloat16")
    section = kv_cache_section({"unpatched": 100 * MIB, "pr": 76 * MIB, "share_all": 70 * MIB}, layout)
    assert section["replica"]["freed"] == {
        "pr": {"bytes": 24 * MIB, "blocks": 48, "tokens": 768},
        "share_all": {"bytes": 30 * MIB, "blocks": 60, "tokens": 960},
    }
    assert section["deepseek_v41_flash"]["tokens"] == 2_106_752
    assert section["deepseek_v41_flash"]["or_swa_requests"] == 2_057
    assert section["deepseek_v3_mla"]["blocks"] == 1_236
    with pytest.raises(KitError, match="no unpatched estimate"):
        kv_cache_section({"pr": 1}, layout)


# --- alternative (b): the caps and the kept sets, from the config --------------------------------

# Replica configs with explicit sizing (not the presets, whose sizing may change): the N/2 sizing and vLLM's default.
HALF = ReplicaConfig(cudagraph_capture_sizes=(128, 256, 512), replay_sizing="half", speculator=True)
VLLM = ReplicaConfig(
    cudagraph_capture_sizes=(128, 256, 512), window=96, max_num_seqs=128, decoder_replay_trim_threshold=128
)
LARGE_VLLM = ReplicaConfig(
    cudagraph_capture_sizes=(512, 1024, 2048, 4096, 8192), window=128, decoder_replay_trim_threshold=768
)


def test_caps_leave_the_sizes_up_to_them_and_run_the_rest_eagerly():
    assert HALF.decoder_replay_cudagraph_capture_sizes == [64, 128, 256]
    assert cap_sweep(HALF) == [64, 128, 256, None]
    assert [eager_replay_sizes(HALF, cap) for cap in cap_sweep(HALF)] == [[128, 256], [256], [], []]
    assert [capped_replay_sizes(HALF, cap) for cap in cap_sweep(HALF)] == [[64], [64, 128], [64, 128, 256]] + [
        [64, 128, 256]  # no cap
    ]
    assert eager_replay_sizes(HALF, 100) == [128, 256] and capped_replay_sizes(HALF, 100) == [64]
    # A cap that leaves every size is vLLM 0.33 as it is: measured once, as unpatched.
    assert [cap_scenario(HALF, cap) for cap in cap_sweep(HALF)] == ["cap_64", "cap_128", "unpatched", "unpatched"]
    assert scenarios_to_run(HALF) == ["unpatched", "pr", "share_all", "cap_64", "cap_128", "keep_256", "keep_64_256"]


def test_the_sweep_is_a_handful_of_processes_however_many_replay_sizes():
    # vLLM's sizing: multiples of the window; the caps are the smallest size and the largest at or below each model
    # capture size (512 is both a model and a replay size: every size, so unpatched).
    assert VLLM.decoder_replay_cudagraph_capture_sizes == [96, 192, 288, 384, 480, 512]
    assert cap_sweep(VLLM) == [96, 192, 512, None]
    assert [cap_scenario(VLLM, cap) for cap in cap_sweep(VLLM)] == ["cap_96", "cap_192", "unpatched", "unpatched"]
    assert keep_sweep(VLLM) == [[512], [96, 512], [96, 192, 288, 384, 480, 512]]
    assert [keep_scenario(VLLM, kept) for kept in keep_sweep(VLLM)] == ["keep_512", "keep_96_512", "unpatched"]
    assert scenarios_to_run(VLLM) == ["unpatched", "pr", "share_all", "cap_96", "cap_192", "keep_512", "keep_96_512"]
    # The large shape: about 30 replay sizes, still ten processes in all, not one per size.
    sizes = LARGE_VLLM.decoder_replay_cudagraph_capture_sizes
    assert len(sizes) > 25 and (sizes[0], sizes[-1]) == (128, 8192)
    assert cap_sweep(LARGE_VLLM) == [128, 512, 1024, 2048, 4096, 8192, None]
    assert scenarios_to_run(LARGE_VLLM)[3:] == [
        *("cap_128", "cap_512", "cap_1024", "cap_2048", "cap_4096"),
        *("keep_8192", "keep_128_8192"),
    ]
    assert eager_replay_sizes(LARGE_VLLM, 4096) == [s for s in sizes if s > 4096]
    # One replay size: nothing to drop or cap below it; two: the largest alone, then both.
    assert scenarios_to_run(sized([256])) == ["unpatched", "pr", "share_all"]
    assert keep_sweep(sized([128, 256])) == [[256], [128, 256]]


def test_kept_sets_run_a_dropped_size_in_the_next_kept_one_and_eagerly_above_the_largest():
    assert dropped_replay_sizes(VLLM_SMALL, [96, 512]) == [192, 288, 384, 480]
    assert padded_replay_sizes(VLLM_SMALL, [96, 512]) == [[192, 512], [288, 512], [384, 512], [480, 512]]
    assert kept_eager_replay_sizes(VLLM_SMALL, [96, 512]) == [] == kept_eager_replay_sizes(VLLM_SMALL, [512])
    assert padded_replay_sizes(VLLM_SMALL, [96, 288]) == [[192, 288]]
    assert kept_eager_replay_sizes(VLLM_SMALL, [96, 288]) == [384, 480, 512]


def test_scenario_names():
    assert parse_scenario("share_all") == ("share_all", None) and parse_scenario("cap_128") == ("cap", 128)
    assert parse_scenario("keep_512") == ("keep", (512,)) and parse_scenario("keep_96_512") == ("keep", (96, 512))
    for bad in ("cap_0", "cap_x", "cap", "share", "cap_96_512", "keep", "keep_", "keep_512_96", "keep_96_96"):
        with pytest.raises(KitError, match="unknown scenario"):
            parse_scenario(bad)
    for bad in ("keep_0_512", "keep_96__512", "drop_512", "keep_96_x"):
        with pytest.raises(KitError, match="unknown scenario"):
            parse_scenario(bad)
    assert scenario_replay_sizes(VLLM_SMALL, "pr") is None
    assert scenario_replay_sizes(VLLM_SMALL, "cap_200") == [96, 192]
    assert scenario_replay_sizes(VLLM_SMALL, "keep_96_512") == [96, 512]
    with pytest.raises(KitError, match=r"^keep_100_512: 100 not among the config's replay capture sizes \(96, "):
        scenario_replay_sizes(VLLM_SMALL, "keep_100_512")
    with pytest.raises(KitError, match="^cap_50 leaves no replay size: the smallest is 96$"):
        scenario_replay_sizes(VLLM_SMALL, "cap_50")
    # Every name the sweep makes reads back as the sizes it measures.
    for config in (HALF, VLLM, LARGE_VLLM):
        for scenario in scenarios_to_run(config)[3:]:
            sizes = scenario_replay_sizes(config, scenario)
            assert sizes and set(sizes) < set(config.decoder_replay_cudagraph_capture_sizes), scenario


def test_steps_that_can_make_a_replay_batch_above_a_cap():
    config = {"cudagraph_capture_sizes": [512, 1024, 2048], "decoder_replay_trim_threshold": 768}
    assert steps_with_eager_replay(config, 128) == [1024, 2048]  # 512 keeps the replay layers inside its graph
    assert steps_with_eager_replay(config, 1024) == [2048]
    assert steps_with_eager_replay(config, 2048) == []
    # A step padded to N holds 1 up to N replay rows: a cap below N can send it eager, even N = 128 under cap 96.
    assert steps_with_eager_replay({"cudagraph_capture_sizes": [128, 256, 512]}, 96) == [128, 256, 512]


# --- the speculator ----------------------------------------------------------------------------


def test_drafter_capture_sizes_as_vllm_derives_them():
    # Rounded up to whole requests of 4 (or 3) query tokens, none above 128 requests or the largest size.
    assert speculator_capture_sizes((128, 256, 512), 4) == [512, 256, 128]
    assert speculator_capture_sizes((128, 256, 512), 3) == [258, 129]  # 513 > 512
    assert speculator_capture_sizes((512, 1024, 2048, 4096, 8192), 4) == [512]  # 1024 tokens = 256 requests
    assert speculator_capture_sizes((6, 10), 4) == [8]  # 10 rounds up to 12, above the largest size
    assert speculator_capture_sizes((6, 8), 4, max_num_reqs=1) == []
    with pytest.raises(KitError):
        speculator_capture_sizes((8,), 0)


def reference_draft(runner: GPUModelRunner, ids: torch.Tensor) -> torch.Tensor:
    """The drafter by hand: main_proj over the aux hidden states, plus the ids' embedding, its layers, its norm."""
    drafter = runner.speculator.model
    _, aux = runner.run(ids, use_cudagraph=False)
    x = torch.cat(aux, dim=-1) @ drafter.main_proj.weight.T if aux else runner.run(ids, use_cudagraph=False)[0]
    x = x + runner.model.embed_tokens.weight[ids]
    for layer in drafter.layers:
        x = layer(x)
    return drafter.norm(x)


@pytest.mark.parametrize("aux", [(3,), (1, 3), ()])
def test_the_speculator_runs_eagerly_on_cpu_and_equals_a_reference(aux):
    runner = GPUModelRunner(dataclasses.replace(TINY, aux_hidden_state_layers=aux), "cpu")
    assert runner.speculator.query_cudagraph_manager is None  # graphs need CUDA
    ids = (torch.arange(16) * 7) % TINY.vocab_size
    step = runner.step(ids, use_cudagraph=False)
    assert step.draft_graph_size is None and not step.target_outputs_overwritten
    torch.testing.assert_close(step.draft_hidden_states, reference_draft(runner, ids), rtol=1e-5, atol=1e-5)
    hidden, aux_states = runner.run(ids, use_cudagraph=False)
    assert torch.equal(step.hidden_states, hidden) and len(step.aux_hidden_states) == len(aux)
    # The draft is a copy: the next step's draft does not change it.
    other = runner.step(torch.arange(16) % TINY.vocab_size, use_cudagraph=False)
    assert not torch.equal(other.draft_hidden_states, step.draft_hidden_states)
    assert torch.equal(step.draft_hidden_states, runner.step(ids, use_cudagraph=False).draft_hidden_states)


def test_a_step_reads_the_target_before_the_drafter_and_reports_an_overwrite(monkeypatch):
    runner = GPUModelRunner(TINY, "cpu")
    ids = torch.arange(16)
    clean = runner.step(ids, use_cudagraph=False)
    propose = runner.speculator.propose

    def propose_then_scribble(input_ids, last_hidden_states, aux_hidden_states, use_cudagraph=True):
        draft = propose(input_ids, last_hidden_states, aux_hidden_states, use_cudagraph)
        for t in (last_hidden_states, *aux_hidden_states):  # what a drafter graph on the model stream may do
            t.fill_(7.0)
        return draft

    monkeypatch.setattr(runner.speculator, "propose", propose_then_scribble)
    step = runner.step(ids, use_cudagraph=False)
    assert step.target_outputs_overwritten and not clean.target_outputs_overwritten
    assert torch.equal(step.hidden_states, clean.hidden_states)
    assert torch.equal(step.aux_hidden_states[0], clean.aux_hidden_states[0])
    assert torch.equal(step.draft_hidden_states, clean.draft_hidden_states)


def test_staging_for_a_graph_copies_the_aux_rows_the_graph_combines_itself():
    runner = GPUModelRunner(TINY, "cpu")
    spec = runner.speculator
    ids = torch.arange(8)
    hidden, aux = runner.execute_model(ids, use_cudagraph=False)
    spec.stage_target_outputs(ids, hidden, aux, num_graph_tokens=16)
    assert torch.equal(spec._aux_staging[:8], aux[0]) and torch.equal(spec.input_ids[:8], ids)
    spec._prepare_graph_forward(8)  # what the FULL graph runs first: the combine, from the staging buffer only
    spec._generate_draft(8)
    graph_like = spec.draft_hidden_states[:8].clone()
    assert torch.equal(graph_like, spec.propose(ids, hidden, aux, use_cudagraph=False))


def test_no_speculator_and_the_wrong_aux_count_are_one_line_errors():
    with pytest.raises(KitError, match="no speculator"):
        GPUModelRunner(dataclasses.replace(TINY, speculator=False), "cpu").propose(torch.zeros(8, 64), ())
    runner = GPUModelRunner(TINY, "cpu")
    with pytest.raises(KitError, match="2 aux hidden states for 1 aux layers"):
        runner.speculator.propose(torch.arange(8), torch.zeros(8, 64), (torch.zeros(8, 64),) * 2)
    with pytest.raises(KitError, match="need CUDA"):
        runner.speculator.capture()


# --- the capture path on FakeCuda ----------------------------------------------------------------


@pytest.fixture
def fake_cuda(monkeypatch):
    """tests/helpers.py's FakeCuda, and `torch.cuda.graph` (the drafter's FULL capture) on it."""
    from tests.helpers import FakeCuda

    cuda = FakeCuda(monkeypatch)

    @contextlib.contextmanager
    def graph(cuda_graph, pool=None, stream=None):
        with torch.cuda.stream(stream):
            cuda_graph.capture_begin(pool=pool)
            try:
                yield
            finally:
                cuda_graph.capture_end()

    monkeypatch.setattr(torch.cuda, "graph", graph)
    return cuda


def cpu_runner_with_graph_managers(monkeypatch, config=TINY) -> GPUModelRunner:
    """A CPU runner with CUDA's graph managers (their captures run eagerly on FakeCuda)."""
    from kit.replica.decoder_replay_cudagraph import DecoderReplayCudaGraphManager

    runner = GPUModelRunner(config, "cpu")
    state = runner.model_state
    state.replay_cudagraphs = DecoderReplayCudaGraphManager(
        runner.device, state.decoder_replay_layers, config.decoder_replay_cudagraph_capture_sizes, 64, torch.float32
    )
    spec = runner.speculator
    spec.query_cudagraph_manager = DFlashCudaGraphManager(runner.device, spec.capture_sizes, spec.num_query_per_req)
    monkeypatch.setattr(runner, "device", torch.device("cuda"))  # capture_model's check; the rest stays on the CPU
    return runner


@pytest.mark.parametrize(
    "scenario,replay_shares,drafter_shares",
    [("unpatched", False, False), ("pr", True, False), ("share_all", True, True)],
)
def test_the_speculator_is_captured_last_on_the_stream_the_scenario_gives(
    fake_cuda, monkeypatch, scenario, replay_shares, drafter_shares
):
    runner = cpu_runner_with_graph_managers(monkeypatch)
    with run.scenario_patch(scenario), CaptureRecorder() as rec:
        runner.capture_model()
    managers = [r.manager for r in rec.records]
    first_drafter = managers.index(scenarios.DRAFTER)
    assert set(managers[:first_drafter]) == {"model graphs", "replay graphs"}
    assert set(managers[first_drafter:]) == {scenarios.DRAFTER}  # last, as in vLLM's capture_model
    assert sorted(r.size for r in rec.records if r.manager == scenarios.DRAFTER) == [8, 16]
    streams = {r.manager: r.stream for r in rec.records}
    assert (streams["replay graphs"] == streams["model graphs"]) is replay_shares
    assert (streams[scenarios.DRAFTER] == streams["model graphs"]) is drafter_shares
    assert streams[scenarios.DRAFTER] != streams["replay graphs"] or drafter_shares
    pools = {r.pool for r in rec.records}
    assert len(pools) == 1  # one global graph pool for all three
    assert set(runner.speculator.query_cudagraph_manager.graphs) == {8, 16}
    assert not replica_patch.is_applied() and not SHARE_ALL.is_applied()


def test_a_kept_set_captures_only_its_replay_sizes_and_the_dispatch_pads_to_them(fake_cuda, monkeypatch):
    runner = cpu_runner_with_graph_managers(monkeypatch)
    assert TINY.decoder_replay_cudagraph_capture_sizes == [4, 8]
    run.set_replay_capture_sizes(runner, scenarios.scenario_replay_sizes(TINY, "keep_8"))
    with CaptureRecorder() as rec:
        runner.capture_model()
    assert {r.size for r in rec.records if r.manager == "replay graphs"} == {8}
    assert {r.size for r in rec.records if r.manager == "model graphs"} == {8, 16}  # the model graphs as they were
    replay = runner.model_state.replay_cudagraphs
    assert [replay.dispatch(rows) for rows in (1, 4, 5, 8, 9)] == [8, 8, 8, 8, None]  # padded to 8; eager above it


def test_share_all_applies_as_one_patch_and_refuses_on_top_of_the_pr():
    before = (GPUModelRunner.capture_model, speculator.DSparkSpeculator.capture, DFlashCudaGraphManager.capture)
    with SHARE_ALL.patched("share") as patch:
        assert "self.speculator.capture(stream=self.cudagraph_manager.capture_stream)" in patch.diff()
        assert GPUModelRunner.capture_model is not before[0]
    assert (GPUModelRunner.capture_model, speculator.DSparkSpeculator.capture, DFlashCudaGraphManager.capture) == before
    with replica_patch.patched("pr"), pytest.raises(KitError, match="already has PR 63155's change"):
        SHARE_ALL.apply("share")
    assert not replica_patch.is_applied() and not SHARE_ALL.is_applied()


def test_profiling_captures_into_a_throwaway_pool_and_drops_the_graphs(fake_cuda, monkeypatch):
    runner = cpu_runner_with_graph_managers(monkeypatch)
    free = iter([1000 * MIB, 900 * MIB])
    monkeypatch.setattr(model_runner, "free_device_memory", lambda device, empty_cache=True: next(free))
    global_pool = runner.cudagraph_manager.pool
    pools_before = [m.pool for m in runner.graph_managers()] + [w.graph_pool for w in runner.graph_wrappers()]
    with CaptureRecorder() as rec:
        assert runner.profile_cudagraph_memory() == 100 * MIB
    assert {r.pool for r in rec.records} == {rec.records[0].pool} and rec.records[0].pool != tuple(global_pool)
    assert [m.pool for m in runner.graph_managers()] + [w.graph_pool for w in runner.graph_wrappers()] == pools_before
    assert not any(m.graphs_captured for m in runner.graph_managers())
    assert all(not w.captures and not w.outputs for w in runner.graph_wrappers())
    assert not runner.speculator.query_cudagraph_manager.graphs
    with CaptureRecorder() as rec:  # the real capture after it: into the global pool again
        assert runner.capture_model() == 0
    assert {r.pool for r in rec.records} == {tuple(global_pool)}


# --- the recording: assembled, read, shown -------------------------------------------------------


def fake_check(size: int, previous: int, *, exact: bool = True, graph: int | None = None, overwritten=False) -> dict:
    return {
        "size": size,
        "previous_size": previous,
        "draft_graph_size": graph,
        "target_outputs_overwritten": overwritten,
        "bit_exact": exact,
        "draft_bit_exact": exact,
        "max_abs_diff": 0.0 if exact else 3.5,
        "draft_max_abs_diff": 0.0 if exact else 3.5,
        "differing_outputs": [] if exact else ["draft_hidden_states"],
    }


def fake_run(scenario: str, pool: int, estimate: int, streams: dict, *, differ=(), overwritten=False) -> dict:
    sizes = (128, 256, 512)
    checks = [
        fake_check(s, p, exact=(s, p) not in differ, graph=s, overwritten=overwritten) for s in sizes for p in sizes
    ]
    labels = set(streams.values())
    return {
        "scenario": scenario,
        "graph_pool_bytes": pool,
        "graph_pool_by_stream": {label: pool // len(labels) for label in labels},
        "capture_streams": streams,
        "replay_decisions": [],
        "checks": checks if scenario in scenarios.MAIN_SCENARIOS else [],
        "profile_estimate_bytes": estimate,
        "capture_free_memory_delta": estimate,
        "provenance": {**PROVENANCE, "command": f"python -m kit.experiments.alternatives --scenario {scenario}"},
    }


def fake_runs(share_all_differs=(), keep=(56, 56), caps=(40, 48)) -> dict[str, dict]:
    """Runs for `HALF` (replay sizes 64, 128, 256); `keep`: the graph pool in MiB keeping 256 alone and 64 with 256;
    `caps`: capped at 64 and at 128 (unpatched's is 56 MiB, the PR's 32)."""
    own = {"model graphs": "model graphs stream", "replay graphs": "replay graphs stream"}
    one = dict.fromkeys(("model graphs", "replay graphs", scenarios.DRAFTER), "model graphs stream")
    return {
        "unpatched": fake_run("unpatched", 56 * MIB, 120 * MIB, {**own, scenarios.DRAFTER: "DFlash stream"}),
        "pr": fake_run("pr", 32 * MIB, 96 * MIB, {**one, scenarios.DRAFTER: "DFlash stream"}),
        "share_all": fake_run("share_all", 24 * MIB, 88 * MIB, one, differ=share_all_differs, overwritten=True),
        "cap_64": fake_run("cap_64", caps[0] * MIB, 104 * MIB, own),
        "cap_128": fake_run("cap_128", caps[1] * MIB, 112 * MIB, own),
        "keep_256": fake_run("keep_256", keep[0] * MIB, 120 * MIB, own),
        "keep_64_256": fake_run("keep_64_256", keep[1] * MIB, 120 * MIB, own),
    }


def write_recording(folder, runs=None, preset="small", config=HALF):
    data = assemble(preset, config, runs or fake_runs(), PROVENANCE)
    path = folder / f"{preset}.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def recordings(tmp_path, monkeypatch):
    monkeypatch.setattr(result, "RECORDINGS_DIR", tmp_path)
    return tmp_path


def test_assemble_makes_the_contract_from_the_runs():
    data = assemble("small", HALF, fake_runs(keep=(56, 54)), PROVENANCE)
    assert [data[v]["saved_bytes"] for v in ("unpatched", "pr", "share_all")] == [0, 24 * MIB, 32 * MIB]
    assert all(data[v]["safe"] for v in ("unpatched", "pr", "share_all"))
    assert [
        (r["max_replay_size"], r["graph_pool_bytes"] // MIB, r["eager_replay_sizes"]) for r in data["cap_replay_sizes"]
    ] == [
        (64, 40, [128, 256]),
        (128, 48, [256]),
        (256, 56, []),
        (None, 56, []),
    ]
    assert data["replay_capture_sizes"] == [64, 128, 256]
    assert [
        (r["kept_replay_sizes"], r["graph_pool_bytes"] // MIB, r["saved_bytes"] // MIB, r["eager_replay_sizes"])
        for r in data["drop_intermediate_sizes"]
    ] == [([256], 56, 0, []), ([64, 256], 54, 2, []), ([64, 128, 256], 56, 0, [])]
    assert [(r["measured_in"], r["dropped_replay_sizes"], r["padded_to"]) for r in data["drop_intermediate_sizes"]] == [
        ("keep_256", [64, 128], [[64, 256], [128, 256]]),
        ("keep_64_256", [128], [[128, 256]]),
        ("unpatched", [], []),
    ]
    assert data["kv_cache"]["replica"]["freed"]["pr"] == {"bytes": 24 * MIB, "blocks": 48, "tokens": 768}
    assert data["kv_cache"]["replica"]["freed"]["share_all"]["blocks"] == 64
    assert data["speculator"]["capture_sizes"] == [512, 256, 128]
    runs = fake_runs()
    del runs["cap_64"], runs["keep_64_256"]
    with pytest.raises(KitError, match="no run of cap_64, keep_64_256"):
        assemble("small", HALF, runs, PROVENANCE)


def group_lines(**runs) -> list[str]:
    """`replay_group_lines` of a recording assembled from fake runs for HALF (replay sizes 64, 128, 256)."""
    return replay_group_lines(assemble("small", HALF, fake_runs(**runs), PROVENANCE))


def test_where_dropping_intermediate_sizes_saves_nothing_the_lines_say_so_and_name_the_cap_that_did():
    lines = group_lines(keep=(56, 56), caps=(40, 48))
    assert lines == [
        "  the replay graphs' own group, every size captured: 24.0 MiB (what the PR saves)",
        "  keeping 256 (1 of 3 sizes) saves 0.0 MiB; in proportion to the sizes dropped it would save 16.0 MiB",
        "  keeping 64, 256 (2 of 3 sizes) saves 0.0 MiB; in proportion to the sizes dropped it would save 8.0 MiB",
        "  so: dropping intermediate sizes did not shrink the graph pool (it saved at most 0.0 MiB): the replay "
        "graphs' group follows the largest captured replay size (256), not the number of sizes; only capping the "
        "largest shrank it (cap 64 saves 16.0 MiB, cap 128 saves 8.0 MiB; batches above the cap run eagerly)",
    ]
    # Dropping sizes that makes the pool grow saves nothing either; no cap that saves: said too.
    assert group_lines(keep=(58, 56), caps=(56, 56))[-1] == (
        "  so: dropping intermediate sizes did not shrink the graph pool (it saved at most 0.0 MiB): the replay "
        "graphs' group follows the largest captured replay size (256), not the number of sizes; no cap shrank it "
        "either (cap 64 saves 0.0 MiB, cap 128 saves 0.0 MiB)"
    )


def test_where_dropping_intermediate_sizes_saves_the_lines_say_that():
    lines = group_lines(keep=(40, 48), caps=(40, 48))
    assert lines[1] == (
        "  keeping 256 (1 of 3 sizes) saves 16.0 MiB; in proportion to the sizes dropped it would save 16.0 MiB"
    )
    assert lines[-1] == (
        "  so: dropping intermediate sizes did shrink the graph pool, by up to 16.0 MiB: the replay graphs' group "
        "does not follow the largest captured size alone; capping the largest: cap 64 saves 16.0 MiB, cap 128 saves "
        "8.0 MiB"
    )
    assert group_lines(keep=(56, 54))[-1].startswith(
        "  so: dropping intermediate sizes did shrink the graph pool, by up to 2.0 MiB"
    )


def test_with_one_replay_size_there_is_nothing_to_drop():
    data = assemble("small", HALF, fake_runs(), PROVENANCE)
    data["drop_intermediate_sizes"] = data["drop_intermediate_sizes"][-1:]
    data["replay_capture_sizes"] = [256]
    data["drop_intermediate_sizes"][0]["kept_replay_sizes"] = [256]
    assert replay_group_lines(data) == ["  only 1 replay size(s): no size below the largest to drop"]


def test_the_verdict_says_bit_exact_or_where_it_differs():
    safe, evidence = safety_verdict(fake_runs()["share_all"])
    assert safe
    assert evidence.startswith("graphs equal eager bit for bit in all 9 steps (each size after each size)")
    assert "drafter graphs 128, 256, 512 captured on the model graphs stream" in evidence
    assert "overwrote the target's outputs in the pool in 9 of them, after propose had copied them out" in evidence
    safe, evidence = safety_verdict(fake_runs(share_all_differs={(256, 128)})["share_all"])
    assert not safe
    assert evidence.startswith("graphs differ from eager in 1 of 9 steps (256 after 128): draft_hidden_states")
    assert "largest difference 3.5" in evidence and "\n" not in evidence
    eager_only = fake_runs()["pr"]
    eager_only["checks"] = [{**c, "draft_graph_size": None} for c in eager_only["checks"]]
    assert safety_verdict(eager_only) == (
        False,
        "target graphs equal eager in all 9 steps, but no drafter graph replayed: the drafter unshown",
    )
    assert safety_verdict({"checks": []})[0] is False


def test_pool_figures_sum_the_global_pool_by_stream():
    raw = {
        "segments": [
            {"segment_pool_id": [0, 1], "stream": 7, "total_size": 2 * MIB},
            {"segment_pool_id": (0, 1), "stream": 9, "total_size": 20 * MIB},
            {"segment_pool_id": [0, 1], "stream": 9, "total_size": 2 * MIB},
            {"segment_pool_id": [0, 0], "stream": 9, "total_size": 99 * MIB},  # the default pool: not counted
            {"segment_pool_id": [0, 2], "stream": 11, "total_size": 5 * MIB},  # another graph pool
        ],
        "kit": {
            "pools": {"global graph pool": [0, 1]},
            "streams": {"model graphs stream": 7, "replay graphs stream": 9},
            "captures": [{"manager": "model graphs", "stream": 7}, {"manager": scenarios.DRAFTER, "stream": 11}],
        },
    }
    assert pool_figures(raw) == {
        "graph_pool_bytes": 24 * MIB,
        "graph_pool_by_stream": {"model graphs stream": 2 * MIB, "replay graphs stream": 22 * MIB},
        "capture_streams": {"model graphs": "model graphs stream", scenarios.DRAFTER: "stream 0xb"},
    }
    with pytest.raises(KitError, match="no global graph pool"):
        pool_figures({"segments": [], "kit": {"pools": {}}})


def test_alternatives_json_is_the_contract(recordings, capsys):
    write_recording(recordings)
    assert kit_main(["alternatives", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for scenario in ("unpatched", "pr", "share_all"):
        assert {"graph_pool_bytes", "saved_bytes", "safe", "evidence"} <= set(out[scenario])
        assert isinstance(out[scenario]["safe"], bool) and "\n" not in out[scenario]["evidence"]
    assert out["pr"]["saved_bytes"] == 24 * MIB
    assert all({"max_replay_size", "graph_pool_bytes", "eager_replay_sizes"} <= set(r) for r in out["cap_replay_sizes"])
    drops = out["drop_intermediate_sizes"]
    assert drops and all({"kept_replay_sizes", "graph_pool_bytes", "eager_replay_sizes"} <= set(r) for r in drops)
    assert {"replica", "deepseek_v41_flash", "deepseek_v3_mla"} <= set(out["kv_cache"])
    assert out["source"] == (
        f"recorded on NVIDIA H200, torch 2.11.0+cu130, 2026-12-10T00:00:00+00:00 ({recordings / 'small.json'})"
    )


def test_alternatives_prints_the_source_the_variants_the_caps_and_the_kv_cache(recordings, capsys):
    write_recording(recordings)
    assert kit_main(["alternatives"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    recorded = "recorded on NVIDIA H200, torch 2.11.0+cu130, 2026-12-10T00:00:00+00:00"
    assert lines[0] == f"source: {recorded} ({recordings / 'small.json'})"
    assert any(line.split()[:5] == ["share_all", "24.0", "MiB", "32.0", "MiB"] for line in lines)
    assert any(line.split()[:6] == ["64", "40.0", "MiB", "16.0", "MiB", "128,"] for line in lines)
    assert "  pr frees 24.0 MiB of KV budget: 48 blocks, 768 tokens" in lines
    assert f"  {scenarios.SAFE_IN_THE_REPLICAS_STEP}" in lines  # (a)'s "safe" is the replica's step only
    assert any(line.split() == ["64,", "256", "56.0", "MiB", "0.0", "MiB", "none"] for line in lines)  # kept sets
    assert any(line.startswith("  so: dropping intermediate sizes did not shrink the graph pool") for line in lines)
    write_recording(recordings, fake_runs(share_all_differs={(512, 512)}))
    assert kit_main(["alternatives"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.split()[:6] == ["share_all", "24.0", "MiB", "32.0", "MiB", "NO"] for line in lines)
    assert any(
        line.startswith("  share_all: graphs differ from eager in 1 of 9 steps (512 after 512)") for line in lines
    )
    assert "DeepSeek-V4.1-Flash (assumed): the PR's 5.18 GiB = 32,918 blocks of 64, 2,106,752 tokens" in out
    assert "or the sliding windows of 2,057 more requests" in out


def test_a_missing_or_broken_recording_is_one_line(recordings, capsys):
    assert _one_line_error(capsys, ["alternatives", "--preset", "large"]) == (
        f"no alternatives recording for preset 'large' ({recordings / 'large.json'}); "
        "run `python -m kit alternatives --live --preset large` on a GPU"
    )
    (recordings / "small.json").write_text("{not json")
    assert _one_line_error(capsys, ["alternatives"]).startswith(
        f"{recordings / 'small.json'}: not an alternatives recording (not JSON"
    )
    path = write_recording(recordings)
    data = json.loads(path.read_text())
    good = copy.deepcopy(data)
    broken = copy.deepcopy(data)
    del broken["share_all"]["safe"]
    path.write_text(json.dumps(broken))
    assert _one_line_error(capsys, ["alternatives", "--json"]) == (
        f"{path}: not an alternatives recording ('share_all' lacks safe)"
    )
    del data["cap_replay_sizes"][1]["eager_replay_sizes"]
    path.write_text(json.dumps(data))
    assert _one_line_error(capsys, ["alternatives"]) == (
        f"{path}: not an alternatives recording (a cap_replay_sizes row lacks eager_replay_sizes)"
    )
    path.write_text(json.dumps({**good, "drop_intermediate_sizes": [{"graph_pool_bytes": 1}]}))
    assert _one_line_error(capsys, ["alternatives"]) == (
        f"{path}: not an alternatives recording (a drop_intermediate_sizes row lacks kept_replay_sizes, "
        "eager_replay_sizes)"
    )
    path.write_text(json.dumps({**good, "drop_intermediate_sizes": {}}))
    assert _one_line_error(capsys, ["alternatives"]) == (
        f"{path}: not an alternatives recording ('drop_intermediate_sizes' is not a list of rows)"
    )
    assert _one_line_error(capsys, ["alternatives", "--preset", "huge"]) == (
        f"unknown preset 'huge': one of {', '.join(PRESETS)}"
    )


def test_a_recording_made_before_the_kept_sets_still_reads_and_says_they_were_not_measured(recordings, capsys):
    path = write_recording(recordings)
    data = json.loads(path.read_text())
    del data["drop_intermediate_sizes"], data["replay_capture_sizes"]
    path.write_text(json.dumps(data))
    assert kit_main(["alternatives"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  not measured: this recording predates the measurement (python -m kit alternatives --live)" in lines
    assert not any(line.startswith("  so: ") for line in lines)
    assert replay_group_lines(result.load_graphs_vs_eager("small")) == []


NO_CUDA = (
    "live alternatives runs need CUDA, and this process has none; without --live, alternatives shows the H200 recording"
)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )


def test_live_without_cuda_is_one_line(tmp_path):
    done = _run("kit", "alternatives", "--live")
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"kit: error: {NO_CUDA}\n")
    for flag in ("--scenario", "--variant"):  # --variant: the name in the recordings' provenance commands
        done = _run("kit.experiments.alternatives", flag, "pr", "--out", str(tmp_path / "pr.json"))
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"kit: error: {NO_CUDA}\n")
    done = _run("kit.experiments.alternatives", "--out", str(tmp_path / "rec"))
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"kit: error: {NO_CUDA}\n")
    assert list(tmp_path.iterdir()) == []  # refused before any file or folder was made


# --- the shipped H200 recordings (recorded by the lead: python -m kit.experiments.alternatives) ---


@pytest.mark.parametrize("preset", ["small", "large"])
def test_the_shipped_recording_makes_sense(preset):
    data = result.load_graphs_vs_eager(preset)
    assert data["preset"] == preset and not recorded.predates_vllm_sizing(data)
    assert data["config"]["speculator"] is True and data["provenance"]["gpu"].startswith("NVIDIA")
    assert data["unpatched"]["saved_bytes"] == 0
    assert data["pr"]["saved_bytes"] > 0
    assert data["share_all"]["saved_bytes"] >= data["pr"]["saved_bytes"]
    assert data["unpatched"]["safe"] and data["pr"]["safe"], (data["unpatched"]["evidence"], data["pr"]["evidence"])
    caps = data["cap_replay_sizes"]
    assert caps[-1]["max_replay_size"] is None and caps[-1]["graph_pool_bytes"] == data["unpatched"]["graph_pool_bytes"]
    pools = [row["graph_pool_bytes"] for row in caps]
    assert pools == sorted(pools)  # a lower cap never reserves more
    assert data["kv_cache"]["replica"]["freed"]["pr"]["blocks"] > 0
    drops = data["drop_intermediate_sizes"]
    every = data["replay_capture_sizes"]
    config = data["config"]
    assert data["config"]["replay_sizing"] == "vllm" and every == default_replay_capture_sizes(
        max(config["cudagraph_capture_sizes"]), config["max_num_seqs"], config["window"]
    )
    assert drops[-1]["kept_replay_sizes"] == every and drops[-1]["measured_in"] == "unpatched"
    assert all(row["kept_replay_sizes"][-1] == every[-1] and not row["eager_replay_sizes"] for row in drops)
    assert replay_group_lines(data)[-1].startswith("  so: dropping intermediate sizes did")

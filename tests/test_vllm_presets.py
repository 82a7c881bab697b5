"""The presets of vLLM's own defaults (h200-default, gb200-default): recomputed by vLLM 0.33's config code.

scripts/vllm_presets.py calls vLLM's own functions (the scheduler's defaults,
`VllmConfig._set_cudagraph_sizes`, `DecoderReplayCudaGraphManager.__init__`)
with the device stood in; the replica reads the checked-in JSON (the H200 has
no vLLM). Here vLLM, installed on the CPU, computes them again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kit.experiments.dispatch import can_run, dispatch_replay_size
from kit.experiments.safety_run.result import enumerate_pairs, no_break_sizes
from kit.replica.model import PRESETS, VLLM_PRESETS_JSON, default_replay_capture_sizes, vllm_default_presets

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import vllm_presets  # noqa: E402


@pytest.fixture(scope="module")
def computed() -> dict:
    return vllm_presets.compute_presets()


def test_the_checked_in_presets_are_what_vllms_config_code_computes(computed):
    assert json.loads(VLLM_PRESETS_JSON.read_text()) == computed
    assert computed["provenance"]["vllm_version"] == "0.33.0"


def test_the_default_ceiling_is_512_on_an_h200_and_1024_on_the_blackwell_family(computed):
    h200, gb200 = computed["presets"]["h200-default"], computed["presets"]["gb200-default"]
    assert (h200["max_cudagraph_capture_size"], gb200["max_cudagraph_capture_size"]) == (512, 1024)
    assert h200["decoder_replay_trim_threshold"] == gb200["decoder_replay_trim_threshold"] == 768
    assert gb200["cudagraph_capture_sizes"][-17:] == list(range(768, 1025, 16))
    assert h200["decoder_replay_cudagraph_capture_sizes"] == [128, 256, 384, 512]
    # the device capability decides (is_device_capability_family(100)), not the memory
    Device = vllm_presets.Device
    assert vllm_presets.compute_preset(Device("B300", (10, 3), 139.8))["max_cudagraph_capture_size"] == 1024
    assert vllm_presets.compute_preset(Device("big Hopper", (9, 0), 184.0))["max_cudagraph_capture_size"] == 512


@pytest.mark.parametrize("name", ["h200-default", "gb200-default"])
def test_the_replica_presets_take_vllms_sizes(name):
    numbers, config = vllm_default_presets()[name], PRESETS[name]
    assert list(config.cudagraph_capture_sizes) == numbers["cudagraph_capture_sizes"]
    assert config.decoder_replay_trim_threshold == numbers["decoder_replay_trim_threshold"]
    assert config.window == numbers["window"] and config.max_num_seqs == numbers["max_num_seqs"]
    # the replica's own sizing of replay graphs gives what vLLM's DecoderReplayCudaGraphManager gave
    assert config.decoder_replay_cudagraph_capture_sizes == numbers["decoder_replay_cudagraph_capture_sizes"]
    assert (
        default_replay_capture_sizes(numbers["max_cudagraph_capture_size"], numbers["max_num_seqs"], numbers["window"])
        == numbers["decoder_replay_cudagraph_capture_sizes"]
    )


def test_h200_default_breaks_no_model_graph_and_gb200_default_dispatches_mostly_r_over_n():
    h200, gb200 = PRESETS["h200-default"], PRESETS["gb200-default"]
    assert enumerate_pairs(h200) == [] and no_break_sizes(h200) == sorted(h200.cudagraph_capture_sizes)
    pairs = enumerate_pairs(gb200)
    breaking = sorted({n for n, _, _ in pairs})
    assert breaking == list(range(768, 1025, 16))
    sizes = gb200.decoder_replay_cudagraph_capture_sizes
    own = {n: dispatch_replay_size(n, sizes) for n in breaking}  # where N's own full batch runs
    assert sum(r > n for n, r in own.items()) == 14  # 14 of 17: all but 768, 896 and 1024
    assert {(n, r) for n, r, d in pairs if d and r > n} == {(n, own[n]) for n in breaking if own[n] > n}
    assert all(can_run(gb200, 2)(n, r) for n, r, _ in pairs)  # with PCP 2 every pairing is reachable


def test_the_script_check_mode_says_whether_the_json_is_current(capsys):
    assert vllm_presets.main(["--check"]) == 0
    assert "as vLLM computes it" in capsys.readouterr().out


def test_vllms_path_at_the_gb200_defaults_dispatches_what_the_kit_says(monkeypatch):
    """`vllm_standin.preset_config` builds vLLM's own runner at the preset's numbers: vLLM's manager makes the
    replay sizes, and vLLM's dispatch rule over them gives 126 pairings, 14 with R > N, as recorded."""
    import torch

    from kit.experiments.vllm import capture as vc
    from kit.experiments.vllm import safety as vs
    from tests.test_vllm_safety import stand_in_cuda

    numbers = vllm_default_presets()["gb200-default"]
    stand_in_cuda(monkeypatch)
    runner = vc.build_runner(vc.preset_config("gb200-default"), torch.device("cpu"))
    assert vs.replay_sizes(runner) == numbers["decoder_replay_cudagraph_capture_sizes"]
    assert vs.trim_threshold(runner) == numbers["decoder_replay_trim_threshold"]
    assert runner.vllm_config.scheduler_config.max_num_seqs == numbers["max_num_seqs"]
    pairs = vs.dispatchable_pairs(runner)
    assert len(pairs) == 126 and sum(r > n for n, r, _ in pairs) == 14 and len(vs.pcp_pairs(runner)) == 10

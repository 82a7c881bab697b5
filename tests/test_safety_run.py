"""Adversarial pairings on the CPU: which pairs, the adversary's hook, reading and showing a recording, the command.

The pairs themselves run on a GPU (tests/gpu/test_safety_run_live.py); here a
fake recording in tmp_path stands in for the shipped one, and a fake replay
graph manager (the real manager's `run`, with an eager "replay" that logs
each call) stands in for the replay graphs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

import kit.experiments.safety_run as safety_run
from kit import KitError
from kit.cli import main as kit_main
from kit.experiments.safety_run import (
    DISPATCH_RULE,
    SAFETY_SCENARIOS,
    SCENARIO_OF,
    adversary,
    compare_outputs,
    enumerate_pairs,
    load_pairs,
    output_names,
    pair_tables,
    pair_verdicts,
)
from kit.experiments.scenarios import SCENARIOS
from kit.replica.forward_context import CUDAGraphMode, get_forward_context
from kit.replica.model import PRESETS, ReplicaConfig
from kit.replica.model_runner import GPUModelRunner
from tests.helpers import TINY

PROVENANCE = {
    "gpu": "NVIDIA H200",
    "torch": "2.11.0+cu130",
    "cuda": "13.0",
    "date": "2026-12-10T00:00:00+00:00",
    "command": "python -m kit.experiments.safety_run --preset small --out kit/recordings/safety",
}


# --- which pairs ----------------------------------------------------------------


# vLLM's dispatch rule and the pairs it gives: tests/test_dispatch.py.


# --- the adversary's hook, on the CPU ------------------------------------------------


class FakeReplayGraphs:
    """A replay graph manager with two static input buffers; its replays and its `run` log what they see."""

    def __init__(self, sizes=(4, 8)) -> None:
        self.input_buffers = [torch.zeros(max(sizes), 3), torch.zeros(max(sizes), 1)]
        self.capture_sizes = sorted(sizes, reverse=True)
        self.graphs_captured = True
        self.log: list[tuple] = []
        log = self.log

        class Runner:
            captures = dict.fromkeys(sizes)

            def __call__(self, *inputs):
                context = get_forward_context()
                log.append(("replay", context.num_tokens, context.cudagraph_runtime_mode, [t.clone() for t in inputs]))
                return inputs

        self.breakable_cg_runner = Runner()

    def dispatch(self, num_rows):
        return min((s for s in self.capture_sizes if s >= num_rows), default=None)

    def run(self, rows, inputs):
        self.log.append(("run", rows, inputs))
        return "outputs"


@pytest.fixture
def cpu_runner() -> GPUModelRunner:
    runner = GPUModelRunner(TINY, device="cpu")
    runner.model_state.replay_cudagraphs = FakeReplayGraphs()
    return runner


@pytest.fixture
def cpu_state(cpu_runner):
    return cpu_runner.model_state


def test_the_adversary_replays_its_graph_on_its_inputs_before_the_real_replay_graph(cpu_state):
    noise = [torch.randn(4, 3), torch.randn(4, 1)]
    break_input = torch.randn(16, 3)
    with adversary(cpu_state, 4, noise) as hook:
        cpu_state.prepare_replay_batch(16, use_replay_graphs=True)
        batch = cpu_state.decoder_replay_layers.replay_batch
        assert batch.run_graph("rows", (break_input,)) == "outputs"
    assert hook.replays == 1
    (first, num_tokens, mode, seen), (second, rows, (given,)) = cpu_state.replay_cudagraphs.log
    assert (first, num_tokens, mode) == ("replay", 4, CUDAGraphMode.PIECEWISE)  # replay graph 4 ...
    assert all(torch.equal(a, b) for a, b in zip(seen, noise, strict=True))  # ... on the random inputs, every buffer
    assert (second, rows) == ("run", "rows")  # then the step's own replay, as normal,
    assert torch.equal(given, break_input) and given.data_ptr() != break_input.data_ptr()  # on the inputs read first
    assert "prepare_replay_batch" not in vars(cpu_state)  # the hook is gone with the block
    cpu_state.prepare_replay_batch(16, use_replay_graphs=True)
    assert cpu_state.decoder_replay_layers.replay_batch.run_graph == cpu_state.replay_cudagraphs.run


def test_the_adversary_stays_out_of_eager_runs_and_refuses_a_size_never_captured(cpu_runner, cpu_state):
    noise = [torch.zeros(4, 3), torch.zeros(4, 1)]
    with adversary(cpu_state, 4, noise) as hook:
        cpu_runner.run(torch.arange(16) % TINY.vocab_size, use_cudagraph=False)
        assert cpu_state.decoder_replay_layers.replay_batch.run_graph is None
    assert hook.replays == 0 and cpu_state.replay_cudagraphs.log == []
    with pytest.raises(KitError, match="no replay graph of 6 rows"), adversary(cpu_state, 6, noise):
        pass


def test_outputs_are_compared_bit_for_bit_hidden_states_and_every_aux_state():
    config = ReplicaConfig(**{**TINY.__dict__, "aux_hidden_state_layers": (1, 3)})
    eager = (torch.ones(4, 2), (torch.zeros(4, 2), torch.ones(4, 2)))
    assert compare_outputs(config, eager, eager) == {
        "bit_exact": True,
        "max_abs_diff": 0.0,
        "outputs": 3,
        "differing_outputs": [],
        "mismatched_elements": 0,
    }
    graph = (torch.ones(4, 2), (torch.full((4, 2), 0.5), torch.ones(4, 2)))
    row = compare_outputs(config, graph, eager)
    assert (row["bit_exact"], row["max_abs_diff"], row["differing_outputs"]) == (False, 0.5, ["aux_hidden_state[1]"])
    garbage = (torch.full((4, 2), float("nan")), eager[1])
    assert compare_outputs(config, garbage, eager)["max_abs_diff"] == float("inf")  # NaN: the largest difference


# --- reading and showing a recording -------------------------------------------------------


def policy_metadata(policy: str, preset: str) -> dict:
    """What `run_scenario` records beside a policy's pairs."""
    scenario = SCENARIO_OF[policy]
    config = safety_run.safety_config(scenario, preset)
    return {
        "policy": policy,
        "scenario": scenario,
        "description": SCENARIOS[scenario][2],
        "preset": preset,
        "config": dataclasses.asdict(config),
        "has_early_aux": policy == "early_aux_shared",
        "shares_model_stream": policy != "unpatched",
        "outputs": output_names(config),
        "seed": safety_run.SEED,
        "provenance": PROVENANCE,
    }


def fake_recording(folder, differing=frozenset(), alone_differing=frozenset(), preset="small"):
    """A recording of every policy at `preset`: bit-exact but for `differing` (model, replay) of early_aux_shared."""
    pairs = []
    for policy in SAFETY_SCENARIOS:
        for n, r, dispatchable in enumerate_pairs(PRESETS[preset]):
            bad = policy == "early_aux_shared" and (n, r) in differing
            alone_bad = policy == "early_aux_shared" and n in alone_differing
            pairs.append(
                {
                    "policy": policy,
                    "model_size": n,
                    "replay_size": r,
                    "dispatchable": dispatchable,
                    "bit_exact": not bad,
                    "max_abs_diff": 2.5 * (n // 128) if bad else 0.0,
                    "outputs": 3 if policy == "early_aux_shared" else 2,
                    "differing_outputs": ["hidden_states"] if bad else [],
                    "alone_bit_exact": not alone_bad,
                    "alone_max_abs_diff": 1.0 if alone_bad else 0.0,
                }
            )
    data = {
        "preset": preset,
        "rule": DISPATCH_RULE,
        "pairs": pairs,
        "policies": {policy: policy_metadata(policy, preset) for policy in SAFETY_SCENARIOS},
        "provenance": PROVENANCE,
    }
    path = folder / f"{preset}.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def recordings(tmp_path, monkeypatch):
    monkeypatch.setattr(safety_run, "RECORDINGS_DIR", tmp_path)
    return tmp_path


def test_verdicts_say_all_bit_exact_or_which_pairs_differ_and_by_how_much(recordings):
    fake_recording(recordings, differing={(512, 96), (128, 288)}, alone_differing={512})
    df = load_pairs("small")
    assert list(df["policy"].unique()) == list(SAFETY_SCENARIOS) and len(df) == 54
    assert df.attrs["source"] == (
        f"recorded on NVIDIA H200, torch 2.11.0+cu130, 2026-12-10T00:00:00+00:00 ({recordings / 'small.json'})"
    )
    assert pair_verdicts(df) == [
        "pr: all 18 pairings bit-exact (11 dispatchable)",
        "unpatched: all 18 pairings bit-exact (11 dispatchable)",
        "early_aux_shared: 2 of 18 pairings differ from eager (1 of them dispatchable): (128, 288), (512, 96) — "
        "largest difference 10; with only its own replay graph, model graph 512 differs too",
    ]


def test_the_table_has_a_row_per_model_graph_and_marks_stress_only_pairs(recordings):
    fake_recording(recordings, differing={(512, 192)})
    table = pair_tables(load_pairs("small"))["early_aux_shared"]
    assert list(table.columns) == ["N \\ R", "96", "192", "288", "384", "480", "512", "own replay alone"]
    assert table.set_index("N \\ R").loc[512].tolist() == ["bit-exact", "differs 10"] + ["bit-exact"] * 5
    assert table.set_index("N \\ R").loc[128].tolist() == ["bit-exact"] * 2 + ["bit-exact *"] * 4 + ["bit-exact"]


def test_safety_prints_the_tables_verdicts_and_source(recordings, capsys):
    fake_recording(recordings, differing={(256, 96)})
    assert kit_main(["safety"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"source: {load_pairs('small').attrs['source']}"
    start = out.index("pr: all 18 pairings bit-exact (11 dispatchable)")  # the early-aux verdict on vLLM's path follows
    assert out[start : start + 3] == [
        "pr: all 18 pairings bit-exact (11 dispatchable)",
        "unpatched: all 18 pairings bit-exact (11 dispatchable)",
        "early_aux_shared: 1 of 18 pairings differ from eager (1 of them dispatchable): (256, 96) — "
        "largest difference 5",
    ]
    headers = [f"{p} ({SCENARIOS[SCENARIO_OF[p]][2]})" for p in SAFETY_SCENARIOS]
    assert [line for line in out if line in headers] == headers  # one table each, under its name
    assert sum("differs 5" in line for line in out) == 1


def test_safety_json_is_the_contract(recordings, capsys):
    fake_recording(recordings, differing={(1024, 256)}, preset="large")
    assert kit_main(["safety", "--preset", "large", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"pairs", "source", "provenance"} <= set(out)
    assert len(out["pairs"]) == 3 * 4 * 32 and out["provenance"] == PROVENANCE  # model graph 512 does not break
    for pair in out["pairs"]:
        assert {"policy", "model_size", "replay_size", "bit_exact", "max_abs_diff"} <= set(pair)
    assert [p for p in out["pairs"] if not p["bit_exact"]] == [
        p for p in out["pairs"] if (p["policy"], p["model_size"], p["replay_size"]) == ("early_aux_shared", 1024, 256)
    ]


# --- one-line errors ----------------------------------------------------------------------


def _one_line_error(capsys, argv) -> str:
    assert kit_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and captured.err.startswith("kit: error: ")
    return captured.err.removeprefix("kit: error: ").strip()


def test_a_missing_recording_is_one_line_naming_it_and_the_live_run(recordings, capsys):
    assert _one_line_error(capsys, ["safety", "--preset", "large"]) == (
        f"no safety recording for preset 'large' ({recordings / 'large.json'}); "
        "run `python -m kit safety --live --preset large` on a GPU"
    )


def test_a_recording_that_is_not_one_is_one_line(recordings, capsys):
    (recordings / "small.json").write_text("{not json")
    assert _one_line_error(capsys, ["safety"]).startswith(
        f"{recordings / 'small.json'}: not a safety recording (not JSON"
    )
    path = fake_recording(recordings)
    data = json.loads(path.read_text())
    del data["pairs"][3]["bit_exact"]
    path.write_text(json.dumps(data))
    assert _one_line_error(capsys, ["safety"]) == f"{path}: not a safety recording (a pair lacks bit_exact)"


def test_an_unknown_preset_or_scenario_is_one_line(recordings, capsys):
    assert _one_line_error(capsys, ["safety", "--preset", "huge"]) == (
        "unknown preset 'huge': one of small, large, small_half, large_half"
    )
    with pytest.raises(KitError, match="unknown safety scenario 'share': one of pr, unpatched, early_aux_shared"):
        safety_run.run_scenario("share")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )


NO_CUDA = "live safety runs need CUDA, and this process has none; without --live, safety shows the H200 recording"


def test_live_without_cuda_is_one_line(tmp_path):
    done = _run("kit", "safety", "--live")
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"kit: error: {NO_CUDA}\n")
    out = tmp_path / "pr.json"
    for flag in ("--scenario", "--policy"):  # --policy: the name in the recordings' provenance commands
        done = _run("kit.experiments.safety_run", flag, "pr", "--out", str(out))
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"kit: error: {NO_CUDA}\n")
    done = _run("kit.experiments.safety_run", "--out", str(tmp_path / "rec"))
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"kit: error: {NO_CUDA}\n")
    assert list(tmp_path.iterdir()) == []  # refused before any file or folder was made

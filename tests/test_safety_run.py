"""Adversarial pairings on the CPU: which pairs, the adversary's hook, reading and showing a recording, the command.

The pairs themselves run on a GPU (tests/gpu/test_safety_run_live.py); here a
fake recording in tmp_path stands in for the shipped one, and a fake replay
graph manager (the real manager's `run`, with an eager "replay" that logs
each call) stands in for the replay graphs. The command,
`kit.experiments.safety_run.__main__`, runs in fresh processes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from kit import KitError
from kit.cli import main as kit_main
from kit.experiments.dispatch import RULE as DISPATCH_RULE
from kit.experiments.power import CONTROL, FAILED, NOT_RECORDED, NOTHING_READ, SHOWN, PoolPoison, power_fields
from kit.experiments.safety_run import result as safety_result
from kit.experiments.safety_run import run as safety_gpu
from kit.experiments.safety_run.result import (
    SCENARIO_OF,
    UNPLANTED,
    enumerate_pairs,
    load_pairs,
    load_recording,
    pair_tables,
    pair_verdicts,
    pairs_frame,
)
from kit.experiments.safety_run.run import adversary, compare_outputs, output_names
from kit.experiments.scenarios import SCENARIOS
from kit.replica.forward_context import CUDAGraphMode, get_forward_context, override_forward_context
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


def test_a_forced_pairing_runs_the_replay_batch_in_graph_r_and_pads_eagerly_to_r(cpu_state):
    break_input = torch.randn(16, 3)
    with adversary(cpu_state, 8) as hook:
        cpu_state.prepare_replay_batch(16, use_replay_graphs=True, num_rows=4)
        batch = cpu_state.decoder_replay_layers.replay_batch
        assert batch.forward_context.num_tokens == 8  # forced: vLLM's dispatch would pad 4 rows to 4
        assert batch.forward_context.cudagraph_runtime_mode == CUDAGraphMode.PIECEWISE
        assert batch.run_graph("rows", (break_input,)) == "outputs"
        cpu_state.prepare_replay_batch(16, use_replay_graphs=False, num_rows=4)
        eager = cpu_state.decoder_replay_layers.replay_batch
        assert eager.run_graph is None and eager.num_padded == 8  # eagerly: the same shapes as graph 8
    assert hook.replayed == [8] and hook.replays == 1
    ((what, rows, (given,)),) = cpu_state.replay_cudagraphs.log
    assert (what, rows) == ("run", "rows") and given is break_input  # the step's own gather and replay, as normal
    assert "prepare_replay_batch" not in vars(cpu_state)  # the hook is gone with the block
    cpu_state.prepare_replay_batch(16, use_replay_graphs=True, num_rows=4)
    batch = cpu_state.decoder_replay_layers.replay_batch
    assert batch.run_graph == cpu_state.replay_cudagraphs.run and batch.forward_context.num_tokens == 4


def test_the_poison_comes_right_after_the_replay_on_its_outputs(cpu_state):
    seen = []
    with adversary(cpu_state, poison=lambda outputs: seen.append((outputs, len(cpu_state.replay_cudagraphs.log)))):
        cpu_state.prepare_replay_batch(16, use_replay_graphs=True, num_rows=4)
        batch = cpu_state.decoder_replay_layers.replay_batch
        assert batch.forward_context.num_tokens == 4  # not forced: the graph vLLM's dispatch picks
        assert batch.run_graph("rows", (torch.zeros(16, 3),)) == "outputs"
    assert seen == [("outputs", 1)]  # once, after the replay, handed R's outputs (which it must keep)


def test_the_adversary_refuses_a_size_never_captured(cpu_state):
    with pytest.raises(KitError, match="no replay graph of 6 rows"), adversary(cpu_state, 6):
        pass


# --- the positive control, on the CPU ---------------------------------------------------------------

# Replay sizes 2, 4, ..., 16 (vLLM's default sizing, window 2): model graph 8 dispatches up to 8, so replay graphs
# 10 to 16 are stress pairings of it (forced); model graph 16 dispatches every one.
STRESS = ReplicaConfig(
    hidden_size=64, num_layers=4, decoder_replay_start=2, aux_hidden_state_layers=(3,), vocab_size=97,
    cudagraph_capture_sizes=(8, 16), window=2, max_num_seqs=8, decoder_replay_trim_threshold=4,
)  # fmt: skip


class PoolRunner:
    """`run_pairs`'s runner on the CPU: a graph pool (float32) where the forward leaves a value before the replay
    batch and, when `carried`, reads it again after it as its aux output; the replay graphs write their outputs
    into the pool too. With `masked`, a second writer after R rewrites that value (as the earlier adversary's own
    replay graph did), so nothing R could write there shows."""

    def __init__(self, carried: bool, masked: bool = False) -> None:
        self.config, self.device = STRESS, torch.device("cpu")
        self.model_state = GPUModelRunner(STRESS, device="cpu").model_state
        graphs = FakeReplayGraphs(sizes=STRESS.decoder_replay_cudagraph_capture_sizes)
        graphs.run = self.replay
        self.model_state.replay_cudagraphs = graphs
        self.pool = torch.zeros(64)  # [0, 16): the early value; [32, 48): the replay graphs' outputs
        self.carried, self.masked = carried, masked
        self.replayed: list[int] = []

    def replay(self, rows, inputs):
        self.replayed.append(get_forward_context().num_tokens)
        out = self.pool[32 : 32 + rows.numel()]
        return (out.copy_(inputs[0][rows] * 3),)

    def run(self, ids, use_cudagraph=True, num_replay_rows=None):
        n, x = ids.numel(), ids.float()
        self.model_state.prepare_replay_batch(n, use_cudagraph, piecewise=True, num_rows=num_replay_rows)
        batch = self.model_state.decoder_replay_layers.replay_batch
        early = (self.pool[:n] if use_cudagraph else torch.empty(n)).copy_(x + 1)
        if batch.run_graph is not None:
            with override_forward_context(batch.forward_context):
                (out,) = batch.run_graph(batch.rows, (x,))
            if self.masked:
                early.copy_(x + 1)
        else:
            out = x[batch.rows] * 3
        hidden = torch.zeros(n).index_copy_(0, batch.rows, out)
        return hidden, ((early if self.carried else x + 1).clone(),)


def pool_pairs(carried: bool, masked: bool = False) -> tuple[list[dict], PoolPoison]:
    runner = PoolRunner(carried, masked)
    poison = PoolPoison([runner.pool.view(torch.uint8)])
    return safety_gpu.run_pairs(runner, poison=poison), poison


def test_every_pairing_runs_one_replay_graph_r_dispatched_or_forced_and_equals_eager(monkeypatch):
    rows, _ = pool_pairs(carried=True)
    # (8, R > 8) are dispatched with pcp_size 2: more replay rows than the step's 8 tokens
    pcp = {(r["model_size"], r["replay_size"]): r for r in rows if r["dispatch_pcp"] == 2}
    assert set(pcp) == {(8, s) for s in (10, 12, 14, 16)} and all(r["how"] == "dispatched" for r in rows)
    assert all(r["replay_rows"] > 8 for r in pcp.values())
    # where no pcp_size dispatches a pairing, N's rows are forced into R
    without_pcp = safety_result.smallest_pcp

    def pcp1_only(config, model_size, replay_size):
        return without_pcp(config, model_size, replay_size, pcp_sizes=(1,))

    monkeypatch.setattr(safety_gpu, "smallest_pcp", pcp1_only)  # as run_pairs reads it
    rows, poison = pool_pairs(carried=True)
    assert [(r["model_size"], r["replay_size"], r["dispatchable"]) for r in rows] == enumerate_pairs(STRESS)
    forced = {(r["model_size"], r["replay_size"]) for r in rows if r["how"] == "forced"}
    assert forced == {(8, s) for s in (10, 12, 14, 16)}
    assert all(r["how"] == ("dispatched" if r["dispatchable"] else "forced") for r in rows)
    assert all(r["bit_exact"] for r in rows)  # the same rows in graph R and eagerly
    assert poison.calls == len(rows) and poison.saved is None  # one control per pairing, the pool put back


def test_a_value_read_after_r_gives_every_pairing_power():
    rows, _ = pool_pairs(carried=True)
    assert all(r["power"] is True for r in rows)
    assert {r["power_reason"] for r in rows} == {SHOWN.format(outputs="aux_hidden_state[3]")}
    assert all(r["power_differing_outputs"] == ["aux_hidden_state[3]"] for r in rows)


def test_nothing_read_after_r_but_its_outputs_is_no_power():
    rows, _ = pool_pairs(carried=False)  # R's outputs are read (the hidden states), but they are R's result
    assert all(r["power"] is False and r["power_reason"] == NOTHING_READ for r in rows)


def test_a_writer_after_r_that_masks_it_is_no_power():
    rows, _ = pool_pairs(carried=True, masked=True)
    assert all(r["power"] is False for r in rows)


def test_the_poison_keeps_r_outputs_and_the_pool_is_put_back():
    pool = torch.arange(16, dtype=torch.float32)
    before = pool.clone()
    poison = PoolPoison([pool.view(torch.uint8)])
    poison(pool[4:6])
    assert torch.equal(pool[4:6], before[4:6])
    assert pool[:4].isnan().all() and pool[6:].isnan().all()  # 0xFF bytes: NaN
    poison.restore()
    assert torch.equal(pool, before) and poison.calls == 1


def test_verdicts_count_only_pairings_with_power_as_shown():
    rows, _ = pool_pairs(carried=False)
    df = pairs_frame({"pairs": [{"scenario": "pr", **r} for r in rows]})
    listed = ", ".join(f"({r['model_size']}, {r['replay_size']})" for r in rows)
    assert pair_verdicts(df) == [
        f"pr: all {len(rows)} pairings bit-exact (12 dispatchable); 0 of {len(rows)} pairings shown (with power); "
        f"{len(rows)} without power: {listed} because N reads no graph-pool byte after R but R's outputs"
    ]
    rows, _ = pool_pairs(carried=True)
    df = pairs_frame({"pairs": [{"scenario": "pr", **r} for r in rows]})
    assert pair_verdicts(df)[0].endswith(f"; {len(rows)} of {len(rows)} pairings shown (with power)")


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
    config = safety_result.safety_config(scenario, preset)
    return {
        "scenario": policy,
        "replica_scenario": scenario,
        "description": SCENARIOS[scenario][2],
        "preset": preset,
        "config": dataclasses.asdict(config),
        "has_early_aux": policy == "early_aux_shared",
        "shares_model_stream": policy != "unpatched",
        "outputs": output_names(config),
        "seed": safety_result.SEED,
        "provenance": PROVENANCE,
    }


def fake_recording(folder, differing=frozenset(), alone_differing=frozenset(), preset="small", unpowered=None):
    """A recording of every policy at `preset`: bit-exact but for `differing` (model, replay) of early_aux_shared.

    With `unpowered` (a set of (policy, model, replay)), every pair has its power: none for those, else some;
    without, the recording predates the positive control.
    """
    pairs = []
    for policy in UNPLANTED:  # as the shipped recordings, made before the planted scenario
        for n, r, dispatchable in enumerate_pairs(PRESETS[preset]):
            bad = policy == "early_aux_shared" and (n, r) in differing
            alone_bad = policy == "early_aux_shared" and n in alone_differing
            pairs.append(
                {
                    "scenario": policy,
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
            if unpowered is not None:
                weak = (policy, n, r) in unpowered
                pairs[-1].update(power=not weak, power_reason=NOTHING_READ if weak else SHOWN.format(outputs="x"))
    data = {
        "preset": preset,
        "rule": DISPATCH_RULE,
        "pairs": pairs,
        "scenarios": {policy: policy_metadata(policy, preset) for policy in UNPLANTED},
        "provenance": PROVENANCE,
    }
    path = folder / f"{preset}.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def recordings(tmp_path, monkeypatch):
    monkeypatch.setattr(safety_result, "RECORDINGS_DIR", tmp_path)
    return tmp_path


def test_verdicts_say_all_bit_exact_or_which_pairs_differ_and_by_how_much(recordings):
    fake_recording(recordings, differing={(512, 96), (128, 288)}, alone_differing={512})
    df = load_pairs("small")
    assert list(df["scenario"].unique()) == list(UNPLANTED) and len(df) == 54
    assert df.attrs["source"] == (
        f"recorded on NVIDIA H200, torch 2.11.0+cu130, 2026-12-10T00:00:00+00:00 ({recordings / 'small.json'})"
    )
    old = f"; {NOT_RECORDED}: none of these 18 pairings is counted as shown"
    assert pair_verdicts(df) == [
        "pr: all 18 pairings bit-exact (11 dispatchable)" + old,
        "unpatched: all 18 pairings bit-exact (11 dispatchable)" + old,
        "early_aux_shared: 2 of 18 pairings differ from eager (1 of them dispatchable): (128, 288), (512, 96) — "
        "largest difference 10; with only its own replay graph, model graph 512 differs too" + old,
    ]


def test_the_table_has_a_row_per_model_graph_and_marks_stress_only_pairs(recordings):
    fake_recording(recordings, differing={(512, 192)})
    table = pair_tables(load_pairs("small"))["early_aux_shared"]
    assert list(table.columns) == ["N \\ R", "96", "192", "288", "384", "480", "512", "own replay alone"]
    assert table.set_index("N \\ R").loc[512].tolist() == ["bit-exact", "differs 10"] + ["bit-exact"] * 5
    # not dispatched without PCP: 288 with pcp_size 2 (256 global rows), 384..512 with 4 (512 rows)
    expected = ["bit-exact"] * 2 + ["bit-exact *2"] + ["bit-exact *4"] * 3 + ["bit-exact"]
    assert table.set_index("N \\ R").loc[128].tolist() == expected


def test_safety_prints_the_tables_verdicts_and_source(recordings, capsys):
    weak = {("pr", 128, 96), ("pr", 512, 512), ("early_aux_shared", 256, 96)}
    fake_recording(recordings, differing={(256, 96)}, unpowered=weak)
    assert kit_main(["safety"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"source: {load_pairs('small').attrs['source']}"
    because = "because N reads no graph-pool byte after R but R's outputs"
    start = out.index(  # the early-aux verdict on vLLM's path follows
        "pr: all 18 pairings bit-exact (11 dispatchable); 16 of 18 pairings shown (with power); 2 without power: "
        f"(128, 96), (512, 512) {because}"
    )
    assert out[start : start + 3] == [
        "pr: all 18 pairings bit-exact (11 dispatchable); 16 of 18 pairings shown (with power); 2 without power: "
        f"(128, 96), (512, 512) {because}",
        "unpatched: all 18 pairings bit-exact (11 dispatchable); 18 of 18 pairings shown (with power)",
        "early_aux_shared: 1 of 18 pairings differ from eager (1 of them dispatchable): (256, 96) — "
        f"largest difference 5; 17 of 18 pairings shown (with power); 1 without power: (256, 96) {because}",
    ]
    assert sum("\u2020" in line for line in out) == 2 + 1 + 1  # pr's two rows, early_aux_shared's one, the legend
    assert f"\u2020 without power, not shown: {NOTHING_READ}" in out
    assert out[3] == CONTROL  # what power means, under the dispatch rule
    headers = [f"{p} ({SCENARIOS[SCENARIO_OF[p]][2]})" for p in UNPLANTED]
    assert [line for line in out if line in headers] == headers  # one table each, under its name
    assert sum("differs 5" in line for line in out) == 1


def test_safety_json_is_the_contract(recordings, capsys):
    fake_recording(recordings, differing={(1024, 256)}, preset="large")
    assert kit_main(["safety", "--preset", "large", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"pairs", "source", "provenance"} <= set(out)
    assert len(out["pairs"]) == 3 * 4 * 32 and out["provenance"] == PROVENANCE  # model graph 512 does not break
    for pair in out["pairs"]:
        assert {"policy", "model_size", "replay_size", "bit_exact", "max_abs_diff"} <= set(pair)  # the contract's keys
        assert pair["policy"] == pair["scenario"]
    assert [p for p in out["pairs"] if not p["bit_exact"]] == [
        p for p in out["pairs"] if (p["scenario"], p["model_size"], p["replay_size"]) == ("early_aux_shared", 1024, 256)
    ]
    # dispatchability under the preset's rule per PCP size; pcp1 is `dispatchable`
    assert out["pcp_sizes"] == [1, 2, 4, 8]
    by_pair = {(p["model_size"], p["replay_size"]): p for p in out["pairs"] if p["scenario"] == "pr"}
    assert all(p["dispatchable_under"]["pcp1"] == p["dispatchable"] for p in by_pair.values())
    assert by_pair[(2048, 4096)]["dispatchable_under"] == {"pcp1": False, "pcp2": True, "pcp4": True, "pcp8": True}
    assert by_pair[(2048, 4096)]["dispatch_pcp"] == 2 and by_pair[(1024, 8192)]["dispatch_pcp"] == 8
    assert by_pair[(1024, 2304)]["dispatch_pcp"] == 4  # 2304 rows need more than 2 x 1024
    # Made before the positive control: every pair says so, and none is counted as shown.
    assert all(p["power"] is None and p["power_reason"] == NOT_RECORDED for p in out["pairs"])
    assert all(v.endswith(f"{NOT_RECORDED}: none of these 128 pairings is counted as shown") for v in out["verdicts"])


def test_a_preset_without_breaking_model_graphs_records_no_pairings_and_says_why(recordings, capsys):
    fake_recording(recordings, preset="h200-default")  # vLLM's H200 defaults: largest model graph 512 < 768
    assert load_recording("h200-default")["pairs"] == []
    assert kit_main(["safety", "--preset", "h200-default"]) == 0
    out = capsys.readouterr().out
    assert "no pairings: every model graph of h200-default (up to 512 tokens) is below the trim threshold of 768" in out
    assert "*k: not dispatched" not in out  # no table, no footnote
    assert kit_main(["safety", "--preset", "h200-default", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pairs"] == []
    fake_recording(recordings)
    data = json.loads((recordings / "small.json").read_text())
    (recordings / "small.json").write_text(json.dumps({**data, "pairs": []}))  # a preset that has pairings
    assert "no 'pairs' list" in _one_line_error(capsys, ["safety"])


def test_safety_json_carries_each_pairings_power(recordings, capsys):
    fake_recording(recordings, unpowered={("pr", 256, 192)})
    assert kit_main(["safety", "--json"]) == 0
    pairs = json.loads(capsys.readouterr().out)["pairs"]
    weak = [p for p in pairs if p["power"] is not True]
    assert [(p["scenario"], p["model_size"], p["replay_size"], p["power"]) for p in weak] == [("pr", 256, 192, False)]
    assert weak[0]["power_reason"] == NOTHING_READ


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
        "unknown preset 'huge': one of small, large, small_half, large_half, h200-default, gb200-default"
    )
    with pytest.raises(KitError, match="unknown safety scenario 'share': one of pr, unpatched, early_aux_shared"):
        safety_gpu.run_scenario("share")


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


def test_a_pair_without_power_recorded_is_not_shown_beside_pairs_with_it(recordings):
    path = fake_recording(recordings, unpowered=set())
    data = json.loads(path.read_text())
    for pair in data["pairs"][:2]:  # pr's (128, 96) and (128, 192): recorded before the control
        del pair["power"], pair["power_reason"]
    path.write_text(json.dumps(data))
    assert pair_verdicts(load_pairs("small"))[0] == (
        f"pr: all 18 pairings bit-exact (11 dispatchable); 16 of 18 pairings shown (with power); 2 without power: "
        f"(128, 96), (128, 192) because {NOT_RECORDED}"
    )


def test_a_check_that_failed_has_power_even_where_the_poison_changed_nothing():
    same = (torch.ones(4), (torch.ones(4),))
    names = ["hidden_states", "aux_hidden_state[1]"]
    assert power_fields(names, same, same, failed=True) == {
        "power": True, "power_reason": FAILED, "power_differing_outputs": [], "power_max_abs_diff": 0.0,
    }  # fmt: skip
    assert power_fields(names, same, same)["power"] is False
    poisoned = (torch.ones(4), (torch.full((4,), float("nan")),))
    assert power_fields(names, poisoned, same)["power_reason"] == SHOWN.format(outputs="aux_hidden_state[1]")


def test_a_recording_in_the_words_of_before_reads_as_one_in_todays(tmp_path):
    """Recordings once called a scenario `policy` (and its replica scenario `scenario`), the runs `policies`."""
    today = json.loads(fake_recording(tmp_path).read_text())
    before = json.loads(json.dumps(today))
    before["policies"] = before.pop("scenarios")
    for run in before["policies"].values():
        run["policy"], run["scenario"] = run.pop("scenario"), run.pop("replica_scenario")
    for pair in before["pairs"]:
        pair["policy"] = pair.pop("scenario")
    (tmp_path / "before.json").write_text(json.dumps(before))
    read = safety_result.load_recording("small", tmp_path / "before.json")
    assert {k: v for k, v in read.items() if k != "source"} == today
    again = safety_result.load_recording("small", tmp_path / "small.json")
    assert safety_result.safety_lines(read)[1:] == safety_result.safety_lines(again)[1:]

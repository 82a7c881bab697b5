"""The safety argument on vLLM's own path (kit.experiments.vllm.safety), on the CPU.

vLLM 0.33's capture path runs here as installed, with CUDA streams and
graphs stood in (a graph replays nothing; the breaks run), around a small
stand-in (hidden size 64) with an early aux state: the read/write recording
is tagged by phase on vLLM's own `BreakableCUDAGraphWrapper._capture`,
`BreakableCUDAGraphCapture.add_eager` and `DecoderReplayLayers.run_layers`,
and all three are put back; the obligation is tabled over the pairings vLLM's
dispatch can produce, with the replay sizes vLLM's own replay graph manager
made; each pairing's replay batch of `rows_for(N, R)` rows is dispatched by
vLLM to replay graph R and replayed once in N's break; the figures reach
`demo --vllm --json`, and a recording made before them still loads. What the
graphs compute is on the H200 (tests/test_vllm_recording.py).
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kit.analysis.readwrite import (
    AFTER_REPLAY,
    BREAK,
    MODEL,
    OBLIGATION,
    RUNS_REPLAY,
    ReadWriteRecording,
    model_segment,
)
from kit.errors import KitError
from kit.experiments import power
from kit.experiments.power import FAILED, NOT_RECORDED, NOTHING_READ, PoolPoison
from kit.experiments.readwrite_run.result import OUTPUTS_READ
from kit.experiments.summary import vllm_scenario_of
from kit.experiments.vllm import capture as vc
from kit.experiments.vllm import recordings as vr
from kit.experiments.vllm import safety as vs
from kit.recordings import RECORDINGS
from tests.vllm_standins import StandInCuda, StandInGraph

SMALL = vc.StandInConfig(hidden_size=64, vocab_size=512).with_early_aux()
REPLAY_SIZES = [96, 192, 288, 384, 480, 512]
# (model size, replay size, rows): every pairing vLLM 0.33's dispatch can make with the default replay sizes.
DISPATCHABLE = [
    (128, 96, 96), (128, 192, 128),
    (256, 96, 96), (256, 192, 192), (256, 288, 256),
    (512, 96, 96), (512, 192, 192), (512, 288, 288), (512, 384, 384), (512, 480, 480), (512, 512, 512),
]  # fmt: skip
NEW_KEYS = ("pairings", "pairings_verdict", "readwrite", "readwrite_verdict", "readwrite_verdicts", "readwrite_holds")
SHIPPED = RECORDINGS / "vllm"


def stand_in_cuda(monkeypatch) -> None:
    """vLLM's capture path on the CPU: streams and graphs stood in, a fresh global graph pool and workspace.

    vLLM's wrapper hands out weak references to its outputs; on the CPU their
    memory would go back to the system, so here it hands out the tensors.
    """
    vc.import_vllm()
    from vllm.compilation import breakable_cudagraph
    from vllm.platforms import interface
    from vllm.v1.worker import workspace

    StandInGraph.cuda = StandInCuda(monkeypatch)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", StandInGraph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(interface.Platform, "graph_pool_handle", classmethod(lambda cls: (0, 1)), raising=False)
    monkeypatch.setattr(interface.Platform, "_global_graph_pool", None, raising=False)
    monkeypatch.setattr(workspace, "_manager", None)
    monkeypatch.setattr(breakable_cudagraph, "weak_ref_tensors", lambda tensors: tensors)


def vllm_functions(runner) -> tuple:
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture, BreakableCUDAGraphWrapper

    return (
        BreakableCUDAGraphWrapper.__dict__["_capture"],
        BreakableCUDAGraphCapture.__dict__["add_eager"],
        runner.model_state.decoder_replay_layers.run_layers,
    )


@pytest.fixture(scope="module")
def captured():
    """The small stand-in captured once through `GPUModelRunner.capture_model`, reads and writes recorded."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        stand_in_cuda(monkeypatch)
        runner = vc.build_runner(SMALL, torch.device("cpu"))
        before = vllm_functions(runner)
        recording = vc.capture_recorded(runner, "runner")
        yield SimpleNamespace(runner=runner, recording=recording, before=before)


def outputs_poison(runner) -> PoolPoison:
    """A poison whose "graph pool" is the model graphs' outputs (on the CPU the graphs replay nothing, so what a
    forward returns is what its capture left there): poisoned after R, they are read after it."""
    entries = runner.cudagraph_manager.breakable_cg_runner.entries.values()
    return PoolPoison([t.view(-1).view(torch.uint8) for e in entries for t in power._tensors(e.output)])


@pytest.fixture(scope="module")
def pairings(captured):
    return vs.run_pairings(captured.runner, vc.run_forward, poison=outputs_poison(captured.runner))


@pytest.fixture(scope="module")
def readwrite(captured):
    return vs.readwrite_result(captured.recording, captured.runner)


def test_the_stand_in_takes_vllms_default_replay_sizes():
    cfg = vc.StandInConfig()
    assert (cfg.window, cfg.trim_threshold, cfg.cudagraph_capture_sizes) == (96, 128, (128, 256, 512))
    assert cfg.decoder_replay_cudagraph_capture_sizes == ()  # DecoderReplayCudaGraphManager.__init__ makes them
    # V4.1's nested return by default; the flat one is the hypothetical, and the only difference of its scenarios.
    assert cfg.with_early_aux().aux_hidden_state_layers == (1, 4) and cfg.with_early_aux().aux_return == "nested"
    assert cfg.with_early_aux(aux_return="flat").aux_return == "flat"
    with pytest.raises(KitError, match="aux_return must be one of nested, flat"):
        cfg.with_early_aux(aux_return="recursive")
    for name in ("early_aux_pr", "early_aux_shared"):
        nested, flat = vr.VLLM_SCENARIOS[name], vr.VLLM_SCENARIOS[f"{name}_flat"]
        assert nested.aux_return == "nested" and flat.description.startswith("hypothetical: ")
        assert nested._replace(description="", aux_return="flat") == flat._replace(description="")


def test_every_model_graph_is_tagged_segment_break_replay_after_and_outputs(captured):
    assert vs.replay_sizes(captured.runner) == REPLAY_SIZES and vs.trim_threshold(captured.runner) == 128
    parts = ["segment 0", "break 0", "runs_replay 0", "after_replay 0", "segment 1", "output 0"]
    assert vs.phases_seen(captured.recording) == {
        "model_graphs": {str(n): parts for n in (128, 256, 512)},
        "replay_graphs": REPLAY_SIZES,
    }
    ops = {}
    for a in captured.recording.accesses:
        if a.phase.graph == MODEL:
            ops.setdefault(a.phase.part, set()).add(a.op)
    # The break gathers the rows, the replay layers run their matmuls, the rest scatters and copies them back.
    assert "aten.index_select.default" in ops[BREAK] and not any("mm" in op for op in ops[BREAK])
    assert any("mm" in op for op in ops[RUNS_REPLAY]) and "aten.index_select.default" not in ops[RUNS_REPLAY]
    assert {"aten.index_copy_.default", "aten.copy_.default"} <= ops[AFTER_REPLAY]
    assert not any("mm" in op for op in ops[AFTER_REPLAY])


def test_the_callers_reads_of_the_outputs_include_the_early_aux(captured):
    """The early aux (layer 1's input, N x hidden bf16) is written before the break and read by the caller."""
    from kit.analysis.readwrite import carried_reads

    for n in (128, 256, 512):
        read = [p for p in carried_reads(captured.recording, n) if p.op == OUTPUTS_READ]
        assert n * SMALL.hidden_size * 2 in {p.end - p.start for p in read}, n


def test_vllms_functions_are_put_back(captured):
    from kit.record.readwrite import ReadWriteRecorder

    assert vllm_functions(captured.runner) == captured.before
    recorder = ReadWriteRecorder()
    with pytest.raises(RuntimeError, match="inside"), vs.vllm_phases(captured.runner, recorder):
        assert vllm_functions(captured.runner) != captured.before
        raise RuntimeError("inside")
    assert vllm_functions(captured.runner) == captured.before
    assert "add" not in vars(recorder)


def test_vllms_weak_ref_views_are_not_recorded(captured):
    from kit.record.readwrite import ReadWriteRecorder

    x = torch.ones(16)
    with ReadWriteRecorder() as rw, vs.vllm_phases(captured.runner, rw), rw.phase(model_segment(8)):
        torch.ops._C.weak_ref_tensor(x)
        x.add(1)
    assert {a.op for a in rw.recording().accesses} == {"aten.add.Tensor"}


def test_the_obligation_is_tabled_over_vllms_dispatchable_pairings(readwrite):
    assert readwrite["replay_sizes"] == REPLAY_SIZES and readwrite["trim_threshold"] == 128
    rows = readwrite["rows"]
    assert len(rows) == 3 * len(REPLAY_SIZES)
    assert {(r["model_size"], r["replay_size"]) for r in rows if r["can_run"]} == {(n, r) for n, r, _ in DISPATCHABLE}
    assert len(readwrite["verdicts"]) == len(DISPATCHABLE)
    assert readwrite["summary"].startswith(OBLIGATION) and readwrite["holds"] in (True, False)
    assert readwrite["holds"] == all(r["holds"] for r in rows if r["can_run"])
    for r in rows:  # carried: at least the early aux the caller reads
        assert r["carried_bytes"] >= r["model_size"] * SMALL.hidden_size * 2
        assert r["first_overlap"] is None or isinstance(r["first_overlap"], int)
    assert json.loads(json.dumps(readwrite)) == readwrite
    again = ReadWriteRecording.from_records(readwrite["accesses"])
    assert vs.phases_seen(again) == readwrite["phases"]


def test_nothing_checked_is_not_claimed_to_hold(captured):
    """A recording whose breaks never ran the replay layers leaves no pairing to check: holds is None."""
    without = ReadWriteRecording([a for a in captured.recording.accesses if a.phase.graph != MODEL])
    result = vs.readwrite_result(without, captured.runner)
    assert result["holds"] is None and result["rows"] == [] and result["summary"].endswith("no pairing can run.")


def test_the_replay_batch_of_rows_for_r_dispatches_to_r(captured):
    from vllm.config import CUDAGraphMode

    runner, state = captured.runner, captured.runner.model_state
    assert vs.dispatchable_pairs(runner) == DISPATCHABLE
    for n, r, rows in DISPATCHABLE:
        graph = state.replay_batch(n, True, rows=rows)
        assert graph.rows.tolist() == list(range(n - rows, n))  # the step's last `rows` rows
        assert graph.forward_context.batch_descriptor.num_tokens == r
        assert graph.forward_context.cudagraph_runtime_mode == CUDAGraphMode.PIECEWISE
        assert graph.run_graph == state.replay_cudagraphs.run and graph.num_padded is None
        eager = state.replay_batch(n, False, rows=rows, pad=True)
        assert eager.run_graph is None and eager.rows.numel() == rows
        assert eager.forward_context.cudagraph_runtime_mode == CUDAGraphMode.NONE
        assert eager.num_padded == (None if rows == r else r)
        plain = state.replay_batch(n, False, rows=rows)
        assert plain.num_padded is None and plain.forward_context.batch_descriptor.num_tokens == rows
    assert state.replay_batch(512, True).rows.numel() == 256  # half the rows by default, as before
    with pytest.raises(KitError, match="cannot hold a replay batch"):
        state.replay_batch(128, True, rows=0)
    # more rows than tokens: a PCP step's global count, dispatched by that count, the step's own rows padded to it
    pcp = state.replay_batch(128, True, rows=256)
    assert pcp.rows.tolist() == list(range(128)) and pcp.forward_context.batch_descriptor.num_tokens == 288
    assert state.replay_batch(128, False, rows=256, pad=True).num_padded == 288
    assert state.replay_batch(128, False, rows=600, pad=True).num_padded == 600  # above every graph: eager


def test_the_pairings_pcp_adds_run_on_vllms_path_with_the_global_row_count(captured):
    found = vs.pcp_pairs(captured.runner)
    assert found == [
        (128, 288, 256, 2), (128, 384, 384, 4), (128, 480, 480, 4), (128, 512, 512, 4),
        (256, 384, 384, 2), (256, 480, 480, 2), (256, 512, 512, 2),
    ]  # fmt: skip
    result = vs.run_pcp_pairings(captured.runner, vc.run_forward, poison=outputs_poison(captured.runner))
    assert [(p["model_size"], p["replay_size"], p["rows"], p["pcp_size"]) for p in result["pairs"]] == found
    for p in result["pairs"]:
        assert p["replayed"] == [p["replay_size"]] and "error" not in p and isinstance(p["bit_exact"], bool), p
        assert isinstance(p["power"], bool), p  # the PCP pairings carry their power too
    assert json.loads(json.dumps(result)) == result


def test_each_pairing_replays_its_replay_graph_once_in_the_models_break(pairings):
    assert [(p["model_size"], p["replay_size"], p["rows"]) for p in pairings["pairs"]] == DISPATCHABLE
    for p in pairings["pairs"]:
        assert p["dispatched"] == p["replay_size"] and p["replayed"] == [p["replay_size"]], p
        assert "error" not in p and p["dispatchable"] is True
        assert p["outputs"] == 3 and isinstance(p["bit_exact"], bool)
    assert pairings["outputs"] == ["hidden_states", "aux_hidden_state[1]", "aux_hidden_state[4]"]
    assert pairings["replay_sizes"] == REPLAY_SIZES and "not run on vLLM's path" in pairings["not_run"]
    assert pairings["verdict"] == vs.pairings_verdict(pairings["pairs"])
    assert json.loads(json.dumps(pairings)) == pairings


def test_a_pairing_that_replays_another_graph_is_kept_with_its_error(captured, monkeypatch):
    """Rows that vLLM's dispatch pads to another graph than R: the pairing says so instead of passing."""
    monkeypatch.setattr(vs, "dispatchable_pairs", lambda runner: [(256, 288, 192)])
    found = vs.run_pairings(captured.runner, vc.run_forward, poison=PoolPoison([]))["pairs"]
    assert found[0]["replayed"] == [192] and found[0]["error"].startswith("the replay batch of 192 rows replayed")
    assert "1 did not replay the graph they asked for" in vs.pairings_verdict(found)
    assert found[0]["power"] is None and found[0]["power_reason"].startswith("the positive control did not run")
    assert vs.pairings_verdict(found).endswith("; 0 of 1 pairings shown (with power); 1 without power: (256, 288) "
                                               "because the positive control did not run")  # fmt: skip


def test_each_pairing_has_power_where_what_n_reads_after_r_is_poisoned(pairings):
    for p in pairings["pairs"]:
        assert p["power"] is True and p["power_reason"].startswith("the graph pool poisoned right after R"), p
        assert p["power_differing_outputs"], p
    assert pairings["verdict"].endswith("; 11 of 11 pairings shown (with power)")


def test_a_pool_that_n_does_not_read_after_r_gives_no_power(captured):
    unread = torch.zeros(64)
    poison = PoolPoison([unread.view(torch.uint8)])

    def graphs_only(runner, ids, use_cudagraph, rows=None, pad=False):
        # On the CPU the stand-in graphs replay nothing and differ from eager; a check that failed has power
        # (FAILED). Here the reference is the graphs' own forward, so only the control decides.
        return vc.run_forward(runner, ids, True, rows=rows)

    found = vs.run_pairings(captured.runner, graphs_only, poison=poison)
    assert poison.calls == len(DISPATCHABLE) and torch.equal(unread, torch.zeros(64))  # poisoned, put back
    assert all(p["bit_exact"] and p["power"] is False and p["power_reason"] == NOTHING_READ for p in found["pairs"])
    assert "0 of 11 pairings shown (with power); 11 without power: (128, 96)" in found["verdict"]
    assert all(p["power"] is True for p in vs.run_pairings(captured.runner, vc.run_forward, poison=poison)["pairs"]
               if not p["bit_exact"]), FAILED  # fmt: skip


def test_the_pairings_verdict():
    exact = {"model_size": 512, "replay_size": 512, "bit_exact": True, "max_abs_diff": 0.0, "differing_outputs": []}
    differ = {**exact, "bit_exact": False, "max_abs_diff": 5.25, "differing_outputs": ["aux_hidden_state[1]"]}
    assert vs.pairings_verdict([exact, exact]).startswith("graphs equal eager bit for bit on all 2 dispatchable")
    line = vs.pairings_verdict([exact, differ])
    assert line.startswith("graphs DIFFER from eager on 1 of 2") and "(512, 512) 5.25" in line
    old = f"{NOT_RECORDED}: none of these 2 pairings is counted as shown"  # rows from before the positive control
    assert line.endswith(f"outputs that differ: aux_hidden_state[1]; {old}")
    assert vs.pairings_verdict([]).startswith("no pairing can run")


def test_the_early_aux_leaves_a_captured_forward_weak_only_when_returned_flat(monkeypatch):
    import vllm.utils.torch_utils as torch_utils
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture

    vc.import_vllm()
    monkeypatch.setattr(torch_utils, "weak_ref_tensor", lambda t: ("weak", t))
    device_tensor, cpu_tensor = torch.empty(4, device="meta"), torch.ones(4)
    assert vc.handed_out([device_tensor], "flat")[0] is device_tensor  # eager: no capture
    monkeypatch.setattr(BreakableCUDAGraphCapture, "current", classmethod(lambda cls: object()))
    assert vc.handed_out([device_tensor], "flat")[0] == ("weak", device_tensor)
    assert vc.handed_out([device_tensor], "nested")[0] is device_tensor  # V4.1's: vLLM's wrapper keeps it
    assert vc.handed_out([cpu_tensor], "flat")[0] is cpu_tensor


def test_provenance_names_every_bypassed_constructor_and_what_is_not_modelled():
    from kit.experiments.vllm import standin as vllm_standin

    source = Path(vc.__file__).read_text() + Path(vllm_standin.__file__).read_text()  # the entry point and the runner
    made = set(re.findall(r"object\.__new__\((?:\w+\.)*(\w+)\)", source))
    assert made == {"DeepseekV41ModelState", "GPUModelRunner", "GroupCoordinator"}
    assert {f"{name}.__init__" for name in made} <= set(vc.BYPASSED)
    assert 'object.__setattr__(config, "model_config"' in source and "VllmConfig.model_config" in vc.BYPASSED
    not_modelled = " ".join(vc.NOT_MODELLED).lower()
    for thing in ("speculator", "full graphs", "microbatch", "attention", "kv cache", "parallelism"):
        assert thing in not_modelled, thing
    assert "DSpark" in vc.NOT_MODELLED["speculator"]
    assert "bypassed=BYPASSED" in source and "not_modelled=NOT_MODELLED" in source  # in every recording


# --- what reaches `demo --vllm`, for new recordings and old ones ------------------------------


def old_format(name: str) -> dict:
    """A shipped recording as it was before the pairings and the obligation were recorded."""
    raw = pickle.loads((SHIPPED / f"{name}.pickle").read_bytes())
    for key in ("pairings", "readwrite", "break_reads"):
        raw["kit"].pop(key, None)
    return raw


def write_recordings(tmp_path: Path, monkeypatch, extra: dict | None = None) -> list[str]:
    """The shipped recordings, old-format, in `tmp_path`; the scenarios they ran (`recorded_as`), in demo's order."""
    stems = [name for name in (*vr.VLLM_SCENARIOS, *vr.OLD_NAMES) if (SHIPPED / f"{name}.pickle").is_file()]
    ran = set()
    for stem in stems:
        raw = old_format(stem)
        raw["kit"].update(extra or {})
        (tmp_path / f"{stem}.pickle").write_bytes(pickle.dumps(raw))
        ran.add(vr.recorded_as(stem, vllm_scenario_of(raw["kit"])))
    monkeypatch.setattr(vr, "recording_path", lambda name: tmp_path / f"{name}.pickle")
    return [name for name in vr.VLLM_SCENARIOS if name in ran]


def test_demo_vllm_json_carries_the_pairings_and_the_obligation(readwrite, pairings, tmp_path, monkeypatch, capsys):
    from kit.cli import main

    names = write_recordings(tmp_path, monkeypatch, {"readwrite": readwrite, "pairings": pairings})
    assert main(["demo", "--vllm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == names and {"unpatched", "patched"} <= set(data)
    for figures in data.values():
        assert {"replay_added_bytes", "graph_pool_bytes", "provenance"} <= set(figures)  # the contract kept
        assert figures["pairings"] == pairings["pairs"] and figures["pairings_verdict"] == pairings["verdict"]
        assert figures["readwrite"] == readwrite["rows"] and figures["readwrite_verdict"] == readwrite["summary"]
        assert figures["readwrite_verdicts"] == readwrite["verdicts"]
        assert figures["readwrite_holds"] is readwrite["holds"]
    assert main(["demo", "--vllm"]) == 0
    out = capsys.readouterr().out
    said = vs.short_obligation(readwrite["rows"], readwrite["holds"])
    assert f"  read/write obligation: {said}" in out and f"  pairings: {pairings['verdict']}" in out
    assert f"the obligation: {OBLIGATION}" in out


def test_a_recording_from_before_them_still_loads_and_prints(tmp_path, monkeypatch, capsys):
    from kit.cli import main

    names = write_recordings(tmp_path, monkeypatch)
    summary = vc.summarize(old_format(names[0]))
    assert all(summary[key] is None for key in NEW_KEYS)
    assert main(["demo", "--vllm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert all(figures[key] is None for figures in data.values() for key in NEW_KEYS)
    assert main(["demo", "--vllm"]) == 0
    out = capsys.readouterr().out
    assert "  read/write obligation: not in this recording" in out and "  pairings: not in this recording" in out
    assert "the obligation:" not in out


def test_a_step_that_failed_is_shown_with_its_error(tmp_path, monkeypatch, capsys):
    from kit.cli import main

    failed = vs.guarded(lambda: 1 / 0)
    assert failed["error"] == "ZeroDivisionError: division by zero" and failed["where"]
    write_recordings(tmp_path, monkeypatch, {"readwrite": failed, "pairings": failed})
    assert main(["demo", "--vllm"]) == 0
    out = capsys.readouterr().out
    assert "  read/write obligation: ZeroDivisionError: division by zero" in out
    assert "  pairings: ZeroDivisionError: division by zero" in out


def test_the_small_stand_in_is_the_default_but_for_its_width():
    differs = {
        f.name for f in dataclasses.fields(SMALL) if getattr(SMALL, f.name) != getattr(vc.StandInConfig(), f.name)
    }
    assert differs == {"hidden_size", "vocab_size", "aux_hidden_state_layers"}


def test_the_planted_stand_in_carries_its_kept_block_across_the_break_on_vllms_path():
    """vLLM's own capture path on the CPU, the stand-in plain and planted (`planted_cross_break_read`): taking every
    address for the graph pool, the planted one carries exactly its kept float32 (N, 4, hidden) copy more across
    the replay break, read after it, so `vllm_invariant` flags N x 4 x hidden x 4 bytes more per model graph."""
    import dataclasses

    carried = {}
    for planted in (False, True):
        cfg = dataclasses.replace(vc.StandInConfig(hidden_size=64, vocab_size=512), planted_cross_break_read=planted)
        with pytest.MonkeyPatch.context() as monkeypatch:
            stand_in_cuda(monkeypatch)
            runner = vc.build_runner(cfg, torch.device("cpu"))
            recording = vc.capture_recorded(runner, "runner")
            everything = {"segments": [{"address": 0, "total_size": 1 << 62, "segment_pool_id": (0, 1)}]}
            result = vs.vllm_invariant(recording, everything, runner)
        carried[planted] = {r["model_size"]: r["graph_pool_carried_bytes"] for r in result["rows"]}
    assert carried[True].keys() == carried[False].keys() == {128, 256, 512}
    more = {n: carried[True][n] - carried[False][n] for n in carried[True]}
    assert more == {n: n * 4 * 64 * 4 for n in (128, 256, 512)}

"""Early aux on vLLM 0.33's semantics: the replica's weak references and return shape, and the verdict.

vLLM 0.33's `weak_ref_tensors` (`vllm/utils/torch_utils.py`) weak-references
top-level tensors only; DeepSeek-V4.1 returns `(hidden_states, aux_list)`, so
vLLM's breakable wrapper keeps every aux block allocated. The replica must do
the same (a recursing `weak_ref_tensors` frees the early aux block, the flat
case), and the verdict (`kit.experiments.early_aux`) must follow the recorded
checks and graph pools: these tests hold both, on the CPU, with synthetic
summaries and the shipped recordings.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import weakref

import pytest
import torch

from kit.errors import KitError
from kit.experiments import early_aux as ea
from kit.experiments.scenarios import FLAT_AUX_SCENARIOS, SCENARIOS, scenario_config
from kit.experiments.summary import aux_return_of, vllm_scenario_of
from kit.experiments.vllm import capture as vc
from kit.experiments.vllm import recordings as vr
from kit.replica import breakable_cudagraph as bc
from kit.replica.model import AUX_RETURNS, ReplicaConfig
from kit.replica.model_runner import GPUModelRunner
from tests.helpers import TINY

MIB = 1 << 20
EARLY = dataclasses.replace(TINY, aux_hidden_state_layers=(1, *TINY.aux_hidden_state_layers))


# --- the replica's weak references are vLLM's --------------------------------------------------


def weak_leaves(fn, value) -> list[bool]:
    """For each tensor leaf of `value` (depth first), whether `fn(value)` handed it out weak (not the tensor itself)."""
    out = fn(value)

    def walk(before, after):
        if isinstance(before, torch.Tensor):
            return [after is not before]
        return [w for b, a in zip(before, after, strict=True) for w in walk(b, a)]

    return walk(value, out)


def vllms_weak_ref_tensors():
    """vLLM 0.33's own `weak_ref_tensors`, its `weak_ref_tensor` op replaced by a view (no vllm._C here)."""
    from vllm.utils import torch_utils

    original = torch_utils.weak_ref_tensor
    torch_utils.weak_ref_tensor = lambda t: t.view_as(t) if isinstance(t, torch.Tensor) and t.numel() else t
    try:
        yield torch_utils.weak_ref_tensors
    finally:
        torch_utils.weak_ref_tensor = original


vllm_weak = pytest.fixture(vllms_weak_ref_tensors)


@pytest.mark.parametrize(
    "shape",
    [
        "tensor",
        "tuple",
        "list",
        "nested",  # V4.1's (hidden_states, aux_list)
        "deep",
    ],
)
def test_the_replicas_weak_references_take_the_same_tensors_as_vllms(vllm_weak, shape):
    t = [torch.ones(4) + i for i in range(4)]
    value = {
        "tensor": t[0],
        "tuple": (t[0], t[1]),
        "list": [t[0], t[1]],
        "nested": (t[0], [t[1], t[2]]),
        "deep": (t[0], (t[1], [t[2]]), t[3]),
    }[shape]
    assert weak_leaves(bc.weak_ref_tensors, value) == weak_leaves(vllm_weak, value)


def test_a_nested_aux_list_passes_through_as_it_is():
    hidden, aux = torch.ones(4), [torch.zeros(4), torch.full((4,), 2.0)]
    out = bc.weak_ref_tensors((hidden, aux))
    assert out[0] is not hidden and out[0].data_ptr() == hidden.data_ptr()  # top level: weak, same memory
    assert out[1] is aux and all(a is b for a, b in zip(out[1], aux, strict=True))  # nested: the tensors themselves


# --- the replica's forward returns V4.1's shape --------------------------------------------------


def test_the_replicas_forward_returns_v41s_shape_unless_flat():
    assert ReplicaConfig().aux_return == "nested" and set(AUX_RETURNS) == {"nested", "flat"}
    ids = torch.arange(16) % TINY.vocab_size
    outputs = {}
    for aux_return in AUX_RETURNS:
        runner = GPUModelRunner(dataclasses.replace(EARLY, aux_return=aux_return), device="cpu")
        with torch.inference_mode():
            raw = runner.model(ids)
        outputs[aux_return] = runner.run(ids, use_cudagraph=False)
        if aux_return == "nested":
            assert len(raw) == 2 and isinstance(raw[1], list) and len(raw[1]) == 2
        else:
            assert len(raw) == 3 and all(isinstance(x, torch.Tensor) for x in raw)
    (h1, aux1), (h2, aux2) = outputs["nested"], outputs["flat"]
    assert torch.equal(h1, h2) and len(aux1) == len(aux2) == 2
    assert all(torch.equal(a, b) for a, b in zip(aux1, aux2, strict=True))
    with pytest.raises(KitError, match="aux_return must be one of nested, flat"):
        ReplicaConfig(aux_return="recursive")


def captured_early_aux_alive(aux_return: str, monkeypatch) -> bool:
    """Whether the early aux tensor a capture made is still alive once the capture is done (its block allocated).

    The breakable wrapper's `_capture` runs for real on the CPU, its CUDA segments
    replaced by nothing; the wrapper keeps its output as vLLM's does.
    """
    monkeypatch.setattr(bc.BreakableCUDAGraphCapture, "_begin_segment", lambda self: None)
    monkeypatch.setattr(bc.BreakableCUDAGraphCapture, "_end_segment", lambda self: None)
    runner = GPUModelRunner(dataclasses.replace(EARLY, aux_return=aux_return), device="cpu")
    seen = []
    run_layers = runner.model._run_layers

    def keep_early_aux(hidden_states, layer_ids):
        out, aux = run_layers(hidden_states, layer_ids)
        if layer_ids.start == 0:
            seen.extend(weakref.ref(a) for a in aux)
        return out, aux

    runner.model._run_layers = keep_early_aux
    ids = torch.arange(16) % TINY.vocab_size
    with torch.inference_mode():
        runner.model_runnable._capture(16, (ids,))
    gc.collect()
    assert len(seen) == 1  # aux id 1, made before the replay layers
    return seen[0]() is not None


def test_the_wrapper_keeps_the_early_aux_only_when_returned_as_v41_does(monkeypatch):
    assert captured_early_aux_alive("nested", monkeypatch) is True  # vLLM 0.33 with V4.1: the block stays allocated
    assert captured_early_aux_alive("flat", monkeypatch) is False  # each aux top-level, weak: the block is free


def test_the_replica_scenarios_name_their_return_shape():
    assert FLAT_AUX_SCENARIOS == ("early_aux_shared_flat",)
    assert scenario_config("early_aux_shared", "small").aux_return == "nested"
    flat = scenario_config("early_aux_shared_flat", "small")
    assert flat.aux_return == "flat" and flat == dataclasses.replace(scenario_config("early_aux_shared", "small"),
                                                                    aux_return="flat")  # fmt: skip
    assert SCENARIOS["early_aux_shared_flat"][2].startswith("hypothetical: ")
    assert "V4.1" in SCENARIOS["early_aux_shared"][2]


# --- which shape a recording ran -----------------------------------------------------------------


def test_a_recordings_return_shape_is_read_from_what_it_ran():
    assert aux_return_of({"variant": {"config": {"aux_return": "nested"}, "early_aux_pinned": False}}) == "nested"
    assert aux_return_of({"variant": {"early_aux_pinned": True}}) == "nested"  # before aux_return: pinned, V4.1's
    assert aux_return_of({"variant": {"early_aux_pinned": False}}) == "flat"
    assert aux_return_of({"variant": {"early_aux_pinned": None}}) is None  # no early aux
    assert aux_return_of({"vllm_scenario": {"config": {"aux_return": "flat"}}}) == "flat"  # the word now
    assert aux_return_of({"scenario": {"config": {"aux_return": "nested"}}}) == "nested"
    assert aux_return_of({"scenario": {"config": {}}}) == "flat"  # the replica's weak references recursed then
    assert aux_return_of({}) is None


@pytest.mark.parametrize(
    ("stem", "about", "scenario"),
    [
        ("early_aux_shared", {"has_early_aux": True, "early_aux_pinned": False}, "early_aux_shared_flat"),
        ("early_aux_pr", {"has_early_aux": True, "early_aux_pinned": False}, "early_aux_pr_flat"),
        ("early_aux_shared_pinned", {"has_early_aux": True, "early_aux_pinned": True}, "early_aux_shared"),
        ("early_aux_shared", {"has_early_aux": True, "config": {"aux_return": "nested"}}, "early_aux_shared"),
        ("early_aux_shared_flat", {"has_early_aux": True, "config": {"aux_return": "flat"}}, "early_aux_shared_flat"),
        ("patched", {"has_early_aux": False, "early_aux_pinned": None}, "patched"),
    ],
)
def test_a_vllm_recording_is_read_as_the_scenario_it_ran(stem, about, scenario):
    assert vr.recorded_as(stem, about) == scenario


def test_the_shipped_vllm_recordings_are_read_by_the_scenario_they_ran():
    runs = vr.load_recordings()
    files = {name: snap.source_label.rsplit("/", 1)[-1].rstrip(")") for name, snap in runs.items()}
    assert files["early_aux_shared"] == "early_aux_shared.pickle" and files["early_aux_shared_flat"] == (
        "early_aux_shared_flat.pickle"
    )
    for name, snap in runs.items():
        shape = aux_return_of(snap.kit)
        if vllm_scenario_of(snap.kit)["has_early_aux"]:
            assert shape == ("flat" if name.endswith("_flat") else "nested"), (name, files[name])


# --- the verdict ---------------------------------------------------------------------------------


def run(policy: str, shape: str, pool_mib: int, safe: bool = True, **override) -> dict:
    """A synthetic vLLM-path summary with early aux: graphs vs eager, 11 obligation rows and 11 pairings."""
    rows = [{"can_run": True, "holds": safe or i > 0} for i in range(11)] + [{"can_run": False, "holds": True}]
    pairs = [{"dispatchable": True, "bit_exact": safe or i > 0} for i in range(11)]
    summary = {
        "has_early_aux": True, "policy": policy, "aux_return": shape, "graph_pool_bytes": pool_mib * MIB,
        "bit_exact": safe, "max_abs_diff": 0.0 if safe else 7.5, "readwrite": rows, "pairings": pairs,
        "source": f"recorded ({policy}, {shape})",
    }  # fmt: skip
    return {**summary, **override}


def summaries(**changes) -> dict:
    runs = {
        "unpatched": {"has_early_aux": False, "policy": "unpatched", "graph_pool_bytes": 54 * MIB},
        "early_aux_pr": run("pr", "nested", 60),
        "early_aux_pr_flat": run("pr", "flat", 56),
        "early_aux_shared": run("share", "nested", 30),
        "early_aux_shared_flat": run("share", "flat", 28, safe=False),
    }
    for name, value in changes.items():
        if value is None:
            runs.pop(name)
        else:
            runs[name] = value
    return runs


def test_defensive_on_0_33_when_v41s_shape_is_safe_and_necessary_under_a_flat_return():
    v = ea.early_aux_verdict(summaries())
    assert v["on_vllm_0_33"] == ea.DEFENSIVE and v["necessary_under"] == list(ea.CHANGES)
    nested, flat = v["shapes"]["nested"], v["shapes"]["flat"]
    assert (nested["shared"], nested["pr"], nested["pr_shape"]) == ("early_aux_shared", "early_aux_pr", "nested")
    assert v["exception_costs"] == nested["exception_costs"] == 30 * MIB  # 60 under the PR, 30 forced to share
    assert flat["exception_costs"] == 28 * MIB and flat["shown_safe"] is False and nested["shown_safe"] is True
    assert (nested["obligation_holds_on"], nested["obligation_pairings"], nested["pairings_bit_exact"]) == (11, 11, 11)
    assert (flat["obligation_holds_on"], flat["pairings_bit_exact"]) == (10, 10)
    lines = "\n".join(ea.early_aux_lines(v))
    assert "on vLLM 0.33 the exception is DEFENSIVE, not needed" in lines and "it costs 30.00 MiB" in lines
    assert "it becomes NECESSARY under a change that hands the early aux out weak (early_aux_shared_flat" in lines
    assert "the obligation VIOLATED on 1 of 11 dispatchable pairings" in lines


def test_needed_on_0_33_when_v41s_shape_forced_to_share_is_not_safe():
    v = ea.early_aux_verdict(summaries(early_aux_shared=run("share", "nested", 30, safe=False)))
    assert v["on_vllm_0_33"] == ea.NEEDED
    assert "on vLLM 0.33 the exception is NEEDED" in "\n".join(ea.early_aux_lines(v))


@pytest.mark.parametrize(
    "broken",
    [
        {"bit_exact": False, "max_abs_diff": 1.0},  # graphs differ from eager
        {"readwrite": [{"can_run": True, "holds": False}, {"can_run": True, "holds": True}]},  # obligation fails
        {"pairings": [{"dispatchable": True, "bit_exact": False}]},  # a pairing differs
    ],
)
def test_any_failed_check_makes_the_nested_shape_unsafe(broken):
    v = ea.early_aux_verdict(summaries(early_aux_shared=run("share", "nested", 30, **broken)))
    assert v["shapes"]["nested"]["shown_safe"] is False and v["on_vllm_0_33"] == ea.NEEDED


def test_nothing_is_necessary_when_the_flat_shape_is_safe_too():
    v = ea.early_aux_verdict(summaries(early_aux_shared_flat=run("share", "flat", 28)))
    assert v["necessary_under"] == [] and v["on_vllm_0_33"] == ea.DEFENSIVE
    assert "the flat case is safe too (early_aux_shared_flat)" in "\n".join(ea.early_aux_lines(v))


def test_the_cost_falls_back_to_the_other_shapes_pr_run_and_says_so():
    v = ea.early_aux_verdict(summaries(early_aux_pr=None))
    nested = v["shapes"]["nested"]
    assert (nested["pr"], nested["pr_shape"]) == ("early_aux_pr_flat", "flat")
    assert v["exception_costs"] == 26 * MIB  # 56 under the PR (flat) against 30
    assert "(early_aux_pr_flat, aux flat: no nested run under the PR recorded)" in "\n".join(ea.early_aux_lines(v))


def test_unrecorded_shapes_give_no_verdict():
    v = ea.early_aux_verdict(summaries(early_aux_shared=None, early_aux_shared_flat=None))
    assert v["on_vllm_0_33"] is None and v["necessary_under"] is None and v["exception_costs"] is None
    lines = "\n".join(ea.early_aux_lines(v))
    assert "on vLLM 0.33: not shown" in lines and "the flat case: not recorded" in lines
    assert ea.early_aux_verdict({})["on_vllm_0_33"] is None


def test_the_replica_rows_say_their_return_shape():
    policies = {
        "pr": {"has_early_aux": False, "config": {}},
        "early_aux_shared": {"has_early_aux": True, "config": {}},
        "early_aux_shared_flat": {"has_early_aux": True, "config": {"aux_return": "flat"}},
        "nested": {"has_early_aux": True, "config": {"aux_return": "nested"}},
    }
    shapes = {"early_aux_shared": "flat", "early_aux_shared_flat": "flat", "nested": "nested"}
    assert ea.replica_shapes(policies) == shapes
    lines = ea.replica_shape_lines(policies)
    assert lines[0].endswith("flat, recorded when the replica's weak references recursed into nested outputs "
                             "(hypothetical on vLLM 0.33)")  # fmt: skip
    assert lines[2] == "replica's nested rows: aux handed out nested (vLLM 0.33's own)"


# --- kit safety and demo --vllm print it, from the recordings -------------------------------------


def test_kit_safety_prints_the_early_aux_verdict_from_vllms_recordings(capsys):
    from kit.cli import main
    from kit.experiments.safety_run.result import load_recording

    expected = ea.early_aux_verdict({name: vc.summarize(snap) for name, snap in vr.load_recordings().items()})
    assert main(["safety"]) == 0
    out = capsys.readouterr().out
    for line in ea.early_aux_lines(expected):
        assert line in out
    assert main(["safety", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in data["early_aux_vllm"].items() if k != "source"} == json.loads(json.dumps(expected))
    policies = load_recording("small")["scenarios"]
    assert data["early_aux_shapes"] == ea.replica_shapes(policies) and set(data["early_aux_shapes"]) == {
        p for p, about in policies.items() if about["has_early_aux"]
    }
    assert data["early_aux_vllm"]["on_vllm_0_33"] == ea.DEFENSIVE  # what the shipped recordings show


def test_without_vllm_recordings_kit_safety_says_so(monkeypatch, tmp_path, capsys):
    from kit.cli import main

    monkeypatch.setattr(vr, "recording_path", lambda name: tmp_path / f"{name}.pickle")
    assert main(["safety", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["early_aux_vllm"]["on_vllm_0_33"] is None and "no vLLM recordings" in data["early_aux_vllm"]["source"]

"""The replica, its PR patch and the capture recorder, on the CPU and from the H200 recordings.

The patch mechanism is `kit.patch.pr`; the replay layers `kit.replica.decoder_replay_layers`.

The GPU paths (capture, replay, the live recorder) run in tests/gpu/test_replica.py
on the H200 (`scripts/gpu_tests.sh`); the figures they printed are recorded in
kit/recordings/replica by `scripts/record_replica.py` and asserted here.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import types

import pytest
import torch

import kit.patch.replica as replica_patch
from kit import CaptureRecorder, KitError
from kit.analysis.attribution import capture_table
from kit.experiments.scenarios import SCENARIOS, summarize
from kit.patch.install import Patch
from kit.patch.policy import has_early_aux
from kit.record.recorder import label_from_stack, manager_name
from kit.replica import cudagraph_utils, decoder_replay_cudagraph, model_state, parallel_state
from kit.replica.model import ReplicaConfig
from kit.replica.model_runner import GPUModelRunner
from tests.diff_lines import diff_changes, hunk_changes
from tests.helpers import FIXTURES, MIB, TINY

REPLICA = FIXTURES / "replica"


@pytest.fixture(scope="module")
def recorded() -> dict[str, dict]:
    return {p.stem: summarize(str(p)) for p in sorted(REPLICA.glob("*.pickle"))}


def recorded_config(name: str) -> dict:
    """The replica config a shipped recording ran, as its `kit` key holds it."""
    from kit.load.snapshot import load_snapshot

    return load_snapshot(REPLICA / f"{name}.pickle").kit["scenario"]["config"]


# --- the replica on the CPU -------------------------------------------------


def test_replica_builds_and_runs_eagerly_on_cpu():
    runner = GPUModelRunner(TINY, device="cpu")
    ids = torch.arange(16) % TINY.vocab_size
    out, aux = runner.run(ids, use_cudagraph=False)
    assert out.shape == (16, 64) and len(aux) == 1
    # The replay layers ran on the last half of the rows only: the first half's output is zero.
    assert torch.count_nonzero(out[:8]) == 0 and torch.count_nonzero(out[8:]) > 0
    again, _ = runner.run(ids, use_cudagraph=False)
    assert torch.equal(out, again)


def test_replica_gpu_paths_say_they_need_cuda():
    runner = GPUModelRunner(TINY, device="cpu")
    with pytest.raises(KitError, match="needs CUDA"):
        runner.capture_model()
    with pytest.raises(KitError, match="no graphs captured"):
        runner.run(torch.arange(8), use_cudagraph=True)
    with pytest.raises(KitError, match="capture size"):
        runner.run(torch.arange(10), use_cudagraph=False)


def test_has_early_aux_is_an_aux_layer_before_the_replay_start():
    assert has_early_aux(GPUModelRunner(TINY, "cpu").model_state) is False
    early = ReplicaConfig(**{**TINY.__dict__, "aux_hidden_state_layers": (1, 3)})
    assert has_early_aux(GPUModelRunner(early, "cpu").model_state) is True


@pytest.mark.parametrize(
    "field,value",
    [("decoder_replay_start", 0), ("aux_hidden_state_layers", (9,)), ("cudagraph_capture_sizes", (7,)), ("dtype", "x")],
)
def test_bad_replica_config_is_refused(field, value):
    with pytest.raises(KitError):
        ReplicaConfig(**{**TINY.__dict__, field: value})


# --- the patch --------------------------------------------------------------


def originals() -> list:
    return [
        parallel_state.graph_capture,
        cudagraph_utils.graph_capture,
        cudagraph_utils.CudaGraphManager.capture,
        GPUModelRunner.capture_model,
        model_state.DeepseekV41ModelState.capture_inner_cudagraphs,
        decoder_replay_cudagraph.DecoderReplayCudaGraphManager.capture_replay_graphs,
    ]


def test_patch_replaces_every_target_and_revert_restores_the_originals():
    before = originals()
    patch = replica_patch.apply()
    try:
        after = originals()
        assert all(a is not b for a, b in zip(after, before, strict=True))
        assert cudagraph_utils.graph_capture is parallel_state.graph_capture is patch.rewrites[0].function
        assert replica_patch.apply("share") is patch and originals() == after  # applying twice wraps once
    finally:
        replica_patch.revert()
    assert originals() == before and not replica_patch.is_applied()
    replica_patch.revert()  # a second revert is harmless
    assert originals() == before


def test_patched_block_reverts_after_an_exception():
    before = originals()
    with pytest.raises(RuntimeError, match="inside"), replica_patch.patched("separate"):
        assert originals() != before
        raise RuntimeError("inside")
    assert originals() == before


def test_nested_patched_blocks_put_back_the_outer_policy():
    with replica_patch.patched("pr") as outer:
        with replica_patch.patched("separate") as inner:
            assert inner is outer and outer.policy == "separate"
        assert outer.policy == "pr" and replica_patch.is_applied()
    assert not replica_patch.is_applied()


def test_a_patch_that_fails_midway_leaves_nothing_patched():
    class Owner:
        first = staticmethod(lambda: "first")

        def __setattr__(self, name, value):
            if name == "second":
                raise RuntimeError("read-only")
            object.__setattr__(self, name, value)

    owner = Owner()
    object.__setattr__(owner, "second", "second")
    original = owner.first
    with pytest.raises(RuntimeError, match="read-only"):
        Patch("test", [(owner, "first", "new"), (owner, "second", "new")]).apply()
    assert owner.first is original and owner.second == "second"
    with pytest.raises(KitError, match="no attribute 'missing'"):
        Patch("test", [(owner, "first", "new"), (owner, "missing", "new")]).apply()
    assert owner.first is original


def test_unknown_policy_is_refused_before_patching():
    before = originals()
    with pytest.raises(KitError, match="unknown stream policy"):
        replica_patch.apply("sometimes")
    assert originals() == before


class StandInReplayGraphs:
    """Stands in for the CUDA-only replay graph manager: records the stream it is handed."""

    graphs_captured = False

    def capture_replay_graphs(self, prepare, stream=None):
        self.stream = stream


@pytest.mark.parametrize(
    "policy,early_aux,shared",
    [("pr", False, True), ("pr", True, False), ("share", True, True), ("separate", False, False)],
)
def test_patched_capture_inner_cudagraphs_hands_the_stream_on_by_policy(policy, early_aux, shared):
    aux = (1, 3) if early_aux else (3,)
    runner = GPUModelRunner(ReplicaConfig(**{**TINY.__dict__, "aux_hidden_state_layers": aux}), "cpu")
    runner.model_state.replay_cudagraphs = stand_in = StandInReplayGraphs()
    model_stream = object()  # stands in for the model graphs' CUDA stream
    with replica_patch.patched(policy) as patch:
        runner.model_state.capture_inner_cudagraphs(stream=model_stream)
    assert (stand_in.stream is model_stream) is shared
    assert shared or stand_in.stream is None
    decision = patch.decisions[-1]
    assert (decision.model_state, decision.early_aux, decision.shared) == ("DeepseekV41ModelState", early_aux, shared)


@pytest.mark.parametrize(
    "policy,aux,shared",
    [
        (None, (3,), False),
        ("pr", (3,), True),
        ("pr", (1, 3), False),
        ("share", (1, 3), True),
        ("separate", (3,), False),
    ],
)
def test_capture_model_puts_the_replay_graphs_on_the_stream_the_policy_picks(monkeypatch, policy, aux, shared):
    """The whole capture path, unpatched and patched, with CUDA stood in for (tests/test_faults.py's FakeCuda)."""
    from tests.test_faults import FakeCuda

    FakeCuda(monkeypatch)
    config = ReplicaConfig(**{**TINY.__dict__, "aux_hidden_state_layers": aux, "dtype": "float32"})
    runner = GPUModelRunner(config, "cpu")
    state = runner.model_state
    state.replay_cudagraphs = decoder_replay_cudagraph.DecoderReplayCudaGraphManager(
        runner.device, state.decoder_replay_layers, config.decoder_replay_cudagraph_capture_sizes, 64, torch.float32
    )
    monkeypatch.setattr(runner, "device", torch.device("cuda"))  # capture_model's check; the rest stays on the CPU
    with replica_patch.patched(policy) if policy else contextlib.nullcontext(), CaptureRecorder() as rec:
        runner.capture_model()
    streams = {r.manager: r.stream for r in rec.records}
    sizes = {m: sorted(r.size for r in rec.records if r.manager == m) for m in streams}
    assert sizes == {"model graphs": [8, 8, 16, 16], "replay graphs": [4, 8]}  # a model graph: two segments
    assert (streams["replay graphs"] == streams["model graphs"]) is shared
    assert not replica_patch.is_applied()


def test_the_replica_takes_the_prs_own_hunks_where_its_lines_are_vllms():
    import kit.patch.vllm as patch_vllm

    vllm_hunks = {hunk for target in patch_vllm.TARGETS for hunk in target.hunks}
    shared = [hunk for target in replica_patch.TARGETS for hunk in target.hunks if hunk in vllm_hunks]
    assert len(shared) == 5  # graph_capture's two, capture()'s signature, the replay graphs' call and capture
    with replica_patch.patched() as patch:
        table = patch.table()
        assert list(table["function"]) == [target.where for target in replica_patch.TARGETS]
        assert table["defined in"].str.match(r"kit/replica/\w+\.py:\d+$").all()
        assert table["installed in"][0] == "kit.replica.parallel_state, kit.replica.cudagraph_utils"
        for target, rw in zip(replica_patch.TARGETS, patch.rewrites, strict=True):
            takes_stream = "stream" in inspect.signature(rw.function).parameters
            assert takes_stream == (target.qualname != "GPUModelRunner.capture_model")
            # every other line is the replica's own: the diff changes exactly what the hunks change
            assert diff_changes(rw.diff()) == hunk_changes(target.hunks), target.where
    assert "stream=replay_stream(self, stream)" in replica_patch.diff()


# --- the capture recorder's labels -------------------------------------------


def test_manager_names_from_name_or_class():
    assert manager_name(types.SimpleNamespace(name="replay graphs")) == "replay graphs"

    class DecoderReplayCudaGraphManager:
        pass

    class ModelCudaGraphManager:
        pass

    assert manager_name(DecoderReplayCudaGraphManager()) == "decoder replay graphs"
    assert manager_name(ModelCudaGraphManager()) == "model graphs"


def test_caller_label_finds_the_manager_and_size_on_the_stack():
    class EagleCudaGraphManager:
        def capture(self):
            num_tokens = 64  # noqa: F841 - read off the frame by the recorder
            return begin()

    def begin():
        return hook()

    def hook():  # capture_begin's wrapper: the recorder looks from its caller up
        return label_from_stack()

    assert EagleCudaGraphManager().capture() == ("eagle graphs", 64)
    assert hook() is None

    class ModelCudaGraphManager:  # vLLM's loop: `for desc in descs:`, the size in desc.num_tokens
        def capture(self):
            desc = types.SimpleNamespace(num_tokens=512)  # noqa: F841 - read off the frame
            return begin()

    assert ModelCudaGraphManager().capture() == ("model graphs", 512)


# --- the H200 recordings ----------------------------------------------------


def test_every_scenario_is_recorded_with_provenance(recorded):
    manifest = json.loads((REPLICA / "PROVENANCE.json").read_text())
    expected = {f"small_{n}.pickle" for n in SCENARIOS} | {"large_unpatched.pickle", "large_patched.pickle"}
    assert expected <= set(manifest)
    assert all(recorded_config(name)["aux_return"] in ("nested", "flat") for name in recorded)  # the shape named
    for name in expected:
        prov = manifest[name]
        assert prov["gpu"].startswith("NVIDIA") and prov["torch"] and prov["date"]
        assert prov["command"] == "python scripts/record_replica.py --out kit/recordings/replica"


@pytest.mark.parametrize("preset", ["small", "large"])
def test_unpatched_replay_graphs_get_a_mostly_free_group_of_their_own(recorded, preset):
    s = recorded[f"{preset}_unpatched"]
    assert s["replay_stream_names"] == ["replay graphs stream"]
    group = s["replay_group"]
    assert group is not None and group["reserved"] > 0
    assert group["free"] >= 0.9 * group["reserved"]
    assert s["replay_added_by_stream"] == {"replay graphs stream": group["reserved"]}


@pytest.mark.parametrize("preset", ["small", "large"])
def test_patched_replay_graphs_add_no_graph_pool_segment_and_the_model_group_does_not_grow(recorded, preset):
    unpatched, patched = recorded[f"{preset}_unpatched"], recorded[f"{preset}_patched"]
    assert patched["replay_stream_names"] == ["model graphs stream"]
    assert patched["replay_group"] is None
    assert patched["replay_added_bytes"] == 0
    assert patched["model_group"]["reserved"] == unpatched["model_group"]["reserved"]
    saved = unpatched["graph_pool_bytes"] - patched["graph_pool_bytes"]
    assert saved == unpatched["replay_group"]["reserved"]


def test_graphs_equal_eager_except_early_aux_forced_to_share(recorded):
    # V4.1's nested aux list forced to share is bit-exact: vLLM's wrapper keeps the aux blocks allocated.
    safe = ("small_unpatched", "small_patched", "small_early_aux_pr", "small_early_aux_shared")
    for name in (*safe, "large_unpatched", "large_patched"):
        assert recorded[name]["bit_exact"] is True, name
        assert recorded[name]["max_abs_diff"] == 0
    forced = recorded["small_early_aux_shared_flat"]
    assert forced["bit_exact"] is False and forced["max_abs_diff"] > 0
    assert forced["replay_stream_names"] == ["model graphs stream"]
    # The flags above are what the GPU measured (provenance). Computed here from each recording's trace instead: a
    # replay graph that runs in a model graph's break allocates over a block the model graph holds after it
    # exactly where the graphs differed from eager, at the same capture sizes, and its block is the early aux state.
    from kit import liveness_table
    from kit.analysis.liveness import HELD
    from kit.experiments.dispatch import dispatch_replay_size
    from kit.load.snapshot import load_snapshot
    from kit.replica.model import PRESETS, replay_rows

    for name in recorded:
        snap = load_snapshot(REPLICA / f"{name}.pickle")
        sizes = PRESETS[name.split("_")[0]].decoder_replay_cudagraph_capture_sizes

        def replay_size_for(n: int, sizes=sizes) -> int | None:  # the replay graph the default step's rows pad to
            return dispatch_replay_size(replay_rows(n), sizes)

        table = liveness_table(snap, replay_size_for=replay_size_for).rows
        differs = [r for r in snap.kit["equivalence"] if not r["bit_exact"]]
        assert set(table[table["conflict"]]["capture_size"]) == {r["size"] for r in differs}, name
        assert (table[table["conflict"]]["class"] == HELD).all(), name
    assert {
        r["output"]
        for r in load_snapshot(REPLICA / "small_early_aux_shared_flat.pickle").kit["equivalence"]
        if not r["bit_exact"]
    } == {"aux_hidden_state[1]"}


def test_early_aux_under_the_pr_keeps_the_replay_graphs_on_their_own_stream(recorded):
    s = recorded["small_early_aux_pr"]
    assert s["policy"] == "pr" and s["replay_stream_names"] == ["replay graphs stream"]
    assert s["replay_group"] is not None


def test_large_preset_saves_hundreds_of_mib(recorded):
    saved = recorded["large_unpatched"]["graph_pool_bytes"] - recorded["large_patched"]["graph_pool_bytes"]
    assert saved > 256 * MIB


def test_capture_table_labels_each_capture(recorded):
    from kit.load.snapshot import load_snapshot

    snap = load_snapshot(REPLICA / "small_unpatched.pickle")
    table = capture_table(snap)
    assert set(table["manager"]) == {"model graphs", "replay graphs"}
    model_sizes = sorted(table[table["manager"] == "model graphs"]["size"])
    assert model_sizes == [128, 256, 512]
    assert sorted(table[table["manager"] == "replay graphs"]["size"]) == [96, 192, 288, 384, 480, 512]
    # Each breakable capture is two graph segments around the replay layers' eager break.
    assert set(table[table["manager"] == "model graphs"]["graphs"]) == {2}
    replay = table[table["manager"] == "replay graphs"]
    assert replay["new_segment_bytes"].sum() == recorded["small_unpatched"]["replay_group"]["reserved"]


def test_demo_command_prints_the_recorded_figures(capsys):
    from kit.cli import main

    assert main(["demo", "--preset", "large"]) == 0
    out = capsys.readouterr().out
    saved = (
        summarize(REPLICA / "large_unpatched.pickle")["graph_pool_bytes"]
        - summarize(REPLICA / "large_patched.pickle")["graph_pool_bytes"]
    )
    assert f"graph pool saved by the patch: {saved / 2**30:.3f} GiB ({saved} bytes)" in out
    assert "recorded on NVIDIA H" in out and "torch 2.11.0" in out  # each recording's provenance


@pytest.mark.parametrize("preset", ["small", "large"])
def test_what_if_from_the_unpatched_trace_predicts_the_patched_graph_pool(preset):
    from kit import segment_table, what_if
    from kit.load.snapshot import load_snapshot

    unpatched = load_snapshot(REPLICA / f"{preset}_unpatched.pickle")
    patched = load_snapshot(REPLICA / f"{preset}_patched.pickle")
    result = what_if(unpatched, {"replay graphs stream": "model graphs stream"})
    pool = tuple(unpatched.kit["pools"]["global graph pool"])
    predicted = result.predicted[result.predicted["pool"] == pool]["reserved"].sum()
    measured = segment_table(patched)
    assert predicted == measured[measured["pool"] == tuple(patched.kit["pools"]["global graph pool"])]["reserved"].sum()
    assert result.saved[pool] == summarize(unpatched)["replay_group"]["reserved"]


def test_eager_breaks_allocate_outside_the_graph_pool():
    """What a break allocates (its output buffers, the gathered rows) lands in the default pool."""
    from kit.analysis.trace.walk import walk_trace
    from kit.load.snapshot import load_snapshot

    snap = load_snapshot(REPLICA / "small_unpatched.pickle")
    allocs = walk_trace(snap).allocs
    graphs = [g for g in snap.kit["captures"] if g["manager"] == "model graphs"]
    in_breaks = 0
    for before, after in zip(graphs, graphs[1:], strict=False):
        if after["capture"] != before["capture"]:
            continue
        window = allocs[(allocs["index"] >= before["trace_end"]) & (allocs["index"] < after["trace_begin"])]
        in_breaks += len(window)
        assert {tuple(p) for p in window["pool"]} == {(0, 0)}
    assert in_breaks > 0
    graph_pool = tuple(snap.kit["pools"]["global graph pool"])
    in_graphs = allocs[[any(g["trace_begin"] <= i < g["trace_end"] for g in graphs) for i in allocs["index"]]]
    outside = in_graphs[[tuple(p) != graph_pool for p in in_graphs["pool"]]]
    # Only torch's own bookkeeping: the first capture_begin registers 8-byte RNG state tensors.
    assert len(outside) <= 2 and (outside["size"] <= 8).all()
    assert len(in_graphs) > len(outside)


def test_reading_the_stack_keeps_no_local_alive_past_its_rebinding():
    """The recorder's stack walk must not lengthen lifetimes (it would change what the allocator reuses)."""
    import gc
    import weakref

    from kit.record.recorder import label_from_stack

    class Tensor:
        pass

    def forward():
        hidden_states = Tensor()
        first = weakref.ref(hidden_states)
        label_from_stack()  # what capture_begin does at the next graph segment
        hidden_states = Tensor()  # the forward rebinds its hidden states after the break
        gc.collect()
        return first() is None, hidden_states

    freed, still_bound = forward()
    assert freed
    assert isinstance(still_bound, Tensor)

"""PR 63155 applied to the installed vLLM 0.33.0, checked on vLLM's own capture path.

The functions under test are vLLM's, as installed and as patched; only CUDA
streams, process groups and the model are stood in for (tests/vllm_standins.py).
"""

from __future__ import annotations

import ast
import gc
import importlib
import inspect
import sys
from pathlib import Path

import pytest
import vllm  # installed by `make venv`: these tests never skip
from vllm.distributed import parallel_state
from vllm.v1.worker.gpu import cudagraph_utils

import kit.patch.vllm as patch_vllm
from kit.errors import KitError
from kit.patch.policy import has_early_aux
from kit.record.recorder import label_from_stack, manager_name
from tests import vllm_standins as standin
from tests.diff_lines import diff_changes, hunk_changes
from tests.helpers import run_kit

VLLM_ROOT = Path(vllm.__file__).parent


def _installed() -> dict[str, object]:
    """Every object the patch may replace, by where it lives."""
    found = {}
    for target in patch_vllm.TARGETS:
        owner = importlib.import_module(target.module)
        *classes, name = target.qualname.split(".")
        for cls in classes:
            owner = getattr(owner, cls)
        found[target.where] = vars(owner)[name]
    for module in list(sys.modules.values()):
        if "graph_capture" in getattr(module, "__dict__", {}) and module.__name__.startswith("vllm"):
            found[f"{module.__name__}.graph_capture"] = module.graph_capture
    return found


@pytest.fixture(autouse=True)
def nothing_left_patched():
    before = _installed()
    yield
    patch_vllm.revert()
    assert not patch_vllm.is_applied()
    after = _installed()
    assert {k: after[k] for k in before} == before
    assert all(after[k] is parallel_state.graph_capture for k in after.keys() - before.keys())  # modules imported since
    assert "capture_stream" not in vars(cudagraph_utils.CudaGraphManager)


@pytest.fixture
def cuda(monkeypatch):
    cuda = standin.StandInCuda(monkeypatch)
    standin.install_groups(monkeypatch)
    standin.install_workspace(monkeypatch)
    cuda.entered = standin.spy_group_capture(monkeypatch)
    return cuda


def test_the_installed_vllm_is_the_one_the_patch_is_written_for():
    assert vllm.__version__ == patch_vllm.SUPPORTED_VERSION


# --- where the patched functions come from ------------------------------------


def _modules_importing_graph_capture_by_name() -> set[str]:
    """vLLM modules with a module-level `from ... parallel_state import graph_capture` (or from vllm.distributed)."""
    names = set()
    for path in VLLM_ROOT.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.module in ("vllm.distributed.parallel_state", "vllm.distributed"):
                if any(alias.name == "graph_capture" for alias in node.names):
                    rel = path.relative_to(VLLM_ROOT.parent).with_suffix("")
                    names.add(".".join(rel.parts).removesuffix(".__init__"))
    return names


@pytest.mark.slow
def test_every_module_that_imported_graph_capture_by_name_gets_the_patched_one():
    importers = _modules_importing_graph_capture_by_name()
    assert "vllm.v1.worker.gpu.cudagraph_utils" in importers
    for name in importers:
        importlib.import_module(name)
    with patch_vllm.patched() as patch:
        patched = parallel_state.graph_capture
        assert "stream" in inspect.signature(patched).parameters
        for name in importers:
            assert sys.modules[name].graph_capture is patched, name
        assert set(importers) <= set(patch.installed[f"{parallel_state.__name__}.graph_capture"])


def test_a_module_imported_while_patched_is_restored_on_revert():
    with patch_vllm.patched() as patch:
        late = type(sys)("late_importer")
        late.graph_capture = parallel_state.graph_capture  # what `from ... import graph_capture` does now
        sys.modules["late_importer"] = late
    try:
        assert late.graph_capture is patch.rewrites[0].original
    finally:
        del sys.modules["late_importer"]


def test_each_patched_function_is_the_installed_one_with_the_prs_edits():
    with patch_vllm.patched() as patch:
        table = patch.table()
        assert list(table["function"]) == [t.where for t in patch_vllm.TARGETS]
        for target, rw in zip(patch_vllm.TARGETS, patch.rewrites, strict=True):
            new = inspect.unwrap(rw.function)
            assert (new.__module__, new.__qualname__) == (target.module, target.qualname)
            assert Path(inspect.getsourcefile(inspect.unwrap(rw.original))).is_relative_to(VLLM_ROOT)
            assert new.__code__.co_filename == f"<PR 63155: {target.where}>"
            takes_stream = "stream" in inspect.signature(rw.function).parameters
            assert takes_stream == (target.qualname != "GPUModelRunner.capture_model")
            # Every installed line is kept: the diff removes and adds exactly the lines the PR's hunks change.
            assert diff_changes(rw.diff()) == hunk_changes(target.hunks), target.where
        assert table["defined in"].str.contains(r"vllm/.+\.py:\d+$").all()
    assert "stream=self.cudagraph_manager.capture_stream" in patch_vllm.diff()


def test_the_command_line_prints_the_diff():
    run = run_kit("vllm-diff")  # in this process, where vLLM is imported already
    assert run.returncode == 0, run.stderr[-2000:]
    assert "+++ vllm.distributed.parallel_state.graph_capture (PR 63155)" in run.stdout
    assert "capture_replay_graphs(prepare, stream=replay_stream(self, stream))" in run.stdout


# --- graph_capture and CudaGraphManager.capture ---------------------------------


def test_installed_graph_capture_makes_a_new_stream_every_time(cuda):
    with parallel_state.graph_capture(device="cpu") as first, parallel_state.graph_capture(device="cpu") as second:
        assert first.stream is not second.stream
    assert cuda.made == [first.stream, second.stream]


def test_the_given_stream_reaches_every_group_coordinator(cuda):
    stream = standin.StandInStream()
    with patch_vllm.patched():
        with parallel_state.graph_capture("cpu", stream=stream) as context:
            assert context.stream is stream
            assert torch_current_stream() is stream  # made current by GroupCoordinator.graph_capture
        assert cuda.entered == [("tp", stream), ("pp", stream), ("dp", stream)]
        assert cuda.made == []
        with parallel_state.graph_capture("cpu") as context:  # no stream: a new one, as before
            assert cuda.made == [context.stream]


def torch_current_stream():
    import torch

    return torch.cuda.current_stream()


def _recording_forward_fn(calls):
    def create_forward_fn(desc, warmup):
        def forward_fn(cg_mode):
            calls.append((desc.num_tokens, warmup, cg_mode.name, torch_current_stream(), label_from_stack()))

        return forward_fn

    return create_forward_fn


def test_capture_runs_on_the_given_stream_and_records_it(cuda):
    from vllm.models.deepseek_v41.nvidia.decoder_replay_cudagraph import DecoderReplayCudaGraphManager

    stream = standin.StandInStream()
    calls: list = []
    manager = standin.manager(DecoderReplayCudaGraphManager, sizes=(128, 256))
    with patch_vllm.patched():
        assert manager.capture_stream is None
        manager.capture(_recording_forward_fn(calls), stream=stream)
        assert manager.capture_stream is stream
        other = standin.manager(DecoderReplayCudaGraphManager, sizes=(128,))
        other.capture(_recording_forward_fn([]))
        assert other.capture_stream is cuda.made[0]
    assert {c[3] for c in calls} == {stream}
    assert [c[:3] for c in calls] == [
        (256, True, "NONE"),
        (256, True, "PIECEWISE"),
        (128, True, "NONE"),
        (128, True, "PIECEWISE"),
    ]
    # The recorder's label, read off vLLM's own capture frames.
    assert [c[4] for c in calls] == [("decoder replay graphs", 256)] * 2 + [("decoder replay graphs", 128)] * 2


# --- capture_model: who gets which stream ----------------------------------------


def _streams(runner):
    return (
        runner.cudagraph_manager.capture_stream,
        runner.model_state.replay_cudagraphs.capture_stream,
        runner.speculator.cudagraph_manager.capture_stream,
    )


def test_installed_capture_model_gives_every_capture_a_new_stream(cuda):
    runner = standin.deepseek_runner()
    runner.capture_model()
    streams = [s for _, s in cuda.entered[::3]]  # tp, pp, dp see the same stream per capture
    assert len(streams) == 3 and len(set(map(id, streams))) == 3
    assert cuda.made == streams


@pytest.mark.parametrize("specialized", [False, True], ids=["DeepseekV41ModelState", "SpecializedDecode"])
def test_the_replay_graphs_get_the_model_graphs_stream(cuda, specialized):
    runner = standin.deepseek_runner(aux=(37, 38, 39), replay_start=20, specialized=specialized)
    with patch_vllm.patched() as patch:
        runner.capture_model()
        model, replay, speculator = _streams(runner)
    assert model is cuda.made[0]
    assert replay is model
    assert speculator is cuda.made[1] and speculator is not model  # the speculator keeps its own
    assert [s for _, s in cuda.entered[::3]] == [model, model, speculator]
    decision = patch.decisions[-1]
    assert decision.model_state == type(runner.model_state).__qualname__
    assert (decision.early_aux, decision.shared) == (False, True)


@pytest.mark.parametrize("specialized", [False, True], ids=["DeepseekV41ModelState", "SpecializedDecode"])
def test_with_early_aux_the_replay_graphs_keep_their_own_stream(cuda, specialized):
    runner = standin.deepseek_runner(aux=(10, 38), replay_start=20, specialized=specialized)
    with patch_vllm.patched() as patch:
        runner.capture_model()
        model, replay, speculator = _streams(runner)
    assert len({id(model), id(replay), id(speculator)}) == 3
    assert cuda.made == [model, replay, speculator]
    assert (patch.decisions[-1].early_aux, patch.decisions[-1].shared) == (True, False)


def test_an_aux_layer_at_the_replay_start_is_made_inside_the_replay_layers(cuda):
    runner = standin.deepseek_runner(aux=(20,), replay_start=20)
    assert has_early_aux(runner.model_state) is False
    with patch_vllm.patched():
        runner.capture_model()
        model, replay, _ = _streams(runner)
    assert replay is model


def test_policies_override_the_early_aux_rule(cuda):
    with patch_vllm.patched(policy="share"):
        runner = standin.deepseek_runner(aux=(10,), replay_start=20)
        runner.capture_model()
        model, replay, _ = _streams(runner)
        assert replay is model
    with patch_vllm.patched(policy="separate"):
        runner = standin.deepseek_runner()
        runner.capture_model()
        model, replay, _ = _streams(runner)
        assert replay is not model
    with pytest.raises(KitError, match="unknown stream policy"):
        patch_vllm.apply(policy="sometimes")


def test_a_model_whose_aux_layers_cannot_be_read_keeps_the_replay_stream_apart(cuda):
    runner = standin.deepseek_runner()
    runner.model_state.model = standin.StandInModel(standin.StandInBackbone(None, (), 0))  # not the state's layers
    assert has_early_aux(runner.model_state) is None
    with patch_vllm.patched() as patch:
        runner.capture_model()
        model, replay, _ = _streams(runner)
    assert replay is not model
    assert "not found" in patch.decisions[-1].reason


# --- apply and revert ---------------------------------------------------------------


def test_revert_restores_every_original_and_applying_twice_wraps_once():
    before = _installed()
    first = patch_vllm.apply()
    after_first = _installed()
    assert all(after_first[k] is not before[k] for k in before if k.endswith(("graph_capture", "capture_model")))
    assert patch_vllm.apply() is first
    assert _installed() == after_first
    assert (
        inspect.unwrap(cudagraph_utils.CudaGraphManager.capture).__kit_original__
        is before["vllm.v1.worker.gpu.cudagraph_utils.CudaGraphManager.capture"]
    )
    first.revert()
    assert _installed() == before
    first.revert()  # reverting twice is harmless
    assert _installed() == before


def test_an_exception_inside_leaves_nothing_patched():
    before = _installed()
    with pytest.raises(RuntimeError, match="inside"):
        with patch_vllm.apply():
            assert patch_vllm.is_applied()
            raise RuntimeError("inside")
    assert not patch_vllm.is_applied() and _installed() == before
    with pytest.raises(KeyboardInterrupt):
        with patch_vllm.patched():
            raise KeyboardInterrupt
    assert not patch_vllm.is_applied() and _installed() == before


def _unsupported(monkeypatch, owner, name, replacement):
    if replacement is None:
        monkeypatch.delattr(owner, name)
    else:
        monkeypatch.setattr(owner, name, replacement)


def _capture_model_without_inner_capture(self, *, profile_only: bool = False) -> int:
    return 0


def _graph_capture_with_stream(device, stream=None):
    raise AssertionError("never called")


def _capture_with_other_signature(self, create_forward_fn, desc=None):
    raise AssertionError("never called")


@pytest.mark.parametrize(
    "target, replacement, message",
    [
        ("DecoderReplayCudaGraphManager.capture_replay_graphs", None, "capture_replay_graphs is missing"),
        ("CudaGraphManager.capture", _capture_with_other_signature, r"\(self, create_forward_fn, desc\) differs"),
        ("GPUModelRunner.capture_model", _capture_model_without_inner_capture, "`self.model_state.capture_inner"),
        ("graph_capture", _graph_capture_with_stream, "already has PR 63155's change"),
    ],
)
def test_an_unsupported_vllm_is_refused_and_nothing_is_patched(monkeypatch, target, replacement, message):
    where = next(t for t in patch_vllm.TARGETS if t.qualname == target)
    owner = importlib.import_module(where.module)
    *classes, name = target.split(".")
    for cls in classes:
        owner = getattr(owner, cls)
    before = _installed()
    _unsupported(monkeypatch, owner, name, replacement)
    with pytest.raises(KitError, match=message) as error:
        patch_vllm.apply()
    assert "\n" not in str(error.value) and "nothing" in str(error.value)
    assert not patch_vllm.is_applied()
    monkeypatch.undo()
    assert _installed() == before


@pytest.mark.parametrize("depth", [1, 2], ids=["child", "grandchild"])
def test_a_loaded_model_state_that_takes_no_stream_is_refused(depth):
    """An out-of-tree model state written for vLLM 0.33, right below ModelState or below a class of its own."""
    from vllm.v1.worker.gpu.model_states.interface import ModelState

    def capture_inner_cudagraphs(self, input_buffers, block_tables, attn_groups, kv_cache_config):
        return None

    above = ModelState
    for _ in range(depth - 1):
        above = type("PluginBase", (above,), {})  # no override of its own
    plugin = type("PluginModelState", (above,), {"capture_inner_cudagraphs": capture_inner_cudagraphs})
    try:
        with pytest.raises(KitError, match="PluginModelState.capture_inner_cudagraphs takes no stream"):
            patch_vllm.apply()
        assert not patch_vllm.is_applied()
    finally:
        del plugin, above
        gc.collect()
    patch_vllm.apply().revert()


# --- the recorder's names for vLLM's managers -------------------------------------


def test_the_recorder_names_every_vllm_graph_manager():
    from vllm.models.deepseek_v41.nvidia.decoder_replay_cudagraph import DecoderReplayCudaGraphManager
    from vllm.v1.worker.encoder_cudagraph import EncoderCudaGraphManager
    from vllm.v1.worker.gpu.spec_decode.dflash.cudagraph import DFlashCudaGraphManager
    from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.cudagraph_utils import SpeculatorCudaGraphManager

    names = {
        cls.__name__: manager_name(object.__new__(cls))
        for cls in (
            cudagraph_utils.ModelCudaGraphManager,
            DecoderReplayCudaGraphManager,
            SpeculatorCudaGraphManager,
            DFlashCudaGraphManager,
            EncoderCudaGraphManager,
        )
    }
    assert names == {
        "ModelCudaGraphManager": "model graphs",
        "DecoderReplayCudaGraphManager": "decoder replay graphs",
        "SpeculatorCudaGraphManager": "speculator graphs",
        "DFlashCudaGraphManager": "DFlash speculator graphs",
        "EncoderCudaGraphManager": "encoder graphs",
    }

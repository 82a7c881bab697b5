"""vLLM's own capture path from its sources (scripts/vllm_bundle.py, the stubs, kit.experiments.vllm.capture).

On the CPU: the bundle's sources are checked against the wheel's RECORD, the
stubs raise when used and only then, the capture modules import, the
stand-in model has V4.1's break, and vLLM's own `GPUModelRunner.capture_model`
runs end to end around it with CUDA streams and graphs stood in, unpatched
and under `kit.patch.vllm`. The real graphs are on the H200
(tests/test_vllm_recording.py reads what it recorded).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kit.errors import KitError
from kit.experiments.vllm import capture as vc
from kit.experiments.vllm import recordings as vr
from tests.vllm_standins import StandInCuda, StandInGraph

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import vllm_bundle  # noqa: E402

STUBS = sorted(p.name for p in vc.STUBS.iterdir() if (p / "__init__.py").is_file())  # the packaged stubs


def fake_site(tmp_path: Path, text: str = "x = 1\n") -> tuple[Path, Path]:
    site, info = tmp_path / "site", tmp_path / "site" / "vllm-0.33.0.dist-info"
    (site / "vllm").mkdir(parents=True)
    info.mkdir()
    (site / "vllm" / "a.py").write_text(text)
    (info / "METADATA").write_text("Name: vllm\nVersion: 0.33.0\n")
    digest = vllm_bundle.record_hash(b"x = 1\n")
    (info / "RECORD").write_text(f"vllm/a.py,{digest},6\nvllm/b.so,sha256=abc,3\n")
    return site, info


def test_record_hash_is_the_wheel_format():
    # RECORD's form of sha256(b""): urlsafe base64, no padding.
    assert vllm_bundle.record_hash(b"") == "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"


def test_sources_are_taken_only_when_they_match_the_record(tmp_path):
    site, info = fake_site(tmp_path)
    files = dict(vllm_bundle.checked_sources(site, info))
    assert files["vllm/a.py"] == b"x = 1\n" and "vllm-0.33.0.dist-info/METADATA" in files
    assert not any(name.endswith(".so") for name in files)
    (site / "vllm" / "a.py").write_text("x = 2\n")
    with pytest.raises(SystemExit, match="vllm/a.py: sha256 differs from the wheel's RECORD"):
        vllm_bundle.checked_sources(site, info)


def test_the_compiled_extensions_are_read_from_the_record(tmp_path):
    site, info = fake_site(tmp_path)
    with open(info / "RECORD", "a") as f:
        f.write("vllm/sub/_ext_C.abi3.so,sha256=abc,3\nother/x.so,sha256=abc,3\nvllm/c.py,sha256=abc,3\n")
    assert vllm_bundle.extension_modules(info) == ["vllm.b", "vllm.sub._ext_C"]
    # The installed wheel's, which the bundle lists and the GPU machine stands in.
    installed = vllm_bundle.extension_modules(vllm_bundle.installed_vllm()[1])
    assert {"vllm._C_stable_libtorch", "vllm._moe_C_stable_libtorch", "vllm.cumem_allocator"} <= set(installed)
    assert "vllm.vllm_flash_attn._vllm_fa3_C" in installed
    (tmp_path / "bundle").mkdir()
    manifest = vllm_bundle.manifest(tmp_path / "bundle", 1, installed)
    assert manifest["extensions"] == installed


def test_the_installed_vllm_sources_match_its_wheel():
    site, info = vllm_bundle.installed_vllm()
    files = vllm_bundle.checked_sources(site, info)
    names = {name for name, _ in files}
    assert len(names) > 3000
    assert "vllm/v1/worker/gpu/cudagraph_utils.py" in names
    assert "vllm/models/deepseek_v41/nvidia/decoder_replay_cudagraph.py" in names


def test_check_refuses_a_bundle_that_differs_from_its_manifest(tmp_path):
    (tmp_path / "a.whl").write_bytes(b"wheel")
    entry = {"bytes": 5, "sha256": hashlib.sha256(b"wheel").hexdigest()}
    (tmp_path / "MANIFEST.json").write_text(json.dumps({"files": {"a.whl": entry}, "source_files_checked": 1}))
    assert vllm_bundle.check(tmp_path)["files"]["a.whl"] == entry
    (tmp_path / "a.whl").write_bytes(b"other")
    with pytest.raises(SystemExit, match="a.whl is missing or differs"):
        vllm_bundle.check(tmp_path)
    with pytest.raises(SystemExit, match="no bundle at"):
        vllm_bundle.check(tmp_path / "none")


def test_every_wheel_and_stub_is_listed_with_why_in_the_docs():
    docs = (ROOT / "docs" / "vllm.md").read_text()
    for name in [*vllm_bundle.WHEELS, *STUBS]:
        assert f"`{name}`" in docs, name
    assert set(STUBS) >= {"openai_harmony", "xgrammar", "fastapi", "cutlass"}


def run_with_stubs(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh Python whose first import path is the stubs (they shadow what .venv has)."""
    prelude = f"import sys; sys.path.insert(0, {str(vc.STUBS)!r})\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True)


@pytest.mark.parametrize("name", STUBS)
def test_a_stub_raises_when_called(name):
    done = run_with_stubs(f"""
        import {name}, {name}.some.submodule as sub
        from _vllm_stub import StubCalled
        assert {name}.__vllm_stub__ and {name}.__doc__.startswith("Stub of")
        thing = {name}.Anything
        assert isinstance(thing, type) and not isinstance(object(), thing)

        def use():  # in a function, as the capture path would call it
            for call in (thing.method, lambda: sub.Other(1)):
                try:
                    call()
                except StubCalled as e:
                    print("raised:", e)

        use()
    """)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith(f"raised: {name}.") for line in lines)


def test_a_stub_used_by_a_module_body_gives_an_inert_value_and_a_pydantic_field():
    done = run_with_stubs("""
        import xgrammar, pydantic, _vllm_stub
        CONSTANT = xgrammar.AnyTextFormat()          # vllm.parser.harmony does this at import

        class Kernel:
            @xgrammar.jit                             # vllm's CUTLASS kernels do this in class bodies
            def run(self):
                pass

        class Model(pydantic.BaseModel):
            grammar: xgrammar.Grammar | None = None

        assert Model(grammar=3).grammar == 3
        print(_vllm_stub.IMPORT_TIME_VALUES)
        def later():
            return xgrammar.AnyTextFormat()
        later()
    """)
    assert "['xgrammar.AnyTextFormat', 'xgrammar.jit']" in done.stdout
    assert done.returncode == 1 and "StubCalled: xgrammar.AnyTextFormat was called, but it is a stub" in done.stderr


def test_every_capture_module_imports_here():
    results = vc.probe()
    assert [r["module"] for r in results if r["module"] != vc.STAND_IN_STEP] == list(vc.CAPTURE_MODULES)
    assert all(r["ok"] for r in results), [r for r in results if not r["ok"]]
    # The stand-ins go in once vllm.platforms has imported, before anything that calls them.
    assert [r["module"] for r in results].index(vc.STAND_IN_STEP) == 2
    stood_in = results[2]["stood_in"]
    assert not any(isinstance(v, dict) and "error" in v for v in stood_in.values()), stood_in


def test_the_platform_is_the_one_this_process_has():
    """Under tests/vllm_cuda_emulation.py, vLLM's CUDA platform with its compiled parts stood in, as on the H200."""
    import vllm.platforms

    stood_in = vc.import_vllm()
    emulated = bool(os.environ.get("KIT_VLLM_CUDA_EMULATED"))
    assert (stood_in["platform"] == "NvmlCudaPlatform") is emulated
    assert vllm.platforms.current_platform.is_cuda() is emulated
    assert torch.ops._C.cutlass_scaled_mm_supports_fp8(90) is False
    if emulated:
        stub = sys.modules["_vllm_stub"]
        assert stub.EXTENSIONS_LOADED[0] == "vllm._C_stable_libtorch"  # vllm.platforms.cuda imports it first
        assert "vllm._C_stable_libtorch" in [s["module"] for s in vc.stubs_in_use()]
        import vllm.triton_utils

        if not vllm.triton_utils.HAS_TRITON:  # vLLM's placeholder: configs keep what they say
            assert stood_in["triton"].startswith("vLLM's placeholder")
            assert vllm.triton_utils.triton.Config({"BLOCK": 64}, num_stages=1).num_stages == 1


@pytest.mark.slow
def test_under_the_gpu_machines_cuda_platform_the_capture_path_imports_and_runs():
    """The tests below again, in a process where vLLM resolves its CUDA platform (tests/vllm_cuda_emulation.py)."""
    if os.environ.get("KIT_VLLM_CUDA_EMULATED"):
        return  # this is that process
    tests = (
        "every_capture_module or platform_is_the_one or config_is_vllms or stand_in_hands or "
        "capture_path_runs_around_the_stand_in or recorder_finds"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.vllm_cuda_emulation",
         __file__, "-k", tests],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    assert "9 passed" in done.stdout, done.stdout[-500:]


def test_the_probe_says_what_stopped_an_import_and_imports_nothing_after_it():
    results = vc.probe(("json", "kit.no_such_module", "csv"))
    assert [r["module"] for r in results] == ["json", "kit.no_such_module"]
    assert results[0]["ok"] and not results[1]["ok"]
    assert results[1]["error"] == "ModuleNotFoundError: No module named 'kit.no_such_module'"


def test_the_full_probe_goes_on_in_a_fresh_process_after_a_failure():
    results = vc.probe_all(("json", "kit.no_such_module", "csv", "kit.no_such_module_either", "email"))
    assert [(r["module"], r["ok"]) for r in results] == [
        ("json", True), ("kit.no_such_module", False), ("csv", True), ("kit.no_such_module_either", False),
        ("email", True),
    ]  # fmt: skip
    assert vc.probe_all(("json", "csv"), budget_s=-1)[0]["error"] == "not tried: the probe's time ran out"


def test_a_compiled_extension_stand_in_imports_and_raises_when_called():
    """As on the GPU machine, where the bundle carries no extension: the import works, a call raises StubCalled."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent("""
            import importlib.util
            from kit.experiments.vllm import capture as vc
            from kit.experiments.vllm import recordings as vr
            stub = vc.stub_support()
            names = ["vllm._C_stable_libtorch", "vllm.vllm_flash_attn._vllm_fa3_C"]
            stub.stub_extensions(names)  # the real ones are installed here: they are used
            assert importlib.util.find_spec("vllm._C_stable_libtorch").origin.endswith(".so")
            stub.stub_extensions(names, shadow=True)
            import vllm._C_stable_libtorch as ext
            from vllm.vllm_flash_attn import _vllm_fa3_C
            assert ext.__vllm_stub__.startswith("a compiled extension of the vLLM wheel")
            def use():
                try:
                    ext.init_module(1)
                except stub.StubCalled as e:
                    print("raised:", e)
            use()
            print([(s["module"], s.get("compiled_extension")) for s in vc.stubs_in_use()])
        """)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("raised: vllm._C_stable_libtorch.init_module was called, but it is a stub")
    assert lines[1] == "[('vllm._C_stable_libtorch', True), ('vllm.vllm_flash_attn._vllm_fa3_C', True)]"


def test_weak_ref_op_views_the_same_memory():
    """The op registered where vllm._C is missing (as on the H200): same memory, shape, strides and offset."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent("""
            import torch
            from kit.experiments.vllm.capture import install_weak_ref_op
            print(install_weak_ref_op())
            assert install_weak_ref_op() == "kit (vllm._C missing)"  # a second call says the same
            x = torch.arange(24.0).reshape(4, 6)[1:, ::2]
            w = torch.ops._C.weak_ref_tensor(x)
            assert w.data_ptr() == x.data_ptr() and w.stride() == x.stride() and torch.equal(w, x)
            x.add_(1)
            assert torch.equal(w, x)
            print("ok")
        """)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.stdout.split() == ["kit", "(vllm._C", "missing)", "ok"], done.stderr


def test_the_config_is_vllms_with_the_model_config_stood_in():
    vc.import_vllm()
    from vllm.config import CUDAGraphMode, VllmConfig

    cfg = vc.StandInConfig()
    config = vc.vllm_config(cfg, "cpu")
    assert isinstance(config, VllmConfig)
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE
    assert config.compilation_config.cudagraph_capture_sizes == [128, 256, 512]
    assert config.compilation_config.decoder_replay_cudagraph_capture_sizes == []  # vLLM's default sizing
    assert config.model_config.hf_config.hc_mult == 4 and config.model_config.dtype == torch.bfloat16


def test_the_stand_in_hands_the_break_v41s_seven_inputs():
    vc.import_vllm()
    from vllm.models.deepseek_v41.decoder_replay_layers import DecoderReplayLayers

    cfg = vc.StandInConfig().with_early_aux()
    model = vc.build_model(cfg, "cpu")
    backbone = model.model
    assert isinstance(model.decoder_replay_layers, DecoderReplayLayers)
    assert (backbone.decoder_replay_start, backbone.aux_hidden_state_layers) == (3, (1, 4))
    seen = []
    run = backbone.decoder_replay_layers.run_layers
    backbone.decoder_replay_layers.run_layers = lambda *inputs: seen.append(inputs) or run(*inputs)
    with torch.inference_mode():
        hidden, aux = model(torch.zeros(8, dtype=torch.int32), torch.arange(8))
    shapes = [(tuple(t.shape), t.dtype) for t in seen[0]]
    bf16, f32 = torch.bfloat16, torch.float32
    assert shapes == [
        ((8, 1024), bf16), ((8,), torch.int64), ((8,), torch.int32), ((8, 4), f32),
        ((8, 4, 1), f32), ((8, 4, 4), f32), ((8, 4, 1024), bf16),
    ]  # fmt: skip
    assert hidden.shape == (8, 1024) and [a.shape for a in aux] == [(8, 1024)] * 2


def test_capturing_needs_cuda(tmp_path, capsys):
    assert vc.main(["--out", str(tmp_path), "--variant", "unpatched"]) == 2
    assert capsys.readouterr().err.strip().startswith("kit: error: capturing vLLM's graphs needs CUDA")
    with pytest.raises(KitError, match="needs CUDA"):
        vc.record(tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def cpu_capture(monkeypatch):
    """vLLM's capture path on the CPU: streams and graphs stood in, a fresh global graph pool and workspace."""
    vc.import_vllm()
    from vllm.platforms import interface
    from vllm.v1.worker import workspace

    StandInGraph.cuda = StandInCuda(monkeypatch)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", StandInGraph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(interface.Platform, "graph_pool_handle", classmethod(lambda cls: (0, 1)), raising=False)
    monkeypatch.setattr(interface.Platform, "_global_graph_pool", None, raising=False)
    monkeypatch.setattr(workspace, "_manager", None)
    StandInGraph.made = []
    return StandInGraph


@pytest.mark.parametrize("path", vc.PATHS)
@pytest.mark.parametrize("policy", [None, "pr"])
def test_vllms_capture_path_runs_around_the_stand_in(cpu_capture, policy, path):
    import kit.patch.vllm as vllm_patch

    cfg = vc.StandInConfig()
    patch = vllm_patch.patched(policy=policy) if policy else contextlib.nullcontext()
    with patch, vc.graph_capture_streams() as streams:
        runner = vc.build_runner(cfg, torch.device("cpu"))
        vc.capture_graphs(runner, path)
    state = runner.model_state
    model_entries = runner.cudagraph_manager.breakable_cg_runner.entries
    replay_entries = state.replay_cudagraphs.breakable_cg_runner.entries
    # Each model graph is two segments around the replay layers' eager break; each replay graph is one.
    assert sorted(e.batch_descriptor.num_tokens for e in model_entries.values()) == [128, 256, 512]
    assert all(e.capture.num_graphs == 2 and e.capture.num_eager_breaks == 1 for e in model_entries.values())
    assert sorted(e.batch_descriptor.num_tokens for e in replay_entries.values()) == [96, 192, 288, 384, 480, 512]
    model_graphs = [g for e in model_entries.values() for g in e.capture.segments if hasattr(g, "__self__")]
    replay_graphs = [g for e in replay_entries.values() for g in e.capture.segments if hasattr(g, "__self__")]
    model_streams = {g.__self__.stream for g in model_graphs}
    replay_streams = {g.__self__.stream for g in replay_graphs}
    assert len(model_streams) == len(replay_streams) == 1
    assert [s.cuda_stream for s in (*model_streams, *replay_streams)] == streams  # both made by graph_capture()
    assert (model_streams == replay_streams) is (policy == "pr")
    assert {g.__self__.pool() for g in model_graphs + replay_graphs} == {(0, 1)}  # vLLM's global graph pool
    # A step through the graphs dispatches the replay graph of its replay batch (the last half of its rows).
    hidden, aux = vc.run_forward(runner, torch.zeros(256, dtype=torch.int32), use_cudagraph=True)
    assert hidden.shape == (256, 1024) and len(aux) == 1
    assert runner.model.decoder_replay_layers.replay_batch.run_graph == state.replay_cudagraphs.run


def test_the_recorder_finds_each_graphs_manager_and_size_on_vllms_stack(cpu_capture, monkeypatch):
    """vLLM's breakable wrapper is entered from a manager method with no size of its own (`run_pw_graph`,
    the replay manager's `forward_fn`): the size is the wrapper's `batch_descriptor`."""
    from kit.record.recorder import label_from_stack

    labels = []
    begin = StandInGraph.capture_begin
    monkeypatch.setattr(
        StandInGraph, "capture_begin", lambda g, pool=None: labels.append(label_from_stack()) or begin(g, pool)
    )
    vc.capture_graphs(vc.build_runner(vc.StandInConfig(), torch.device("cpu")), "runner")
    model, replay = "model graphs", "decoder replay graphs"
    replay_sizes = (512, 480, 384, 288, 192, 96)
    assert labels == [(model, n) for n in (512, 512, 256, 256, 128, 128)] + [(replay, n) for n in replay_sizes]


@pytest.mark.parametrize("name", ["small_unpatched", "small_patched"])
def test_one_summary_for_the_replica_and_vllm_keeps_the_replicas_old_names(name):
    from kit.experiments import scenarios
    from kit.experiments.summary import OLD_NAMES
    from kit.recordings import recording

    assert vc.summarize is scenarios.summarize  # one summary, not two with their own keys
    mine = vc.summarize(recording(f"replica/{name}.pickle"))
    assert all(mine[old] == mine[new] for old, new in OLD_NAMES.items())
    assert mine["replay_stream_names"] == [("model" if name == "small_patched" else "replay") + " graphs stream"]
    assert mine["replay_on_model_stream"] is (name == "small_patched")


def test_demo_vllm_refuses_what_it_cannot_do(tmp_path, monkeypatch, capsys):
    from kit.cli import main

    monkeypatch.setattr(vr, "recording_path", lambda name: tmp_path / f"{name}.pickle")
    for argv, message in (
        (["demo", "--json"], "--json goes with --vllm"),
        (["demo", "--vllm", "--live"], "bash scripts/vllm_on_device.sh OUT"),
        (["demo", "--vllm"], "no vLLM recordings in kit/recordings/vllm"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err


def test_record_falls_back_to_the_managers_path_and_keeps_what_stopped_the_runner(tmp_path, monkeypatch):
    """`record` on the GPU, with each scenario's process stood in: runner path fails, managers path works."""
    import pickle
    from types import SimpleNamespace

    calls = []

    def fake_run(argv, **kwargs):
        name, path = argv[argv.index("--scenario") + 1], argv[argv.index("--path") + 1]
        calls.append((name, path))
        if path == "runner" or name == "early_aux_shared":
            stages = f"{vc.STAGE_MARK}build the runner\n{vc.STAGE_MARK}capture ({path}: {vc.PATH_CALLS[path]})\n"
            return SimpleNamespace(
                returncode=1, stdout="", stderr=f"{stages}Traceback\nRuntimeError: {name} {path} broke\n"
            )
        raw = {"kit": {"provenance": {"gpu": "NVIDIA H200"}, "vllm_scenario": {"name": name, "path": path}}}
        (tmp_path / f"{name}.pickle").write_bytes(pickle.dumps(raw))
        return SimpleNamespace(returncode=0, stdout=f'INFO a log line\n{{"vllm_scenario": "{name}"}}\n', stderr="")

    monkeypatch.setattr(vc, "require_cuda", lambda message: None)
    monkeypatch.setattr(vc.subprocess, "run", fake_run)
    results = vc.record(tmp_path)
    assert calls == [(name, path) for name in vr.VLLM_SCENARIOS for path in vc.PATHS]
    assert results["patched"] == {"vllm_scenario": "patched"}
    manifest = json.loads((tmp_path / "PROVENANCE.json").read_text())
    entry = manifest["patched.pickle"]
    assert entry["vllm_scenario"]["path"] == "managers" and entry["gpu"] == "NVIDIA H200"
    assert entry["earlier_path_failed"] == [
        {
            "path": "runner", "stage": "capture (runner: GPUModelRunner.capture_model)",
            "error": "RuntimeError: patched runner broke", "returncode": 1,
            "stderr": ["Traceback", "RuntimeError: patched runner broke"],
        }
    ]  # fmt: skip
    assert entry["sha256"] == hashlib.sha256((tmp_path / "patched.pickle").read_bytes()).hexdigest()
    assert [e["path"] for e in manifest["early_aux_shared.pickle"]["failed"]] == list(vc.PATHS)
    assert manifest["early_aux_shared.pickle"]["failed"][1]["stage"].startswith("capture (managers: ")
    assert "failed" in results["early_aux_shared"]


def test_a_scenario_process_past_its_time_is_killed_and_says_where_it_was():
    code = f"import sys, time; print('{vc.STAGE_MARK}capture (runner)', file=sys.stderr, flush=True); time.sleep(30)"
    done = vc.run_fresh([sys.executable, "-c", code], timeout_s=2)
    found = vc.failure("runner", done)
    assert (found["stage"], found["returncode"]) == ("capture (runner)", -9)
    assert found["error"] == "killed after 2 s (its time limit)"  # child_error's line, as every child's

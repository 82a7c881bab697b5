"""Faults mid-capture, threads, and interrupted writes, on the CPU.

What CUDA would do is stood in for by tests/helpers.py's `FakeCuda`: streams with a current one
per thread, graphs whose capture makes their stream capturing (and CUDA
refuse to synchronize meanwhile), and memory history as torch keeps it (a
flag, a trace only `enabled="all"` fills, cleared when switched off). On it
run the real recorder, the replica's breakable capture and graph managers,
the replica patch and, with tests/vllm_standins.py, vLLM's own capture path
under the vLLM patch. Each test checks what must hold after the fault: no
patch left applied, no recorder left recording, memory history as the user
had it, no capture left open, and that capturing again works.
The same on a real GPU: tests/gpu/test_faults.py.
"""

from __future__ import annotations

import _thread
import ast
import json
import pickle
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

import kit.patch.replica as replica_patch
import kit.record.history as kit_history
import kit.record.recorder as capture
from kit import CaptureRecorder, KitError
from kit.fileio import atomic_write
from kit.patch.install import interrupts_deferred
from kit.replica import cudagraph_utils, parallel_state
from kit.replica.breakable_cudagraph import (
    BreakableCUDAGraphCapture,
    eager_break_during_capture,
)

from .helpers import FakeCuda, FakeStream, capture_replica_like

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cuda(monkeypatch):
    return FakeCuda(monkeypatch)


def replica_originals() -> list:
    from kit.replica import decoder_replay_cudagraph, model_runner, model_state

    return [
        parallel_state.graph_capture,
        cudagraph_utils.graph_capture,
        cudagraph_utils.CudaGraphManager.capture,
        model_runner.GPUModelRunner.capture_model,
        model_state.DeepseekV41ModelState.capture_inner_cudagraphs,
        decoder_replay_cudagraph.DecoderReplayCudaGraphManager.capture_replay_graphs,
    ]


@pytest.fixture
def clean(cuda):
    """After the test: nothing patched, nothing recording, history as the test found it, no capture open."""
    before = replica_originals()
    graph_methods = (cuda.Graph.capture_begin, cuda.Graph.capture_end)
    history = cuda.history
    yield cuda
    assert_clean(cuda, before, graph_methods, history)


def assert_clean(cuda: FakeCuda, before: list, graph_methods: tuple, history) -> None:
    assert replica_originals() == before and not replica_patch.is_applied()
    assert (cuda.Graph.capture_begin, cuda.Graph.capture_end) == graph_methods
    assert not capture.hooks_installed() and capture.active_recorders() == []
    assert cuda.history == history
    assert cuda.capturing == {}
    assert cuda.current_stream() is cuda.default
    still_works(cuda)


def still_works(cuda: FakeCuda) -> None:
    """The kernel still works: a new recording of a new capture."""
    stream = FakeStream()
    with CaptureRecorder() as rec, torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with rec.label("after the fault", 1):
            graph.capture_begin()
            graph.capture_end()
    assert [(r.manager, r.stream, r.trace_end is not None) for r in rec.records] == [
        ("after the fault", stream.cuda_stream, True)
    ]
    assert rec.errors == []


def test_a_clean_recording_sees_every_graph_of_the_breakable_capture(clean):
    with replica_patch.patched(), CaptureRecorder() as rec:
        capture_replica_like(None)
    assert [(r.manager, r.size, r.index) for r in rec.records] == [
        ("model graphs", 16, 0),
        ("model graphs", 16, 1),
        ("model graphs", 8, 0),
        ("model graphs", 8, 1),
    ]
    assert all(r.trace_end is not None and not r.aborted for r in rec.records)


@pytest.mark.parametrize("fail", ["capture", "eager break"])
def test_an_exception_inside_a_capture_or_an_eager_break_leaves_nothing_behind(clean, fail):
    with pytest.raises(RuntimeError, match=f"inside the {fail}"):
        with replica_patch.patched(), CaptureRecorder() as rec:
            capture_replica_like(fail)
    assert rec.snapshot is not None  # the recorder stopped and took its snapshot
    # The graph the exception was in ended: by the breakable capture's own exit.
    assert rec.records and all(r.trace_end is not None for r in rec.records)


def test_a_capture_an_exception_left_open_is_ended_by_the_recorder(clean):
    stream = FakeStream()
    with pytest.raises(RuntimeError, match="left open"):
        with CaptureRecorder() as rec, torch.cuda.stream(stream):
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin()
            raise RuntimeError("left open")  # raw capture_begin without capture_end: nothing ends it but the recorder
    assert [r.aborted for r in rec.records] == [True]
    assert any("left open" in e for e in rec.errors)


def test_a_failing_capture_end_is_noted_and_the_capture_ended_or_marked_failed(clean):
    with CaptureRecorder() as rec:
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin()
        with torch.cuda.stream(FakeStream()), pytest.raises(RuntimeError, match="same stream"):
            graph.capture_end()  # on the wrong stream: torch refuses, and the capture stays open
        graph.capture_end()  # on the right one
        broken = torch.cuda.CUDAGraph()
        broken.invalidated = True
        broken.capture_begin()
        with pytest.raises(RuntimeError, match="previous error"):
            broken.capture_end()  # the capture is over, but there is no graph
    assert [(r.trace_end is not None, r.failed) for r in rec.records] == [(True, False), (False, True)]
    assert len(rec.snapshot.kit["captures"]) == 1
    assert [e.split(" raised")[0] for e in rec.errors] == [
        "capture_end of unlabelled graphs graph 0",
        "capture_end of unlabelled graphs graph 1",
    ]


def test_an_error_inside_the_recorders_hook_never_breaks_the_capture(clean, monkeypatch):
    def broken(torch):
        raise RuntimeError("snapshot failed")

    with CaptureRecorder() as rec:
        with monkeypatch.context() as m:
            m.setattr(capture, "trace_length", broken)
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin()
            graph.capture_end()
    assert not clean.capturing  # the capture itself went through
    assert rec.errors == ["_on_begin: RuntimeError: snapshot failed", "_on_end: RuntimeError: snapshot failed"]


@pytest.fixture
def ctrl_c():
    """Ctrl-C raises KeyboardInterrupt here, even where the parent process ignores SIGINT (nohup, `cmd &`)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("seed", range(12))
def test_a_keyboard_interrupt_during_a_long_recording_leaves_nothing_behind(clean, seed, ctrl_c):
    timer = threading.Timer(0.002 + 0.004 * seed, _thread.interrupt_main)
    deadline = time.monotonic() + 10
    with pytest.raises(KeyboardInterrupt):
        timer.start()
        with replica_patch.patched(), CaptureRecorder():
            while time.monotonic() < deadline:
                capture_replica_like("interrupt", sizes=(4, 2))
    timer.cancel()


def test_the_recorder_leaves_history_off_when_it_was_off(clean):
    with CaptureRecorder():
        assert clean.history == "all"
    assert clean.history is None and clean.history_calls == ["all", None]


@pytest.mark.parametrize("getter", [True, False], ids=["isHistoryEnabled", "trace-only"])
def test_the_recorder_leaves_the_users_history_on_and_its_entries_there(monkeypatch, getter):
    cuda = FakeCuda(monkeypatch, history="all", getter=getter)
    users = list(cuda.trace)
    with CaptureRecorder() as rec:
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin()
        graph.capture_end()
    assert cuda.history == "all" and cuda.history_calls == []  # never touched
    assert cuda.trace[: len(users)] == users
    assert rec.snapshot.kit["captures"][0]["trace_begin"] >= len(users)


def test_history_in_state_mode_is_left_on_and_the_empty_windows_are_said(monkeypatch):
    cuda = FakeCuda(monkeypatch, history="state")
    with pytest.warns(UserWarning, match="enabled='state'"), CaptureRecorder():
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin()
        graph.capture_end()
    assert cuda.history == "state" and cuda.history_calls == []


def test_two_recorders_stopped_in_either_order_leave_nothing_behind(clean):
    first, second = CaptureRecorder().start(), CaptureRecorder().start()
    assert capture.active_recorders() == [first, second]
    first.stop()
    assert capture.hooks_installed() and clean.history == "all"  # the second still records
    graph = torch.cuda.CUDAGraph()
    graph.capture_begin()
    graph.capture_end()
    second.stop()
    assert len(second.records) == 1 and first.records == []
    with pytest.raises(KitError, match="not recording"):
        first.stop()
    with pytest.raises(KitError, match="already recording"):
        with CaptureRecorder() as rec:
            rec.start()


def test_two_threads_capture_on_their_own_streams_at_once(clean):
    """vLLM's microbatch threads: each captures on its own stream, both inside patched blocks, one recorder."""
    barrier = threading.Barrier(2, timeout=10)
    seen: dict[str, object] = {}
    errors: list[BaseException] = []

    def worker(name: str, rec: CaptureRecorder, leave_first: bool) -> None:
        try:
            stream = FakeStream()
            with replica_patch.patched(), parallel_state.graph_capture(torch.device("cpu"), stream=stream) as ctx:
                assert ctx.stream is stream and torch.cuda.current_stream() is stream
                with rec.label(f"{name} graphs", 8):
                    barrier.wait()  # both threads capture at the same time
                    with BreakableCUDAGraphCapture(pool=(0, 7)):
                        eager_break_during_capture(lambda x: x + 1)(torch.ones(2))
                    barrier.wait()
                seen[name] = stream
                if not leave_first:
                    barrier.wait()  # the other thread has left its patched block
                    seen[f"{name} still patched"] = replica_patch.is_applied()
            if leave_first:
                barrier.wait()
        except BaseException as e:  # noqa: BLE001 - reported in the main thread
            errors.append(e)
            barrier.abort()

    with CaptureRecorder() as rec:
        threads = [threading.Thread(target=worker, args=(n, rec, n == "a")) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert seen["b still patched"] is True  # a block open in another thread keeps the patch on
    by_manager = {}
    for r in rec.records:
        by_manager.setdefault(r.manager, []).append(r)
    for name in ("a", "b"):
        records = by_manager[f"{name} graphs"]
        assert [r.index for r in records] == [0, 1]  # two graphs around the eager break
        assert {r.stream for r in records} == {seen[name].cuda_stream}
        assert all(r.trace_end is not None and r.pool == (0, 7) for r in records)
    assert rec.errors == []


def test_an_interrupt_inside_interrupts_deferred_is_raised_after_it(ctrl_c):
    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred():
            _thread.interrupt_main()
            time.sleep(0.01)  # a KeyboardInterrupt would land here, half way
            done.append(True)
    assert done == [True]


# --- the vLLM patch: an exception inside a patched vLLM function ---------------------------------


def test_an_exception_inside_a_patched_vllm_function_leaves_nothing_patched(monkeypatch):
    from vllm.models.deepseek_v41.nvidia.decoder_replay_cudagraph import DecoderReplayCudaGraphManager

    import kit.patch.vllm as patch_vllm
    from tests import vllm_standins as standin

    from .test_vllm_patch import _installed

    cuda = standin.StandInCuda(monkeypatch)
    standin.install_groups(monkeypatch)
    standin.install_workspace(monkeypatch)
    before = _installed()

    def raising(fault: BaseException):
        def create_forward_fn(desc, warmup):
            def forward_fn(cg_mode):
                raise fault

            return forward_fn

        return create_forward_fn

    manager = standin.manager(DecoderReplayCudaGraphManager, sizes=(128,))
    for fault in (RuntimeError("inside the patched capture"), KeyboardInterrupt()):
        with pytest.raises(type(fault)), patch_vllm.patched():
            assert patch_vllm.is_applied()
            manager.capture(raising(fault), stream=standin.StandInStream())  # the rewritten CudaGraphManager.capture
        assert not patch_vllm.is_applied() and _installed() == before
        assert cuda.current is cuda.default  # graph_capture's stream contexts were left


# --- nothing lost: every writer writes a temporary file and renames it ---------------------------


def _interrupt_before_rename(monkeypatch):
    """Interrupt every atomic write after its bytes are written, before the rename."""

    def fsync(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr("kit.fileio.os.fsync", fsync)


def test_atomic_write_interrupted_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "out.txt"
    target.write_text("the good one")
    with pytest.raises(KeyboardInterrupt), atomic_write(target) as f:
        f.write("half")
        raise KeyboardInterrupt
    _interrupt_before_rename(monkeypatch)
    with pytest.raises(KeyboardInterrupt), atomic_write(target, "wb") as f:
        f.write(b"all of it")
    assert target.read_text() == "the good one" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


@pytest.mark.parametrize(
    "command",
    [
        ["sim", "{workload}", "-o", "{out}"],
        ["sim", "{workload}", "-o", "{out}", "--json"],
        ["report", "{snap}", "-o", "{out}"],
    ],
    ids=["sim", "sim-json", "report"],
)
def test_an_interrupted_command_leaves_the_previous_output_whole(tmp_path, monkeypatch, capsys, command):
    from kit.cli import main

    from .helpers import FIXTURES, RECORDED

    out = tmp_path / "out"
    out.write_bytes(b"the good one")
    args = [
        a.format(workload=FIXTURES / "corpus" / "pr_two_streams.json", snap=RECORDED["two_streams"], out=out)
        for a in command
    ]
    _interrupt_before_rename(monkeypatch)
    assert main(args) == 130
    assert "interrupted" in capsys.readouterr().err
    assert out.read_bytes() == b"the good one" and [p.name for p in tmp_path.iterdir()] == ["out"]
    monkeypatch.undo()
    assert main(args) == 0 and out.read_bytes() != b"the good one"


def test_a_missing_output_folder_is_a_one_line_error(tmp_path, capsys):
    from kit.cli import main

    from .helpers import FIXTURES

    assert (
        main(["sim", str(FIXTURES / "corpus" / "pr_two_streams.json"), "-o", str(tmp_path / "no" / "out.pickle")]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kit: error: ") and "No such file or directory" in err[0]


def test_an_interrupted_scenario_run_leaves_the_previous_snapshot_whole(tmp_path, monkeypatch):
    from kit.experiments import scenarios

    out = tmp_path / "unpatched.pickle"
    out.write_bytes(b"the good one")
    monkeypatch.setattr(scenarios, "run_scenario", lambda name, preset, speculator=False: {"segments": []})
    _interrupt_before_rename(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        scenarios.main(["unpatched", "-o", str(out)])
    assert out.read_bytes() == b"the good one" and [p.name for p in tmp_path.iterdir()] == [out.name]


WRITE_METHODS = {"write_text", "write_bytes"}
RENAMES = {("os", "replace"), ("os", "rename"), ("shutil", "move")}


def _writes_outside_atomic_write(path: Path) -> list[str]:
    """Calls in `path` that write a file other than through `atomic_write` (or a line marked a streamed log)."""
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
        writes = name in WRITE_METHODS or (owner, name) in RENAMES
        if name == "open" and not owner:
            mode = (
                node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
            )
            writes = isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax+")
        if writes and "streamed log" not in lines[node.lineno - 1]:
            found.append(f"{path.name}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_every_writer_in_the_kit_and_its_scripts_goes_through_atomic_write():
    files = sorted((ROOT / "kit").rglob("*.py")) + sorted((ROOT / "scripts").glob("*.py"))
    files = [f for f in files if f.name != "fileio.py"]  # atomic_write itself
    found = [line for f in files for line in _writes_outside_atomic_write(f)]
    assert found == []


def test_the_writer_check_finds_a_plain_write(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nopen('x', 'wb')\nopen('y')\nos.replace('a', 'b')\nPath('x').write_text('y')\n")
    assert [line.split(": ", 1)[1] for line in _writes_outside_atomic_write(probe)] == [
        "open('x', 'wb')",
        "os.replace('a', 'b')",
        "Path('x').write_text('y')",
    ]


def test_the_snapshot_writer_round_trips(tmp_path):
    from kit.cli import _write_snapshot

    snap = {"segments": [], "device_traces": [[]], "kit": {"source": "simulator"}}
    for as_json in (False, True):
        path = tmp_path / f"s.{'json' if as_json else 'pickle'}"
        _write_snapshot(snap, str(path), as_json)
        assert (json.loads(path.read_text()) if as_json else pickle.loads(path.read_bytes())) == snap


@pytest.mark.parametrize("history", [None, "all"])
def test_the_kits_other_recordings_leave_history_as_they_found_it(monkeypatch, history):
    """`kit.experiments.model_and_replay.run_model_and_replay` and `run-workload` record through `recording_history`."""
    cuda = FakeCuda(monkeypatch, history=history)
    with pytest.raises(RuntimeError, match="inside"), kit_history.recording_history(max_entries=10, stacks="python"):
        assert cuda.history == (history or "all")
        raise RuntimeError("inside")
    assert cuda.history == history
    assert cuda.history_calls == ([] if history else ["all", None])


def test_history_is_off_without_asking_the_allocator_before_cuda_starts(monkeypatch):
    # On a GPU, torch._C._cuda_isHistoryEnabled segfaults before CUDA is initialised.
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch._C, "_cuda_isHistoryEnabled", lambda: pytest.fail("asked the allocator"), raising=False)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda device=None: pytest.fail("asked the allocator"))
    assert kit_history.history_enabled(torch) is False

"""Faults mid-capture and concurrent captures, on a real GPU (run by scripts/gpu_tests.sh).

An exception inside a capture, inside an eager break of the replica, and a
KeyboardInterrupt during a long recording, each with the capture recorder and
the replica patch active; then two threads capturing on their own streams at
once. After each: no patch left applied, no recorder recording, memory history
as it was before (off, or on with its entries), no capture open, the current
stream the default one, and the process still works: plain CUDA work, a new
captured graph that replays right, and a new recording of it.

The same bookkeeping is checked on the CPU with stand-ins in tests/test_faults.py.
These use torch and the kit only (no vLLM, no hypothesis). Each runs in a fresh
process, so a broken one cannot spoil the next, and every wait has a timeout.
"""

from __future__ import annotations

import _thread
import multiprocessing
import os
import signal
import threading
import time

import pytest
import torch

pytestmark = pytest.mark.gpu

TINY = dict(
    hidden_size=256,
    num_layers=4,
    decoder_replay_start=2,
    aux_hidden_state_layers=(3,),
    cudagraph_capture_sizes=(32, 64),
    window=16,  # small enough that both model graphs reach the trim threshold and break
    decoder_replay_trim_threshold=32,
    vocab_size=512,
)


CASE_TIMEOUT_S = int(os.environ.get("KIT_CASE_TIMEOUT_S", "150"))


def _run_case(conn, fn, args) -> None:
    import faulthandler
    import traceback

    faulthandler.enable()  # a crash shows where it crashed
    faulthandler.dump_traceback_later(CASE_TIMEOUT_S - 10, exit=True)  # and a hang where it hung
    try:
        fn(*args)
    except BaseException:  # noqa: BLE001 - everything goes back to the parent as text
        conn.send(traceback.format_exc())
    else:
        conn.send(None)
    finally:
        conn.close()


def in_fresh_process(fn, *args) -> None:
    """Run one case in a new process; fail with its traceback, its exit code if it died, or a timeout."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_run_case, args=(send, fn, args))
    child.start()
    send.close()
    try:
        if not receive.poll(CASE_TIMEOUT_S):
            pytest.fail(f"{fn.__name__} gave no result in {CASE_TIMEOUT_S} s (alive: {child.is_alive()})")
        error = receive.recv()
    except EOFError:
        child.join(10)
        pytest.fail(f"{fn.__name__}: the process died without a result, exit code {child.exitcode}")
    finally:
        if child.is_alive():
            child.kill()
        child.join(10)
    if error is not None:
        pytest.fail(f"{fn.__name__} failed in its process:\n{error}")


# --- what must hold after a fault -----------------------------------------------------------


def _state() -> dict:
    """What a fault must not change: the patched functions, the recorder's wrappers, memory history."""
    from kit.record.history import history_enabled
    from kit.replica import cudagraph_utils, decoder_replay_cudagraph, model_runner, model_state, parallel_state

    return {
        "replica": [
            parallel_state.graph_capture,
            cudagraph_utils.graph_capture,
            cudagraph_utils.CudaGraphManager.capture,
            model_runner.GPUModelRunner.capture_model,
            model_state.DeepseekV41ModelState.capture_inner_cudagraphs,
            decoder_replay_cudagraph.DecoderReplayCudaGraphManager.capture_replay_graphs,
        ],
        "graph": (torch.cuda.CUDAGraph.capture_begin, torch.cuda.CUDAGraph.capture_end),
        "history": history_enabled(torch),
    }


def _assert_clean(before: dict) -> None:
    import kit.patch.replica as replica_patch
    import kit.record.recorder

    after = _state()
    assert after["replica"] == before["replica"] and not replica_patch.is_applied()
    assert after["graph"] == before["graph"]
    assert not kit.record.recorder.hooks_installed() and kit.record.recorder.active_recorders() == []
    assert after["history"] == before["history"]
    assert not torch.cuda.is_current_stream_capturing()
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    _still_works()


def _still_works() -> None:
    """Plain CUDA work, a new captured graph that replays right, and a new recording of it."""
    from kit import CaptureRecorder

    x = torch.arange(1 << 16, device="cuda", dtype=torch.float32)
    assert (x * 2).sum().item() == float(x.sum().item() * 2)
    graph = torch.cuda.CUDAGraph()
    with CaptureRecorder() as rec:
        with rec.label("after the fault", 1), torch.cuda.graph(graph):
            y = x * 3 + 1
    x.add_(1)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, x * 3 + 1)
    assert [(r.manager, r.trace_end is not None) for r in rec.records] == [("after the fault", True)]
    assert rec.errors == []


def _runner():
    from kit.replica import cudagraph_utils
    from kit.replica.model import ReplicaConfig
    from kit.replica.model_runner import GPUModelRunner

    # Each runner gets a graph pool of its own, as in a fresh process: torch refuses to capture into
    # the pool of a runner whose graphs are all gone (see get_global_graph_pool).
    cudagraph_utils._global_graph_pool = None
    runner = GPUModelRunner(ReplicaConfig(**TINY))
    torch.cuda.synchronize()
    return runner


# --- the faults --------------------------------------------------------------------------


def exception_inside_a_capture(user_history: bool) -> None:
    import kit.patch.replica as replica_patch
    from kit import CaptureRecorder

    if user_history:
        torch.cuda.memory._record_memory_history(max_entries=100_000)
        torch.empty(1 << 20, device="cuda")  # an entry of the user's own
    before = _state()
    user_entries = len(torch.cuda.memory._snapshot()["device_traces"][0]) if user_history else 0
    runner = _runner()
    layer = runner.model.layers[0]
    forward = layer.forward

    def failing_forward(hidden_states):
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("inside the capture")
        return forward(hidden_states)

    layer.forward = failing_forward
    with pytest.raises(RuntimeError, match="inside the capture"):
        with replica_patch.patched("pr"), CaptureRecorder() as rec:
            runner.capture_model()
    assert rec.snapshot is not None and rec.records  # it stopped, with what it saw
    if user_history:
        assert len(torch.cuda.memory._snapshot()["device_traces"][0]) >= user_entries  # the user's trace is kept
    _assert_clean(before)
    if user_history:
        torch.cuda.memory._record_memory_history(enabled=None)


def exception_inside_an_eager_break() -> None:
    import kit.patch.replica as replica_patch
    from kit import CaptureRecorder
    from kit.replica.breakable_cudagraph import BreakableCUDAGraphCapture

    before = _state()
    runner = _runner()
    layers = runner.model.decoder_replay_layers
    run_layers = layers.run_layers

    def failing_run_layers(*args):
        # In a capture but not capturing: a model graph's eager break. Model graphs below the trim threshold
        # (and the replay graphs) run the layers inside the graph, while capturing.
        if BreakableCUDAGraphCapture.current() is not None and not torch.cuda.is_current_stream_capturing():
            raise RuntimeError("inside the eager break")
        return run_layers(*args)

    layers.run_layers = failing_run_layers
    with pytest.raises(RuntimeError, match="inside the eager break"):
        with replica_patch.patched("pr"), CaptureRecorder() as rec:
            runner.capture_model()
    assert rec.records and all(r.trace_end is not None for r in rec.records)  # the graph before the break ended
    _assert_clean(before)


class _CtrlC(threading.Thread):
    """Presses Ctrl-C after `delay` seconds, and again every `again` seconds until stopped.

    Python runs the SIGINT handler at the main thread's next bytecode, and that
    may be inside a finaliser (a graph or tensor freed by the collector), where
    the KeyboardInterrupt is printed and dropped ("Exception ignored in"). A
    user presses Ctrl-C again; so does this. `again` is long enough that a
    second press never lands in the cleanup of the first.
    """

    def __init__(self, delay: float, again: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.delay, self.again, self.sent = delay, again, 0
        self._stopped = threading.Event()

    def run(self) -> None:
        if self._stopped.wait(self.delay):
            return
        while True:
            _thread.interrupt_main()
            self.sent += 1
            if self._stopped.wait(self.again):
                return

    def stop(self) -> None:
        self._stopped.set()
        self.join()


def keyboard_interrupt_during_a_long_recording() -> None:
    import kit.patch.replica as replica_patch
    from kit import CaptureRecorder

    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C raises KeyboardInterrupt here, as in a kernel
    before = _state()
    for delay in (0.3, 0.9, 1.7):
        deadline = time.monotonic() + 120
        interrupted = False
        sender = _CtrlC(delay)
        try:
            sender.start()
            with replica_patch.patched("pr"), CaptureRecorder():
                while time.monotonic() < deadline:  # captures until Ctrl-C
                    _runner().capture_model()
        except KeyboardInterrupt:
            interrupted = True
        finally:
            sender.stop()
        assert interrupted, f"no interrupt reached the loop ({sender.sent} sent)"
        _assert_clean(before)


def two_threads_capture_on_their_own_streams_at_once() -> None:
    import kit.patch.replica as replica_patch
    from kit import CaptureRecorder
    from kit.replica import parallel_state

    before = _state()
    x = torch.randn(1 << 20, device="cuda")
    barrier = threading.Barrier(2, timeout=60)
    done: dict[str, tuple] = {}
    errors: list[BaseException] = []

    def worker(name: str, rec: CaptureRecorder, leave_first: bool) -> None:
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                (x * 2).relu_()  # warm up on this stream, before either capture begins
            stream.synchronize()
            barrier.wait()
            with replica_patch.patched("pr"), parallel_state.graph_capture(torch.device("cuda"), stream=stream):
                assert torch.cuda.current_stream() == stream
                graph = torch.cuda.CUDAGraph()
                with rec.label(f"{name} graphs", 1 << 20):
                    barrier.wait()  # both threads capture at the same time
                    graph.capture_begin(capture_error_mode="thread_local")
                    y = (x * 2).relu() + (1 if name == "a" else 2)
                    graph.capture_end()
                    barrier.wait()
                if not leave_first:
                    barrier.wait()  # the other thread has left its patched block by now
                    done["b still patched"] = (replica_patch.is_applied(),)
            if leave_first:
                barrier.wait()
            done[name] = (graph, y, stream.cuda_stream)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
            barrier.abort()

    with CaptureRecorder() as rec:
        threads = [threading.Thread(target=worker, args=(n, rec, n == "a")) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    assert done["b still patched"] == (True,)  # a patched block still open in one thread keeps the patch on
    for name, offset in (("a", 1), ("b", 2)):
        graph, y, stream = done[name]
        records = [r for r in rec.records if r.manager == f"{name} graphs"]
        assert [(r.stream, r.trace_end is not None, r.pool is not None) for r in records] == [(stream, True, True)]
        x.normal_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, (x * 2).relu() + offset)
    assert rec.errors == []
    windows = {c["capture"]: c for c in rec.snapshot.kit["captures"]}
    assert set(windows) == {f"a graphs {1 << 20}", f"b graphs {1 << 20}"}
    _assert_clean(before)


@pytest.mark.parametrize("user_history", [False, True], ids=["history-off", "history-on"])
def test_an_exception_inside_a_capture_leaves_nothing_behind(user_history):
    in_fresh_process(exception_inside_a_capture, user_history)


def test_an_exception_inside_an_eager_break_leaves_nothing_behind():
    in_fresh_process(exception_inside_an_eager_break)


def test_a_keyboard_interrupt_during_a_long_recording_leaves_nothing_behind():
    in_fresh_process(keyboard_interrupt_during_a_long_recording)


def test_two_threads_capture_on_their_own_streams_at_once():
    in_fresh_process(two_threads_capture_on_their_own_streams_at_once)

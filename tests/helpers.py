"""What several test files share: sizes, the shipped recordings, snapshot builders, `python -m kit`, CUDA on the CPU.

- `KIB`, `MIB`: sizes in bytes; `FIXTURES`, `RECORDED`: the shipped H200
  recordings and the two-capture pair;
- `block`, `segment`: torch-shaped snapshot dicts built by hand;
- `run_kit`: `python -m kit ARGS` in a fresh process; `run_kit_in_process`:
  the same through `kit.cli.main`, read with pytest's `capsys`;
- `TINY`: the replica small enough to capture on the CPU in a second;
- `FakeStream`, `FakeCuda`: the parts of `torch.cuda` the recorder, the
  replica and the patches use, stood in on the CPU (tests/test_faults.py
  tests faults on it); `capture_replica_like`: a tiny model with an eager
  break captured by the replica's graph manager.

Torch and the replica are imported on use, so a test of the tables that
imports this module does not pay for them. Fixtures and pytest hooks are in
tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import subprocess
import sys
import threading
import time

from kit.recordings import RECORDINGS
from kit.units import KIB as KIB  # re-exported for the tests
from kit.units import MIB as MIB

FIXTURES = RECORDINGS  # the H200 recordings shipped with the kit
RECORDED = {"two_streams": FIXTURES / "two_streams.pickle", "shared_stream": FIXTURES / "shared_stream.pickle"}


def __getattr__(name: str):
    if name == "TINY":  # a ReplicaConfig: kit.replica.model imports torch
        return tiny_replica()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def tiny_replica():
    """`TINY`: four layers of 64, model graphs of 8 and 16 tokens, one replay graph each."""
    from kit.replica.model import ReplicaConfig

    return ReplicaConfig(
        hidden_size=64,
        num_layers=4,
        decoder_replay_start=2,
        aux_hidden_state_layers=(3,),
        vocab_size=97,
        cudagraph_capture_sizes=(8, 16),
        # One replay graph of N/2 rows per model graph (the "half" sizing), every model graph breaking out.
        window=2,
        decoder_replay_trim_threshold=4,
        replay_sizing="half",
    )


# --- snapshots built by hand ---------------------------------------------------------------------


def block(address: int, size: int, state: str = "active_allocated") -> dict:
    return {"address": address, "size": size, "requested_size": size, "state": state, "frames": []}


def segment(address: int, sizes_states: list[tuple[int, str]], *, stream: int = 0, pool=(0, 0)) -> dict:
    """A torch-shaped segment dict built from its blocks, in address order."""
    blocks, cursor = [], address
    for size, state in sizes_states:
        blocks.append(block(cursor, size, state))
        cursor += size
    allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    pending = sum(b["size"] for b in blocks if b["state"] == "active_pending_free")
    total = cursor - address
    return {
        "device": 0,
        "address": address,
        "total_size": total,
        "allocated_size": allocated,
        "active_size": allocated + pending,
        "requested_size": allocated,
        "stream": stream,
        "segment_type": "small" if total <= 2 * MIB else "large",
        "segment_pool_id": pool,
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }


# --- python -m kit -------------------------------------------------------------------------------


def run_kit(*args: str) -> subprocess.CompletedProcess:
    """`python -m kit ARGS` as its entry point runs it (`kit.cli.main`), in this process: its exit status and output
    as text, as `run_kit_process` has them from a fresh process (argparse's exits included). What `--quiet` sets is
    put back. A few tests keep the fresh process: the entry point itself, and what a new interpreter imports."""
    from kit import progress
    from kit.cli import main

    out, err = io.StringIO(), io.StringIO()
    quiet = progress.is_quiet()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(list(args))
            except SystemExit as e:  # argparse: --help, and the usage errors it reports itself
                status = e.code if isinstance(e.code, int) else int(e.code is not None)
    finally:
        progress.set_quiet(quiet)
    return subprocess.CompletedProcess(["python", "-m", "kit", *args], status, out.getvalue(), err.getvalue())


def run_kit_process(*args: str) -> subprocess.CompletedProcess:
    """`python -m kit ARGS` in a fresh process, its output as text."""
    return subprocess.run([sys.executable, "-m", "kit", *args], capture_output=True, text=True, timeout=300)


def run_kit_in_process(capsys, *args: str) -> tuple[int, str, str]:
    """`python -m kit ARGS` in this process: exit status, stdout, stderr."""
    from kit.cli import main

    capsys.readouterr()
    status = main(list(args))
    out, err = capsys.readouterr()
    return status, out, err


# --- CUDA stood in on the CPU --------------------------------------------------------------------


class FakeStream:
    _ids = itertools.count(0x1000, 0x100)

    def __init__(self, device=None, priority: int = 0) -> None:
        self.cuda_stream = next(self._ids)

    def wait_stream(self, other) -> None:
        pass

    def __repr__(self) -> str:
        return f"<stream {self.cuda_stream:#x}>"


class FakeCuda:
    """The parts of torch.cuda the recorder, the replica and the patches use, on the CPU."""

    def __init__(self, monkeypatch, history: str | None = None, getter: bool = True) -> None:
        import torch

        from kit.replica import cudagraph_utils

        self.local = threading.local()
        self.default = FakeStream()
        self.capturing: dict[int, object] = {}  # stream id -> graph
        self.history = history
        self.trace: list[dict] = [self._entry("alloc")] * 3 if history == "all" else []
        self.history_calls: list = []
        self.lock = threading.Lock()
        self.pools = itertools.count(1)
        cuda = self

        class Graph:
            def __init__(self) -> None:
                self._pool = None

            def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
                stream = cuda.current_stream()
                with cuda.lock:
                    if stream.cuda_stream in cuda.capturing:
                        raise RuntimeError("the stream is capturing already")
                    cuda.capturing[stream.cuda_stream] = self
                self._pool = tuple(pool) if pool is not None else (next(cuda.pools), 0)
                cuda.event("segment_alloc")

            def capture_end(self) -> None:
                stream = cuda.current_stream()
                with cuda.lock:
                    if cuda.capturing.get(stream.cuda_stream) is not self:
                        raise RuntimeError("Capture must end on the same stream it began on.")
                    del cuda.capturing[stream.cuda_stream]
                if getattr(self, "invalidated", False):  # CUDA ends an invalidated capture, then fails
                    raise RuntimeError("operation failed due to a previous error during capture")
                cuda.event("alloc")

            def pool(self):
                return self._pool

            def replay(self) -> None:
                pass

        @contextlib.contextmanager
        def stream(s):
            previous = cuda.current_stream()
            cuda.local.stream = s
            try:
                yield
            finally:
                cuda.local.stream = previous

        def synchronize(device=None) -> None:
            if cuda.capturing:
                raise RuntimeError("operation not permitted when stream is capturing")

        def record_memory_history(enabled="all", *args, **kwargs) -> None:
            cuda.history_calls.append(enabled)
            cuda.history = enabled
            if enabled is None:
                cuda.trace.clear()  # as torch does

        def set_stream(s) -> None:
            cuda.local.stream = s

        self.Graph = Graph
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "set_stream", set_stream)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: cuda.current_stream())
        monkeypatch.setattr(torch.cuda, "stream", stream)
        monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "stand-in GPU")
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, next(cuda.pools)))
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", cuda.is_current_stream_capturing)
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", record_memory_history)
        monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda device=None: cuda.snapshot())
        if getter:
            monkeypatch.setattr(torch._C, "_cuda_isHistoryEnabled", lambda: cuda.history is not None, raising=False)
        else:
            monkeypatch.delattr(torch._C, "_cuda_isHistoryEnabled", raising=False)
        monkeypatch.setattr(cudagraph_utils, "_global_graph_pool", None)

    def _entry(self, action: str) -> dict:
        return {"action": action, "addr": 0, "size": 0, "stream": 0}

    def current_stream(self) -> FakeStream:
        return getattr(self.local, "stream", self.default)

    def is_current_stream_capturing(self) -> bool:
        return self.current_stream().cuda_stream in self.capturing

    def event(self, action: str) -> None:
        with self.lock:
            if self.history == "all":
                self.trace.append(self._entry(action))
            elif self.history == "state":
                self.trace[:] = [self._entry(action)]

    def snapshot(self) -> dict:
        with self.lock:
            self.trace.append(self._entry("snapshot")) if self.history == "all" else None
            return {"segments": [], "device_traces": [list(self.trace)]}


# --- a tiny model with an eager break, captured by the replica's graph manager -------------------


def model_forward(fail: str | None):
    """A model `y = 2x; z = eager_break(y) + 1; 3z` that fails where `fail` says, if it says."""
    import torch

    from kit.replica.breakable_cudagraph import BreakableCUDAGraphCapture, eager_break_during_capture

    @eager_break_during_capture
    def eager_break(x):
        if fail == "eager break" and BreakableCUDAGraphCapture.current() is not None:
            raise RuntimeError("inside the eager break")
        return (x + 1,)

    def model(x):
        y = x * 2
        if fail == "capture" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("inside the capture")
        if fail == "interrupt" and torch.cuda.is_current_stream_capturing():
            time.sleep(0.001)  # a long recording: the interrupt lands anywhere in here
        (z,) = eager_break(y)
        return z * 3

    return model


def create_forward_fn_for(model, pool):
    import torch

    from kit.replica.breakable_cudagraph import BreakableCUDAGraphWrapper
    from kit.replica.forward_context import set_forward_context

    wrapper = BreakableCUDAGraphWrapper(model, pool)

    def create_forward_fn(num_tokens: int, warmup: bool):
        x = torch.ones(num_tokens)

        def forward_fn(mode) -> None:
            with set_forward_context(num_tokens, mode):
                wrapper(x)

        return forward_fn

    return create_forward_fn


def capture_replica_like(fail: str | None, sizes=(16, 8)):
    """The model above captured at `sizes` by the replica's `CudaGraphManager` (on `FakeCuda`, or a GPU)."""
    import torch

    from kit.replica import cudagraph_utils

    manager = cudagraph_utils.CudaGraphManager(torch.device("cpu"), list(sizes), "model graphs")
    manager.capture(create_forward_fn_for(model_forward(fail), manager.pool))
    return manager


# Recordings the kit's tests check once they are made on the H200, not made yet (no H200 could be started in the
# session that added their presets). A test of one of them passes while it is listed here and absent, and fails
# once it is recorded and still listed, so the real checks start the day it lands.
OWED_ON_THE_H200: frozenset[str] = frozenset()  # recordings a change added code for but could not yet record


def owed(relative: str) -> bool:
    """Whether the shipped recording `relative` (under kit/recordings) is still owed: absent, and listed as owed."""
    from kit.recordings import RECORDINGS, shipped

    present = shipped(RECORDINGS / relative) is not None  # as recorded, or shipped compressed beside it
    assert present != (relative in OWED_ON_THE_H200), (
        f"{relative}: {'recorded but still listed' if present else 'missing and not listed'} in OWED_ON_THE_H200"
    )
    return not present

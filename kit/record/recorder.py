"""The capture recorder: every CUDA graph capture in a block of code, labelled.

While a `CaptureRecorder` is active, `torch.cuda.CUDAGraph.capture_begin` and
`capture_end` are wrapped, so every capture is seen, whether it comes from
`torch.cuda.graph`, a raw `CUDAGraph`, the replica, vLLM or torch.compile.
Each graph is labelled by the graph manager whose `capture()` is on the
stack (its `name`, or a name derived from its class, e.g.
`DecoderReplayCudaGraphManager` -> "replay graphs") and the capture size
found there (`num_tokens`, or `desc.num_tokens`, or the `batch_descriptor` vLLM's
breakable wrapper dispatched on); code outside any manager
can label its captures with `recorder.label(...)`. Consecutive graphs of one
manager and size (the segments of a breakable capture) form one capture.

What the recorder cannot identify it does not name. A graph recorded by
torch.compile's cudagraph trees (`torch/_inductor/cudagraph_trees.py` on the
stack) is labelled "torch.compile graphs" with no size, and each such graph
is a capture of its own ("torch.compile graph 1", "torch.compile graph 2",
...): the trees capture one graph per input shape, with no eager break
between them. A graph with no manager, no label and no torch.compile on the
stack is an "unlabelled graphs" capture of its own too ("unlabelled graphs
graph 0", "... graph 1", ...), and its stream is left unnamed
(`kit.analysis.names` then names it by its first allocation). A pool is
called "global graph pool" only when it is vLLM's (`current_platform`'s
`_global_graph_pool`) or the replica's (`kit.replica.cudagraph_utils`); a
pool only one manager (or label) captured into is "<manager> pool"; any
other is left unnamed ("graph pool N").

On stop, the recorder takes a snapshot whose `kit` key names each capture's
stream ("model graphs stream") and pool as above, and lists one window
(trace index range) per graph, so `segment_table`, `capture_attribution`,
`what_if` and the other analyses read it directly; the gaps between a
capture's graphs are its eager breaks.

    with CaptureRecorder() as rec:
        runner.capture_model()
    rec.captures()        # per capture: manager, size, stream, pool, graphs, segments and bytes added
    rec.table()           # the labelled segment-by-stream table

Faults and threads. The wrappers are installed once for all recorders and
removed when the last one stops, and a recorder's own failure inside them is
noted in `recorder.errors`, never raised into the capture it watches.
Leaving the `with` block by an exception (a KeyboardInterrupt included) stops
the recorder: it ends any capture the exception left open in this thread, so
CUDA and the allocator work again, makes the stream current at start current
again, puts the wrappers back and leaves memory history as it found it, and
the exception propagates unchanged. Several
threads may capture at once (vLLM's microbatch threads do): each graph is
attributed to the thread and stream that captured it.

Memory history (`kit.record.history`): if it was off when the first
recorder started, the recorder switches it on (`max_entries`, `stacks`) and
off again when the last one stops; if it was on, it is left alone, and the
recording uses the caller's history as it is (with its `max_entries`: a
buffer too small for the captures leaves windows that point past its start).
"""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import FrameType

import pandas as pd

from kit.analysis.attribution import capture_table
from kit.analysis.names import GRAPH_POOL_LABEL, MODEL_GRAPHS_LABEL, SPECULATOR_GRAPHS_LABEL
from kit.analysis.tables import segment_table
from kit.errors import KitError
from kit.load.snapshot import Snapshot
from kit.patch.install import Patch, interrupts_deferred
from kit.record.history import hold_history, release_history, trace_length
from kit.record.provenance import provenance

# Display names where the one made from the class name would read badly; the
# rest follow the class (DecoderReplayCudaGraphManager -> "decoder replay graphs").
_MANAGER_NAMES = {
    "CudaGraphManager": MODEL_GRAPHS_LABEL,
    "ModelCudaGraphManager": MODEL_GRAPHS_LABEL,
    "DFlashCudaGraphManager": SPECULATOR_GRAPHS_LABEL,
}
TORCH_COMPILE = "torch.compile graphs"  # graphs recorded by torch.compile's cudagraph trees
UNLABELLED = "unlabelled graphs"  # graphs no manager, label or torch.compile accounts for
_CUDAGRAPH_TREES = "torch/_inductor/cudagraph_trees.py"


@dataclass
class CaptureRecord:
    """One CUDA graph captured: a whole capture, or one segment of a breakable one."""

    manager: str
    size: int | None
    stream: int
    index: int  # the graph's place in its capture: 0, then 1 after the first eager break, ...
    trace_begin: int
    pool: tuple[int, int] | None = None
    trace_end: int | None = None
    thread: int = field(default=0, repr=False)
    failed: bool = False  # capture_end raised: the graph was never made
    aborted: bool = False  # an exception left the capture open; the recorder ended it at stop
    name: str | None = None  # a graph that is a capture of its own (torch.compile, unlabelled): its name
    global_pool: bool = False  # its pool is vLLM's (or the replica's) global graph pool

    @property
    def identified(self) -> bool:
        """Whether a graph manager or the caller's label says whose graph this is (only those join captures)."""
        return self.name is None

    @property
    def capture(self) -> str:
        """The capture this graph belongs to: its own name, else manager and size."""
        if self.name is not None:
            return self.name
        return self.manager if self.size is None else f"{self.manager} {self.size}"


def manager_name(obj: object) -> str:
    """A manager's display name: its `name`, else from its class name."""
    name = getattr(obj, "name", None)
    if isinstance(name, str) and name:
        return name
    cls = type(obj).__name__
    if cls in _MANAGER_NAMES:
        return _MANAGER_NAMES[cls]
    words = re.sub(r"(?<!^)(?=[A-Z])", " ", cls.replace("CudaGraphManager", "")).lower().strip()
    return f"{words} graphs" if words else "graphs"


def _is_manager(obj: object) -> bool:
    return any(c.__name__.endswith("CudaGraphManager") for c in type(obj).__mro__)


def _size_in(frame_locals: dict) -> int | None:
    for name in ("num_tokens", "token_budget"):  # token_budget: vLLM's encoder graphs
        if isinstance(frame_locals.get(name), int):
            return frame_locals[name]
    for name in ("desc", "batch_descriptor"):  # batch_descriptor: vLLM's BreakableCUDAGraphWrapper.__call__
        size = getattr(frame_locals.get(name), "num_tokens", None)
        if isinstance(size, int):
            return size
    return None


def _peek_locals(frame: FrameType) -> tuple[object, int | None]:
    """A frame's `self` and capture size, without keeping the frame's other locals alive.

    Before Python 3.13, reading `f_locals` of a function frame leaves a dict of
    all its locals on the frame until the function returns. A tensor the function
    then rebinds would outlive its last use, and the recording would show the
    allocator a longer lifetime than an unrecorded run has (the forward's hidden
    states held across a later eager break). So the dict is emptied after the
    read; the function's own variables are not touched by that.
    """
    local = frame.f_locals
    owner, size = local.get("self"), _size_in(local)
    if sys.version_info < (3, 13) and frame.f_code.co_flags & inspect.CO_OPTIMIZED:
        local.clear()
    return owner, size


def _is_cudagraph_trees(frame: FrameType) -> bool:
    return frame.f_code.co_filename.replace("\\", "/").endswith(_CUDAGRAPH_TREES)


def label_from_stack(frame: FrameType | None = None, max_depth: int = 60) -> tuple[str, int | None] | None:
    """The innermost graph manager on the stack (from `frame`, else the caller's), and the capture size found there.

    The size is the innermost `num_tokens` (or `desc.num_tokens`, `batch_descriptor.num_tokens`, or an encoder's
    `token_budget`) at or below the manager's frame. torch.compile's cudagraph
    trees met first give `("torch.compile graphs", None)`: their shapes are not a size.
    """
    frame = frame if frame is not None else sys._getframe(1)
    size = None
    for _ in range(max_depth):
        if frame is None:
            return None
        if _is_cudagraph_trees(frame):
            return TORCH_COMPILE, None
        owner, frame_size = _peek_locals(frame)
        if size is None:
            size = frame_size
        if owner is not None and _is_manager(owner):
            return manager_name(owner), size
        frame = frame.f_back
    return None


# --- the wrappers and the history, shared by every recorder -----------------------------

_registry_lock = threading.RLock()
_active: list[CaptureRecorder] = []
_hooks: Patch | None = None


def active_recorders() -> list[CaptureRecorder]:
    """The recorders recording now, in any thread."""
    with _registry_lock:
        return list(_active)


def hooks_installed() -> bool:
    """Whether `CUDAGraph.capture_begin`/`capture_end` are the recorder's wrappers now."""
    return _hooks is not None and _hooks.applied


def _dispatch(hook: str, graph, frame: FrameType | None, **kwargs) -> None:
    """Tell every active recorder; a recorder's failure is noted on it, never raised into the capture."""
    with _registry_lock:
        recorders = list(_active)
    for recorder in recorders:
        try:
            getattr(recorder, hook)(graph, frame, **kwargs)
        except Exception as e:  # noqa: BLE001 - the capture being watched matters more than its record
            recorder.errors.append(f"{hook}: {type(e).__name__}: {e}")


def _install_hooks(torch) -> None:
    global _hooks
    if _hooks is not None and _hooks.applied:
        return
    graph_cls = torch.cuda.CUDAGraph
    begin, end = graph_cls.capture_begin, graph_cls.capture_end

    def capture_begin(graph, *args, **kwargs):
        _dispatch("_on_begin", graph, sys._getframe(1))
        return begin(graph, *args, **kwargs)

    def capture_end(graph, *args, **kwargs):
        try:
            out = end(graph, *args, **kwargs)
        except BaseException as e:
            _dispatch("_on_end_failed", graph, None, error=e)
            raise
        _dispatch("_on_end", graph, None)
        return out

    replacements = [(graph_cls, "capture_begin", capture_begin), (graph_cls, "capture_end", capture_end)]
    _hooks = Patch("capture recorder", replacements).apply()


def _remove_hooks_if_unused() -> None:
    global _hooks
    if _active or _hooks is None:
        return
    if all(vars(owner).get(attr) is new for owner, attr, new in _hooks.replacements):
        _hooks.revert()
    # Else something wrapped them after us: ours stays inside its wrapper, inert with no recorder active.
    _hooks = None


class CaptureRecorder:
    """Records every graph capture between `start()` and `stop()`.

    With `history=True` (the default) memory history is recorded for the
    duration if it was off, and switched off again at the end; pass False
    when the caller records it already (it must then be on, or the windows
    are empty).
    """

    def __init__(self, *, history: bool = True, max_entries: int = 2_000_000, stacks: str = "python") -> None:
        self.history = history
        self.max_entries = max_entries
        self.stacks = stacks
        self.records: list[CaptureRecord] = []
        self.snapshot: Snapshot | None = None
        self.errors: list[str] = []  # what went wrong inside the wrappers (never raised into a capture)
        self._open: dict[int, tuple[CaptureRecord, object, object]] = {}  # id(graph) -> record, graph, stream
        self._labels = threading.local()
        self._lock = threading.Lock()
        self._holds_history = False
        self._started_on: tuple[int, object] | None = None  # thread and current stream at start
        self._faulted = False

    # --- lifecycle --------------------------------------------------------

    @property
    def recording(self) -> bool:
        with _registry_lock:
            return self in _active

    def start(self) -> CaptureRecorder:
        import torch

        if not torch.cuda.is_available():
            raise KitError("the capture recorder needs CUDA; load a recorded snapshot instead")
        with _registry_lock, interrupts_deferred():
            if self in _active:
                raise KitError("this recorder is already recording")
            _active.append(self)
            try:
                self._started_on = (threading.get_ident(), torch.cuda.current_stream())
                _install_hooks(torch)
                if self.history:
                    hold_history(max_entries=self.max_entries, stacks=self.stacks)
                    self._holds_history = True
            except BaseException:
                _active.remove(self)
                _remove_hooks_if_unused()
                raise
        return self

    def stop(self) -> Snapshot:
        """Take the snapshot, put `capture_begin`/`capture_end` back, leave memory history as it was."""
        import torch

        if not self.recording:
            raise KitError("this recorder is not recording")
        try:
            self._end_open_captures(torch)
            torch.cuda.synchronize()
            raw = torch.cuda.memory._snapshot()
            raw["kit"] = self._kit_metadata(torch)
            self.snapshot = Snapshot(raw, origin="capture recorder", live=True)
            _last_recording[0] = raw
            if self.records and not self.snapshot.has_trace:
                warnings.warn(
                    "capture recorder: memory history kept no trace (it was on with enabled='state'?), "
                    "so the capture windows are empty",
                    stacklevel=2,
                )
        finally:
            with _registry_lock, interrupts_deferred():
                if self in _active:
                    _active.remove(self)
                _remove_hooks_if_unused()
                if self._faulted:
                    self._put_back_stream(torch)
                if self._holds_history:
                    self._holds_history = False
                    release_history()
        return self.snapshot

    def _put_back_stream(self, torch) -> None:
        """After a fault, make the stream current at start current again (an exception can skip a stream's exit)."""
        thread, stream = self._started_on or (None, None)
        if thread == threading.get_ident() and torch.cuda.current_stream() != stream:
            torch.cuda.set_stream(stream)
            self.errors.append("an exception left another stream current; the one current at start is again")

    def __enter__(self) -> CaptureRecorder:
        return self.start()

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.stop()
            return
        self._faulted = True
        try:
            self.stop()
        except Exception as stop_error:  # noqa: BLE001 - the exception from inside the block is the one to see
            exc.add_note(f"(kit: stopping the capture recorder after this failed too: {stop_error})")

    @contextlib.contextmanager
    def label(self, manager: str, size: int | None = None) -> Iterator[None]:
        """Label the captures this thread makes in the block (code with no graph manager)."""
        previous = getattr(self._labels, "current", None)
        self._labels.current = (manager, size)
        try:
            yield
        finally:
            self._labels.current = previous

    def _end_open_captures(self, torch) -> None:
        """End the captures this thread began that an exception left open: the stream and the allocator work again.

        (A capture must end in the thread that began it; one another thread left open stays as it is.)
        """
        me = threading.get_ident()
        with self._lock:
            left = [entry for entry in self._open.values() if entry[0].thread == me]
        for record, graph, stream in left:
            with torch.cuda.stream(stream):
                still_open = torch.cuda.is_current_stream_capturing()
                if still_open:
                    record.aborted = True
                    self.errors.append(f"the capture of {graph_name(record)} was left open by an exception; ended")
                    try:
                        graph.capture_end()
                    except Exception as e:  # noqa: BLE001 - it may be beyond saving; the stop goes on
                        self.errors.append(f"ending it failed: {type(e).__name__}: {e}")
            if not still_open:
                record.failed = True  # its capture_end raised and the capture is gone: no graph
            with self._lock:
                self._open.pop(id(graph), None)

    # --- the hooks ---------------------------------------------------------

    def _on_begin(self, graph, frame: FrameType | None) -> None:
        import torch

        given = getattr(self._labels, "current", None)
        manager, size = given or label_from_stack(frame) or (UNLABELLED, None)
        stream = torch.cuda.current_stream()
        thread = threading.get_ident()
        index = trace_length(torch)
        with self._lock:
            record = CaptureRecord(manager, size, stream.cuda_stream, 0, index, thread=thread)
            if given is None and manager in (TORCH_COMPILE, UNLABELLED):
                record.name = self._own_capture_name(manager)  # a capture of its own: no eager break before it
            else:
                last = next((r for r in reversed(self.records) if r.thread == thread), None)
                if _continues(last, record):
                    record.index = last.index + 1  # the next segment of a breakable capture: an eager break between
            self.records.append(record)
            self._open[id(graph)] = (record, graph, stream)

    def _own_capture_name(self, manager: str) -> str:
        """A name for a graph that is a capture of its own: "torch.compile graph 1", "unlabelled graphs graph 0"."""
        n = sum(1 for r in self.records if r.manager == manager and not r.identified)
        return f"torch.compile graph {n + 1}" if manager == TORCH_COMPILE else f"{manager} graph {n}"

    def _on_end(self, graph, frame: FrameType | None) -> None:
        import torch

        index = trace_length(torch)
        with self._lock:
            entry = self._open.pop(id(graph), None)
            if entry is None:
                return
            record = entry[0]
            record.pool = tuple(graph.pool())
            record.global_pool = record.pool in known_global_pools()
            record.trace_end = index

    def _on_end_failed(self, graph, frame: FrameType | None, error: BaseException) -> None:
        # The capture may still be open (torch refused before ending it) or gone: `stop` tells which.
        with self._lock:
            entry = self._open.get(id(graph))
        if entry is not None:
            self.errors.append(f"capture_end of {graph_name(entry[0])} raised {type(error).__name__}: {error}")

    # --- results -------------------------------------------------------------

    def _kit_metadata(self, torch) -> dict:
        finished = [r for r in self.records if r.trace_end is not None and r.pool is not None]
        return {
            "source": "live GPU",
            "provenance": provenance("kit.CaptureRecorder"),
            "streams": stream_names(self.records),
            "pools": pool_names(self.records),
            "graphs": {graph_name(r): list(r.pool) for r in finished},
            "captures": [
                {
                    "graph": graph_name(r),
                    "capture": r.capture,
                    "manager": r.manager,
                    "size": r.size,
                    "index": r.index,
                    "stream": r.stream,
                    "pool": list(r.pool),
                    "trace_begin": r.trace_begin,
                    "trace_end": r.trace_end,
                    **({"aborted": True} if r.aborted else {}),
                }
                for r in finished
            ],
        }

    def _require_snapshot(self) -> Snapshot:
        if self.snapshot is None:
            raise KitError("no recording yet: use the recorder as a context manager, or call stop()")
        return self.snapshot

    def captures(self) -> pd.DataFrame:
        """Per capture: manager, size, stream, pool, graphs, and the segments it added (`capture_table`)."""
        return capture_table(self._require_snapshot())

    def table(self) -> pd.DataFrame:
        """The labelled segment-by-stream table of the recording."""
        return segment_table(self._require_snapshot())


_last_recording: list[dict | None] = [None]


def last_recording() -> dict | None:
    """The raw snapshot of the last recorder stopped in this process (what a vLLM worker sends back)."""
    return _last_recording[0]


def _continues(last: CaptureRecord | None, record: CaptureRecord) -> bool:
    """Whether `record` is the next graph of `last`'s capture: one known manager (or label), size and stream."""
    if last is None or not last.identified:
        return False
    return (last.manager, last.size, last.stream) == (record.manager, record.size, record.stream)


def graph_name(record: CaptureRecord) -> str:
    """A graph's name: its capture's and its place there ("model graphs 512 graph 1"), or its own name."""
    return record.name if record.name is not None else f"{record.capture} graph {record.index}"


def stream_names(records: list[CaptureRecord]) -> dict[str, int]:
    """Each capture stream by the first manager known to capture on it ("model graphs stream").

    A stream only unlabelled graphs captured on gets no name here: `kit.analysis.names`
    names it by its first allocation.
    """
    streams: dict[str, int] = {}
    for r in records:
        if r.manager != UNLABELLED and r.stream not in streams.values():
            streams.setdefault(f"{r.manager} stream", r.stream)
    return streams


def pool_names(records: list[CaptureRecord]) -> dict[str, list[int]]:
    """The pools the recorder knows: vLLM's global graph pool, and a pool only one manager captured into.

    A pool torch.compile's trees, unlabelled graphs or several managers captured into gets no
    name here (`kit.analysis.names` numbers it: "graph pool N").
    """
    by_pool: dict[tuple[int, int], list[CaptureRecord]] = {}
    for r in records:
        if r.pool is not None:
            by_pool.setdefault(r.pool, []).append(r)
    names: dict[str, list[int]] = {}
    for pool, mine in by_pool.items():
        managers = {r.manager for r in mine}
        if any(r.global_pool for r in mine):
            names.setdefault(GRAPH_POOL_LABEL, list(pool))
        elif len(managers) == 1 and all(r.identified for r in mine):
            names.setdefault(f"{mine[0].manager} pool", list(pool))
    return names


def known_global_pools() -> set[tuple[int, int]]:
    """The global graph pools made in this process: vLLM's platform pool and the replica's, where made.

    Read without making one: vLLM's `current_platform.get_global_graph_pool()` would mint it.
    """
    pools = set()
    replica = sys.modules.get("kit.replica.cudagraph_utils")
    platforms = sys.modules.get("vllm.platforms")
    platform = vars(platforms).get("_current_platform") if platforms is not None else None
    candidates = [
        getattr(replica, "_global_graph_pool", None),
        getattr(type(platform), "_global_graph_pool", None) if platform is not None else None,
    ]
    for pool in candidates:
        try:
            a, b = pool
            pools.add((int(a), int(b)))
        except (TypeError, ValueError):
            continue
    return pools

"""The capture recorder: every CUDA graph capture in a block of code, labelled.

While a `CaptureRecorder` is active, `torch.cuda.CUDAGraph.capture_begin` and
`capture_end` are wrapped, so every capture is seen, whether it comes from
`torch.cuda.graph`, a raw `CUDAGraph`, the replica or vLLM. Each graph is
labelled by the graph manager whose `capture()` is on the stack (its `name`,
or a name derived from its class, e.g. `DecoderReplayCudaGraphManager` ->
"replay graphs") and the capture size found there (`num_tokens`, or
`desc.num_tokens`); code outside any manager can label its captures with
`recorder.label(...)`. Consecutive graphs of one manager and size (the
segments of a breakable capture) form one capture.

On stop, the recorder takes a snapshot whose `kit` key names each capture's
stream ("model graphs stream") and pool, and lists one window (trace index
range) per graph, so `segment_table`, `capture_attribution`, `what_if` and
the other analyses read it directly; the gaps between a capture's graphs are
its eager breaks.

    with CaptureRecorder() as rec:
        runner.capture_model()
    rec.captures()        # per capture: manager, size, stream, pool, graphs, segments and bytes added
    rec.table()           # the labelled segment-by-stream table
"""

from __future__ import annotations

import contextlib
import datetime
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import FrameType

import pandas as pd

from kit.errors import KitError
from kit.patch import Patch
from kit.snapshot import Snapshot

# Display names where the one made from the class name would read badly; the
# rest follow the class (DecoderReplayCudaGraphManager -> "decoder replay graphs").
_MANAGER_NAMES = {
    "CudaGraphManager": "model graphs",
    "ModelCudaGraphManager": "model graphs",
    "DFlashCudaGraphManager": "DFlash speculator graphs",
}


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

    @property
    def capture(self) -> str:
        """The capture this graph belongs to: manager and size."""
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
    size = getattr(frame_locals.get("desc"), "num_tokens", None)
    return size if isinstance(size, int) else None


def label_from_stack(frame: FrameType | None = None, max_depth: int = 60) -> tuple[str, int | None] | None:
    """The innermost graph manager on the stack (from `frame`, else the caller's), and the capture size found there.

    The size is the innermost `num_tokens` (or `desc.num_tokens`, or an encoder's
    `token_budget`) at or below the manager's frame.
    """
    frame = frame if frame is not None else sys._getframe(1)
    size = None
    for _ in range(max_depth):
        if frame is None:
            return None
        local = frame.f_locals
        if size is None:
            size = _size_in(local)
        owner = local.get("self")
        if owner is not None and _is_manager(owner):
            return manager_name(owner), size
        frame = frame.f_back
    return None


def _trace_length(torch) -> int:
    traces = torch.cuda.memory._snapshot()["device_traces"]
    return len(traces[torch.cuda.current_device()]) if traces else 0


class CaptureRecorder:
    """Records every graph capture between `start()` and `stop()`.

    With `history=True` (the default) memory history is recorded for the
    duration and switched off at the end; pass False when the caller records
    it already (it must then be on, or the windows are empty).
    """

    def __init__(self, *, history: bool = True, max_entries: int = 2_000_000, stacks: str = "python") -> None:
        self.history = history
        self.max_entries = max_entries
        self.stacks = stacks
        self.records: list[CaptureRecord] = []
        self.snapshot: Snapshot | None = None
        self._open: dict[int, CaptureRecord] = {}
        self._labels = threading.local()
        self._lock = threading.Lock()
        self._patch: Patch | None = None

    # --- lifecycle --------------------------------------------------------

    def start(self) -> CaptureRecorder:
        import torch

        if not torch.cuda.is_available():
            raise KitError("the capture recorder needs CUDA; load a recorded snapshot instead")
        if self._patch is not None:
            raise KitError("this recorder is already recording")
        graph_cls = torch.cuda.CUDAGraph
        begin, end = graph_cls.capture_begin, graph_cls.capture_end
        recorder = self

        def capture_begin(graph, *args, **kwargs):
            recorder._on_begin(graph)
            return begin(graph, *args, **kwargs)

        def capture_end(graph, *args, **kwargs):
            out = end(graph, *args, **kwargs)
            recorder._on_end(graph)
            return out

        self._patch = Patch(
            "capture recorder", [(graph_cls, "capture_begin", capture_begin), (graph_cls, "capture_end", capture_end)]
        ).apply()
        if self.history:
            try:
                torch.cuda.memory._record_memory_history(max_entries=self.max_entries, stacks=self.stacks)
            except BaseException:
                self._patch.revert()
                self._patch = None
                raise
        return self

    def stop(self) -> Snapshot:
        """Take the snapshot, put `capture_begin`/`capture_end` back, stop the history."""
        import torch

        if self._patch is None:
            raise KitError("this recorder is not recording")
        try:
            torch.cuda.synchronize()
            raw = torch.cuda.memory._snapshot()
            raw["kit"] = self._kit_metadata(torch)
            self.snapshot = Snapshot(raw, origin="capture recorder", live=True)
            _last_recording[0] = raw
        finally:
            self._patch.revert()
            self._patch = None
            if self.history:
                torch.cuda.memory._record_memory_history(enabled=None)
        return self.snapshot

    def __enter__(self) -> CaptureRecorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @contextlib.contextmanager
    def label(self, manager: str, size: int | None = None) -> Iterator[None]:
        """Label the captures this thread makes in the block (code with no graph manager)."""
        previous = getattr(self._labels, "current", None)
        self._labels.current = (manager, size)
        try:
            yield
        finally:
            self._labels.current = previous

    # --- the hooks ---------------------------------------------------------

    def _on_begin(self, graph) -> None:
        import torch

        label = (
            getattr(self._labels, "current", None) or label_from_stack(sys._getframe(2)) or ("unlabelled graphs", None)
        )
        stream = torch.cuda.current_stream().cuda_stream
        thread = threading.get_ident()
        index = _trace_length(torch)
        with self._lock:
            mine = [r for r in self.records if r.thread == thread]
            last = mine[-1] if mine else None
            same = last is not None and (last.manager, last.size, last.stream) == (*label, stream)
            record = CaptureRecord(*label, stream, last.index + 1 if same else 0, index, thread=thread)
            self.records.append(record)
            self._open[id(graph)] = record

    def _on_end(self, graph) -> None:
        import torch

        index = _trace_length(torch)
        with self._lock:
            record = self._open.pop(id(graph), None)
            if record is None:
                return
            record.pool = tuple(graph.pool())
            record.trace_end = index

    # --- results -------------------------------------------------------------

    def _kit_metadata(self, torch) -> dict:
        finished = [r for r in self.records if r.trace_end is not None]
        streams: dict[str, int] = {}
        for r in self.records:
            if r.stream not in streams.values():
                streams[f"{r.manager} stream"] = r.stream
        pools = sorted({r.pool for r in self.records if r.pool is not None})
        pool_names = {"global graph pool": list(pools[0])} if len(pools) == 1 else {}
        for r in self.records:
            if r.pool is not None and len(pools) > 1:
                pool_names.setdefault(f"{r.manager} pool", list(r.pool))
        return {
            "source": "live GPU",
            "provenance": {
                "gpu": torch.cuda.get_device_name(),
                "torch": str(torch.__version__),
                "cuda": torch.version.cuda,
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "command": "kit.capture.CaptureRecorder",
            },
            "streams": streams,
            "pools": pool_names,
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
                }
                for r in finished
            ],
        }

    def _require_snapshot(self) -> Snapshot:
        if self.snapshot is None:
            raise KitError("no recording yet: use the recorder as a context manager, or call stop()")
        return self.snapshot

    def captures(self) -> pd.DataFrame:
        return capture_table(self._require_snapshot())

    def table(self) -> pd.DataFrame:
        from kit.tables import segment_table

        return segment_table(self._require_snapshot())


_last_recording: list[dict | None] = [None]


def last_recording() -> dict | None:
    """The raw snapshot of the last recorder stopped in this process (what `kit.vllm` sends from a worker)."""
    return _last_recording[0]


def graph_name(record: CaptureRecord) -> str:
    return f"{record.capture} graph {record.index}"


def capture_table(snapshot: Snapshot) -> pd.DataFrame:
    """Per recorded capture: manager, size, stream, pool, graphs, eager breaks, and the segments it added.

    `new_segment_bytes` are the segments its graphs added to its pool;
    `break_segment_bytes` those its eager breaks added elsewhere (the breaks
    run outside the capture, so outside the graph pool).
    """
    from kit.tables import stream_labels
    from kit.trace import replay_trace

    graphs = snapshot.kit.get("captures") or []
    made = replay_trace(snapshot).new_segments
    labels = stream_labels(snapshot)
    rows = []
    for name in dict.fromkeys(g.get("capture", g["graph"]) for g in graphs):
        mine = [g for g in graphs if g.get("capture", g["graph"]) == name]
        first, last, pool = mine[0], mine[-1], tuple(mine[0]["pool"])
        inside = made[(made["index"] >= first["trace_begin"]) & (made["index"] < last["trace_end"])]
        in_pool = inside["pool"].map(lambda p, pool=pool: tuple(p) == pool).astype(bool)
        rows.append(
            {
                "manager": first.get("manager", name),
                "size": first.get("size"),
                "stream": first["stream"],
                "stream_label": labels.get(first["stream"], str(first["stream"])),
                "pool": pool,
                "graphs": len(mine),
                "eager_breaks": len(mine) - 1,
                "new_segments": int(in_pool.sum()),
                "new_segment_bytes": int(inside[in_pool]["size"].sum()),
                "break_segment_bytes": int(inside[~in_pool]["size"].sum()),
                "trace_begin": first["trace_begin"],
                "trace_end": last["trace_end"],
            }
        )
    columns = ["manager", "size", "stream", "stream_label", "pool", "graphs", "eager_breaks", "new_segments"]
    columns += ["new_segment_bytes", "break_segment_bytes", "trace_begin", "trace_end"]
    table = pd.DataFrame(rows, columns=columns)
    table.attrs["source"] = snapshot.source_label
    return table

"""CUDA memory history, switched on for the kit's recordings and left as the user had it.

Every recording the kit makes (the capture recorder, the two-capture
experiment, running a workload on the GPU) needs memory history on, and must
leave it as it found it: off again if the kit switched it on, untouched if the
user had it on, with whatever `max_entries` they chose. Recordings may nest or
overlap (two recorders in two threads), so history is held by a count: the
first holder switches it on if it was off, the last one to let go switches it
off again if the kit switched it on.

torch has no public getter for the history's state; `history_enabled` asks
`torch._C._cuda_isHistoryEnabled` (what torch's own CUDA-graph trees use), and
on a torch without it takes a non-empty trace as on and an empty one as off.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.RLock()
_holders = {"count": 0, "ours": False}


def history_enabled(torch: Any) -> bool:
    """Whether this process records CUDA memory history now."""
    if not torch.cuda.is_initialized():
        return False  # switching history on initialises CUDA; asking the allocator before that segfaults
    probe = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if probe is not None:
        with contextlib.suppress(Exception):
            return bool(probe())
    traces = torch.cuda.memory._snapshot().get("device_traces") or []
    return any(traces)  # switching history off clears the trace, so entries mean it is on


def trace_length(torch: Any) -> int:
    """Entries in the current device's memory history trace: the index the next event will have."""
    traces = torch.cuda.memory._snapshot().get("device_traces") or []
    device = torch.cuda.current_device()
    return len(traces[device]) if device < len(traces) else 0


def hold_history(**kwargs: Any) -> None:
    """Take a hold on memory history; the first hold switches it on (`kwargs` go to `_record_memory_history`)."""
    import torch

    with _lock:
        if _holders["count"] == 0:
            was_on = history_enabled(torch)
            if not was_on:
                torch.cuda.memory._record_memory_history(**kwargs)
            _holders["ours"] = not was_on
        _holders["count"] += 1


def release_history() -> None:
    """Let go of a hold; the last one switches history off again if the kit switched it on."""
    import torch

    with _lock:
        _holders["count"] -= 1
        if _holders["count"] == 0 and _holders["ours"]:
            _holders["ours"] = False
            torch.cuda.memory._record_memory_history(enabled=None)


@contextlib.contextmanager
def recording_history(**kwargs: Any) -> Iterator[None]:
    """Memory history on for the block (`kwargs` go to `_record_memory_history`), then as it was found."""
    hold_history(**kwargs)
    try:
        yield
    finally:
        release_history()

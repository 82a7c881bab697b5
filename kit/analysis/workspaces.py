"""Per-stream cuBLAS workspaces in a trace: memory a process makes once per stream, not per request.

The first matrix multiply on a stream makes that stream's cuBLAS workspace
(and, for cuBLASLt matmuls, a cuBLASLt one) through the caching allocator,
and PyTorch keeps it, keyed by (handle, stream), for the life of the process
(`at::cuda::getCurrentCUDABlasHandle`, `getCUDABlasLtWorkspace`). Inside a
capture the allocation lands in the graph pool and stays allocated there.
Had that stream's work run on a stream that already had its workspace, the
allocation would never have happened; `kit.analysis.whatif` uses this module
to leave it out of a prediction.

Workspaces are found two ways, and `Workspaces.found_by` says which:

- `"frames"`: the trace recorded C++ frames (`_record_memory_history()`'s
  default, `stacks="all"`), and the allocation was made under a frame naming
  a workspace getter;
- `"size"`: no C++ frames, and not a workload's snapshot; an allocation of a known workspace size
  (`WORKSPACE_BYTES`), never freed in the trace, the first of its size on its
  stream. A program tensor of exactly that shape would be taken for one,
  which is why the what-if says when it guessed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from kit.load.snapshot import Snapshot
from kit.units import MIB

# Sizes seen on the H200 with torch 2.11 (kit/recordings/plain/replay_graphs_separate.pickle):
# the cuBLAS workspace (`_getWorkspaceSize()` on Hopper) and the cuBLASLt one.
WORKSPACE_BYTES = frozenset({32 * MIB, 1 * MIB})
_LT = re.compile(r"BlasLt\w*Workspace", re.IGNORECASE)
_CUBLAS = re.compile(r"setWorkspaceForHandle|getCurrentCUDABlasHandle|getNewWorkspace|CUDABlasWorkspace", re.IGNORECASE)
_CPP = re.compile(r"\.(cpp|cc|cu|h|hpp)$|^\?\?$|^$")


@dataclass
class Workspaces:
    """The workspace allocations of one device's trace, and of the segments it started with.

    `allocs` maps a trace index to its kind ("cuBLAS" or "cuBLASLt", or
    "cuBLAS-sized" / "cuBLASLt-sized" when told apart by size); `seeded`
    maps the address of a block live when the trace began to its (kind,
    stream); `found_by` is "frames", "size" or "" when there is none.
    """

    allocs: dict[int, str] = field(default_factory=dict)
    seeded: dict[int, tuple[str, int]] = field(default_factory=dict)
    found_by: str = ""


def workspace_kind(frames: Sequence[dict]) -> str | None:
    """ "cuBLASLt" or "cuBLAS" when a frame names a workspace getter; None otherwise."""
    for frame in frames:
        name = frame.get("name") if isinstance(frame, dict) else None
        if not isinstance(name, str):
            continue
        if _LT.search(name):
            return "cuBLASLt"
        if _CUBLAS.search(name):
            return "cuBLAS"
    return None


def has_cpp_frames(entries: Sequence) -> bool:
    """Whether any trace entry's frames include a C++ one (so frames can tell a workspace apart)."""
    for e in entries:
        for frame in e.frames:
            filename = frame.get("filename") if isinstance(frame, dict) else None
            if isinstance(filename, str) and _CPP.search(filename):
                return True
    return False


def find_workspaces(snap: Snapshot, entries: Sequence, device: int = 0) -> Workspaces:
    """The cuBLAS and cuBLASLt workspaces among `entries` (one device's trace) and the blocks live before it.

    A snapshot of a workload (`run-workload` or `sim`: its `kit` key says
    `"workload": true`) has none: a workload only allocates and frees.
    """
    if (snap.kit_key or {}).get("workload") is True:
        return Workspaces()
    if has_cpp_frames(entries):
        return _by_frames(snap, entries, device)
    return _by_size(snap, entries, device)


def _by_frames(snap: Snapshot, entries: Sequence, device: int) -> Workspaces:
    found = Workspaces(found_by="frames")
    allocated_in_trace = set()
    for i, e in enumerate(entries):
        if e.action == "alloc":
            allocated_in_trace.add(e.addr)
            kind = workspace_kind(e.frames)
            if kind:
                found.allocs[i] = kind
    for seg in snap.segments:
        if seg.device != device:
            continue
        for b in seg.blocks:
            kind = workspace_kind(b.frames) if b.state == "active_allocated" else None
            if kind and b.address not in allocated_in_trace:
                found.seeded[b.address] = (kind, seg.stream)
    if not found.allocs and not found.seeded:
        found.found_by = ""
    return found


def _by_size(snap: Snapshot, entries: Sequence, device: int) -> Workspaces:
    """Allocations of a workspace size never freed in the trace, the first of their size on their stream."""
    live_at_end = {
        b.address for s in snap.segments if s.device == device for b in s.blocks if b.state == "active_allocated"
    }
    found = Workspaces(found_by="size")
    seen: set[tuple[int, int]] = set()  # (stream, size)
    last_alloc: dict[int, int] = {}  # address -> index of its last allocation in the trace
    for i, e in enumerate(entries):
        if e.action == "alloc":
            last_alloc[e.addr] = i
    for i, e in enumerate(entries):
        if e.action != "alloc" or e.size not in WORKSPACE_BYTES or (e.stream, e.size) in seen:
            continue
        if last_alloc[e.addr] != i or e.addr not in live_at_end:
            continue  # freed within the trace: not a workspace
        seen.add((e.stream, e.size))
        found.allocs[i] = "cuBLAS-sized" if e.size == 32 * MIB else "cuBLASLt-sized"
    if not found.allocs:
        found.found_by = ""
    return found

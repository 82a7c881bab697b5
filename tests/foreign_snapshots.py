"""Snapshots as other torch versions write them, built by hand from PyTorch's source history.

No GPU with those torch versions is at hand, so each version's snapshot is the
same small allocator story written with that version's keys. The story, on
one device: a 512-byte tensor on the default stream (a 2 MiB small segment);
a graph pool (0, 1) whose capture on stream S1 allocates 8 MiB and a
12 MiB temporary in a 20 MiB segment and frees the temporary; then a capture
on stream S2 into the same pool needs 12 MiB and cudaMallocs a new 12 MiB
segment although the 12 MiB free block sits on S1: 12 MiB stranded.

Where each key set comes from (torch/csrc/cuda/Module.cpp
`THCPModule_memorySnapshot`, torch/csrc/cuda/memory_snapshot.cpp and the
`_snapshot` docstring in torch/cuda/memory.py, and the pull requests that
changed them):

- 2.0: Module.cpp as of pytorch/pytorch@003ce81 (read through the code
  search): a segment has no `is_expandable` and no `frames`; a block has no
  `address`, and its stack is a `history` list of {addr, real_size, frames};
  trace entries (PR #86241) are action, addr, size, stream, frames.
- 2.1: expandable segments (PR #96995, April 2023) add `is_expandable` and the
  `segment_map`/`segment_unmap` actions; blocks carry `address` and `frames`
  (the `history` list is gone), segments `frames`.
- 2.4: trace entries gain `time_us` (PR #112266, torch 2.2); the snapshot
  gains `allocator_settings` (PR #119404, torch 2.3).
- 2.6: `external_annotations` (record_function annotations, PR #129072, 2.5).
- 2.9: trace entries gain `compile_context` (PR #152707, 2.8).
- 2.11: trace entries gain `user_metadata` (PR #165490, 2.10), and
  `allocator_settings` `graph_capture_record_stream_reuse`: the key sets of
  the H200 recordings in tests/fixtures (torch 2.11.0+cu130), recorded.
- current (2.14, installed here): trace entries gain `pool_id` (PR #177717)
  and the `annotate` action (PR #190575), both documented in the installed
  torch/cuda/memory.py `_snapshot`.

Variants: `state_only(version)` is what `_record_memory_history(enabled="state")`
leaves (memory_snapshot.cpp sets the trace's ring buffer to one entry unless
enabled == "all"), `no_traces(version)` what `memory_snapshot(include_traces=False)`
returns (PR #172672: no trace entries), and `expandable()` a snapshot
recorded with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`: one segment
per mapped range, grown by `segment_map` events.
"""

from __future__ import annotations

import copy

from .helpers import MIB

A, B, C = 0x7F00_0000_0000, 0x7F00_0400_0000, 0x7F00_0800_0000
S1, S2 = 0x5555_0000_1000, 0x5555_0000_2000
GRAPH_POOL = (0, 1)

SEGMENT_KEYS = {
    "2.0": (
        "device",
        "address",
        "total_size",
        "allocated_size",
        "active_size",
        "requested_size",
        "stream",
        "segment_type",
        "segment_pool_id",
        "blocks",
    ),
}
SEGMENT_KEYS["2.1"] = (*SEGMENT_KEYS["2.0"], "is_expandable", "frames")
for _v in ("2.4", "2.6", "2.9", "2.11", "current"):
    SEGMENT_KEYS[_v] = SEGMENT_KEYS["2.1"]

BLOCK_KEYS = {"2.0": ("size", "requested_size", "state", "history")}
for _v in ("2.1", "2.4", "2.6", "2.9", "2.11", "current"):
    BLOCK_KEYS[_v] = ("address", "size", "requested_size", "state", "frames")

TRACE_KEYS = {"2.0": ("action", "addr", "size", "stream", "frames")}
TRACE_KEYS["2.1"] = TRACE_KEYS["2.0"]
TRACE_KEYS["2.4"] = (*TRACE_KEYS["2.1"], "time_us")
TRACE_KEYS["2.6"] = TRACE_KEYS["2.4"]
TRACE_KEYS["2.9"] = (*TRACE_KEYS["2.6"], "compile_context")
TRACE_KEYS["2.11"] = (*TRACE_KEYS["2.9"], "user_metadata")
TRACE_KEYS["current"] = (*TRACE_KEYS["2.11"], "pool_id")

TOP_KEYS = {"2.0": ("segments", "device_traces")}
TOP_KEYS["2.1"] = TOP_KEYS["2.0"]
TOP_KEYS["2.4"] = (*TOP_KEYS["2.1"], "allocator_settings")
TOP_KEYS["2.6"] = (*TOP_KEYS["2.4"], "external_annotations")
for _v in ("2.9", "2.11", "current"):
    TOP_KEYS[_v] = TOP_KEYS["2.6"]

VERSIONS = tuple(TOP_KEYS)
FRAME = [{"filename": "model.py", "line": 42, "name": "forward"}]

# The story as (action, addr, size, stream, pool) events; pool only for the graph pool's.
EVENTS = [
    ("segment_alloc", A, 2 * MIB, 0, None),
    ("alloc", A, 512, 0, None),
    ("segment_alloc", B, 20 * MIB, S1, GRAPH_POOL),
    ("alloc", B, 8 * MIB, S1, GRAPH_POOL),
    ("alloc", B + 8 * MIB, 12 * MIB, S1, GRAPH_POOL),
    ("free_requested", B + 8 * MIB, 12 * MIB, S1, GRAPH_POOL),
    ("free_completed", B + 8 * MIB, 12 * MIB, S1, GRAPH_POOL),
    ("segment_alloc", C, 12 * MIB, S2, GRAPH_POOL),
    ("alloc", C, 12 * MIB, S2, GRAPH_POOL),
    ("free_requested", C, 12 * MIB, S2, GRAPH_POOL),
    ("free_completed", C, 12 * MIB, S2, GRAPH_POOL),
]
STRANDED = {(GRAPH_POOL, S2): 12 * MIB}  # what `reuse` must find on every version


def _allocator_settings(version: str, expandable: bool = False) -> dict:
    settings = {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True" if expandable else "",
        "max_split_size": -1,
        "garbage_collection_threshold": 0.0,
        "expandable_segments": expandable,
        "pinned_num_register_threads": 1,
        "release_lock_on_cudamalloc": False,
        "pinned_use_cuda_host_register": False,
        "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)},
    }
    if version in ("2.11", "current"):
        settings["graph_capture_record_stream_reuse"] = False
    return settings


def _block(version: str, address: int, size: int, state: str) -> dict:
    full = {"address": address, "size": size, "requested_size": size if state != "inactive" else 0, "state": state}
    if version == "2.0":
        full["history"] = [{"addr": address, "real_size": size, "frames": FRAME}] if state != "inactive" else []
    else:
        full["frames"] = FRAME if state != "inactive" else []
    return {k: full[k] for k in BLOCK_KEYS[version] if k in full}


def _segment(version: str, address: int, blocks: list[tuple[int, str]], stream: int, pool: tuple) -> dict:
    parts, cursor = [], address
    for size, state in blocks:
        parts.append(_block(version, cursor, size, state))
        cursor += size
    total = cursor - address
    allocated = sum(size for size, state in blocks if state == "active_allocated")
    full = {
        "device": 0,
        "address": address,
        "total_size": total,
        "allocated_size": allocated,
        "active_size": allocated,
        "requested_size": allocated,
        "stream": stream,
        "segment_type": "small" if total <= 2 * MIB else "large",
        "segment_pool_id": pool,
        "blocks": parts,
        "is_expandable": False,
        "frames": FRAME,
    }
    return {k: full[k] for k in SEGMENT_KEYS[version]}


def _entry(version: str, i: int, action: str, addr: int, size: int, stream: int, pool) -> dict:
    full = {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": stream,
        "frames": FRAME,
        "time_us": 1_700_000_000_000_000 + 10 * i,
        "compile_context": "N/A",
        "user_metadata": "",
        "pool_id": pool or (0, 0),
    }
    return {k: full[k] for k in TRACE_KEYS[version]}


def snapshot(version: str) -> dict:
    """The story's snapshot, with its full trace, as torch `version` writes it."""
    raw = {
        "segments": [
            _segment(version, A, [(512, "active_allocated"), (2 * MIB - 512, "inactive")], 0, (0, 0)),
            _segment(version, B, [(8 * MIB, "active_allocated"), (12 * MIB, "inactive")], S1, GRAPH_POOL),
            _segment(version, C, [(12 * MIB, "inactive")], S2, GRAPH_POOL),
        ],
        "device_traces": [[_entry(version, i, *event) for i, event in enumerate(EVENTS)]],
        "allocator_settings": _allocator_settings(version),
        "external_annotations": [],
    }
    if version == "current":  # an annotation on the live tensor (torch.cuda.memory._annotate_tensor)
        note = {**_entry(version, len(EVENTS), "annotate", A, 512, 0, None), "user_metadata": "kv cache"}
        raw["device_traces"][0].append(note)
    return {k: raw[k] for k in TOP_KEYS[version]}


def state_only(version: str) -> dict:
    """History recorded with enabled="state": the trace keeps its last entry only."""
    raw = snapshot(version)
    raw["device_traces"] = [raw["device_traces"][0][-1:]]
    return raw


def no_traces(version: str) -> dict:
    """`memory_snapshot(include_traces=False)`, or a process that never recorded history."""
    raw = snapshot(version)
    raw["device_traces"] = []
    return raw


def expandable(version: str = "2.11") -> dict:
    """The same story with expandable segments in the default pool.

    The default pool's segment on stream 0 grows by mapping 2 MiB pages: a
    2 MiB tensor maps the first page, a 2.5 MiB one maps two more, a 3 MiB
    temporary a fourth, which is unmapped again once the temporary is freed.
    The snapshot holds one segment per mapped range: 6 MiB at A. Graph pools
    never use expandable segments (the allocator keeps private pools out of
    them), so the pool's segments and its stranding are as before.
    """
    raw = snapshot(version)
    raw["allocator_settings"] = _allocator_settings(version, expandable=True)
    blocks = [(2 * MIB, "active_allocated"), (5 * MIB // 2, "active_allocated"), (3 * MIB // 2, "inactive")]
    seg = _segment(version, A, blocks, 0, (0, 0))
    seg["is_expandable"] = True
    raw["segments"][0] = seg
    x, y, z = A, A + 2 * MIB, A + 9 * MIB // 2
    events = [
        ("segment_map", A, 2 * MIB, 0, None),
        ("alloc", x, 2 * MIB, 0, None),
        ("segment_map", A + 2 * MIB, 4 * MIB, 0, None),  # grows the mapped range: still one segment
        ("alloc", y, 5 * MIB // 2, 0, None),
        ("segment_map", A + 6 * MIB, 2 * MIB, 0, None),
        ("alloc", z, 3 * MIB, 0, None),  # takes the whole 3.5 MiB gap: 0.5 MiB is too small to split off
        ("free_requested", z, 3 * MIB, 0, None),
        ("free_completed", z, 3 * MIB, 0, None),
        ("segment_unmap", A + 6 * MIB, 2 * MIB, 0, None),
        *EVENTS[2:],
    ]
    raw["device_traces"] = [[_entry(version, i, *event) for i, event in enumerate(events)]]
    return raw


FOREIGN = {version: snapshot(version) for version in VERSIONS}


def all_variants() -> dict[str, dict]:
    """Every foreign snapshot by name: each version, its state-only and no-trace forms, and expandable segments."""
    out = {}
    for version in VERSIONS:
        out[f"torch-{version}"] = snapshot(version)
        out[f"torch-{version}-state-only"] = state_only(version)
        out[f"torch-{version}-no-traces"] = no_traces(version)
    out["expandable-segments"] = expandable()
    return copy.deepcopy(out)

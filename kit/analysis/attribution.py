"""Which capture added which memory: the kit's capture windows set against the trace walk.

The capture recorder (`kit.record.recorder`) writes, into a snapshot's `kit`
key, one window (a range of trace indices) per CUDA graph, named by the
capture it belongs to ("model graphs 512") and its place in it (0, then 1
after the first eager break). `capture_table` gives one row per capture,
`capture_attribution` one row per (graph, pool, stream) with the segments
each graph's window added. `captures_by_name` and `is_replay_capture` are
how every other analysis reads the windows.
"""

from __future__ import annotations

import pandas as pd

from kit.analysis.tables import pool_label, stream_labels
from kit.analysis.trace.replay import replay_trace
from kit.load.snapshot import Snapshot, load_snapshot


def is_replay_capture(manager: str) -> bool:
    """Whether a capture's manager is one of the decoder replay graphs (the replica's or vLLM's)."""
    return "replay" in manager


def captures_by_name(snapshot: Snapshot) -> dict[str, list[dict]]:
    """The snapshot's capture windows grouped by capture, each capture's graphs in order, captures as recorded."""
    out: dict[str, list[dict]] = {}
    for window in snapshot.captures:
        out.setdefault(window.get("capture", window["graph"]), []).append(window)
    return {name: sorted(gs, key=lambda g: (g.get("index", 0), g["trace_begin"])) for name, gs in out.items()}


def capture_table(snapshot: Snapshot) -> pd.DataFrame:
    """Per recorded capture: manager, size, stream, pool, graphs, eager breaks, and the segments it added.

    `new_segment_bytes` are the segments its graphs added to its pool;
    `break_segment_bytes` those its eager breaks added elsewhere (the breaks
    run outside the capture, so outside the graph pool).
    """
    captures = captures_by_name(snapshot)
    made = replay_trace(snapshot).new_segments if captures else None
    labels = stream_labels(snapshot)
    rows = []
    for name, mine in captures.items():
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


def capture_attribution(snapshot: Snapshot | str | dict, windows: list[dict] | None = None) -> pd.DataFrame:
    """Segments and bytes each capture added, per (pool, stream) group.

    `windows` are dicts with `graph`, `trace_begin` and `trace_end` (trace
    indices); by default the snapshot's own (`Snapshot.captures`).
    """
    snap = load_snapshot(snapshot)
    windows = windows if windows is not None else snap.captures
    made = replay_trace(snap).new_segments
    labels = stream_labels(snap)
    rows = []
    for w in windows:
        inside = made[(made["index"] >= w["trace_begin"]) & (made["index"] < w["trace_end"])]
        for (pool, stream), group in inside.groupby(["pool", "stream"], sort=True):
            rows.append(
                {
                    "graph": w["graph"],
                    "pool": pool,
                    "stream": int(stream),
                    "pool_label": pool_label(pool, snap.pool_names),
                    "stream_label": labels.get(stream, str(stream)),
                    "segments": len(group),
                    "bytes": int(group["size"].sum()),
                }
            )
    table = pd.DataFrame(rows, columns=["graph", "pool", "stream", "pool_label", "stream_label", "segments", "bytes"])
    table.attrs["source"] = snap.source_label
    return table

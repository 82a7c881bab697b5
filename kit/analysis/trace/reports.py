"""Reports from a trace walk: reuse per (pool, stream) group, and which memory a stream stranded.

`reuse_table` counts, per group, the allocations served from a cached block,
those that needed a new segment, and the bytes of new segments made while a
fitting free block sat in the same pool on another stream (stranded).
`stranding_report` turns the stranded ones into one verdict line per group.
"""

from __future__ import annotations

import pandas as pd

from kit.analysis.frames import frame_line
from kit.analysis.tables import format_bytes, pool_label, segment_table, stream_labels
from kit.analysis.trace.replay import replay_trace
from kit.analysis.trace.state import TraceReplay
from kit.load.snapshot import Snapshot, load_snapshot

REUSE_COLUMNS = ("allocs", "reused", "new_segments", "new_segment_bytes", "stranded_bytes")


def reuse_table(snapshot: Snapshot | str | dict, replay: TraceReplay | None = None) -> pd.DataFrame:
    """Per (pool, stream) group: allocs, reused, new segments, their bytes, and the stranded bytes.

    Pass `replay` (from `replay_trace` of the same snapshot) to skip walking the trace again.
    """
    snap = load_snapshot(snapshot)
    replay = replay or replay_trace(snap)
    a = replay.allocs
    a = a.assign(
        reused=a["served"] == "reused",
        new=a["served"] != "reused",
        new_bytes=a["segment_bytes"],
        stranded_bytes=a["segment_bytes"].where(a["served"] == "stranded", 0),
    )
    table = (
        a.groupby(["pool", "stream"], sort=True)
        .agg(
            allocs=("index", "size"),
            reused=("reused", "sum"),
            new_segments=("new", "sum"),
            new_segment_bytes=("new_bytes", "sum"),
            stranded_bytes=("stranded_bytes", "sum"),
        )
        .reset_index()
    )
    labels = stream_labels(snap)
    pools = snap.pool_names
    table["pool_label"] = [pool_label(p, pools) for p in table["pool"]]
    table["stream_label"] = [labels.get(s, str(s)) for s in table["stream"]]
    table = table.astype({c: "int64" for c in ("stream", *REUSE_COLUMNS)})
    table.attrs["source"] = snap.source_label
    table.attrs["mismatches"] = replay.mismatches
    return table


def stranding_report(snapshot: Snapshot | str | dict, replay: TraceReplay | None = None) -> pd.DataFrame:
    """Every (pool, stream) group that made segments while a fitting free block sat on another stream.

    Columns: `pool`, `stream`, `stranded_bytes` (its new segments' bytes),
    `reserved` (the group's bytes at the end), `other_streams`, `other_free`
    (free bytes at the end on those streams, same pool), `frames` (the first
    stack frames of the first stranded allocation, when recorded) and
    `verdict`, one line.
    """
    snap = load_snapshot(snapshot)
    replay = replay or replay_trace(snap)
    a = replay.allocs
    labels = stream_labels(snap)
    end = segment_table(snap)
    end = end[end["device"] == replay.device].set_index(["pool", "stream"])
    rows = []
    for (pool, stream), group in a[a["served"] == "stranded"].groupby(["pool", "stream"], sort=True):
        others = sorted(set(group["other_stream"]))
        other_free = sum(int(end["free"].get((pool, o), 0)) for o in others)
        reserved = int(end["reserved"].get((pool, stream), 0))
        name = labels.get(stream, str(stream))
        other_names = ", ".join(labels.get(o, str(o)) for o in others)
        verdict = (
            f"pool {pool_label(pool, snap.pool_names)} {tuple(pool)}: {format_bytes(reserved)} reserved on {name} "
            f"while {format_bytes(other_free)} sat free on {other_names} "
            f"({format_bytes(group['segment_bytes'].sum())} of its new segments had a fitting free block there)"
        )
        rows.append(
            {
                "pool": pool,
                "stream": int(stream),
                "stranded_bytes": int(group["segment_bytes"].sum()),
                "reserved": reserved,
                "other_streams": others,
                "other_free": other_free,
                "frames": frame_line(group["frames"].iloc[0]),
                "verdict": verdict,
            }
        )
    table = pd.DataFrame(
        rows,
        columns=["pool", "stream", "stranded_bytes", "reserved", "other_streams", "other_free", "frames", "verdict"],
    )
    table.attrs["source"] = snap.source_label
    return table


def stranding_verdicts(snapshot: Snapshot | str | dict) -> list[str]:
    """The one-line verdicts of `stranding_report`."""
    return list(stranding_report(snapshot)["verdict"])

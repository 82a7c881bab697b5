"""Each segment captures added to a pool: the allocator request that made it, and why no free block served it.

`added_segments(snapshot, windows, pool)` gives one row per allocation inside
the capture windows that needed a new segment of `pool`: the trace walk's
allocations with `segment_bytes` (`kit.analysis.trace.walk`), the ones
`capture_attribution` counts, so the rows add up to its bytes. Each row names
the request (its bytes and rounded bytes, stream, capture and graph, the first
Python frame of the program where the trace recorded one) and the segment (its
address, bytes, and size class: a request of up to 1 MiB is served from the
small pool, a larger one from the large pool, and neither takes the other's
blocks).

Why no free block served it comes from the pool's free blocks at that moment:
the trace as recorded, replayed on the allocator simulator with its reasons
kept (`kit.analysis.whatif.trace_decisions`, what-if's baseline, which lays
segments where the recording did). Each free block of the pool was refused
for one reason: it was smaller than the request on the request's own stream
and size class (`too_small`), it was in the other size class
(`other_size_class`), or it sat on another stream (`other_stream`, the case
the walk calls stranded when it fits). `why` says which of these left the
request without a block, the deciding one first. A request the replay served
from a block, against the recording, says so instead of guessing; the walk's
own verdict (`served`) stays beside it.

`replay_added_segments(snapshot, pool)` is this over the replay captures'
window (`kit.analysis.attribution.replay_captures_added`'s): what
`python -m kit demo --vllm` prints under each scenario.
"""

from __future__ import annotations

from typing import Any

from kit.allocator.rules import K_SMALL_SIZE, is_small_request, round_size
from kit.analysis.attribution import checked_capture_windows, is_replay_capture
from kit.analysis.frames import frame_line, is_user_frame
from kit.analysis.names import pool_labels, stream_labels
from kit.analysis.tables import pool_label
from kit.analysis.trace.reports import WHY_STREAM
from kit.analysis.trace.walk import walk_trace
from kit.analysis.whatif import trace_decisions
from kit.load.snapshot import Snapshot, load_snapshot
from kit.units import format_bytes

TOO_SMALL, OTHER_SIZE_CLASS, OTHER_STREAM = "too_small", "other_size_class", "other_stream"
REASONS = {"too small": TOO_SMALL, "other size class": OTHER_SIZE_CLASS, "other stream": OTHER_STREAM}  # simulator's


def added_segments(snapshot: Snapshot | str | dict, windows: list[dict], pool: tuple[int, int]) -> list[dict]:
    """One row per allocation inside `windows` that needed a new segment of `pool`, in trace order.

    Keys: `trace_index`, `request_bytes`, `rounded_bytes`, `segment_bytes`,
    `segment_address`, `segment_type` ("small" or "large": the pool's size
    class), `pool`, `stream` (labels), `capture`, `graph`, `frame` (the first
    frame of the program's own, None where the trace recorded none), `served`
    (the walk's: "new_segment" or "stranded"), `free_blocks` (per reason, the
    pool's free blocks then: `count`, `largest`, `fitting`, and for
    `other_stream` the `streams`), and `why`, one sentence.
    """
    snap = load_snapshot(snapshot)
    pool = tuple(pool)
    walk = walk_trace(snap)
    allocs = walk.allocs
    inside = [
        row
        for row in allocs[allocs["segment_bytes"] > 0].itertuples(index=False)
        if tuple(row.pool) == pool and _window_of(windows, row.index) is not None
    ]
    if not inside:
        return []
    decisions = {d.id: d for d in trace_decisions(snap, walk=walk)}
    streams, pools = stream_labels(snap), pool_labels(snap)
    made = walk.new_segments
    out = []
    for row in inside:
        window = _window_of(windows, row.index)
        rounded = round_size(int(row.size))
        decision = decisions.get(f"a{row.index}")
        free = free_blocks(decision, pool) if decision is not None else None
        small = is_small_request(rounded)
        out.append(
            {
                "trace_index": int(row.index),
                "request_bytes": int(row.size),
                "rounded_bytes": rounded,
                "segment_bytes": int(row.segment_bytes),
                "segment_address": _segment_address(made, row.index, int(row.addr)),
                "segment_type": "small" if small else "large",
                "pool": pools.get(pool, pool_label(pool)),
                "stream": streams.get(int(row.stream), str(row.stream)),
                "capture": window.get("capture", window.get("graph")),
                "graph": window.get("graph"),
                "frame": program_frame(row.frames),
                "served": row.served,
                "free_blocks": free,
                "why": why_new_segment(rounded, free, decision),
            }
        )
    return out


def replay_added_segments(snapshot: Snapshot | str | dict, pool: tuple[int, int]) -> list[dict]:
    """`added_segments` over one window from the first replay graph's start to the last's end (as
    `replay_captures_added` counts): every segment the replay captures added to `pool`."""
    snap = load_snapshot(snapshot)
    replay = [c for c in checked_capture_windows(snap) if is_replay_capture(c.get("manager", ""))]
    if not replay:
        return []
    between = "a break between the replay captures"
    span = {"capture": between, "graph": between, "trace_begin": replay[0]["trace_begin"]}
    span["trace_end"] = replay[-1]["trace_end"]
    return added_segments(snap, [*replay, span], pool)  # each capture's own window first: it names the graph


def _window_of(windows: list[dict], index: int) -> dict | None:
    """The first window holding trace index `index` (a window's end is exclusive)."""
    return next((w for w in windows if w["trace_begin"] <= index < w["trace_end"]), None)


def _segment_address(made, index: int, address: int) -> int | None:
    """The address of the newest segment made before trace entry `index` that holds `address`."""
    before = made[(made["index"] < index) & (made["addr"] <= address) & (address < made["addr"] + made["size"])]
    return int(before["addr"].iloc[-1]) if len(before) else None


def program_frame(frames: list | None) -> str | None:
    """The first frame of the program's own (not torch's, inductor's or the recorder's), as `name (file:line)`;
    None where the trace recorded none (no frames, or only torch's within those kept)."""
    mine = [f for f in frames or () if is_user_frame(f)]
    return frame_line(mine[:1]) if mine else None


def free_blocks(decision: Any, pool: tuple[int, int]) -> dict:
    """The pool's free blocks when the simulator served `decision`, per reason it refused them: `count`, `bytes`,
    `largest`, and `fitting` (those at least as large as the request); `other_stream` also names their `streams`."""
    out = {reason: {"count": 0, "bytes": 0, "largest": 0, "fitting": 0} for reason in REASONS.values()}
    out[OTHER_STREAM]["streams"] = []
    for _address, size, stream, block_pool, reason in decision.refused:
        key = REASONS.get(reason)
        if key is None or tuple(block_pool) != tuple(pool):
            continue
        group = out[key]
        group["count"] += 1
        group["bytes"] += int(size)
        group["largest"] = max(group["largest"], int(size))
        group["fitting"] += int(size >= decision.rounded)
        if key == OTHER_STREAM and size >= decision.rounded and stream not in group["streams"]:
            group["streams"].append(stream)
    return out


def why_new_segment(rounded: int, free: dict | None, decision: Any = None) -> str:
    """Why no free block served a request of `rounded` bytes that made a new segment, from the pool's free blocks
    then (`free_blocks`): the deciding reason first."""
    if decision is None or free is None:
        return "the simulator's replay of the trace has no such request (the trace could not be replayed here)"
    if decision.outcome != "new_segment":
        return (
            f"the simulator's replay of the trace served it from a free block at {decision.block:#x}: the recorded "
            "allocator made a segment here, the replay did not (their states differ at this point)"
        )
    small = is_small_request(rounded)
    mine, other = ("small", "large") if small else ("large", "small")
    limit = f"up to {format_bytes(K_SMALL_SIZE)}" if small else f"over {format_bytes(K_SMALL_SIZE)}"
    parts = []
    elsewhere = free[OTHER_STREAM]
    if elsewhere["fitting"]:
        parts.append(
            f"{_blocks(elsewhere['fitting'])} of its pool and size class that fit sat on "
            f"{', '.join(elsewhere['streams'])} (the largest {format_bytes(elsewhere['largest'])}): {WHY_STREAM}"
        )
    own = free[TOO_SMALL]
    if own["count"]:
        parts.append(
            f"the {_blocks(own['count'])} of the {mine} pool on its own stream were all smaller than its "
            f"{format_bytes(rounded)} ({format_bytes(own['bytes'])} in all, the largest {format_bytes(own['largest'])})"
        )
    else:
        parts.append(f"its own stream had no free block in the {mine} pool")
    crossed = free[OTHER_SIZE_CLASS]
    if crossed["fitting"]:
        parts.append(
            f"{_blocks(crossed['fitting'])} large enough (the largest {format_bytes(crossed['largest'])}) "
            f"{'was' if crossed['fitting'] == 1 else 'were'} in the {other} pool, which a {mine} request ({limit}) "
            "never takes"
        )
    if elsewhere["count"] and not elsewhere["fitting"]:
        parts.append(f"other streams' free blocks in the {mine} pool were smaller too")
    return "; ".join(parts)


def _blocks(n: int) -> str:
    return f"{n} free block{'s' if n != 1 else ''}"


ANOTHER_STREAM, NO_FITTING_BLOCK = "another_stream", "no_fitting_block"


def bytes_by_cause(rows: list[dict]) -> dict[str, int]:
    """The rows' segment bytes by cause: `another_stream` (a free block of the pool that fit sat on another
    stream: the stream rule, what PR 63155 is about) and `no_fitting_block` (no free block of the pool, on any
    stream, fit the request in its size class: the captures needed more than the pool held free)."""
    out = {ANOTHER_STREAM: 0, NO_FITTING_BLOCK: 0}
    for r in rows:
        stranded = r["served"] == "stranded" or bool(r["free_blocks"] and r["free_blocks"][OTHER_STREAM]["fitting"])
        out[ANOTHER_STREAM if stranded else NO_FITTING_BLOCK] += r["segment_bytes"]
    return out


def added_segments_lines(rows: list[dict], indent: str = "    ") -> list[str]:
    """A line of the rows' bytes by cause, then one line per added segment and its why: what `demo --vllm` prints
    under a scenario."""
    if not rows:
        return []
    causes = bytes_by_cause(rows)
    lines = [
        f"{indent}{len(rows)} segment{'s' if len(rows) != 1 else ''}, {format_bytes(sum(causes.values()))}: "
        f"{format_bytes(causes[ANOTHER_STREAM])} made while a free block of the pool that fit sat on another "
        f"stream, {format_bytes(causes[NO_FITTING_BLOCK])} where no free block of the pool fit, on any stream"
    ]
    for r in rows:
        frame = f", at {r['frame']}" if r["frame"] else ""
        lines.append(
            f"{indent}{format_bytes(r['segment_bytes'])} {r['segment_type']}-pool segment for a request of "
            f"{r['request_bytes']:,} B (rounded {r['rounded_bytes']:,} B) on {r['stream']} in {r['graph']}"
            f"{frame} (trace entry {r['trace_index']})"
        )
        lines.append(f"{indent}  why no free block served it: {r['why']}")
    return lines

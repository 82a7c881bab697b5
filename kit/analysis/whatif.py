"""What-if: what a recorded process would have reserved with its streams mapped differently.

`what_if(snapshot, {"replay graphs stream": "model graphs stream"})` turns the
snapshot's trace back into a workload (allocations, frees, the captures in the
snapshot's capture windows (`Snapshot.captures`), and an `empty_cache` for each run of
`segment_free`), moves the mapped streams' operations onto their targets, and
runs both the original and the mapped workload on the simulator. The result is
the predicted segment table, the bytes saved per pool, and named corrections
for what the trace cannot know a shared-stream run would do differently.

It needs a trace recorded from an empty allocator and the capture windows
that the kit's recorders write. `prediction_table` sets a prediction next to
what a patched run measured, and `layout_differences` compares a simulated
state with a recorded one segment by segment and block by block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from kit.allocator.rules import DEFAULT_POOL
from kit.allocator.simulator import CachingAllocatorSim
from kit.allocator.workload import DEFAULT, parse_workload
from kit.analysis.tables import pool_label, segment_table, stream_labels
from kit.analysis.trace.replay import replay_trace
from kit.analysis.trace.state import TraceReplay
from kit.errors import KitError
from kit.load.snapshot import Snapshot, load_snapshot


@dataclass
class WhatIf:
    baseline: pd.DataFrame  # the simulator's table of the trace as recorded
    predicted: pd.DataFrame  # the same with the streams mapped
    saved: dict[tuple[int, int], int]  # reserved bytes saved per pool
    corrections: list[str] = field(default_factory=list)


def _stream_names(snap: Snapshot) -> dict[int, str]:
    names = {0: DEFAULT}
    names.update({sid: name for sid, name in snap.stream_names.items() if sid != 0})
    return names


def trace_to_workload(
    snap: Snapshot, stream_map: Mapping[str, str] | None = None, replay: TraceReplay | None = None
) -> dict:
    """The snapshot's trace as a version-1 workload, with streams renamed by `stream_map`."""
    stream_map = dict(stream_map or {})
    replay = replay or replay_trace(snap)
    if replay.rewound_segments:
        raise KitError(f"{snap.origin}: what-if needs a trace recorded from an empty allocator")
    captures = snap.captures
    if not captures:
        raise KitError(f"{snap.origin}: no capture windows in the snapshot's kit key")
    names = _stream_names(snap)
    pool_names = snap.pool_names
    entries = snap.traces[0]

    def stream(sid: int) -> str:
        name = names.get(sid, f"stream {sid}")
        return stream_map.get(name, name)

    # A window opens before torch.cuda.graph empties the cache and registers the RNG
    # state; the capture itself starts at the window's first graph-pool allocation.
    pool_of_alloc = dict(zip(replay.allocs["index"], replay.allocs["pool"], strict=True))
    begins, ends = {}, {}
    for c in captures:
        end = min(c["trace_end"], len(entries))
        window = [
            i for i in range(min(c["trace_begin"], end), end) if pool_of_alloc.get(i, DEFAULT_POOL) == tuple(c["pool"])
        ]
        start = window[0] if window else end
        begins[start] = c
        ends.setdefault(end, []).append(c)
    ops: list[dict] = []
    ids: dict[int, str] = {}
    capture_stream = None
    for i, e in enumerate(entries):
        for c in ends.pop(i, []):
            ops.append({"op": "capture_end", "graph": c["graph"]})
            capture_stream = None
        if i in begins:
            c = begins[i]
            capture_stream = stream(c["stream"])
            ops.append(
                {
                    "op": "capture_begin",
                    "graph": c["graph"],
                    "pool": pool_names.get(tuple(c["pool"])),
                    "stream": capture_stream,
                }
            )
        if e.action == "alloc":
            ids[e.addr] = f"a{i}"
            ops.append({"op": "alloc", "id": f"a{i}", "bytes": e.size, "stream": capture_stream or stream(e.stream)})
        elif e.action == "free_completed" and e.addr in ids:
            ops.append({"op": "free", "id": ids.pop(e.addr)})
        elif e.action == "segment_free" and capture_stream is None and (not ops or ops[-1]["op"] != "empty_cache"):
            ops.append({"op": "empty_cache"})
    for c in (c for cs in ends.values() for c in cs):
        ops.append({"op": "capture_end", "graph": c["graph"]})
    return {"version": 1, "ops": ops}


def _simulate(workload: dict, origin: str) -> Snapshot:
    sim = CachingAllocatorSim(rng_state=False)  # the trace holds the RNG allocations already
    return Snapshot(sim.run(parse_workload(workload, origin)).snapshot(), origin=origin)


def what_if(snapshot: Snapshot | str | dict, stream_map: Mapping[str, str]) -> WhatIf:
    """Predict the segment table had the mapped streams been their targets."""
    snap = load_snapshot(snapshot)
    snap.require_trace()
    names = set(_stream_names(snap).values())
    for name in (*stream_map.keys(), *stream_map.values()):
        if name not in names:
            raise KitError(f"{snap.origin}: no stream named {name!r} (streams: {', '.join(sorted(names))})")
    replay = replay_trace(snap)
    baseline = segment_table(_simulate(trace_to_workload(snap, None, replay), f"{snap.origin} as recorded"))
    mapped = trace_to_workload(snap, stream_map, replay)
    predicted = segment_table(_simulate(mapped, f"{snap.origin} with streams mapped"))
    saved = {
        pool: int(
            baseline[baseline["pool"] == pool]["reserved"].sum()
            - predicted[predicted["pool"] == pool]["reserved"].sum()
        )
        for pool in sorted(set(baseline["pool"]) | set(predicted["pool"]))
    }
    corrections = []
    recorded = segment_table(snap)
    for pool in sorted(set(recorded["pool"])):
        want = recorded[recorded["pool"] == pool]["reserved"].sum()
        got = baseline[baseline["pool"] == pool]["reserved"].sum()
        if want != got:
            corrections.append(f"simulated {pool} reserves {got - want:+d} bytes against the recording")
    kept = _kept_on_mapped_streams(snap, stream_map)
    if kept:
        corrections.append(
            f"default pool: {kept} bytes allocated on the mapped streams outside captures and never freed "
            "(per-stream caches such as cuBLAS workspaces); a shared-stream run may reuse the target "
            "stream's instead, reserving up to that much less than predicted"
        )
    return WhatIf(baseline, predicted, saved, corrections)


def _kept_on_mapped_streams(snap: Snapshot, stream_map: Mapping[str, str]) -> int:
    names = _stream_names(snap)
    mapped = {sid for sid, name in names.items() if name in stream_map}
    return sum(
        b.requested_size
        for s in snap.segments
        if s.segment_pool_id == DEFAULT_POOL and s.stream in mapped
        for b in s.blocks
        if b.state == "active_allocated"
    )


def canonical_layout(snapshot: Snapshot) -> list[tuple]:
    """Segments and their blocks as the allocator laid them out, streams by name."""
    labels = stream_labels(snapshot)
    return [
        (
            s.address,
            s.total_size,
            s.segment_type,
            s.segment_pool_id,
            labels.get(s.stream, str(s.stream)),
            tuple(
                (b.address - s.address, b.size, b.state, b.requested_size if b.state == "active_allocated" else None)
                for b in s.blocks
            ),
        )
        for s in sorted(snapshot.segments, key=lambda s: s.address)
    ]


def layout_differences(simulated: Snapshot, recorded: Snapshot, limit: int = 5) -> list[str]:
    """Segments that differ between two snapshots' layouts (address, size, pool, stream, blocks)."""
    a = {s[0]: s for s in canonical_layout(simulated)}
    b = {s[0]: s for s in canonical_layout(recorded)}
    out = []
    for address in sorted(set(a) | set(b)):
        if a.get(address) != b.get(address):
            out.append(f"segment {address:#x}: simulated {a.get(address)}, recorded {b.get(address)}")
    return out[:limit] + ([f"... {len(out) - limit} more"] if len(out) > limit else [])


PREDICTION_BYTES = ["unpatched", "predicted", "patched", "saved_predicted", "saved_measured", "predicted_minus_patched"]


def prediction_table(unpatched: Snapshot, patched: Snapshot, whatif: WhatIf) -> pd.DataFrame:
    """Per pool: reserved bytes of the unpatched run, the what-if's prediction from its trace, the patched run.

    `saved_predicted` is the what-if's own figure (its simulated baseline minus
    its prediction), `saved_measured` the unpatched run's reserved bytes minus
    the patched run's; `predicted_minus_patched` is how far the prediction
    missed (`whatif.corrections` names what the trace cannot know).
    """
    before, after, predicted = segment_table(unpatched), segment_table(patched), whatif.predicted
    rows = []
    for pool in sorted(set(before["pool"]) | set(after["pool"]) | set(predicted["pool"])):

        def reserved(table: pd.DataFrame, pool: tuple = pool) -> int:
            return int(table[table["pool"] == pool]["reserved"].sum())

        rows.append(
            {
                "pool_label": pool_label(pool, unpatched.pool_names),
                "unpatched": reserved(before),
                "predicted": reserved(predicted),
                "patched": reserved(after),
                "saved_predicted": int(whatif.saved.get(pool, 0)),
                "saved_measured": reserved(before) - reserved(after),
                "predicted_minus_patched": reserved(predicted) - reserved(after),
            }
        )
    table = pd.DataFrame(rows, columns=["pool_label", *PREDICTION_BYTES])
    table.attrs["source"] = f"predicted: simulator (what-if on the unpatched trace); measured: {patched.source_label}"
    return table

"""What-if: what a recorded process would have reserved with its streams mapped differently.

`what_if(snapshot, {"replay graphs stream": "model graphs stream"})` replays the
snapshot's trace on the allocator simulator twice: once as recorded (the
baseline, which must end where the recording ends) and once with the mapped
streams' allocations made on their targets. Streams are named as `table`
names them, or by id (decimal or hex); pools and streams in the result keep
the recording's ids and labels.

Any snapshot with a trace will do, plain `torch.cuda.memory._dump_snapshot()`
files included:

- a trace that starts mid-process is rewound to its first entry
  (`kit.analysis.trace.rows.initial_state`), and the simulation starts from
  that state: the segments then, with their live blocks;
- every allocation goes to the pool the trace walk found it in, so no capture
  windows are needed: moving a stream changes which free blocks a request
  may take, never which pool it is in;
- each run of `segment_free` is an `empty_cache`, which also releases the
  free segments of a graph pool the trace frees (its graphs are gone).

The result carries corrections only for what the trace cannot know: a
baseline that does not end at the recording, and per-stream caches (cuBLAS
workspaces) on a moved stream. `trace_to_workload` writes the same trace as a
version-1 workload, `prediction_table` sets a prediction next to what a
patched run measured, and `layout_differences` compares a simulated state
with a recorded one segment by segment and block by block.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pandas as pd

from kit import progress
from kit.allocator.rules import DEFAULT_POOL, DEFAULT_STREAM, K_ROUND_LARGE
from kit.allocator.simulator import CachingAllocatorSim, seeded_id
from kit.allocator.workload import DEFAULT
from kit.analysis.names import DEFAULT_STREAM_LABEL, pool_labels, resolve_stream, stream_labels
from kit.analysis.tables import format_bytes, pool_label, segment_table
from kit.analysis.trace.replay import replay_trace
from kit.analysis.trace.rows import initial_state
from kit.analysis.trace.state import TraceReplay
from kit.errors import KitError
from kit.load.snapshot import Snapshot, load_snapshot


@dataclass
class WhatIf:
    """A what-if's answer. Tables are `segment_table`s with the recording's ids and labels.

    `saved` is, per pool, the baseline's reserved bytes minus the prediction's;
    `stream_map` the streams moved (id to id); `corrections` what the
    prediction cannot know, one line each.
    """

    baseline: pd.DataFrame  # the simulator's table of the trace as recorded
    predicted: pd.DataFrame  # the same with the streams mapped
    saved: dict[tuple[int, int], int]  # reserved bytes saved per pool
    corrections: list[str] = field(default_factory=list)
    stream_map: dict[int, int] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)  # stream id -> label, as `table` prints them
    pools: dict[tuple[int, int], str] = field(default_factory=dict)  # pool -> label

    def summary(self) -> list[str]:
        """One line per pool: reserved as recorded, as predicted, and the saving."""
        lines = []
        for pool, saved in self.saved.items():
            before = int(self.baseline[self.baseline["pool"] == pool]["reserved"].sum())
            after = int(self.predicted[self.predicted["pool"] == pool]["reserved"].sum())
            change = (
                f"saves {format_bytes(saved)}"
                if saved > 0
                else f"costs {format_bytes(-saved)}"
                if saved
                else "no change"
            )
            lines.append(
                f"{self.pools.get(pool, pool_label(pool))} {tuple(pool)}: {format_bytes(before)} reserved as "
                f"recorded, {format_bytes(after)} predicted ({change})"
            )
        return lines


def resolve_stream_map(snap: Snapshot, stream_map: Mapping) -> dict[int, int]:
    """`stream_map` (labels or ids, as `table` prints them) as ids; pairs that map a stream to itself dropped."""
    labels = stream_labels(snap)
    out = {}
    for source, target in stream_map.items():
        a, b = (_stream_id(snap, x, labels) for x in (source, target))
        if a != b:
            out[a] = b
    for a, b in out.items():
        if b in out:
            raise KitError(f"{snap.origin}: --map moves {labels[b]!r}, which {labels[a]!r} is mapped onto")
    return out


def _stream_id(snap: Snapshot, ref: object, labels: Mapping[int, str]) -> int:
    if isinstance(ref, int) and not isinstance(ref, bool):
        if ref not in labels:
            raise KitError(f"{snap.origin}: no stream with id {ref}")
        return ref
    return resolve_stream(snap, str(ref), labels)


def _require_simulable(snap: Snapshot, device: int) -> tuple:
    entries = snap.require_trace(device)
    if any(e.action in ("segment_map", "segment_unmap") for e in entries) or any(
        s.is_expandable for s in snap.segments
    ):
        raise KitError(f"{snap.origin}: what-if does not model expandable segments (expandable_segments:True)")
    return entries


def rewound_segments(snap: Snapshot, entries, device: int = 0) -> list[tuple]:
    """The segments when the trace began: (address, size, pool, stream, small, {block: size}, {block: requested}).

    The rewind gives a block freed within the trace the rounded size of its
    request, not any unsplit remainder it also took; that remainder is too
    small to serve a request of its size class, and merges back when the
    block is freed, so the simulation is the same.
    """
    layout, _ = initial_state(snap, entries, device)
    requested = {e.addr: e.size for e in entries if e.action == "free_completed"}
    requested.update(
        (b.address, b.requested_size)
        for s in snap.segments
        if s.device == device
        for b in s.blocks
        if b.state != "inactive"
    )
    out = []
    for address in layout.starts:
        seg = layout.by_start[address]
        blocks = dict(seg.sizes)
        out.append(
            (
                address,
                seg.size,
                seg.pool,
                seg.stream,
                seg.small,
                blocks,
                {a: requested[a] for a in blocks if a in requested},
            )
        )
    return out


class _TraceSim(CachingAllocatorSim):
    """The simulator laying new segments where the recording did, while those places are free."""

    def __init__(self, recorded: list[int], above: int) -> None:
        super().__init__(rng_state=False)  # the trace holds the RNG state's allocations already
        self._recorded: Iterator[int] = iter(recorded)
        self._fresh = _round_up(above)
        self._extents: dict[int, int] = {}  # segment address -> size
        self._starts: list[int] = []  # the same addresses, sorted: segments never overlap
        self._top = 0  # the highest segment end so far

    def seed_segment(self, address: int, size: int, *args, **kwargs) -> None:
        super().seed_segment(address, size, *args, **kwargs)
        self._lay(address, size)

    def _lay(self, address: int, size: int) -> None:
        self._extents[address] = size
        insort(self._starts, address)
        self._top = max(self._top, address + size)

    def _is_free(self, address: int, size: int) -> bool:
        # Disjoint segments sorted by address end in the same order: only the last one
        # starting below `address + size` can reach into [address, address + size).
        i = bisect_left(self._starts, address + size) - 1
        return i < 0 or self._starts[i] + self._extents[self._starts[i]] <= address

    def _cuda_malloc(self, size: int) -> int:
        for address in self._recorded:
            if self._is_free(address, size):
                break
        else:  # above everything laid out so far, the recording's places included
            address = _round_up(max(self._fresh, self._top))
            self._fresh = address + _round_up(size)
        self._lay(address, size)
        return address

    def empty_cache(self, pools=()) -> None:
        super().empty_cache(pools)
        self._extents = {a: n for a, n in self._extents.items() if a in self.segments}
        self._starts = sorted(self._extents)
        self._top = max((a + n for a, n in self._extents.items()), default=0)


def _round_up(n: int) -> int:
    return (n + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE


def simulate_trace(
    snapshot: Snapshot | str | dict,
    stream_map: Mapping | None = None,
    *,
    replay: TraceReplay | None = None,
    device: int = 0,
) -> Snapshot:
    """The snapshot's trace run on the simulator from its rewound start, mapped streams moved; ids kept."""
    snap = load_snapshot(snapshot)
    entries = _require_simulable(snap, device)
    moves = resolve_stream_map(snap, stream_map or {})
    replay = replay or replay_trace(snap, device)
    labels = stream_labels(snap)
    seeded = rewound_segments(snap, entries, device)
    recorded = [e.addr for e in entries if e.action == "segment_alloc"]
    top = max([a + s for a, s, *_ in seeded] + [e.addr + e.size for e in entries] + [0])
    sim = _TraceSim(recorded, top)
    sim.stream_ids = {DEFAULT: DEFAULT_STREAM}
    for sid, label in labels.items():
        if sid != DEFAULT_STREAM:
            sim.stream_ids[label] = sid

    def name(sid: int) -> str:
        sid = moves.get(sid, sid)
        if sid == DEFAULT_STREAM:
            return DEFAULT
        if sid not in labels:  # a stream only the trace's own entries name
            labels[sid] = f"stream {sid}"
            sim.stream_ids[labels[sid]] = sid
        return labels[sid]

    live_seeded = set()
    for address, size, pool, stream, small, blocks, asked in seeded:
        sim.seed_segment(address, size, name(stream), pool, small, blocks, asked)
        live_seeded.update(blocks)
    pool_of = dict(zip(replay.allocs["index"].tolist(), replay.allocs["pool"].tolist(), strict=True))
    ids: dict[int, str] = {}
    in_release = False
    for i, e in enumerate(progress.track(entries, "simulating the what-if", every=4096)):
        action = e.action
        if action == "segment_free":
            if not in_release:
                sim.empty_cache(_graph_pools_freed(sim, entries, i))
            in_release = True
            continue
        in_release = False
        if action == "alloc":
            ids[e.addr] = f"a{i}"
            sim.malloc(f"a{i}", e.size, name(e.stream), tuple(pool_of.get(i, DEFAULT_POOL)))
        elif action == "free_completed":
            tid = ids.pop(e.addr, None)
            if tid is None and e.addr in live_seeded:
                live_seeded.discard(e.addr)
                tid = seeded_id(e.addr)
            if tid is not None and tid in sim.tensors:
                sim.free_tensor(tid)
    raw = sim.snapshot()
    # Streams and pools labelled as in the recording (the simulated trace has no frames to name them from).
    raw["kit"]["streams"] = {label: sid for sid, label in labels.items() if label != DEFAULT_STREAM_LABEL}
    pools = pool_labels(snap)
    raw["kit"]["pools"] = {label: list(p) for p, label in pools.items() if p != DEFAULT_POOL}
    mapped = ", ".join(f"{labels[a]} onto {labels[b]}" for a, b in moves.items())
    origin = f"{snap.origin}, {'streams mapped: ' + mapped if moves else 'as recorded'}"
    return Snapshot(raw, origin=origin)


def _graph_pools_freed(sim: CachingAllocatorSim, entries, start: int) -> set[tuple[int, int]]:
    """Graph pools with a segment in the run of `segment_free` entries from `start` (their graphs are gone)."""
    pools = set()
    for e in entries[start:]:
        if e.action != "segment_free":
            break
        first = sim.segments.get(e.addr)
        if first is not None and first.pool != DEFAULT_POOL:
            pools.add(first.pool)
    return pools


def _reserved_by_pool(table: pd.DataFrame) -> dict[tuple[int, int], int]:
    return {tuple(p): int(v) for p, v in table.groupby("pool")["reserved"].sum().items()}


def what_if(snapshot: Snapshot | str | dict, stream_map: Mapping) -> WhatIf:
    """Predict each pool's reserved bytes had the mapped streams been their targets.

    `stream_map` maps streams to streams, each named as `table` prints it (a
    label such as "default stream" or "stream of capture_b (x.py:41)"), or by
    id, decimal or hex. Works on any snapshot with a trace; an identity map
    reproduces the recording (a difference is reported in `corrections`).

    >>> result = what_if("snap.pickle", {"replay graphs stream": "model graphs stream"})  # doctest: +SKIP
    >>> result.summary()  # doctest: +SKIP
    ['global graph pool (0, 1): 108.00 MiB reserved as recorded, 66.00 MiB predicted (saves 42.00 MiB)']
    """
    snap = load_snapshot(snapshot)
    moves = resolve_stream_map(snap, stream_map)
    replay = replay_trace(snap)
    labels = stream_labels(snap)
    baseline = segment_table(simulate_trace(snap, {}, replay=replay), stream_names=None)
    predicted = segment_table(simulate_trace(snap, moves, replay=replay))
    recorded = segment_table(snap)
    before, after = _reserved_by_pool(baseline), _reserved_by_pool(predicted)
    saved = {pool: before.get(pool, 0) - after.get(pool, 0) for pool in sorted(before.keys() | after.keys())}
    corrections = _baseline_differences(recorded, baseline, replay.device)
    kept = _kept_on_moved_streams(snap, moves)
    if kept:
        corrections.append(
            f"default pool: {format_bytes(kept)} ({kept} bytes) allocated on the moved streams outside captures "
            "and never freed (per-stream caches such as cuBLAS workspaces); a shared-stream run may reuse the "
            "target stream's instead, reserving up to that much less than predicted"
        )
    for table in (baseline, predicted):
        table.attrs["generated_labels"] = recorded.attrs["generated_labels"]
    predicted.attrs["source"] = f"simulator (what-if on the trace of {snap.source_label})"
    baseline.attrs["source"] = f"simulator (the trace of {snap.source_label}, as recorded)"
    return WhatIf(baseline, predicted, saved, corrections, moves, labels, pool_labels(snap))


def _baseline_differences(recorded: pd.DataFrame, baseline: pd.DataFrame, device: int) -> list[str]:
    """Per pool where replaying the trace as recorded does not end at the recording: one line."""
    recorded = recorded[recorded["device"] == device]
    want, got = _reserved_by_pool(recorded), _reserved_by_pool(baseline)
    labels = dict(zip(recorded["pool"], recorded["pool_label"], strict=True))
    return [
        f"{labels.get(pool, pool_label(pool))} {pool}: replaying the trace as recorded reserves "
        f"{format_bytes(got.get(pool, 0) - want.get(pool, 0))} more than the recording; predictions for it "
        "are that far off"
        for pool in sorted(want.keys() | got.keys())
        if want.get(pool, 0) != got.get(pool, 0)
    ]


def _kept_on_moved_streams(snap: Snapshot, moves: Mapping[int, int]) -> int:
    """Bytes still held at the end in the default pool on the streams the map moves."""
    return sum(
        b.requested_size
        for s in snap.segments
        if s.segment_pool_id == DEFAULT_POOL and s.stream in moves
        for b in s.blocks
        if b.state == "active_allocated"
    )


def trace_to_workload(snap: Snapshot, stream_map: Mapping[str, str] | None = None) -> dict:
    """The snapshot's trace as a version-1 workload, with streams renamed by `stream_map` (labels).

    It needs a trace recorded from an empty allocator (a workload starts from
    nothing) and capture windows, the recorder's or inferred
    (`kit.analysis.attribution.capture_windows`), one at a time.
    """
    from kit.analysis.attribution import capture_windows

    stream_map = dict(stream_map or {})
    replay = replay_trace(snap)
    if replay.rewound_segments:
        raise KitError(
            f"{snap.origin}: a workload starts from an empty allocator and this trace starts mid-process "
            f"({replay.rewound_segments} segments already there); what_if() handles such traces"
        )
    labels = stream_labels(snap)
    pools = pool_labels(snap)
    entries = snap.traces[0]

    def stream(sid: int) -> str:
        name = DEFAULT if sid == DEFAULT_STREAM else labels.get(sid, f"stream {sid}")
        return stream_map.get(name, name)

    # A recorder's window opens before torch.cuda.graph empties the cache and registers the RNG
    # state; the capture itself starts at the window's first graph-pool allocation.
    pool_of_alloc = dict(zip(replay.allocs["index"], replay.allocs["pool"], strict=True))
    begins, ends = {}, {}
    for c in capture_windows(snap):
        end = min(c["trace_end"], len(entries))
        window = [
            i for i in range(min(c["trace_begin"], end), end) if pool_of_alloc.get(i, DEFAULT_POOL) == tuple(c["pool"])
        ]
        if not window:  # nothing went into the pool: the graph adds nothing to replay
            continue
        begins[window[0]] = c
        ends.setdefault(end, []).append(c)
    ops: list[dict] = []
    ids: dict[int, str] = {}
    capture = None
    for i, e in enumerate(entries):
        for c in ends.pop(i, []):
            ops.append({"op": "capture_end", "graph": c["graph"]})
            capture = None
        if i in begins:
            c = begins[i]
            if capture is not None:
                raise KitError(
                    f"{snap.origin}: captures of {capture['graph']!r} and {c['graph']!r} overlap; a workload "
                    "has one capture at a time (what_if() handles this trace)"
                )
            capture = c
            ops.append(
                {
                    "op": "capture_begin",
                    "graph": c["graph"],
                    "pool": pools.get(tuple(c["pool"])),
                    "stream": stream(c["stream"]),
                }
            )
        if e.action == "alloc":
            ids[e.addr] = f"a{i}"
            ops.append(
                {
                    "op": "alloc",
                    "id": f"a{i}",
                    "bytes": e.size,
                    "stream": stream(capture["stream"]) if capture else stream(e.stream),
                }
            )
        elif e.action == "free_completed" and e.addr in ids:
            ops.append({"op": "free", "id": ids.pop(e.addr)})
        elif e.action == "segment_free" and capture is None and (not ops or ops[-1]["op"] != "empty_cache"):
            ops.append({"op": "empty_cache"})
    for c in (c for cs in ends.values() for c in cs):
        ops.append({"op": "capture_end", "graph": c["graph"]})
    return {"version": 1, "ops": ops}


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

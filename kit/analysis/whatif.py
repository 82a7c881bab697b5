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
- each run of `segment_free` is an `empty_cache`; when the recording's
  freed segments include a graph pool's (its graphs are gone), that pool's
  free segments are released too, in that run and every later one. Which
  pools those are is read off the recorded segments, never the simulated ones;
- a moved stream's cuBLAS workspace (`kit.analysis.workspaces`) is left out
  when the stream it moves onto already has its own, as a run on that stream
  never makes it; `WhatIf.modelled` lists each one.

The result carries corrections for what the trace cannot know: a baseline
that does not end at the recording, and workspaces told apart by their shape
because no C++ frames were recorded. `trace_decisions` is the baseline's every allocation, with the
free blocks it refused and why (`kit.analysis.added_segments` reads it). `trace_to_workload` writes the same trace as a
version-1 workload, `prediction_table` sets a prediction next to what a
patched run measured, and `layout_differences` compares a simulated state
with a recorded one segment by segment and block by block.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import sys
import threading
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import pandas as pd

from kit import progress
from kit.allocator.rules import DEFAULT_POOL, DEFAULT_STREAM, K_ROUND_LARGE, K_SMALL_BUFFER, expandable_range_size
from kit.allocator.simulator import GPU_MEMORY, CachingAllocatorSim, range_bases, seeded_id
from kit.allocator.workload import DEFAULT
from kit.analysis.names import DEFAULT_STREAM_LABEL, pool_labels, resolve_stream, stream_labels
from kit.analysis.tables import pool_label, segment_table
from kit.analysis.trace.rows import initial_state
from kit.analysis.trace.state import TraceWalk
from kit.analysis.trace.walk import walk_trace
from kit.analysis.workspaces import find_workspaces
from kit.errors import KitError
from kit.load.columns import INACTIVE
from kit.load.snapshot import Snapshot, load_snapshot, per_snapshot
from kit.units import format_bytes


@dataclass
class WhatIf:
    """A what-if's answer. Tables are `segment_table`s with the recording's ids and labels.

    `saved` is, per pool, the baseline's reserved bytes minus the prediction's;
    `stream_map` the streams moved (id to id); `corrections` what the
    prediction cannot know, one line each; `modelled` the per-stream
    allocations (cuBLAS workspaces) left out because a moved stream's target
    already had its own; `spread` the pools whose prediction depends on
    where cudaMalloc lays new segments, with the range seen.
    """

    baseline: pd.DataFrame  # the simulator's table of the trace as recorded
    predicted: pd.DataFrame  # the same with the streams mapped
    saved: dict[tuple[int, int], int]  # reserved bytes saved per pool
    corrections: list[str] = field(default_factory=list)
    stream_map: dict[int, int] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)  # stream id -> label, as `table` prints them
    pools: dict[tuple[int, int], str] = field(default_factory=dict)  # pool -> label
    modelled: list[str] = field(default_factory=list)  # per-stream allocations the mapped run never makes
    # pool -> (lowest, highest) reserved bytes over segment placements, where they differ; None: not tried
    spread: dict[tuple[int, int], tuple[int, int]] | None = field(default_factory=dict)

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


def _refuse_captures_on_the_default_stream(snap: Snapshot, moves: Mapping[int, int], walk: TraceWalk) -> None:
    """A stream that captured graphs cannot move onto the default stream: CUDA refuses to capture there."""
    allocs = walk.allocs
    in_graph_pool = allocs["pool"].map(lambda pool: tuple(pool) != DEFAULT_POOL)
    for source, target in moves.items():
        if target != DEFAULT_STREAM:
            continue
        captured = allocs[(allocs["stream"] == source) & in_graph_pool]
        if len(captured):
            raise KitError(
                f"{snap.origin}: --map moves {stream_labels(snap)[source]!r} onto the default stream, but it "
                f"captured graphs ({len(captured)} graph-pool allocations) and CUDA graphs cannot be captured on "
                "the default stream; map it onto another capture stream"
            )


def _require_nothing_mapped_before(snap: Snapshot, entries) -> None:
    """Refuse a trace of expandable segments that allocates in pages it never mapped (they were mapped before it).

    The simulation of expandable segments starts from an empty allocator: it
    cannot rebuild ranges whose pages were mapped before the trace began.
    """
    mapped: set[int] = set()  # 2 MiB page numbers, the granule of both pools' pages
    for e in entries:
        pages = range(e.addr // K_SMALL_BUFFER, (e.addr + e.size) // K_SMALL_BUFFER)
        if e.action == "segment_map":
            mapped.update(pages)
        elif e.action == "segment_unmap":
            mapped.difference_update(pages)
        elif e.action == "alloc" and e.addr // K_SMALL_BUFFER not in mapped:
            raise KitError(
                f"{snap.origin}: what-if simulates expandable segments only from a trace that starts with nothing "
                f"mapped, and this one allocates at {e.addr:#x} in pages mapped before it began"
            )


def _expandable_pools(snap: Snapshot, entries, device: int) -> dict[int, tuple[int, int]]:
    """Per alloc (trace index), the pool of the expandable segment it lands in.

    A segment's virtual range serves one (stream, pool); one still reserved at
    the end is the pool the snapshot gives its mapped pages. A range given back
    is taken for the default pool's: a graph pool keeps its pages while its
    graphs live.
    """
    span = expandable_range_size(False, GPU_MEMORY)
    live: dict[int, list] = {}  # base -> [bytes mapped, alloc indices]
    done: list[list[int]] = []  # alloc indices of ranges given back
    for i, e in enumerate(entries):
        base = next((b for b in live if b <= e.addr < b + span), None)
        if e.action == "segment_map":
            live.setdefault(e.addr if base is None else base, [0, []])[0] += e.size
        elif e.action == "segment_unmap" and base is not None:
            live[base][0] -= e.size
            if live[base][0] == 0:
                done.append(live.pop(base)[1])
        elif e.action == "alloc" and base is not None:
            live[base][1].append(i)
    pools = {i: DEFAULT_POOL for indices in done for i in indices}
    segments = [s for s in snap.segments if s.device == device]
    for base, (_, indices) in live.items():
        pool = next((tuple(s.segment_pool_id) for s in segments if base <= s.address < base + span), DEFAULT_POOL)
        pools.update(dict.fromkeys(indices, pool))
    return pools


# What the simulation of expandable segments cannot know, said with every what-if on such a recording.
EXPANDABLE_CAVEAT = (
    "expandable segments (expandable_segments:True) are simulated as torch 2.11 runs them; an empty_cache "
    "that unmapped nothing leaves no trace entry, so one the mapped run would have unmapped pages at is missed, "
    "and a trace that starts with pages already mapped is refused"
)


@per_snapshot
def _rewound(snap: Snapshot, device: int) -> list[tuple]:
    """`rewound_segments` of a snapshot's device: every simulation seeds the same (and only reads them)."""
    return rewound_segments(snap, snap.trace_view(device), device)


def rewound_segments(snap: Snapshot, entries, device: int = 0) -> list[tuple]:
    """The segments when the trace began: (address, size, pool, stream, small, {block: size}, {block: requested}).

    The rewind gives a block freed within the trace the rounded size of its
    request, not any unsplit remainder it also took; that remainder is too
    small to serve a request of its size class, and merges back when the
    block is freed, so the simulation is the same.
    """
    layout, _ = initial_state(snap, entries, device)
    requested = {e.addr: e.size for e in entries if e.action == "free_completed"}
    c = snap.columns  # the snapshot's blocks as columns: typed segments would read the file again
    on_device = (c.device[c.block_segment] == device) & (c.block_state != INACTIVE)
    requested.update(zip(c.block_address[on_device].tolist(), c.block_requested[on_device].tolist(), strict=True))
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


# Where a simulation lays the segments the recording did not make: `RECORDED` reuses the
# recording's addresses in order while they are free (the baseline reproduces the recording
# this way), the others are the alternatives `placement_spread` tries.
RECORDED, ASCENDING, DESCENDING, SHUFFLED = "recorded", "ascending", "descending", "shuffled"
PLACEMENTS = (ASCENDING, DESCENDING, SHUFFLED)
SPREAD_EVENTS = 500_000  # above this many trace events the spread is left out (each try is one more simulation)
# How far outside the placements' range the real allocator's figure has been measured, as a share of
# the pool: on the 12 pairs of kit/recordings/merged_spread (H100, `scripts/whatif_vs_merged.py`), 6
# default pools fell outside, the farthest by 146 MiB of 5,362 MiB (2.7%). A measurement, not a bound.
SPREAD_SEEN_OUTSIDE = 0.03
# From this many trace events the spread's tries run in forked processes, beside the what-if's own runs, where that
# is safe (`_forks_safely`): each try is a whole simulation, and below this they take a fraction of a second.
SPREAD_IN_PROCESSES = 100_000
_FORKED: tuple | None = None  # (snapshot, moves, walk) of the tries now running: a forked process inherits it


class _TraceSim(CachingAllocatorSim):
    """The simulator laying new segments where the recording did, while those places are free.

    With another `placement` it lays them elsewhere: only above everything
    recorded, going up or down, or at the recording's addresses in a shuffled
    order. cudaMalloc's choice of address is the driver's, and among free
    blocks of one size the allocator takes the lowest address, so where new
    segments land can change which block later requests split.
    """

    def __init__(
        self,
        recorded: list[int],
        above: int,
        placement: str = RECORDED,
        expandable: bool = False,
        keep_trace: bool = True,
    ) -> None:
        # the trace holds the RNG state's allocations already
        super().__init__(rng_state=False, expandable_segments=expandable)
        if not keep_trace and not expandable:  # (expandable segments read their own trace back while mapping)
            self.trace = deque(maxlen=0)  # a run nobody reads the trace of appends to a sink: a sixth of its time
        if placement == SHUFFLED:
            recorded = random.Random(0).sample(recorded, len(recorded))
        self._recorded: Iterator[int] = iter(recorded if placement in (RECORDED, SHUFFLED) else ())
        self._fresh = _round_up(above)
        self._descending = placement == DESCENDING
        self._ceiling = self._fresh + (1 << 44)  # DESCENDING lays segments down from here
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
            if self._descending:
                address = self._ceiling = self._ceiling - _round_up(size)
            else:
                address = _round_up(max(self._fresh, self._top))
                self._fresh = address + _round_up(size)
        self._lay(address, size)
        return address

    def empty_cache(self, pools=()) -> None:
        held = len(self.segments) + len(self.ranges)
        super().empty_cache(pools)
        if len(self.segments) + len(self.ranges) == held:  # nothing released: the layout stands
            return
        gone = self._extents.keys() - self.segments.keys() - self.ranges.keys()
        reached_top = False
        for address in gone:
            del self._starts[bisect_left(self._starts, address)]
            reached_top |= address + self._extents.pop(address) >= self._top
        if reached_top:
            self._top = max((a + n for a, n in self._extents.items()), default=0)


def _round_up(n: int) -> int:
    return (n + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE


def simulate_trace(
    snapshot: Snapshot | str | dict,
    stream_map: Mapping | None = None,
    *,
    walk: TraceWalk | None = None,
    device: int = 0,
    placement: str = RECORDED,
    trace: bool = True,
) -> Snapshot:
    """The snapshot's trace run on the simulator from its rewound start, mapped streams moved; ids kept.

    `placement` says where segments the recording did not make are laid (`_TraceSim`); `trace=False`
    leaves the simulated trace out of the result, for a caller that reads its segments only.
    """
    snap = load_snapshot(snapshot)
    moves = resolve_stream_map(snap, stream_map or {})
    walk = walk or walk_trace(snap, device)
    sim, labels, left_out, workspaces = _run_trace(snap, moves, walk, device, placement, keep_trace=trace)
    raw = sim.snapshot(trace=trace)
    # Streams and pools labelled as in the recording (the simulated trace has no frames to name them from).
    raw["kit"]["streams"] = {label: sid for sid, label in labels.items() if label != DEFAULT_STREAM_LABEL}
    pools = pool_labels(snap)
    raw["kit"]["pools"] = {label: list(p) for p, label in pools.items() if p != DEFAULT_POOL}
    raw["kit"]["whatif"] = {"workspaces_found_by": workspaces.found_by, "workspaces_left_out": left_out}
    mapped = ", ".join(f"{labels[a]} onto {labels[b]}" for a, b in moves.items())
    origin = f"{snap.origin}, {'streams mapped: ' + mapped if moves else 'as recorded'}"
    return Snapshot(raw, origin=origin)


def baseline_table(snap: Snapshot, walk: TraceWalk) -> pd.DataFrame:
    """The segment table of the trace simulated as recorded (what-if, the ranking and the report all compare against
    it), simulated once per snapshot and device; a copy, so that a caller may change it."""
    return _baseline(snap, walk.device).copy()


@per_snapshot
def _baseline(snap: Snapshot, device: int) -> pd.DataFrame:
    simulated = simulate_trace(snap, {}, walk=walk_trace(snap, device), device=device, trace=False)
    return segment_table(simulated, stream_names=None)


def simulated_reserved(
    snap: Snapshot, moves: Mapping[int, int], walk: TraceWalk, placement: str = RECORDED
) -> dict[tuple[int, int], int]:
    """Reserved bytes per pool of the trace simulated with `moves` (ids resolved), nothing else built."""
    return _run_trace(snap, moves, walk, walk.device, placement, keep_trace=False)[0].reserved_by_pool()


def trace_decisions(snapshot: Snapshot | str | dict, *, walk: TraceWalk | None = None, device: int = 0) -> list:
    """How the simulator served every allocation of the trace as recorded: one `Decision` each, its `id` `a<trace
    index>`, with the free blocks it refused and why (`CachingAllocatorSim(explain=True)`); what-if's baseline."""
    snap = load_snapshot(snapshot)
    return _run_trace(snap, {}, walk or walk_trace(snap, device), device, RECORDED, explain=True)[0].decisions


def _run_trace(
    snap: Snapshot,
    moves: Mapping[int, int],
    walk: TraceWalk,
    device: int,
    placement: str,
    explain: bool = False,
    keep_trace: bool = True,
) -> tuple:
    """The trace run on the simulator from its rewound start, `moves` applied: the simulator, the stream labels,
    the workspaces left out, and the workspaces found. `keep_trace=False`: the simulator keeps no trace of its
    own (nothing will read it)."""
    entries = snap.trace_view(device)
    acts, addrs, sizes, streams = entries.fields()
    labels = stream_labels(snap)
    expandable = snap.expandable
    if expandable:
        _require_nothing_mapped_before(snap, entries)
        seeded = []
        recorded = range_bases((e.action, e.addr, e.size) for e in entries)
    else:
        seeded = _rewound(snap, device)
        recorded = [addr for action, addr in zip(acts, addrs, strict=True) if action == "segment_alloc"]
    top = max([a + s for a, s, *_ in seeded] + [a + s for a, s in zip(addrs, sizes, strict=True)] + [0])
    sim = _TraceSim(recorded, top, placement, expandable, keep_trace)
    sim.explain = explain  # a Decision per allocation, its refusals listed, with the id `a<trace index>`
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
    recorded_pool: dict[int, tuple[int, int]] = {}  # segment address -> its pool, as recorded
    for address, size, pool, stream, small, blocks, asked in seeded:
        sim.seed_segment(address, size, name(stream), pool, small, blocks, asked)
        live_seeded.update(blocks)
        recorded_pool[address] = tuple(pool)
    if expandable:
        pool_of = _expandable_pools(snap, entries, device)
    else:
        pool_of = dict(zip(walk.allocs["index"].tolist(), walk.allocs["pool"].tolist(), strict=True))
    workspaces = find_workspaces(snap, entries, device)
    made = {(kind, moves.get(stream, stream)) for kind, stream in workspaces.seeded.values()}
    left_out: list[dict] = []
    ids: dict[int, str] = {}
    freed_pools: set[tuple[int, int]] = set()  # graph pools whose graphs are gone
    in_release = False
    named: dict[int, str] = {}  # `name` of each stream id, made once
    walked = enumerate(zip(acts, addrs, sizes, streams, strict=True))
    for i, (action, addr, size, stream) in progress.track(walked, "simulating the what-if", len(acts), every=4096):
        if action in RELEASES:  # the first of a run is the empty_cache that made them
            if not in_release:
                freed_pools |= _graph_pools_freed(acts, addrs, i, recorded_pool)
                sim.empty_cache(freed_pools)
            if action == "segment_free":
                recorded_pool.pop(addr, None)
            in_release = True
            continue
        in_release = False
        if action in ("segment_alloc", "segment_map"):
            recorded_pool[addr] = _pool_of_next_alloc(acts, i, pool_of)
        elif action == "alloc":
            pool = tuple(pool_of.get(i, DEFAULT_POOL))
            kind = workspaces.allocs.get(i)
            if kind is not None:
                key = (kind, moves.get(stream, stream))
                if key in made:  # the stream it moves onto has its own already: never made
                    left_out.append({"index": i, "kind": kind, "bytes": size, "stream": stream, "pool": pool})
                    continue
                made.add(key)
            ids[addr] = tid = f"a{i}"
            label = named.get(stream)
            if label is None:
                label = named[stream] = name(stream)
            sim.malloc(tid, size, label, pool)
        elif action == "free_completed":
            tid = ids.pop(addr, None)
            if tid is None and addr in live_seeded:
                live_seeded.discard(addr)
                tid = seeded_id(addr)
            if tid is not None and tid in sim.tensors:
                sim.free_tensor(tid)
    return sim, labels, left_out, workspaces


def _graph_pools_freed(
    acts: list[str], addrs: list[int], start: int, recorded_pool: Mapping[int, tuple]
) -> set[tuple[int, int]]:
    """Graph pools with a segment in the run of `segment_free` entries from `start` (their graphs are gone).

    Read off the recording's segments, never the simulation's: once streams are
    mapped, a simulated segment at a recorded address can be another pool's.
    """
    pools = set()
    for i in range(start, len(acts)):  # by index: a slice would copy the rest of the trace at every empty_cache
        if acts[i] not in RELEASES:
            break
        pool = _recorded_pool_at(recorded_pool, addrs[i])
        if pool != DEFAULT_POOL:
            pools.add(pool)
    return pools


RELEASES = ("segment_free", "segment_unmap")  # what one empty_cache writes to the trace


def _recorded_pool_at(recorded_pool: Mapping[int, tuple], address: int) -> tuple:
    """The pool of the segment at `address`; an unmap's address may be inside pages mapped from below it."""
    if address in recorded_pool:
        return recorded_pool[address]
    start = max((a for a in recorded_pool if a <= address), default=None)
    return DEFAULT_POOL if start is None else recorded_pool[start]


def _pool_of_next_alloc(acts: list[str], start: int, pool_of: Mapping[int, tuple]) -> tuple[int, int]:
    """The pool of the allocation a `segment_alloc` at `start` was made for (the next alloc in the trace)."""
    for j in range(start + 1, len(acts)):
        if acts[j] == "alloc":
            return tuple(pool_of.get(j, DEFAULT_POOL))
    return DEFAULT_POOL


def reserved_by_pool(table: pd.DataFrame) -> dict[tuple[int, int], int]:
    """Reserved bytes per pool of a `segment_table` (prediction, baseline or recording)."""
    if table.empty:
        return {}
    return {tuple(p): int(v) for p, v in table.groupby("pool", sort=True)["reserved"].sum().items()}


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
    snap.check_trace(0)
    moves = resolve_stream_map(snap, stream_map)
    walk = walk_trace(snap)
    _refuse_captures_on_the_default_stream(snap, moves, walk)
    labels = stream_labels(snap)
    with spread_tries(snap, moves, walk) as tries:  # started now, beside the two runs below, where it is safe
        baseline = baseline_table(snap, walk)
        simulated = simulate_trace(snap, moves, walk=walk, trace=False)
        predicted = segment_table(simulated)
        recorded = segment_table(snap)
        before, after = reserved_by_pool(baseline), reserved_by_pool(predicted)
        saved = {pool: before.get(pool, 0) - after.get(pool, 0) for pool in sorted(before.keys() | after.keys())}
        corrections = _baseline_differences(recorded, baseline, walk.device)
        if snap.expandable:
            corrections.append(EXPANDABLE_CAVEAT)
        spread = placement_spread(snap, moves, walk, after, tries)
    corrections += _spread_lines(snap, spread, after)
    facts = simulated.kit["whatif"]
    modelled = [_left_out_line(w, labels, moves, pool_labels(snap)) for w in facts["workspaces_left_out"]]
    if modelled and facts["workspaces_found_by"] == "size":
        corrections.append(
            "cuBLAS workspaces were told apart by shape, not by C++ frames (none recorded): "
            f"{len(modelled)} allocation(s) of a workspace size, never freed, the first of their size on their "
            "stream, were left out; a program tensor of that shape would be taken for one "
            "(record with _record_memory_history(stacks='all') to be sure)"
        )
    for table in (baseline, predicted):
        table.attrs["generated_labels"] = recorded.attrs["generated_labels"]
    predicted.attrs["source"] = f"simulator (what-if on the trace of {snap.source_label})"
    baseline.attrs["source"] = f"simulator (the trace of {snap.source_label}, as recorded)"
    return WhatIf(baseline, predicted, saved, corrections, moves, labels, pool_labels(snap), modelled, spread)


def _baseline_differences(recorded: pd.DataFrame, baseline: pd.DataFrame, device: int) -> list[str]:
    """Per pool where replaying the trace as recorded does not end at the recording: one line."""
    recorded = recorded[recorded["device"] == device]
    want, got = reserved_by_pool(recorded), reserved_by_pool(baseline)
    labels = dict(zip(recorded["pool"], recorded["pool_label"], strict=True))
    lines = []
    for pool in sorted(want.keys() | got.keys()):
        off = got.get(pool, 0) - want.get(pool, 0)
        if off:
            lines.append(
                f"{labels.get(pool, pool_label(pool))} {pool}: replaying the trace as recorded reserves "
                f"{format_bytes(abs(off))} {'more' if off > 0 else 'less'} than the recording "
                f"({format_bytes(got.get(pool, 0))} against {format_bytes(want.get(pool, 0))}); "
                "predictions for this pool may be off by as much"
            )
    return lines


def placement_spread(
    snap: Snapshot,
    moves: Mapping[int, int],
    walk: TraceWalk,
    predicted: Mapping[tuple, int],
    tries: Callable[[], list[dict]] | None = None,
) -> dict[tuple[int, int], tuple[int, int]] | None:
    """Per pool whose prediction changes with where cudaMalloc lays new segments: (lowest, highest) bytes.

    A mapped run makes segments the recording never made, and the driver
    picks their addresses; the allocator breaks ties between free blocks of
    one size by address, so a pool can end larger or smaller. The mapped
    trace is simulated again with each of `PLACEMENTS`; pools whose reserved
    bytes differ between the tries are returned with the range. None when the
    trace has more than `SPREAD_EVENTS` events (not tried). `tries`: the
    runs' results already under way (`spread_tries`).
    """
    if not moves:
        return {}
    if snap.check_trace(walk.device) > SPREAD_EVENTS:
        return None
    runs = [predicted] + (tries() if tries else _tries_in_order(snap, moves, walk))
    spread = {}
    for pool in sorted(set().union(*runs)):
        figures = [t.get(pool, 0) for t in runs]
        if min(figures) != max(figures):
            spread[pool] = (min(figures), max(figures))
    return spread


@contextlib.contextmanager
def spread_tries(snap: Snapshot, moves: Mapping[int, int], walk: TraceWalk) -> Iterator[Callable[[], list[dict]]]:
    """The spread's runs (`simulated_reserved` with each of `PLACEMENTS`), as a call that returns their results.

    Where `_forks_safely` says so they start at once, one forked process each,
    and run beside what the caller does meanwhile; elsewhere the call runs
    them one after another. Leaving the block ends any still running.
    """
    global _FORKED
    if not (moves and _forks_safely(snap, walk.device)):
        yield lambda: _tries_in_order(snap, moves, walk)
        return
    if not snap.expandable:
        _rewound(snap, walk.device)  # made once, here, for every process to inherit
    _FORKED = (snap, moves, walk)
    fork = multiprocessing.get_context("fork")
    pool = ProcessPoolExecutor(len(PLACEMENTS), mp_context=fork, initializer=progress.set_quiet, initargs=(True,))
    try:
        futures = [pool.submit(_forked_try, placement) for placement in PLACEMENTS]
        yield lambda: [future.result() for future in futures]
    finally:
        pool.shutdown(cancel_futures=True)
        _FORKED = None


def _tries_in_order(snap: Snapshot, moves: Mapping[int, int], walk: TraceWalk) -> list[dict[tuple[int, int], int]]:
    """The spread's runs one after another, in this process."""
    return [simulated_reserved(snap, moves, walk, placement) for placement in PLACEMENTS]


def _forks_safely(snap: Snapshot, device: int) -> bool:
    """Whether the spread's tries may run in forked processes: a long enough trace, a core to spare, Linux, and no
    thread but this one (a fork copies no thread: a lock another held, tqdm's or the import system's, would stay
    held in the child; a notebook's kernel always runs threads, so there the tries run in order)."""
    events = snap.check_trace(device)
    return (
        SPREAD_IN_PROCESSES <= events <= SPREAD_EVENTS
        and (os.cpu_count() or 1) > 1
        and sys.platform == "linux"
        and threading.active_count() == 1
    )


def _forked_try(placement: str) -> dict[tuple[int, int], int]:
    """One try of the spread, in a forked process: the snapshot, moves and walk are the parent's, inherited."""
    snap, moves, walk = _FORKED
    return simulated_reserved(snap, moves, walk, placement)


def _spread_lines(snap: Snapshot, spread: dict | None, predicted: Mapping[tuple, int]) -> list[str]:
    if spread is None:
        return [
            f"the prediction was not tried with other segment placements (over {SPREAD_EVENTS:,} trace events); "
            "where cudaMalloc lays the mapped run's new segments can move a pool's figure either way"
        ]
    pools = pool_labels(snap)
    return [
        f"{pools.get(pool, pool_label(pool))} {pool}: the prediction depends on where cudaMalloc lays the "
        "segments the mapped run makes (free blocks of one size are taken lowest address first): "
        f"{format_bytes(predicted.get(pool, 0))} with the recording's addresses, {format_bytes(low)} to "
        f"{format_bytes(high)} over the {len(PLACEMENTS) + 1} placements tried. The range cannot bound the "
        "real figure: the driver picks each new segment's address by rules the trace does not show; on the "
        f"kit's recorded pairs the GPU's figure fell up to {SPREAD_SEEN_OUTSIDE:.0%} of the pool outside such a range"
        for pool, (low, high) in spread.items()
    ]


def within_seen_spread(measured: int, low: int, high: int) -> bool:
    """Whether `measured` lies in `low`..`high` widened by `SPREAD_SEEN_OUTSIDE` of the pool each way."""
    return low - SPREAD_SEEN_OUTSIDE * measured <= measured <= high + SPREAD_SEEN_OUTSIDE * measured


def _left_out_line(
    workspace: dict, labels: Mapping[int, str], moves: Mapping[int, int], pools: Mapping[tuple, str]
) -> str:
    """`cuBLAS workspace of <stream> (32.00 MiB, graph pool 1) left out: <target> has its own`."""
    stream, pool = workspace["stream"], tuple(workspace["pool"])
    where = pools.get(pool, pool_label(pool))
    return (
        f"{workspace['kind']} workspace of {labels.get(stream, stream)} ({format_bytes(workspace['bytes'])}, "
        f"{where}) left out: on {labels.get(moves.get(stream, stream), stream)} it would reuse that stream's"
    )


def trace_to_workload(snap: Snapshot, stream_map: Mapping[str, str] | None = None) -> dict:
    """The snapshot's trace as a version-1 workload, with streams renamed by `stream_map` (labels).

    It needs a trace recorded from an empty allocator (a workload starts from
    nothing) and capture windows, the recorder's or inferred
    (`kit.analysis.attribution.capture_windows`), one at a time.
    """
    from kit.analysis.attribution import capture_windows

    stream_map = dict(stream_map or {})
    walk = walk_trace(snap)
    if walk.rewound_segments:
        raise KitError(
            f"{snap.origin}: a workload starts from an empty allocator and this trace starts mid-process "
            f"({walk.rewound_segments} segments already there); what_if() handles such traces"
        )
    labels = stream_labels(snap)
    pools = pool_labels(snap)
    entries = snap.traces[0]

    def stream(sid: int) -> str:
        name = DEFAULT if sid == DEFAULT_STREAM else labels.get(sid, f"stream {sid}")
        return stream_map.get(name, name)

    # A recorder's window opens before torch.cuda.graph empties the cache and registers the RNG
    # state; the capture itself starts at the window's first graph-pool allocation.
    pool_of_alloc = dict(zip(walk.allocs["index"], walk.allocs["pool"], strict=True))
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
        elif e.action in RELEASES and capture is None and (not ops or ops[-1]["op"] != "empty_cache"):
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

"""The safety argument from what is read and written: the proof obligation, checked per pairing.

The obligation PR 63155 must meet, in one sentence (`OBLIGATION`): for every
model graph N and every replay graph R that can run in N's eager break, the
bytes R writes do not overlap the bytes that N reads after the break (in its
later segments, or as its outputs, which the caller reads after the forward)
and that were last written before the break: the values N carries across it.

`kit.record.readwrite.ReadWriteRecorder` records, during capture, the
device byte ranges every aten op reads and writes, tagged with a `Phase`
(which capture: model graph N segment J, its break J, its outputs read after
the forward, or replay graph R). Capture records what replay does: a graph
replays the kernels and addresses it captured. Here:

- `carried_reads`: per model graph and replay break, the bytes read after the
  replay layers start there (where R would run: `RUNS_REPLAY`; the rest of the
  break, `AFTER_REPLAY`, later segments and breaks, the outputs) whose last
  write came before that point (bytes written at or after it are left out:
  that value is made after R has run). A model graph may have several breaks
  (V4.1 breaks at every attention); R runs only in the one where the replay
  layers ran (`ReadWriteRecording.replay_breaks`), and its own breaks' writes
  count as its writes;
- `unseen_writer_reads`, `after_replay_reads`: the reads of bytes an op
  returned unwritten (`FRESH`: an `empty` output) that no recorded op wrote
  before them: a kernel outside the dispatcher (Triton called directly,
  DeepGEMM, NCCL through ctypes) wrote them, unseen, or nothing did. Such
  reads are reported as "written outside the dispatcher" per phase and per
  pairing, never counted as carried: when that kernel ran, and what it read,
  the recording cannot say. Recordings made before the recorder marked fresh
  bytes (every shipped one up to 2026-12-05) have none to report;
- `readwrite_table`: per (model graph, break, replay graph) pairing, those
  bytes intersected with the bytes R writes, with the ops on both sides, and
  beside them the blind spot: `unseen_writer_bytes` (read after R starts,
  written outside the dispatcher) and `unseen_overlap_bytes` (where that blind
  spot meets R: those bytes where R writes, or bytes carried or unseen that R
  returns unwritten and may fill outside the dispatcher);
- `obligation_verdicts`, `obligation_summary`: holds, or violated with the
  bytes and the op names;
- `break_reads`, `attach_break_reads`: what each break read, the input
  `kit.analysis.liveness` uses to tell a break's inputs from blocks read after
  it (the lifetime analysis sees when blocks are allocated and freed, not
  what reads them).

Alternative (a) of the PR, the speculator's capture on the model graphs'
stream too, needs the same kind of argument for the drafter, which runs after
the target forward in the same step (`DRAFTER_OBLIGATION`): `drafter_table`
intersects the bytes each drafter graph D writes with the bytes the step reads
after D whose values model graph N wrote, from phases `drafter_graph(D)` (its
capture) and `step_before_drafter(N)`, `step_after_drafter(N)` (a real step:
what the sampler and `propose` read before D replays, what the step reads
after it); `step_read_entries` hands those reads to the lifetime analysis
(`kit.analysis.liveness.drafter_liveness_table`).

Why only the bytes carried across the break, and not what the segments did
with blocks they freed: a segment ends with `CUDAGraph.capture_end`, which
calls `cudaStreamEndCapture` on the capture stream and checks its result
(`AT_CUDA_CHECK(cudaStreamEndCapture(capture_stream_, &graph_));` in
aten/src/ATen/cuda/CUDAGraph.cpp of pytorch/pytorch). CUDA fails that call unless every stream forked into the
capture has joined back to the origin stream ("Failure to rejoin to the origin
stream will result in failure of the overall capture operation", CUDA
Programming Guide, cross-stream dependencies in stream capture), so a
segment's graph ends only after all its work, on every stream it forked. The
break's eager work and R's replay are queued on the stream the segment was
replayed on, after it. So a block a segment freed is idle when R writes it,
even if its free was pending (freed with `record_stream` uses during capture,
which the caching allocator defers: `needs_events_deferred_until_no_capture`
in c10/cuda/CUDACachingAllocator.cpp, whose
`insert_events_deferred_until_no_capture` says "we know all streams recorded
during cudagraph must have completed") or made on another stream. What is
left is data: does anything after the break read a value R overwrote. That is
the obligation, and it asks the same of R's own graph, which ends joined too.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kit.analysis.attribution import is_replay_capture
from kit.errors import KitError
from kit.units import format_bytes

OBLIGATION = (
    "For every model graph N and every replay graph R that can run in N's eager break, the bytes R writes "
    "do not overlap the bytes read after R starts (by the rest of the break, N's later segments and breaks, "
    "or the caller reading N's outputs) whose values were written before R started."
)
DRAFTER_OBLIGATION = (
    "For every model graph N and every drafter graph D that can run after it in a step, the bytes D writes do "
    "not overlap the bytes read after D begins (by D itself or by the rest of the step) whose values N wrote."
)
MODEL, REPLAY, DRAFTER, STEP = "model", "replay", "drafter", "step"
SEGMENT, BREAK, OUTPUT = "segment", "break", "output"
# A model graph's replay break in three parts: BREAK up to where the replay layers start (the gather of their
# inputs), RUNS_REPLAY while they run (where replay graph R runs), AFTER_REPLAY the rest of the break.
RUNS_REPLAY, AFTER_REPLAY = "runs_replay", "after_replay"
_PART_ORDER = {SEGMENT: 0.0, BREAK: 1.0, RUNS_REPLAY: 1.25, AFTER_REPLAY: 1.5}
BEFORE, AFTER = "before", "after"  # a step's eager work before and after its drafter graph
READ, WRITE = "read", "write"
# Recorded since the recorder's blind spots were made visible (older recordings hold neither): MAY_WRITE, the hull
# of a write of more element ranges than the recorder lists (some of its bytes written: counted as written by a
# replay graph, never as rewriting a value); FRESH, bytes an op returned unwritten (`empty` and its kin).
MAY_WRITE, FRESH = "may_write", "fresh"
UNSEEN_WRITER = "written outside the dispatcher"
TABLE_COLUMNS = [
    "model_size",
    "break",
    "replay_size",
    "can_run",
    "carried_bytes",
    "replay_write_bytes",
    "overlap_bytes",
    "first_overlap",
    "reading_ops",
    "writing_ops",
    "holds",
    "unseen_writer_bytes",
    "unseen_writer_ops",
    "unseen_made_by",
    "unseen_overlap_bytes",
]


@dataclass(frozen=True, order=True)
class Phase:
    """Where an op ran: model or replay graph `size`, in segment `index`, break `index`, or its outputs."""

    graph: str
    size: int
    part: str = SEGMENT
    index: int = 0

    @property
    def label(self) -> str:
        if self.graph == STEP:
            return f"step of {self.size} tokens, {self.part} the drafter's graph"
        if self.graph == DRAFTER:
            return f"drafter graph {self.size}"
        part = {
            OUTPUT: "outputs read after the forward",
            RUNS_REPLAY: f"break {self.index} while the replay layers run",
            AFTER_REPLAY: f"break {self.index} after the replay layers",
        }.get(self.part, f"{self.part} {self.index}")
        return f"{self.graph} graph {self.size} {part}"

    @property
    def order(self) -> float:
        """Position in the graph's forward: segment J at 2J, break J from 2J + 1 (its replay part at
        2J + 1.25, the rest of it at 2J + 1.5), the outputs last."""
        return float("inf") if self.part == OUTPUT else 2 * self.index + _PART_ORDER[self.part]


def model_segment(size: int, index: int = 0) -> Phase:
    return Phase(MODEL, size, SEGMENT, index)


def model_break(size: int, index: int = 0) -> Phase:
    return Phase(MODEL, size, BREAK, index)


def model_runs_replay(size: int, index: int = 0) -> Phase:
    return Phase(MODEL, size, RUNS_REPLAY, index)


def model_after_replay(size: int, index: int = 0) -> Phase:
    return Phase(MODEL, size, AFTER_REPLAY, index)


def model_outputs(size: int) -> Phase:
    return Phase(MODEL, size, OUTPUT)


def replay_graph(size: int) -> Phase:
    return Phase(REPLAY, size)


def drafter_graph(size: int) -> Phase:
    return Phase(DRAFTER, size)


def step_before_drafter(size: int) -> Phase:
    return Phase(STEP, size, BEFORE)


def step_after_drafter(size: int) -> Phase:
    return Phase(STEP, size, AFTER)


@dataclass(frozen=True)
class Access:
    """One op's read or write of the bytes [start, end), in recording order `seq`."""

    seq: int
    phase: Phase
    op: str
    kind: str
    start: int
    end: int

    def to_record(self) -> str:
        """One line, `seq graph size part index kind start end op` (the op last: it may hold spaces)."""
        p = self.phase
        return " ".join(
            map(str, (self.seq, p.graph, p.size, p.part, p.index, self.kind, self.start, self.end, self.op))
        )

    @classmethod
    def from_record(cls, record: str) -> Access:
        seq, graph, size, part, index, kind, start, end, op = record.split(" ", 8)
        return cls(int(seq), Phase(graph, int(size), part, int(index)), op, kind, int(start), int(end))


class Ranges:
    """Disjoint, sorted half-open byte ranges `[start, end)`; union `|`, intersection `&`, difference `-`."""

    __slots__ = ("spans",)

    def __init__(self, spans: Iterable[tuple[int, int]] = ()) -> None:
        spans = spans if isinstance(spans, list) else list(spans)
        if len(spans) > _MANY:
            self.spans = _merged_many(spans)
            return
        merged: list[tuple[int, int]] = []
        for start, end in sorted((int(s), int(e)) for s, e in spans if e > s):
            if merged and start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        self.spans = merged

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self.spans)

    def __bool__(self) -> bool:
        return bool(self.spans)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ranges) and self.spans == other.spans

    def __repr__(self) -> str:
        return f"Ranges({[(hex(s), hex(e)) for s, e in self.spans]})"

    @property
    def total(self) -> int:
        return sum(e - s for s, e in self.spans)

    def __or__(self, other: Ranges) -> Ranges:
        return Ranges(self.spans + other.spans)

    def __and__(self, other: Ranges) -> Ranges:
        small, large = sorted((self.spans, other.spans), key=len)
        if len(small) * 16 < len(large):  # a few spans against many: look each up
            return Ranges([piece for start, end in small for piece in _clip(large, start, end)])
        out, i, j = [], 0, 0
        a, b = self.spans, other.spans
        while i < len(a) and j < len(b):
            start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
            if start < end:
                out.append((start, end))
            if a[i][1] < b[j][1]:
                i += 1
            else:
                j += 1
        return Ranges(out)

    def __sub__(self, other: Ranges) -> Ranges:
        return Ranges([piece for start, end in self.spans for piece in _outside(other.spans, start, end)])

    def intersects(self, start: int, end: int) -> bool:
        i = bisect.bisect_right(self.spans, (start, float("inf"))) - 1
        candidates = self.spans[max(i, 0) : i + 2]
        return any(s < end and start < e for s, e in candidates)


_MANY = 256  # spans from which a union is merged by numpy


def _merged_many(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`spans` sorted and merged where they overlap or touch (numpy: for the many spans of strided tensors)."""
    a = np.fromiter(itertools.chain.from_iterable(spans), dtype=np.int64, count=2 * len(spans)).reshape(-1, 2)
    a = a[a[:, 1] > a[:, 0]]
    if not len(a):
        return []
    a = a[np.lexsort((a[:, 1], a[:, 0]))]
    ends = np.maximum.accumulate(a[:, 1])
    first = np.flatnonzero(np.r_[True, a[1:, 0] > ends[:-1]])
    last = np.r_[first[1:] - 1, len(a) - 1]
    return list(zip(a[first, 0].tolist(), ends[last].tolist(), strict=True))


def _clip(spans: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The parts of sorted, disjoint `spans` within `[start, end)`."""
    i = max(bisect.bisect_right(spans, (start, float("inf"))) - 1, 0)
    out = []
    while i < len(spans) and spans[i][0] < end:
        s, e = max(spans[i][0], start), min(spans[i][1], end)
        if s < e:
            out.append((s, e))
        i += 1
    return out


def _outside(spans: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The parts of `[start, end)` outside sorted, disjoint `spans`."""
    out = []
    i = max(bisect.bisect_right(spans, (start, float("inf"))) - 1, 0)  # the first span that can reach start
    while i < len(spans) and spans[i][0] < end:
        cut_start, cut_end = spans[i]
        if cut_end > start:
            if cut_start > start:
                out.append((start, cut_start))
            start = max(start, cut_end)
        i += 1
    if start < end:
        out.append((start, end))
    return out


@dataclass(frozen=True)
class Piece:
    """Bytes `[start, end)` an op read or wrote, with the op and the phase's label; for a read of bytes written
    outside the dispatcher, `made_by` is the op that returned them unwritten, with its phase."""

    start: int
    end: int
    op: str
    phase: str
    made_by: str = ""


@dataclass
class ReadWriteRecording:
    """What a `ReadWriteRecorder` saw: every access in recording order."""

    accesses: list[Access]

    def to_records(self) -> list[str]:
        return [a.to_record() for a in self.accesses]

    @classmethod
    def from_records(cls, records: Iterable[str]) -> ReadWriteRecording:
        return cls([Access.from_record(r) for r in records])

    def sizes(self, graph: str) -> list[int]:
        return sorted({a.phase.size for a in self.accesses if a.phase.graph == graph})

    def of(self, graph: str, size: int) -> list[Access]:
        return [a for a in self.accesses if a.phase.graph == graph and a.phase.size == size]

    def breaks(self, size: int) -> list[int]:
        """The eager breaks model graph `size` went through, by index."""
        return sorted({a.phase.index for a in self.of(MODEL, size) if a.phase.part == BREAK})

    def replay_breaks(self, size: int) -> list[int]:
        """The breaks of model graph `size` where the replay layers ran (where a replay graph can run).

        A recording that marks no replay part anywhere (made before they were
        recorded) has every break taken for one, with R starting at its end.
        """
        if not self.marks_replay:
            return self.breaks(size)
        return sorted({a.phase.index for a in self.of(MODEL, size) if a.phase.part == RUNS_REPLAY})

    @property
    def marks_replay(self) -> bool:
        return any(a.phase.part == RUNS_REPLAY for a in self.accesses)


def _recording(recording: ReadWriteRecording | Iterable) -> ReadWriteRecording:
    if isinstance(recording, ReadWriteRecording):
        return recording
    accesses = list(recording)
    if all(isinstance(a, Access) for a in accesses):
        return ReadWriteRecording(accesses)
    return ReadWriteRecording.from_records(accesses)


def by_op(accesses: Iterable[Access]) -> Iterator[list[Access]]:
    """Accesses grouped by the op that made them (one sequence number), in recording order."""
    group: list[Access] = []
    for access in accesses:
        if group and access.seq != group[0].seq:
            yield group
            group = []
        group.append(access)
    if group:
        yield group


class FreshBytes:
    """Bytes returned unwritten (`FRESH`) that no recorded op has written since, with the op that returned them.

    A read does not clear them (a read of fresh bytes by an in-place op, an
    `index_copy_` into an `empty`, is reported too: the rows it keeps hold what
    no recorded op wrote); an exact write or a `MAY_WRITE` hull does (a recorded
    op may have written them).
    """

    def __init__(self) -> None:
        self.ranges = Ranges()
        self.made: list[Piece] = []  # every fresh return, latest last

    def update(self, accesses: list[Access]) -> None:
        """After one op: its writes (exact or hull) leave the fresh bytes, its unwritten returns join them."""
        written = Ranges((a.start, a.end) for a in accesses if a.kind in (WRITE, MAY_WRITE))
        new = [Piece(a.start, a.end, a.op, a.phase.label) for a in accesses if a.kind == FRESH]
        if written:
            self.ranges = self.ranges - written
        if new:
            self.ranges = self.ranges | Ranges((p.start, p.end) for p in new)
            self.made += new

    def reads(self, access: Access) -> list[Piece]:
        """The parts of a read whose bytes are fresh: written outside the dispatcher, each with its maker."""
        pieces = []
        for start, end in _clip(self.ranges.spans, access.start, access.end):
            maker = next(p for p in reversed(self.made) if p.start < end and start < p.end)
            pieces.append(Piece(start, end, access.op, access.phase.label, f"{maker.op} in {maker.phase}"))
        return pieces


def after_replay_reads(
    recording: ReadWriteRecording | Iterable, size: int, break_index: int = 0
) -> tuple[list[Piece], list[Piece]]:
    """The reads after replay graph R starts in break `break_index` of model graph `size`: (carried, unseen).

    Carried: bytes whose last recorded write came before R started
    (`carried_reads`). Unseen: bytes returned unwritten (`FRESH`, before or
    after R started) that no recorded op wrote before the read: written outside
    the dispatcher, at a time the recording cannot tell; they are never carried.
    Bytes returned unwritten after R started count as made after it.
    """
    recording = _recording(recording)
    boundary = (model_runs_replay if recording.marks_replay else model_break)(size, break_index).order
    rewritten, fresh, carried, unseen = Ranges(), FreshBytes(), [], []
    for accesses in by_op(recording.of(MODEL, size)):
        order = accesses[0].phase.order
        if order > boundary:
            for access in (a for a in accesses if a.kind == READ):
                unseen += fresh.reads(access)
                carried += [
                    Piece(s, e, access.op, access.phase.label)
                    for start, end in _outside(fresh.ranges.spans, access.start, access.end)
                    for s, e in _outside(rewritten.spans, start, end)
                ]
        fresh.update(accesses)
        if order >= boundary:
            rewritten = rewritten | Ranges((a.start, a.end) for a in accesses if a.kind in (WRITE, FRESH))
    return carried, unseen


def carried_reads(recording: ReadWriteRecording | Iterable, size: int, break_index: int = 0) -> list[Piece]:
    """The bytes read after replay graph R starts in break `break_index` of model graph `size`, whose last write
    came before R started.

    R starts where the replay layers start (`RUNS_REPLAY`). The reads before
    it (the gather of the layers' inputs) and the replay layers' own reads
    are left out; every read after it counts: the rest of the break, the later
    segments and breaks, the outputs the caller reads. A read of bytes written
    at or after R's start is left out: that value is made after R ran. In a
    recording without replay parts R starts at the break's end. A read of bytes
    no recorded op wrote since an op returned them unwritten is left out too:
    they were written outside the dispatcher (`after_replay_reads` lists them).
    """
    return after_replay_reads(recording, size, break_index)[0]


def unseen_writer_reads(recording: ReadWriteRecording | Iterable) -> list[Piece]:
    """Every read, in any phase, of bytes returned unwritten that no recorded op wrote before it.

    Per graph (model, replay or drafter graph, or step of one size) in
    recording order: what a kernel outside the dispatcher wrote (or nobody:
    uninitialised memory), whose writer and whose own reads the recorder
    cannot see. Each piece names its reading op, its phase and `made_by`.
    """
    recording = _recording(recording)
    pieces = []
    for graph, size in sorted({(a.phase.graph, a.phase.size) for a in recording.accesses}):
        fresh = FreshBytes()
        for accesses in by_op(recording.of(graph, size)):
            for access in (a for a in accesses if a.kind == READ):
                pieces += fresh.reads(access)
            fresh.update(accesses)
    return pieces


def unseen_writer_table(recording: ReadWriteRecording | Iterable) -> pd.DataFrame:
    """`unseen_writer_reads` per phase: the bytes, the ops that read them and the ops that returned them unwritten."""
    rows: dict[str, dict] = {}
    for p in unseen_writer_reads(recording):
        row = rows.setdefault(p.phase, {"phase": p.phase, "ranges": [], "reading_ops": set(), "made_by": set()})
        row["ranges"].append((p.start, p.end))
        row["reading_ops"].add(p.op)
        row["made_by"].add(p.made_by)
    records = [
        {
            "phase": r["phase"],
            "unseen_writer_bytes": Ranges(r["ranges"]).total,
            "reading_ops": sorted(r["reading_ops"]),
            "made_by": sorted(r["made_by"]),
        }
        for r in rows.values()
    ]
    return pd.DataFrame(records, columns=["phase", "unseen_writer_bytes", "reading_ops", "made_by"])


def unseen_writer_lines(recording: ReadWriteRecording | Iterable) -> list[str]:
    """One line per phase that read bytes written outside the dispatcher; none when the recorder saw every writer."""
    return [
        f"{row['phase']}: {format_bytes(row['unseen_writer_bytes'])} {UNSEEN_WRITER} (returned unwritten by "
        f"{', '.join(row['made_by'])}; read by {', '.join(row['reading_ops'])}); the kernel that wrote them, and what "
        "it read, are not recorded"
        for _, row in unseen_writer_table(recording).iterrows()
    ]


def replay_writes(recording: ReadWriteRecording | Iterable, size: int) -> list[Piece]:
    """Every byte range replay graph `size` writes (the hulls of writes too large to list in full included)."""
    recording = _recording(recording)
    return [
        Piece(a.start, a.end, a.op, a.phase.label) for a in recording.of(REPLAY, size) if a.kind in (WRITE, MAY_WRITE)
    ]


def unwritten_returns(recording: ReadWriteRecording | Iterable, graph: str, size: int) -> Ranges:
    """The bytes graph `size` returned unwritten that none of its recorded ops wrote: filled, if at all, outside
    the dispatcher."""
    fresh = FreshBytes()
    for accesses in by_op(_recording(recording).of(graph, size)):
        fresh.update(accesses)
    return fresh.ranges


def _touching(pieces: list[Piece], ranges: Ranges) -> list[Piece]:
    return [p for p in pieces if ranges.intersects(p.start, p.end)]


def readwrite_table(
    recording: ReadWriteRecording | Iterable, *, can_run: Callable[[int, int], bool] | None = None
) -> pd.DataFrame:
    """Per (model graph, break, replay graph) pairing: the carried bytes R writes, and whether the obligation holds.

    `can_run(model_size, replay_size)` says which replay graphs can run in a
    model graph's break (vLLM's dispatch: `kit.experiments.dispatch.can_run`);
    without it every pairing can. Every pairing gets a row; the verdicts read
    only those that can run. `first_overlap` is the lowest overlapping address.
    `holds` is the obligation on what the recorder saw; beside it the blind
    spot: `unseen_writer_bytes` read after R starts were written outside the
    dispatcher (`unseen_writer_ops` read them, `unseen_made_by` returned them
    unwritten), and `unseen_overlap_bytes` of the bytes read after R starts
    are where R writes over such bytes or may write outside the dispatcher
    (R's own unwritten returns): for those the recording cannot decide.
    """
    recording = _recording(recording)
    replays = {r: replay_writes(recording, r) for r in recording.sizes(REPLAY)}
    written = {r: Ranges((p.start, p.end) for p in pieces) for r, pieces in replays.items()}
    unwritten = {r: unwritten_returns(recording, REPLAY, r) for r in replays}
    rows = []
    for model_size in recording.sizes(MODEL):
        for j in recording.replay_breaks(model_size):
            carried_pieces, unseen_pieces = after_replay_reads(recording, model_size, j)
            carried = Ranges((p.start, p.end) for p in carried_pieces)
            unseen = Ranges((p.start, p.end) for p in unseen_pieces)
            for replay_size, writes in written.items():
                overlap = carried & writes
                blind = (unseen & writes) | ((carried | unseen) & unwritten[replay_size])
                rows.append(
                    {
                        "model_size": model_size,
                        "break": j,
                        "replay_size": replay_size,
                        "can_run": True if can_run is None else bool(can_run(model_size, replay_size)),
                        "carried_bytes": carried.total,
                        "replay_write_bytes": writes.total,
                        "overlap_bytes": overlap.total,
                        "first_overlap": overlap.spans[0][0] if overlap else None,
                        "reading_ops": sorted({p.op for p in _touching(carried_pieces, overlap)}),
                        "writing_ops": sorted({p.op for p in _touching(replays[replay_size], overlap)}),
                        "holds": not overlap,
                        "unseen_writer_bytes": unseen.total,
                        "unseen_writer_ops": sorted({p.op for p in unseen_pieces}),
                        "unseen_made_by": sorted({p.made_by for p in unseen_pieces}),
                        "unseen_overlap_bytes": blind.total,
                    }
                )
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    table["first_overlap"] = table["first_overlap"].astype("Int64")  # addresses stay exact beside the missing ones
    table.attrs["obligation"] = OBLIGATION
    return table


def unseen_clause(row: Mapping) -> str:
    """What a pairing's row says of bytes written outside the dispatcher: "" when there are none."""
    unseen, blind = int(row.get("unseen_writer_bytes", 0) or 0), int(row.get("unseen_overlap_bytes", 0) or 0)
    if not unseen and not blind:
        return ""
    clause = ""
    if unseen:
        clause = (
            f"; not seen: {format_bytes(unseen)} read after it by {', '.join(row['unseen_writer_ops'])} were "
            f"{UNSEEN_WRITER} (returned unwritten by {', '.join(row['unseen_made_by'])}), not counted as carried"
        )
    if blind:
        clause += (
            f"; {format_bytes(blind)} read after it meet replay graph {row['replay_size']} where a writer is "
            "unseen: the recording cannot decide those"
        )
    return clause


def obligation_verdicts(table: pd.DataFrame) -> list[str]:
    """One line per pairing that can run: holds, or violated with the bytes, the first address and the ops; and
    what was written outside the dispatcher, where anything was (`unseen_clause`)."""
    lines = []
    for _, row in table[table["can_run"]].iterrows():
        pair = f"model graph {row['model_size']} break {row['break']}, replay graph {row['replay_size']}"
        if row["holds"]:
            lines.append(
                f"{pair}: holds: replay graph {row['replay_size']} writes none of the "
                f"{format_bytes(row['carried_bytes'])} carried across the break{unseen_clause(row)}"
            )
        else:
            lines.append(
                f"{pair}: VIOLATED: {format_bytes(row['overlap_bytes'])} carried across the break (first at "
                f"{int(row['first_overlap']):#x}, read after it by {', '.join(row['reading_ops'])}) are written "
                f"by {', '.join(row['writing_ops'])} in replay graph {row['replay_size']}{unseen_clause(row)}"
            )
    return lines


def obligation_summary(table: pd.DataFrame) -> str:
    """The obligation and its result in one line, and what was written outside the dispatcher where anything was."""
    if table.empty:
        return f"{OBLIGATION} Nothing to check: no pairing can run."
    running = table[table["can_run"]]
    bad = running[~running["holds"]]
    if running.empty:
        return f"{OBLIGATION} Nothing to check: no pairing can run."
    if bad.empty:
        return f"{OBLIGATION} Holds for all {len(running)} pairings that can run.{unseen_summary(running)}"
    pairs = ", ".join(f"({m}, {r})" for m, r in zip(bad["model_size"], bad["replay_size"], strict=True))
    return (
        f"{OBLIGATION} Violated in {len(bad)} of {len(running)} pairings that can run: {pairs} "
        f"(model graph, replay graph), {format_bytes(bad['overlap_bytes'].sum())} in all.{unseen_summary(running)}"
    )


def unseen_summary(running: pd.DataFrame) -> str:
    """The pairings whose reads after R include bytes written outside the dispatcher: "" when none (or a table made
    before the recorder marked them)."""
    if "unseen_writer_bytes" not in running:
        return ""
    seen = running[(running["unseen_writer_bytes"] > 0) | (running["unseen_overlap_bytes"] > 0)]
    if seen.empty:
        return ""
    undecided = int((seen["unseen_overlap_bytes"] > 0).sum())
    return (
        f" In {len(seen)} of them bytes read after R were {UNSEEN_WRITER}, which the recorder cannot see (not counted "
        f"as carried); {undecided} pairing(s) meet R there and cannot be decided from the recording."
    )


def break_reads(recording: ReadWriteRecording | Iterable) -> dict[tuple[int, int], Ranges]:
    """What each model graph's break read: `(model size, break index) -> Ranges`."""
    recording = _recording(recording)
    reads: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for a in recording.accesses:
        if a.phase.graph == MODEL and a.phase.part == BREAK and a.kind == READ:
            reads.setdefault((a.phase.size, a.phase.index), []).append((a.start, a.end))
    return {key: Ranges(spans) for key, spans in reads.items()}


def capture_names(captures: Iterable[Mapping]) -> dict[tuple[str, int], str]:
    """`(MODEL or REPLAY, size) -> capture name` from the capture recorder's windows (`kit["captures"]`).

    A replay capture is one `is_replay_capture` names so; a model graph is any
    other capture with more than one graph (segments around eager breaks).
    """
    graphs: dict[str, list[Mapping]] = {}
    for c in captures:
        graphs.setdefault(c["capture"], []).append(c)
    names = {}
    for name, gs in graphs.items():
        if is_replay_capture(gs[0].get("manager", "")):
            names[(REPLAY, gs[0]["size"])] = name
        elif len(gs) > 1:
            names[(MODEL, gs[0]["size"])] = name
    return names


def attach_break_reads(raw: dict, recording: ReadWriteRecording | Iterable) -> dict:
    """Write what each break read into a recorded snapshot's `kit` key (`break_reads`), for the liveness analysis.

    `raw` is a snapshot dict with the capture recorder's windows; each model
    graph's size names its capture there (`capture_names`). Where the
    recording marks the replay layers' part of a break, `replay_breaks` says
    which breaks those were. Returns `raw`.
    """
    recording = _recording(recording)
    names = capture_names(raw.get("kit", {}).get("captures") or [])
    entries = []
    for (size, j), ranges in sorted(break_reads(recording).items()):
        if (MODEL, size) not in names:
            raise KitError(f"the snapshot has no model graph of size {size} to attach its break's reads to")
        entries.append({"capture": names[(MODEL, size)], "break": j, "ranges": [list(span) for span in ranges]})
    raw.setdefault("kit", {})["break_reads"] = entries
    if recording.marks_replay:
        # Which breaks the replay layers ran in: the lifetime analysis checks only those.
        raw["kit"]["replay_breaks"] = [
            {"capture": names[(MODEL, size)], "breaks": recording.replay_breaks(size)}
            for size in recording.sizes(MODEL)
            if (MODEL, size) in names
        ]
    return raw


def read_break_reads(entries: Iterable[Mapping]) -> dict[tuple[str, int], Ranges]:
    """`kit["break_reads"]` of a snapshot as `(capture, break index) -> Ranges`."""
    return {(e["capture"], int(e["break"])): Ranges(tuple(span) for span in e["ranges"]) for e in entries}


# --- alternative (a): the drafter's graphs on the model graphs' stream -------------------------

DRAFTER_COLUMNS = [
    "model_size",
    "drafter_size",
    "can_run",
    "output_bytes",
    "read_before_bytes",
    "read_after_bytes",
    "drafter_write_bytes",
    "outputs_overwritten_bytes",
    "overlap_bytes",
    "first_overlap",
    "reading_ops",
    "writing_ops",
    "holds",
]


def _ranges(accesses: Iterable[Access], *kinds: str) -> Ranges:
    return Ranges((a.start, a.end) for a in accesses if a.kind in kinds)


def model_writes(recording: ReadWriteRecording | Iterable, size: int) -> Ranges:
    """Every byte model graph `size` writes: its segments and its breaks (the hulls of writes too large to list)."""
    return _ranges(_recording(recording).of(MODEL, size), WRITE, MAY_WRITE)


def model_outputs_read(recording: ReadWriteRecording | Iterable, size: int) -> Ranges:
    """The bytes of model graph `size`'s outputs, as its caller reads them after the forward."""
    return _ranges((a for a in _recording(recording).of(MODEL, size) if a.phase.part == OUTPUT), READ)


def step_reads(recording: ReadWriteRecording | Iterable, size: int, part: str) -> list[Piece]:
    """What a step of `size` tokens reads before (`BEFORE`) or after (`AFTER`) its drafter graph.

    A read of bytes that the same part of the step wrote first is left out: that
    value was made in the step, after the target forward.
    """
    rewritten, pieces = Ranges(), []
    for access in _recording(recording).of(STEP, size):
        if access.phase.part != part:
            continue
        span = Ranges([(access.start, access.end)])
        if access.kind in (WRITE, FRESH):
            rewritten = rewritten | span
        elif access.kind == READ:
            pieces += [Piece(s, e, access.op, access.phase.label) for s, e in span - rewritten]
    return pieces


def drafter_table(
    recording: ReadWriteRecording | Iterable, *, can_run: Callable[[int, int], bool] | None = None
) -> pd.DataFrame:
    """Per (model graph N, drafter graph D) pairing: what D writes against what the step still reads of N's values.

    The drafter runs after the target forward, in the same step: the sampler and
    `propose` read N's outputs (`read_before_bytes`, recorded on a real step),
    then D replays, then the step goes on (`read_after_bytes`: bytes N wrote,
    read after D). `outputs_overwritten_bytes` are N's outputs that D writes:
    harmless when every read of them comes before D, which is what the
    obligation (`DRAFTER_OBLIGATION`) asks: `overlap_bytes`, the bytes D writes
    that are read after it with N's values, must be none. `can_run(model_size,
    drafter_size)` is the speculator's dispatch (None: every pairing can).
    """
    recording = _recording(recording)
    drafters = {d: _ranges(recording.of(DRAFTER, d), WRITE, MAY_WRITE) for d in recording.sizes(DRAFTER)}
    drafter_pieces = {
        d: [
            Piece(a.start, a.end, a.op, a.phase.label) for a in recording.of(DRAFTER, d) if a.kind in (WRITE, MAY_WRITE)
        ]
        for d in drafters
    }
    rows = []
    for model_size in recording.sizes(MODEL):
        written = model_writes(recording, model_size)
        outputs = model_outputs_read(recording, model_size)
        before = Ranges((p.start, p.end) for p in step_reads(recording, model_size, BEFORE)) & written
        after_pieces = [p for p in step_reads(recording, model_size, AFTER) if written.intersects(p.start, p.end)]
        after = Ranges((p.start, p.end) for p in after_pieces) & written
        for drafter_size, writes in drafters.items():
            overlap = after & writes
            rows.append(
                {
                    "model_size": model_size,
                    "drafter_size": drafter_size,
                    "can_run": True if can_run is None else bool(can_run(model_size, drafter_size)),
                    "output_bytes": outputs.total,
                    "read_before_bytes": before.total,
                    "read_after_bytes": after.total,
                    "drafter_write_bytes": writes.total,
                    "outputs_overwritten_bytes": (outputs & writes).total,
                    "overlap_bytes": overlap.total,
                    "first_overlap": overlap.spans[0][0] if overlap else None,
                    "reading_ops": sorted({p.op for p in _touching(after_pieces, overlap)}),
                    "writing_ops": sorted({p.op for p in _touching(drafter_pieces[drafter_size], overlap)}),
                    "holds": not overlap,
                }
            )
    table = pd.DataFrame(rows, columns=DRAFTER_COLUMNS)
    table["first_overlap"] = table["first_overlap"].astype("Int64")
    table.attrs["obligation"] = DRAFTER_OBLIGATION
    return table


def drafter_verdicts(table: pd.DataFrame) -> list[str]:
    """One line per (model graph, drafter graph) pairing that can run: holds, or violated with bytes and ops."""
    lines = []
    for _, row in table[table["can_run"]].iterrows():
        pair = f"model graph {row['model_size']}, drafter graph {row['drafter_size']}"
        over = format_bytes(row["outputs_overwritten_bytes"])
        if row["holds"]:
            lines.append(
                f"{pair}: holds: the step reads {format_bytes(row['read_after_bytes'])} of the model graph's values "
                f"after the drafter, none of them written by it ({over} of the target's outputs are overwritten "
                "after the sampler and propose read them)"
            )
        else:
            lines.append(
                f"{pair}: VIOLATED: {format_bytes(row['overlap_bytes'])} of the model graph's values (first at "
                f"{int(row['first_overlap']):#x}, read after the drafter by {', '.join(row['reading_ops'])}) are "
                f"written by {', '.join(row['writing_ops'])} in drafter graph {row['drafter_size']}"
            )
    return lines


def drafter_summary(table: pd.DataFrame) -> str:
    """The drafter's obligation and its result in one line."""
    running = table[table["can_run"]]
    bad = running[~running["holds"]]
    overwritten = int((running["outputs_overwritten_bytes"] > 0).sum())
    if running.empty:
        return f"{DRAFTER_OBLIGATION} Nothing to check: no pairing can run."
    if bad.empty:
        return (
            f"{DRAFTER_OBLIGATION} Holds for all {len(running)} pairings that can run (in {overwritten} of them the "
            "drafter overwrites the target's outputs, all read before it)."
        )
    pairs = ", ".join(f"({m}, {d})" for m, d in zip(bad["model_size"], bad["drafter_size"], strict=True))
    return (
        f"{DRAFTER_OBLIGATION} Violated in {len(bad)} of {len(running)} pairings that can run: {pairs} "
        f"(model graph, drafter graph), {format_bytes(bad['overlap_bytes'].sum())} in all."
    )


def step_read_entries(recording: ReadWriteRecording | Iterable, names: Mapping[int, str]) -> list[dict]:
    """`kit["step_reads"]` for a snapshot: per model graph (`names[size]` its capture), what its step read when.

    Each entry: `{"capture", "before": [[start, end], ...], "after": [...]}`,
    the bytes the step read before and after its drafter graph
    (`kit.analysis.liveness.drafter_liveness_table` reads them).
    """
    recording = _recording(recording)
    entries = []
    for size in recording.sizes(STEP):
        if size not in names:
            raise KitError(f"the snapshot has no model graph of size {size} to attach its step's reads to")
        parts = {part: Ranges((p.start, p.end) for p in step_reads(recording, size, part)) for part in (BEFORE, AFTER)}
        entries.append({"capture": names[size], **{k: [list(s) for s in v] for k, v in parts.items()}})
    return entries


def read_step_reads(entries: Iterable[Mapping]) -> dict[str, tuple[Ranges, Ranges]]:
    """`kit["step_reads"]` of a snapshot as `capture -> (read before the drafter, read after it)`."""
    return {e["capture"]: (Ranges(tuple(s) for s in e[BEFORE]), Ranges(tuple(s) for s in e[AFTER])) for e in entries}

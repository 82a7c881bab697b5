"""The safety argument from a recorded trace: what each model graph holds across its eager break.

PR 63155 is safe when no graph-pool tensor of the model graph is still needed
while a replay graph runs in its eager break. If one is (aux hidden states
produced before the replay layers, with the replay graphs forced onto the
model graphs' stream), the replay graph overwrites it. From a recording with
the capture recorder's windows: `liveness_table` lists the graph-pool blocks
each model capture holds across each eager break, how long it holds them, and
which replay capture allocated over them (on a plain snapshot, from inferred
windows: `kit.analysis.attribution.capture_windows`, where any other capture
into the pool counts as one that may run in the break); `liveness_verdicts` says safe or
conflict per capture, and `break_allocations` checks that the breaks allocate
outside the pool (their outputs live there). `kit.analysis.equivalence` is
the same question asked of the outputs on a GPU, and `kit.analysis.readwrite`
asks it of what is read and written: a trace says when a block is allocated
and freed, never who reads it, so this analysis infers liveness from
lifetimes and from what each break read (when the snapshot has it), and the
read/write analysis checks the inference.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

import pandas as pd

from kit.analysis.attribution import captures_by_name, is_replay_capture
from kit.analysis.frames import first_user_frame, frame_line, is_user_frame
from kit.analysis.readwrite import Ranges, read_break_reads, read_step_reads
from kit.analysis.trace.walk import walk_trace
from kit.errors import KitError
from kit.load.snapshot import Snapshot, load_snapshot
from kit.units import format_bytes

RELEASED = "released by the break"
BREAK_INPUT = "break input"
HELD = "held after the break"
LIVENESS_COLUMNS = [
    "capture",
    "capture_size",
    "break",
    "break_begin",
    "break_end",
    "addr",
    "bytes",
    "alloc_index",
    "free_index",
    "class",
    "alloc_frame",
    "free_frame",
    "overlapping_replay",
    "replay_in_break",
    "replay_overlaps",
    "conflict",
]
BREAK_COLUMNS = ["capture", "break", "break_begin", "break_end", "allocs", "bytes", "pool_allocs", "pool_bytes"]
BREAK_COLUMNS += ["unmapped", "outside_pool"]


@dataclass
class Liveness:
    """What `liveness_table` found: one row per (model capture, break, held block), and what was paired.

    `rows` has the columns of `LIVENESS_COLUMNS`; `model_captures` are the
    captures with eager breaks, in recording order, `replay_captures` the
    replay captures checked against them, and `paired` says whether each
    break was paired with the one replay graph that runs in it
    (`replay_size_for`) rather than with every replay graph;
    `break_reads_known` whether what each break read was known (`break input`
    needs it).
    """

    rows: pd.DataFrame
    source: str
    model_captures: list[str]
    replay_captures: list[str]
    paired: bool
    break_reads_known: bool = False

    def verdicts(self) -> list[str]:
        """One line per model capture: safe, or the conflict (`liveness_verdicts`)."""
        return liveness_verdicts(self)


@dataclass
class _Life:
    index: int  # trace index of the alloc
    addr: int
    size: int  # requested bytes: what the tensor's kernels touch
    pool: tuple[int, int] | None
    frames: list
    free: int | None = None  # trace index of its free_requested (or free_completed), None if never
    free_frames: list | None = None

    def overlaps(self, other: _Life) -> bool:
        return self.addr < other.addr + other.size and other.addr < self.addr + self.size


def _captures(snap: Snapshot) -> dict[str, list[dict]]:
    """The capture windows, recorded or inferred, per capture; a one-line error when there are none."""
    captures = captures_by_name(snap)
    if not captures:
        raise KitError(
            f"{snap.origin}: no captures: the kit key lists none and no allocation in the trace landed in a graph pool"
        )
    return captures


def _lifetimes(snap: Snapshot, device: int) -> list[_Life]:
    """Every alloc of the trace with its pool (from the replayed segments) and its free."""
    allocs = walk_trace(snap, device).allocs
    pools = {int(i): tuple(p) for i, p in zip(allocs["index"], allocs["pool"], strict=True)}
    lives: list[_Life] = []
    live: dict[int, _Life] = {}
    for i, e in enumerate(snap.traces.get(device, ())):
        if e.action == "alloc":
            life = live[e.addr] = _Life(i, e.addr, e.size, pools.get(i), e.frames)
            lives.append(life)
        elif e.action in ("free_requested", "free_completed") and e.addr in live:
            life = live.pop(e.addr)
            life.free, life.free_frames = i, e.frames
    return lives


def _in_windows(index: int, graphs: list[dict]) -> bool:
    return any(g["trace_begin"] <= index < g["trace_end"] for g in graphs)


def liveness_table(
    snapshot: Snapshot | str | dict,
    *,
    replay_size_for: Callable[[int], int | Collection[int]] | None = None,
    break_reads: Mapping[tuple[str, int], Iterable[tuple[int, int]]] | None = None,
    device: int = 0,
) -> Liveness:
    """The graph-pool blocks each model capture holds across each eager break, and who writes over them.

    From the snapshot's capture windows (`Snapshot.captures`, written by
    `CaptureRecorder`): a capture's consecutive graphs are its segments, the
    gaps between them its eager breaks. A block of the capture's pool is held
    across a break when it was allocated in the capture before the break and
    not freed before the break began. Its `class`:

    - `released by the break`: freed from the break's start up to the next
      segment's first pool allocation (the forward dropped it as the break
      returned: a break argument the forward does not keep);
    - `break input`: any other block the break read (`break_reads`), which
      the forward passed into the break and kept bound. The real DeepSeek-V4.1
      forward does this with `residual`, `post_mix` and `res_mix`: they go into
      the break with the hidden states and stay bound until the forward
      returns, and nothing reads them after the break;
    - `held after the break`: any other, freed later or never: the model graph
      may read it after the break (an aux hidden state).

    The rule is the break's reads, not a guess from the trace: a trace shows
    when a block is allocated and freed, never who reads it, and a block the
    forward keeps bound looks the same whether it is read after the break
    (an early aux state) or not (a break input). `break_reads` maps
    `(model capture, break index)` to the byte ranges the break read
    (`kit.analysis.readwrite.break_reads`); by default they come from the
    snapshot's `kit["break_reads"]` (`kit.analysis.readwrite.attach_break_reads`).
    Without them no block is called a break input: every block held and not
    released counts as held after the break, which may flag a block nothing
    reads after the break (the safe side; `break_reads_known` says which).
    The rule assumes a break input is not read after the break as well; the
    read/write analysis checks that assumption (`kit.analysis.readwrite`).

    Replay captures (a manager named "... replay ...") are checked for
    allocations, inside their windows, over each block's bytes
    (`overlapping_replay`, `replay_overlaps` as (capture, trace index)). Any
    replay graph may run in any break (vLLM picks it by the step's replay
    rows); `replay_size_for(model capture size)` names the one that does, or
    the set that can (vLLM's rule: `kit.experiments.dispatch`), when known.
    With several breaks per model graph (V4.1 breaks at every attention),
    only those where the replay layers ran (`kit["replay_breaks"]`, written
    by `attach_break_reads`) are checked; without it every break is.
    `conflict`: a block held after the break that a replay graph that may run
    in the break writes over.
    """
    snap = load_snapshot(snapshot)
    captures = _captures(snap)
    inferred = any(gs[0].get("inferred") for gs in captures.values())
    lives = _lifetimes(snap, device)
    if break_reads is None and snap.kit.get("break_reads") is not None:
        break_reads = read_break_reads(snap.kit["break_reads"])
    reads = {key: Ranges(spans) for key, spans in (break_reads or {}).items()}
    # Which breaks the replay layers ran in, where the recording says (`attach_break_reads`); else every break.
    replay_breaks = None
    if snap.kit.get("replay_breaks") is not None:
        replay_breaks = {e["capture"]: {int(j) for j in e["breaks"]} for e in snap.kit["replay_breaks"]}

    def writes_over(gs: list[dict]) -> bool:
        # Inferred windows have no roles: any other capture into the pool may run in a break.
        return inferred or is_replay_capture(gs[0].get("manager", ""))

    replays = {
        name: [life for life in lives if life.pool == tuple(gs[0]["pool"]) and _in_windows(life.index, gs)]
        for name, gs in captures.items()
        if writes_over(gs)
    }
    rows = []
    models = [name for name, gs in captures.items() if (inferred or not writes_over(gs)) and len(gs) > 1]
    for name in models:
        others = {r: lives_ for r, lives_ in replays.items() if r != name}
        rows += _breaks_of(name, captures[name], captures, lives, others, replay_size_for, reads, replay_breaks)
    table = pd.DataFrame(rows, columns=LIVENESS_COLUMNS)
    source = snap.source_label + (", capture windows and eager breaks inferred from the trace" if inferred else "")
    table.attrs["source"] = source
    table.attrs["inferred"] = inferred
    known = break_reads is not None
    return Liveness(table, source, models, list(replays), paired=replay_size_for is not None, break_reads_known=known)


def _program_frame(frames: list) -> str:
    """The first frame of the program's own code (not torch's, nor the kit's recorders'), as `name (file:line)`."""
    mine = [f for f in frames or () if is_user_frame(f)]
    return frame_line(mine[:1]) if mine else first_user_frame(frames)


def _classify(held: list[_Life], next_first: int, read: Ranges | None) -> dict[int, str]:
    """Each held block's class: released by the break, a break input (the break read it), or held after it."""
    classes = {}
    for life in held:
        if life.free is not None and life.free < next_first:
            classes[id(life)] = RELEASED
        elif read is not None and read.intersects(life.addr, life.addr + life.size):
            classes[id(life)] = BREAK_INPUT
        else:
            classes[id(life)] = HELD
    return classes


def _breaks_of(name, graphs, captures, lives, replays, replay_size_for, reads, replay_breaks=None) -> list[dict]:
    pool = tuple(graphs[0]["pool"])
    mine = [life for life in lives if life.pool == pool and _in_windows(life.index, graphs)]
    size = graphs[0].get("size")
    running = set(replays)
    if replay_size_for is not None and size is not None:
        sizes = replay_size_for(size)
        sizes = set(sizes) if isinstance(sizes, set | frozenset | list | tuple) else {sizes}
        running = {r for r in replays if captures[r][0].get("size") in sizes}
    rows = []
    for j, (before, after) in enumerate(zip(graphs, graphs[1:], strict=False)):
        if replay_breaks is not None and j not in replay_breaks.get(name, ()):
            continue  # a break where the replay layers do not run (an attention break): no replay graph runs there
        begin, end = before["trace_end"], after["trace_begin"]
        firsts = [life.index for life in mine if after["trace_begin"] <= life.index < after["trace_end"]]
        next_first = min(firsts, default=after["trace_end"])
        held = [life for life in mine if life.index < begin and (life.free is None or life.free >= begin)]
        classes = _classify(held, next_first, reads.get((name, j)))
        for life in held:
            overlaps = [(r, other.index) for r, others in replays.items() for other in others if life.overlaps(other)]
            names = sorted({r for r, _ in overlaps}, key=list(replays).index)
            in_break = [r for r in names if r in running]
            rows.append(
                {
                    "capture": name,
                    "capture_size": size,
                    "break": j,
                    "break_begin": begin,
                    "break_end": end,
                    "addr": life.addr,
                    "bytes": life.size,
                    "alloc_index": life.index,
                    "free_index": life.free,
                    "class": classes[id(life)],
                    "alloc_frame": _program_frame(life.frames),
                    "free_frame": _program_frame(life.free_frames or []),
                    "overlapping_replay": names,
                    "replay_in_break": in_break,
                    "replay_overlaps": overlaps,
                    "conflict": classes[id(life)] == HELD and bool(in_break),
                }
            )
    return rows


def liveness_verdicts(liveness: Liveness | Snapshot | str | dict) -> list[str]:
    """One line per model capture: safe, or the conflict with the bytes and the replay graphs that overwrite them.

    Takes a `liveness_table` result or anything `liveness_table` takes.
    """
    found = liveness if isinstance(liveness, Liveness) else liveness_table(liveness)
    table = found.rows
    lines = []
    for name in found.model_captures:
        rows = table[table["capture"] == name]
        bad = rows[rows["conflict"]]
        if len(bad):
            writers = sorted({r for names in bad["replay_in_break"] for r in names})
            first = bad.iloc[0]
            lines.append(
                f"{name}: CONFLICT: {format_bytes(bad['bytes'].sum())} in {len(bad)} block(s) held after the break "
                f"(first at {first['addr']:#x}, allocated at {first['alloc_frame'] or '?'}) are written over by "
                f"{', '.join(writers)}, which {'runs' if found.paired else 'may run'} in the break"
                + ("" if found.break_reads_known else " (the breaks' reads unrecorded: held may include break inputs)")
            )
        else:
            lines.append(f"{name}: safe: {_safe_detail(rows)}")
    return lines


def _safe_detail(rows: pd.DataFrame) -> str:
    if rows.empty:
        return "no graph-pool block is held across its breaks"
    breaks = rows["break"].nunique()
    by_class = rows.groupby("class")["bytes"].sum()
    parts = ", ".join(f"{format_bytes(by_class[c])} {c}" for c in (RELEASED, BREAK_INPUT, HELD) if c in by_class)
    text = f"{format_bytes(rows['bytes'].sum())} held across {breaks} break{'s' if breaks > 1 else ''} ({parts})"
    reused = rows[rows["overlapping_replay"].map(bool)]
    if reused.empty:
        return text + "; no replay graph allocates over them"
    dead = reused[reused["class"] != HELD]
    if len(dead):
        text += f"; replay graphs reuse {format_bytes(dead['bytes'].sum())} that nothing reads after the break"
    held = reused[reused["class"] == HELD]
    if len(held):
        others = sorted({r for names in held["overlapping_replay"] for r in names})
        text += (
            f"; {format_bytes(held['bytes'].sum())} held after the break is reused only by "
            f"{', '.join(others)}, which {'does' if len(others) == 1 else 'do'} not run in this break"
        )
    return text


def break_allocations(snapshot: Snapshot | str | dict, *, device: int = 0) -> pd.DataFrame:
    """Per eager break of every recorded capture: what it allocated, and whether all of it landed outside the pool.

    The PR's argument needs the break's outputs outside the graph pool: a
    replay graph sharing the pool can then never write over them.
    `outside_pool` is true when no allocation in the break's window landed in
    the capture's pool and every one was mapped to a segment (`unmapped`: not).
    """
    snap = load_snapshot(snapshot)
    captures = _captures(snap)
    lives = _lifetimes(snap, device)
    rows = []
    for name, graphs in captures.items():
        pool = tuple(graphs[0]["pool"])
        for j, (before, after) in enumerate(zip(graphs, graphs[1:], strict=False)):
            begin, end = before["trace_end"], after["trace_begin"]
            inside = [life for life in lives if begin <= life.index < end]
            in_pool = [life for life in inside if life.pool == pool]
            unmapped = sum(life.pool is None for life in inside)
            rows.append(
                {
                    "capture": name,
                    "break": j,
                    "break_begin": begin,
                    "break_end": end,
                    "allocs": len(inside),
                    "bytes": sum(life.size for life in inside),
                    "pool_allocs": len(in_pool),
                    "pool_bytes": sum(life.size for life in in_pool),
                    "unmapped": unmapped,
                    "outside_pool": not in_pool and not unmapped,
                }
            )
    table = pd.DataFrame(rows, columns=BREAK_COLUMNS)
    table.attrs["source"] = snap.source_label
    return table


# --- alternative (a): what the target forward leaves for the step when the drafter runs ----------

READ_BEFORE = "read before the drafter"
READ_AFTER = "read after the drafter"
UNREAD = "not read by the step"
GRAPH_OUTPUT = "graph output, readers unknown"
DRAFTER_LIVENESS_COLUMNS = [
    "capture",
    "capture_size",
    "addr",
    "bytes",
    "alloc_index",
    "free_index",
    "class",
    "alloc_frame",
    "drafter",
    "drafter_size",
    "drafter_overlaps",
    "conflict",
]


def is_drafter_capture(manager: str) -> bool:
    """A speculator's capture, by its manager's name (the replica's `DFlashCudaGraphManager`: "DFlash speculator")."""
    return "speculator" in manager.lower() or "drafter" in manager.lower()


def target_captures(captures: Mapping[str, list[dict]]) -> list[str]:
    """The target model's captures a drafter may follow: every capture neither a replay nor a drafter capture.

    Whole graphs count as much as broken ones: a model graph below the trim
    threshold never breaks (one graph), yet its forward leaves outputs the
    drafter's graph may allocate over.
    """
    return [
        name
        for name, gs in captures.items()
        if not is_replay_capture(gs[0].get("manager", "")) and not is_drafter_capture(gs[0].get("manager", ""))
    ]


@dataclass
class DrafterLiveness:
    """What `drafter_liveness_table` found: one row per (model capture, output block, drafter capture)."""

    rows: pd.DataFrame
    source: str
    model_captures: list[str]
    drafter_captures: list[str]
    step_reads_known: bool

    def verdicts(self) -> list[str]:
        return drafter_liveness_verdicts(self)


def _forward_outputs(mine: list[_Life]) -> list[_Life]:
    """The blocks of a capture still allocated after its forward's last allocation: its outputs, and any temporary
    freed only as the forward returned (the trace cannot tell them apart; the step's reads can)."""
    last_alloc = max((life.index for life in mine), default=-1)
    return [life for life in mine if life.free is None or life.free > last_alloc]


def _output_class(life: _Life, reads: tuple[Ranges, Ranges] | None) -> str:
    if reads is None:
        return GRAPH_OUTPUT
    before, after = reads
    if after.intersects(life.addr, life.addr + life.size):
        return READ_AFTER
    return READ_BEFORE if before.intersects(life.addr, life.addr + life.size) else UNREAD


def drafter_liveness_table(
    snapshot: Snapshot | str | dict,
    *,
    step_reads: Mapping[str, tuple[Ranges, Ranges]] | None = None,
    device: int = 0,
) -> DrafterLiveness:
    """The graph-pool blocks each model capture leaves when its forward ends, and the drafter captures over them.

    The drafter (a speculator's graphs) runs after the target forward, in the
    same step. A model capture's outputs are among the blocks of its pool
    allocated in its windows and still allocated after the forward's last
    allocation: the forward returns them, and the capture then frees them as
    it keeps weak references (vLLM's wrappers do, inside the capture, so the
    trace shows them freed at its very end). A temporary freed only as the
    forward returned looks the same; the step's reads tell them apart. The
    capture's other blocks were freed inside the forward, and `capture_end`
    joins the capture's streams, so they are idle when the forward ends. Each
    output's `class`:

    - with `step_reads` (`capture -> (bytes the step read before the drafter,
      after it)`; by default the snapshot's `kit["step_reads"]`,
      `kit.analysis.readwrite.step_read_entries`): `read before the drafter`,
      `read after the drafter`, or `not read by the step`;
    - without them: `graph output, readers unknown`: a trace shows the block's
      allocation and its free, not that the sampler and `propose` read it
      before the drafter replays (the weak reference frees it at capture).

    `conflict`: an output a drafter capture allocates over (in its window, the
    same pool) that is read after the drafter, or whose readers are unknown.
    Every drafter capture is paired with every model capture (any drafter graph
    may follow any forward).
    """
    snap = load_snapshot(snapshot)
    captures = _captures(snap)
    lives = _lifetimes(snap, device)
    if step_reads is None and snap.kit.get("step_reads") is not None:
        step_reads = read_step_reads(snap.kit["step_reads"])
    drafters = {
        name: [life for life in lives if life.pool == tuple(gs[0]["pool"]) and _in_windows(life.index, gs)]
        for name, gs in captures.items()
        if is_drafter_capture(gs[0].get("manager", ""))
    }
    models = target_captures(captures)
    rows = []
    for name in models:
        graphs, pool = captures[name], tuple(captures[name][0]["pool"])
        outputs = _forward_outputs([life for life in lives if life.pool == pool and _in_windows(life.index, graphs)])
        reads = None if step_reads is None else step_reads.get(name, (Ranges(), Ranges()))
        for life in outputs:
            cls = _output_class(life, reads)
            for drafter, others in drafters.items():
                overlaps = any(life.overlaps(other) for other in others)
                rows.append(
                    {
                        "capture": name,
                        "capture_size": graphs[0].get("size"),
                        "addr": life.addr,
                        "bytes": life.size,
                        "alloc_index": life.index,
                        "free_index": life.free,
                        "class": cls,
                        "alloc_frame": _program_frame(life.frames),
                        "drafter": drafter,
                        "drafter_size": captures[drafter][0].get("size"),
                        "drafter_overlaps": overlaps,
                        "conflict": overlaps and cls in (READ_AFTER, GRAPH_OUTPUT),
                    }
                )
    table = pd.DataFrame(rows, columns=DRAFTER_LIVENESS_COLUMNS)
    table.attrs["source"] = snap.source_label
    return DrafterLiveness(table, snap.source_label, models, list(drafters), step_reads is not None)


def drafter_liveness_verdicts(found: DrafterLiveness) -> list[str]:
    """One line per model capture: safe, or the outputs a drafter capture writes over while they may still be read."""
    lines = []
    for name in found.model_captures:
        rows = found.rows[found.rows["capture"] == name]
        outputs = rows.drop_duplicates("addr")
        over = rows[rows["drafter_overlaps"]]
        bad = rows[rows["conflict"]]
        if len(bad):
            writers = sorted(set(bad["drafter"]))
            blocks = bad.drop_duplicates("addr")
            why = "read after the drafter" if found.step_reads_known else "whose readers the trace cannot show"
            lines.append(
                f"{name}: CONFLICT: {format_bytes(blocks['bytes'].sum())} of its outputs in {len(blocks)} block(s), "
                f"{why}, are written over by {', '.join(writers)}"
            )
        elif len(over):
            blocks = over.drop_duplicates("addr")
            lines.append(
                f"{name}: safe: the drafter's graphs allocate over {format_bytes(blocks['bytes'].sum())} of the "
                f"{format_bytes(outputs['bytes'].sum())} it leaves when its forward ends, none of it read after "
                "the drafter"
            )
        else:
            lines.append(
                f"{name}: safe: no drafter graph allocates over the {format_bytes(outputs['bytes'].sum())} it leaves "
                "when its forward ends"
            )
    return lines

"""Block reuse step by step: a recorded trace replayed on the simulator, one graph-pool allocation at a time.

Notebook 02 (root cause) is built on this. `StepThrough` turns the trace back
into a workload (`kit.analysis.whatif.trace_to_workload`), replays it on the
simulator with the recording's own segment addresses and `explain=True`, and
for each step gives the allocator state before and after it, the pool's free
blocks with the verdict on each (taken, or why it was refused), and a
sentence saying what happened. `mismatches()` checks the replay's final state
against the recording, segment by segment and block by block;
`mark_traces` outlines the blocks a step took or refused on a segment map.
`StepView` is the notebook's slider over the steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from kit.allocator.simulator import CachingAllocatorSim, Decision, recorded_segment_addresses
from kit.allocator.workload import DEFAULT, Op, parse_workload
from kit.analysis.names import GRAPH_POOL_LABEL
from kit.analysis.tables import pool_label, segment_table, stream_labels, style_table
from kit.analysis.whatif import layout_differences, trace_to_workload
from kit.load.snapshot import Snapshot, load_snapshot
from kit.markup import html_text
from kit.show.pictures import MARK_COLOURS, FigureWidget, figure_widget, segment_map_figure, segment_row
from kit.units import MIB, format_bytes

TAKEN = "taken"
FITS = "fits, not the best fit"  # the allocator takes the smallest fitting block, lowest address first
_RANK = {TAKEN: 0, "refused: other stream": 1}  # table order: the answer, then the root cause


@dataclass
class Step:
    """One allocation in the graph pool: its place in the step-through and the simulator's decision."""

    number: int  # 0-based position among the pool's allocations
    capture: str  # the graph being captured when it was made
    decision: Decision


class StepThrough:
    """A recorded trace replayed on the simulator, one graph-pool allocation at a time."""

    def __init__(self, snapshot: Snapshot | str | dict, pool_name: str = GRAPH_POOL_LABEL) -> None:
        self.recorded = load_snapshot(snapshot)
        self.name = Path(self.recorded.origin).name
        self.ops: list[Op] = parse_workload(trace_to_workload(self.recorded), self.name)
        self.addresses = recorded_segment_addresses(self.recorded.raw)
        self.pool_name = pool_name
        self.pool = tuple(self.recorded.kit["pools"][pool_name])
        sim = self._run(len(self.ops), explain=True)
        capture_of = _captures_by_op(self.ops)
        decisions = [d for d in sim.decisions if d.pool == self.pool]
        self.steps = [Step(i, capture_of[d.index], d) for i, d in enumerate(decisions)]
        self.final = self._snapshot(sim, f"trace of {self.name} replayed to the end")
        self._states: dict[int, Snapshot] = {}

    def _run(self, op_count: int, *, explain: bool = False) -> CachingAllocatorSim:
        # The trace holds the RNG-state allocations already, so the simulator must not add its own.
        sim = CachingAllocatorSim(addresses=self.addresses, explain=explain, rng_state=False)
        return sim.run(self.ops[:op_count])

    def _snapshot(self, sim: CachingAllocatorSim, origin: str) -> Snapshot:
        raw = sim.snapshot()
        # Unnamed, stream 0 reads "default stream", as in the recording's tables.
        raw["kit"]["streams"] = {k: v for k, v in raw["kit"]["streams"].items() if k != DEFAULT}
        return Snapshot(raw, origin=origin)

    def state(self, op_count: int) -> Snapshot:
        """The simulated allocator after the first `op_count` operations of the workload."""
        if op_count not in self._states:
            self._states[op_count] = self._snapshot(
                self._run(op_count), f"trace of {self.name} replayed to op {op_count} of {len(self.ops)}"
            )
        return self._states[op_count]

    def before(self, step: Step) -> Snapshot:
        return self.state(step.decision.index)

    def after(self, step: Step) -> Snapshot:
        return self.state(step.decision.index + 1)

    def first_step_on(self, stream: str) -> Step:
        """The first graph-pool allocation made on `stream`."""
        for step in self.steps:
            if step.decision.stream == stream:
                return step
        raise KeyError(f"no allocation in {self.pool_name} on {stream!r}")

    def free_blocks(self, step: Step) -> pd.DataFrame:
        """The free blocks of the request's pool just before it, each with the allocator's verdict."""
        d = step.decision
        refused = {address: reason for address, _, _, _, reason in d.refused}
        state = self.before(step)
        labels = stream_labels(state)
        rows = []
        for seg in state.segments:
            if seg.segment_pool_id != d.pool:
                continue
            for b in seg.blocks:
                if not b.is_free:
                    continue
                if d.outcome == "reused" and b.address == d.block:
                    verdict = TAKEN
                elif b.address in refused:
                    verdict = f"refused: {refused[b.address]}"
                else:
                    verdict = FITS
                rows.append((_RANK.get(verdict, 2), verdict, labels[seg.stream], b.address, seg.address, b.size))
        rows.sort()
        table = pd.DataFrame(
            [(v, stream, f"{a:#x}", f"{s:#x}", size) for _, v, stream, a, s, size in rows],
            columns=["verdict", "stream_label", "block", "segment", "free"],
        )
        table.attrs["source"] = state.source_label
        return table

    def describe(self, step: Step) -> str:
        """What the request asked for, what its pool offered, and what it got, in two sentences."""
        d = step.decision
        size_class = "small" if d.small else "large"
        ask = (
            f"Step {step.number + 1} of {len(self.steps)} ({step.capture} capture): {d.stream} asks for "
            f"{format_bytes(d.requested)} ({d.rounded:,} bytes rounded, {size_class} blocks) in the {self.pool_name}."
        )
        blocks = self.free_blocks(step)
        offered = blocks.groupby("verdict", sort=False)["free"].agg(["size", "sum"])
        parts = [f"{v}: {n} block{'s' * (n > 1)} ({format_bytes(total)})" for v, (n, total) in offered.iterrows()]
        free = "Free blocks of the pool: " + ("; ".join(parts) if parts else "none") + "."
        if d.outcome == "reused":
            rest = ", split: the rest stays free" if d.split else ""
            outcome = f"It takes the block at {d.block:#x}{rest}."
        else:
            outcome = (
                f"Nothing it may take fits: a new {format_bytes(d.segment_size)} segment at {d.block:#x} (cudaMalloc)."
            )
        return " ".join([ask, free, outcome])

    def marks(self, step: Step) -> list[dict[str, Any]]:
        """Blocks to outline on the pool's segment map after `step`: the one it took, those refused as other stream's.

        Each is `{"kind", "row", "base", "size"}` in the units and row labels of
        `kit.segment_map_figure` (MiB, "pool | segment address", the pool's label escaped as there).
        """
        d = step.decision
        wanted = {d.block: "taken by this request"}
        wanted.update(
            {a: "refused: other stream" for a, _, _, p, r in d.refused if r == "other stream" and p == d.pool}
        )
        state = self.after(step)
        out = []
        for seg in state.segments:
            for b in seg.blocks:
                if b.address in wanted:
                    out.append(
                        {
                            "kind": wanted[b.address],
                            "row": segment_row(pool_label(seg.segment_pool_id, state.pool_names), seg.address),
                            "base": (b.address - seg.address) / MIB,
                            "size": b.size / MIB,
                        }
                    )
        return out

    def mismatches(self) -> list[str]:
        """How the replay's final state differs from the recording; empty when they match block for block."""
        return layout_differences(self.final, self.recorded)


def _captures_by_op(ops: list[Op]) -> list[str]:
    """For each op, the graph being captured when it ran ("no capture" outside one)."""
    out, current = [], "no capture"
    for op in ops:
        if op.op == "capture_begin":
            current = op.graph
        out.append(current)
        if op.op == "capture_end":
            current = "no capture"
    return out


def pool_view(snapshot: Snapshot, pool: tuple[int, int]) -> Snapshot:
    """The snapshot with only `pool`'s segments (for a segment map of one pool)."""
    raw = dict(snapshot.raw)
    raw["segments"] = [s for s in snapshot.raw["segments"] if tuple(s["segment_pool_id"]) == tuple(pool)]
    return Snapshot(raw, origin=snapshot.origin, live=snapshot.live)


MARK_WIDTHS = {"taken by this request": 3, "refused: other stream": 2}  # outline px
MARK_STYLE = {kind: (MARK_COLOURS[kind], width) for kind, width in MARK_WIDTHS.items()}  # outline colour, width


def mark_traces(marks: list[dict[str, Any]]) -> list:
    """Outline bars for `StepThrough.marks`, one trace per kind (empty ones too, so a figure keeps its traces)."""
    traces = []
    for kind, (colour, width) in MARK_STYLE.items():
        mine = [m for m in marks if m["kind"] == kind]
        traces.append(
            go.Bar(
                orientation="h",
                name=kind,
                y=[m["row"] for m in mine],
                x=[m["size"] for m in mine],
                base=[m["base"] for m in mine],
                marker=dict(color="rgba(0,0,0,0)", line=dict(color=colour, width=width)),
                hoverinfo="skip",
            )
        )
    return traces


GROUP_COLUMNS = ["pool_label", "stream_label", "segments", "reserved", "allocated", "free", "largest_free"]


class StepView:
    """A slider over a `StepThrough`'s steps; for the step picked, what notebook 02 shows of it.

    The request in a sentence, its pool's free blocks just before it with the
    allocator's verdict on each, the segment-by-stream table just after it,
    and the pool's segment map with the block it took and the blocks it
    refused as another stream's outlined. `widget` is the view to display;
    `step` is its main control.
    """

    def __init__(self, steps: StepThrough, start: Step | None = None) -> None:
        self.steps = steps
        first = (start.number if start is not None else 0) + 1
        self.step = widgets.IntSlider(
            min=1,
            max=len(steps.steps),
            value=first,
            description="request",
            continuous_update=False,
            layout={"width": "90%"},  # a step every few pixels, not every two
        )
        self.step.add_class("kit-main-control")
        self.request, self.free_blocks, self.groups = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.segment_map: FigureWidget | None = None  # made by the first show()
        self.step.observe(self.show, names="value")
        self.show()

    @property
    def widget(self) -> widgets.VBox:
        return widgets.VBox([self.step, self.request, self.free_blocks, self.groups, self.segment_map])

    @property
    def current(self) -> Step:
        return self.steps.steps[self.step.value - 1]

    def show(self, change=None) -> None:
        steps, current = self.steps, self.current
        after = steps.after(current)
        self.request.value = f"<p>{html_text(steps.describe(current))}</p>"
        blocks = steps.free_blocks(current)
        self.free_blocks.value = "<b>Free blocks of its pool, before the request</b>" + (
            style_table(blocks).to_html() if len(blocks) else "<p>none: the pool has no free block</p>"
        )
        table = style_table(segment_table(after)[GROUP_COLUMNS]).to_html()
        self.groups.value = "<b>Segment-by-stream table, after it</b>" + table
        figure = segment_map_figure(pool_view(after, steps.pool))
        self.segment_map = figure_widget(self.segment_map, figure, mark_traces(steps.marks(current)))

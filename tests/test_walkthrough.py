"""The notebooks' helpers: the block-reuse step-through, the patch's diffs, the prediction table."""

from __future__ import annotations

import inspect

import pytest

import kit
import kit.patch.replica as replica_patch
from kit.analysis.trace.walk import walk_trace
from kit.analysis.whatif import layout_differences, prediction_table
from kit.replica import parallel_state
from kit.show.stepthrough import FITS, TAKEN, StepThrough, pool_view

from .helpers import FIXTURES, RECORDED

REPLICA = FIXTURES / "replica"
MAPPING = {"replay graphs stream": "model graphs stream"}


@pytest.fixture(scope="module")
def two_streams() -> StepThrough:
    return StepThrough(RECORDED["two_streams"])


def _group(table, pool, label) -> dict:
    rows = table[(table["pool"] == pool) & (table["stream_label"] == label)]
    return rows.iloc[0].to_dict() if len(rows) else {}


def test_steps_are_the_recorded_graph_pool_allocations(two_streams):
    walk = walk_trace(two_streams.recorded)
    in_pool = walk.allocs[walk.allocs["pool"].map(tuple) == two_streams.pool]
    assert len(two_streams.steps) == len(in_pool) > 0
    assert [s.number for s in two_streams.steps] == list(range(len(two_streams.steps)))
    assert {s.capture for s in two_streams.steps} == {"model graph", "replay graph"}
    assert [s.decision.requested for s in two_streams.steps] == list(in_pool["size"])


def test_final_state_matches_the_recording_block_for_block(two_streams):
    assert two_streams.mismatches() == []
    stepped = kit.segment_table(two_streams.state(len(two_streams.ops)))
    recorded = kit.segment_table(two_streams.recorded)
    figures = ["pool", "stream_label", "segments", "reserved", "allocated", "free", "largest_free"]
    assert stepped[figures].to_dict("records") == recorded[figures].to_dict("records")


def test_a_changed_layout_is_reported():
    recorded = kit.load_snapshot(RECORDED["two_streams"])
    raw = {**recorded.raw, "segments": recorded.raw["segments"][1:]}
    diffs = layout_differences(kit.Snapshot(raw, origin="one segment short"), recorded)
    assert len(diffs) == 1 and f"{recorded.segments[0].address:#x}" in diffs[0]


def test_first_replay_request_refuses_the_model_streams_free_blocks(two_streams):
    step = two_streams.first_step_on("replay graphs stream")
    assert step.capture == "replay graph"
    d = step.decision
    assert d.outcome == "new_segment" and d.segment_size > 0
    assert any(reason == "other stream" for *_, reason in d.refused)
    blocks = two_streams.free_blocks(step)
    other = blocks[blocks["verdict"] == "refused: other stream"]
    assert set(other["stream_label"]) == {"model graphs stream"}
    # Every free block of the model stream's group that fits the request is refused, none taken.
    before = kit.segment_table(two_streams.before(step))
    model = _group(before, two_streams.pool, "model graphs stream")
    assert model["largest_free"] >= d.rounded
    large = blocks[blocks["verdict"] != "refused: other size class"]
    assert other["free"].sum() == large[large["stream_label"] == "model graphs stream"]["free"].sum()
    assert TAKEN not in set(blocks["verdict"])
    # Before this request the replay stream has no group in the graph pool; after it, one new segment.
    assert not _group(before, two_streams.pool, "replay graphs stream")
    after = _group(kit.segment_table(two_streams.after(step)), two_streams.pool, "replay graphs stream")
    assert after["segments"] == 1 and after["reserved"] == d.segment_size
    text = two_streams.describe(step)
    assert "replay graphs stream" in text and "new" in text and "refused: other stream" in text


def test_every_step_takes_its_block_and_the_tables_agree(two_streams):
    for step in two_streams.steps:
        d = step.decision
        after = {b.address: b for s in two_streams.after(step).segments for b in s.blocks}
        assert after[d.block].state == "active_allocated" and after[d.block].requested_size == d.requested
        verdicts = two_streams.free_blocks(step)["verdict"]
        assert (verdicts == TAKEN).sum() == (d.outcome == "reused")
        if d.outcome == "new_segment":  # nothing fitting was left on its own stream
            assert FITS not in set(verdicts)


def test_on_one_stream_nothing_is_refused_for_its_stream():
    shared = StepThrough(RECORDED["shared_stream"])
    assert shared.mismatches() == []
    assert {s.decision.stream for s in shared.steps} == {"model graphs stream"}
    assert not any(r == "other stream" for s in shared.steps for *_, r in s.decision.refused)
    with pytest.raises(KeyError):
        shared.first_step_on("replay graphs stream")


def test_marks_land_on_rows_of_the_pool_segment_map(two_streams):
    step = two_streams.first_step_on("replay graphs stream")
    figure = kit.segment_map_figure(pool_view(two_streams.after(step), two_streams.pool))
    rows = set(figure.layout.yaxis.categoryarray)
    marks = two_streams.marks(step)
    assert {m["kind"] for m in marks} == {"taken by this request", "refused: other stream"}
    assert all(m["row"] in rows for m in marks)
    refused = sum(m["size"] for m in marks if m["kind"] == "refused: other stream") * 2**20
    blocks = two_streams.free_blocks(step)
    assert refused == blocks[blocks["verdict"] == "refused: other stream"]["free"].sum()


def test_pool_view_keeps_only_that_pool(two_streams):
    view = pool_view(two_streams.recorded, two_streams.pool)
    assert view.segments and all(s.segment_pool_id == two_streams.pool for s in view.segments)
    assert len(view.segments) < len(two_streams.recorded.segments)
    assert view.source_label == two_streams.recorded.source_label


@pytest.mark.parametrize("preset", ["small", "large"])
def test_prediction_table_sets_the_what_if_next_to_the_patched_run(preset):
    unpatched = kit.load_snapshot(REPLICA / f"{preset}_unpatched.pickle")
    patched = kit.load_snapshot(REPLICA / f"{preset}_patched.pickle")
    whatif = kit.what_if(unpatched, MAPPING)
    table = prediction_table(unpatched, patched, whatif).set_index("pool_label")
    pool = tuple(unpatched.kit["pools"]["global graph pool"])
    graph = table.loc["global graph pool"]
    before, after = kit.segment_table(unpatched), kit.segment_table(patched)
    assert graph["unpatched"] == before[before["pool"] == pool]["reserved"].sum()
    assert graph["patched"] == after[after["pool"] == pool]["reserved"].sum()
    assert graph["saved_predicted"] == whatif.saved[pool]
    # The prediction from the unpatched trace is the graph pool the patched run measured.
    assert graph["predicted"] == graph["patched"] and graph["predicted_minus_patched"] == 0
    replay_group = _group(before, pool, "replay graphs stream")
    assert graph["saved_measured"] == replay_group["reserved"] > 0
    assert "simulator" in table.attrs["source"] and "recorded" in table.attrs["source"]


def test_the_patch_shows_each_replaced_function_and_its_diff_and_reverts():
    patch = replica_patch.apply("pr")
    try:
        table = patch.table()
        names = {name for places in table["installed in"] for name in places.split(", ")}
        assert {t.rsplit(".", 1)[0] for t in patch.targets()} == names
        row = table[table["function"] == "kit.replica.parallel_state.graph_capture"].iloc[0]
        assert "kit.replica.cudagraph_utils" in row["installed in"]  # one original, imported by name twice
        diff = patch.diff()
        assert "-    context = GraphCaptureContext(torch.cuda.Stream(device=device))" in diff
        assert diff.count("\n--- ") + diff.startswith("---") == len(table) and "\n+" in diff
    finally:
        replica_patch.revert()
    assert not patch.applied and patch.diff() == diff  # the diff still reads after the revert
    assert "torch.cuda.Stream(device=device)" in inspect.getsource(parallel_state.graph_capture)


def test_show_in_redraws_the_same_widget_with_the_new_figure_and_extra_traces():
    import plotly.graph_objects as go

    from kit.show.pictures import group_bar_figure, segment_map_figure, show_in

    snap = kit.load_snapshot(FIXTURES / "two_streams.pickle")
    widget = go.FigureWidget(group_bar_figure(snap))
    same = widget
    fig = segment_map_figure(snap)
    show_in(widget, fig, [go.Scatter(x=[0], y=[0], name="mark")])
    assert widget is same
    assert [t.name for t in widget.data] == [*(t.name for t in fig.data), "mark"]
    assert widget.layout.title.text == fig.layout.title.text

"""The notebooks' views in kit/show: the liveness timeline, the safety views, the before/after view, the step view
and the snapshot explorer, each checked against the analysis it draws, on the shipped H200 recordings."""

from __future__ import annotations

import pickle

import pandas as pd
import pytest

import kit
from kit.analysis.liveness import HELD, RELEASED
from kit.experiments.scenarios import replica_runs
from kit.replica.model import replay_rows
from kit.show import explorer as explorer_module
from kit.show.before_after import SCENARIO_OF, BeforeAfterView, change_figure, replay_segment_bytes, saving_line
from kit.show.explorer import SHIPPED, SnapshotExplorer, load_path, load_upload, reuse_section, uploaded_file
from kit.show.safety import SafetyView, liveness_view, overview_table, scenario_for
from kit.show.stepthrough import StepThrough, StepView
from kit.show.timeline import BREAK_COLOUR, MARKS, REPLAY_COLOUR, break_bands, timeline_figure

from .conftest import FIXTURES, RECORDED

ROOT = FIXTURES.parents[1]
KIT_RECORDINGS = ("shared_stream", "small_unpatched", "small_patched")  # the kit's own recordings in the explorer


def shipped_path(name: str):
    return FIXTURES / SHIPPED[name]


@pytest.fixture(scope="module")
def runs() -> dict[str, kit.Snapshot]:
    return replica_runs("small", source="recorded")


def _paired(snapshot: kit.Snapshot) -> kit.Liveness:
    return kit.liveness_table(snapshot, replay_size_for=replay_rows)


# --- kit.show.timeline ------------------------------------------------------------------------------


def test_timeline_bars_run_from_each_held_blocks_allocation_to_its_free(runs):
    snap = runs["early_aux_shared"]
    liveness = _paired(snap)
    fig = timeline_figure(snap, liveness, "title", source="the source")
    rows = liveness.rows
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    assert {RELEASED, HELD} <= set(bars)
    assert sum(len(t.y) for t in bars.values()) == len(rows) == len(fig.layout.yaxis.categoryarray)
    for cls, bar in bars.items():
        mine = rows[rows["class"] == cls]
        frees = mine["free_index"].fillna(len(snap.trace)).astype(int)
        assert list(bar.base) == list(mine["alloc_index"])
        assert [b + x for b, x in zip(bar.base, bar.x, strict=True)] == list(frees)
        assert all(y.startswith(f"{size}: ") for y, size in zip(bar.y, mine["capture_size"], strict=True))
    assert "title" in fig.layout.title.text and "source: the source" in fig.layout.title.text


def test_timeline_marks_split_replay_allocations_by_whether_their_graph_runs_in_the_break(runs):
    snap = runs["early_aux_shared"]
    liveness = _paired(snap)
    fig = timeline_figure(snap, liveness, "t")
    marks = {t.name: t for t in fig.data if t.type == "scatter"}
    in_break, elsewhere = marks[MARKS[True][0]], marks[MARKS[False][0]]
    rows = liveness.rows
    pairs = zip(rows["replay_overlaps"], rows["replay_in_break"], strict=True)
    expected_in = sum(replay in names for overlaps, names in pairs for replay, _ in overlaps)
    assert len(in_break.x) == expected_in > 0
    assert len(in_break.x) + len(elsewhere.x) == sum(len(o) for o in rows["replay_overlaps"])
    # The conflict block (model graph 256's aux hidden state) carries a cross.
    conflict = rows[rows["conflict"]].iloc[0]
    assert f"{conflict['capture_size']}: {conflict['addr']:#x}" in {y.split(" (")[0] for y in in_break.y}
    # On separate streams no replay graph allocates over a held block: no marks at all.
    unpatched = runs["unpatched"]
    quiet = timeline_figure(unpatched, _paired(unpatched), "t")
    assert all(len(t.x) == 0 for t in quiet.data if t.type == "scatter")


def test_break_bands_shade_each_eager_break_and_each_replay_capture(runs):
    snap = runs["patched"]
    bands = break_bands(snap)
    grey = [(b["x0"], b["x1"]) for b in bands if b["fillcolor"] == BREAK_COLOUR]
    orange = [(b["x0"], b["x1"]) for b in bands if b["fillcolor"] == REPLAY_COLOUR]
    breaks = kit.break_allocations(snap)
    assert grey == list(zip(breaks["break_begin"], breaks["break_end"], strict=True)) and grey
    replay = [w for w in snap.captures if "replay" in w["manager"]]
    assert orange == [(w["trace_begin"], w["trace_end"]) for w in replay] and orange
    assert all(x0 < x1 for x0, x1 in grey + orange)


# --- kit.show.safety ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy, early_aux, expected",
    [
        ("pr", False, ("patched", True)),
        ("pr", True, ("early_aux_pr", False)),
        ("share", False, ("patched", True)),
        ("share", True, ("early_aux_shared", True)),
        ("separate", False, ("unpatched", False)),
        ("separate", True, ("early_aux_pr", False)),
    ],
)
def test_scenario_for_follows_the_prs_rule(policy, early_aux, expected):
    assert scenario_for(policy, early_aux) == expected


def test_overview_table_reads_each_scenarios_three_checks(runs):
    table = overview_table(runs).set_index("scenario")
    assert list(table.index) == list(runs)
    assert table.loc["early_aux_shared", "graphs vs eager"].startswith("differ")
    assert table.loc["early_aux_shared", "of it under a replay graph"] != "0 B"
    for name in ("unpatched", "patched", "early_aux_pr"):
        assert table.loc[name, "graphs vs eager"] == "bit-exact"
        assert table.loc[name, "of it under a replay graph"] == "0 B"
    assert table["breaks allocate outside the pool"].all()
    assert table.loc["patched", "replay graphs on"] == "model graphs stream"
    assert table.loc["unpatched", "replay graphs on"] == "replay graphs stream"
    assert table.attrs["source"] == runs["patched"].source_label


def test_a_run_captured_just_now_in_another_process_names_its_gpu_and_run(runs):
    raw = runs["patched"].raw
    live = kit.Snapshot(raw, origin="small patched, captured just now", live=True)
    assert live.source_label == f"live GPU ({raw['kit']['provenance']['gpu']}: small patched, captured just now)"
    assert kit.Snapshot(raw, origin="capture recorder", live=True).source_label == "live GPU (this process's allocator)"


def test_liveness_view_formats_addresses_bytes_and_replay_names(runs):
    liveness = _paired(runs["early_aux_shared"])
    page = liveness_view(liveness).to_html()
    first = liveness.rows.iloc[0]
    assert f"{first['addr']:#x}" in page and kit.format_bytes(first["bytes"]) in page
    assert "replay graphs 256, replay graphs 128, replay graphs 64" in page
    assert liveness.source in page


def test_safety_view_shows_the_capture_the_rule_picks_and_redraws_in_place(runs):
    view = SafetyView(runs, replay_size_for=replay_rows)
    widget = view.timeline
    assert (view.policy.value, view.early_aux.value, view.scenario) == ("pr", True, "early_aux_pr")
    assert "keep a stream of their own" in view.status.value and "CONFLICT" not in view.status.value
    view.policy.value = "share"  # observed: the view updates
    assert view.scenario == "early_aux_shared" and view.timeline is widget
    assert "CONFLICT" in view.status.value and "graphs differ from eager" in view.status.value
    assert "policy share, early aux True" in widget.layout.title.text
    expected = timeline_figure(runs["early_aux_shared"], _paired(runs["early_aux_shared"]), "t")
    assert [len(t.x) for t in widget.data] == [len(t.x) for t in expected.data]
    view.early_aux.value = False
    assert view.scenario == "patched" and "share the model graphs' stream" in view.status.value
    assert "kit-main-control" in view.policy._dom_classes


# --- kit.show.before_after ---------------------------------------------------------------------------


def test_before_after_view_says_what_the_graph_pool_saved():
    presets = ("small", "large")
    runs = {
        (preset, name): snap
        for preset in presets
        for name, snap in replica_runs(preset, tuple(SCENARIO_OF.values()), source="recorded").items()
    }
    view = BeforeAfterView(runs, presets)
    assert "kit-main-control" in view.preset._dom_classes and not hasattr(view, "policy")
    for preset in presets:
        view.preset.value = preset
        unpatched, patched = runs[preset, "unpatched"], runs[preset, "patched"]
        before, after = kit.segment_table(unpatched), kit.segment_table(patched)
        change = kit.diff_tables(before, after, by="label")
        pool = tuple(unpatched.kit["pools"]["global graph pool"])
        saved = before[before["pool"] == pool]["reserved"].sum() - after[after["pool"] == pool]["reserved"].sum()
        assert saved > 0 and f"saved ({saved:,} bytes)" in saving_line(change)
        assert saving_line(change) in view.change_html.value
        assert "replica, unpatched" in view.before_html.value and "replica, patched" in view.after_html.value
        assert "vLLM 0.33 (unpatched)" not in view.before_html.value  # the runs are the replica's, not vLLM's
        # Under the patch the replay captures add no graph-pool segment; unpatched they add what the patch saves.
        assert replay_segment_bytes(patched) == 0 and replay_segment_bytes(unpatched) == saved
        assert "patched: the replay captures added 0 B (0 bytes)" in view.change_html.value
        assert view.bars.layout.title.text == change_figure(change, "unpatched", "patched").layout.title.text
        drawn = {name for trace in view.bars.data for name in trace.y[1]}
        assert drawn == {"unpatched", "patched"}


def test_change_figure_draws_both_sides_of_every_group():
    before = kit.segment_table(RECORDED["two_streams"])
    change = kit.diff_tables(before, kit.segment_table(RECORDED["shared_stream"]), by="label")
    figure = change_figure(change, "two streams", "one stream")
    totals: dict[tuple[str, str], float] = {}
    for trace in figure.data:
        for group, run, mib in zip(trace.y[0], trace.y[1], trace.x, strict=True):
            totals[group, run] = totals.get((group, run), 0) + mib
    for row in change.itertuples():
        group = f"{row.pool_label} / {row.stream_label}"
        assert totals[group, "two streams"] * 2**20 == pytest.approx(row.reserved_before)
        assert totals[group, "one stream"] * 2**20 == pytest.approx(row.reserved_after)
    assert "source: before:" in figure.layout.title.text


# --- kit.show.stepthrough.StepView -------------------------------------------------------------------


def test_step_view_starts_where_asked_and_follows_its_slider():
    steps = StepThrough(RECORDED["two_streams"])
    first_replay = steps.first_step_on("replay graphs stream")
    view = StepView(steps, start=first_replay)
    assert view.current is first_replay and view.step.value == first_replay.number + 1
    assert "replay graphs stream" in view.request.value and "refused: other stream" in view.free_blocks.value
    names = [t.name for t in view.segment_map.data]
    assert names[-2:] == ["taken by this request", "refused: other stream"]
    outlined = {t.name: len(t.y) for t in view.segment_map.data[-2:]}
    assert outlined == {m: sum(k["kind"] == m for k in steps.marks(first_replay)) for m in outlined}
    view.step.value = 1
    assert view.current is steps.steps[0] and "model graphs stream" in view.request.value
    assert "none: the pool has no free block" in view.free_blocks.value


# --- kit.show.explorer -------------------------------------------------------------------------------


def test_load_upload_reads_bytes_like_a_file_and_refuses_a_hostile_pickle(capsys):
    path = RECORDED["two_streams"]
    uploaded = load_upload(path.read_bytes(), "/somewhere/two_streams.pickle")
    assert uploaded.origin == "upload two_streams.pickle"
    pd.testing.assert_frame_equal(kit.segment_table(uploaded), kit.segment_table(kit.load_snapshot(path)))
    with pytest.raises(kit.KitError, match=r"^upload hostile\.pickle: "):
        load_upload(b"cbuiltins\nprint\n(S'this never runs'\ntR.", "hostile.pickle")
    assert "this never runs" not in capsys.readouterr().out


def test_load_path_reads_relative_paths_from_the_root(tmp_path):
    assert load_path("  two_streams.pickle ", FIXTURES).origin == str(RECORDED["two_streams"])
    assert load_path(str(RECORDED["two_streams"]), tmp_path).origin == str(RECORDED["two_streams"])
    with pytest.raises(kit.KitError, match="no_such_snapshot.pickle"):
        load_path("no_such_snapshot.pickle", tmp_path)


def test_reuse_section_gives_the_verdicts_or_says_why_there_are_none(runs):
    table, verdicts = reuse_section(kit.load_snapshot(RECORDED["two_streams"]))
    graph_pool = (
        "global graph pool, replay graphs stream: 42.00 MiB of new segments were made while a fitting free block "
        "sat on model graphs stream at that moment"
    )
    assert "<table" in table and graph_pool in verdicts
    _, verdicts = reuse_section(kit.load_snapshot(RECORDED["shared_stream"]))
    assert "global graph pool" not in verdicts and "no eager breaks in the recorded captures" in verdicts
    _, verdicts = reuse_section(kit.load_snapshot(FIXTURES / "corpus" / "pr_shared_stream.pickle"))
    assert "no stranded segments" in verdicts
    _, verdicts = reuse_section(runs["patched"])  # capture windows: the liveness verdicts too
    assert verdicts.count("safe:") == 3
    no_trace = {**kit.load_snapshot(RECORDED["two_streams"]).raw, "device_traces": [[]]}
    table, verdicts = reuse_section(kit.Snapshot(no_trace, origin="no history"))
    assert table.startswith("<p><i>reuse table: no history: no trace recorded") and verdicts == ""


def test_uploaded_file_reads_both_ipywidgets_value_shapes():
    assert uploaded_file(()) is None and uploaded_file({}) is None
    assert uploaded_file(({"name": "a.pickle", "content": memoryview(b"ab")},)) == (b"ab", "a.pickle")
    assert uploaded_file({"x": {"metadata": {"name": "b.json"}, "content": b"{}"}}) == (b"{}", "b.json")


def test_snapshot_explorer_loads_each_choice_and_says_what_is_wrong_in_one_line(tmp_path):
    explorer = SnapshotExplorer(ROOT, "kit/recordings/two_streams.pickle")
    plain = ("two_captures_shared", "two_captures_separate", "record_stream_separate", "record_stream_shared")
    assert explorer.main.options == ("path", *plain, "compile_reduce_overhead", *KIT_RECORDINGS)
    assert explorer.first.origin == str(ROOT / "kit/recordings/two_streams.pickle")
    assert "data source: recorded: recorded on NVIDIA H200" in explorer.status.value
    bars = explorer.figures[kit.group_bar_figure]
    explorer.main.value = "small_patched"  # observed: loads the shipped recording, and names it in the path box
    assert explorer.path_box.value == "kit/recordings/replica/small_patched.pickle"
    assert "small_patched.pickle" in explorer.status.value and "safe:" in explorer.verdicts_html.value
    assert "small_patched.pickle" in bars.layout.title.text
    explorer.path_box.value = "kit/recordings/no_such.pickle"
    explorer.on_load()  # the Load button: switches to the path, which fails in one line
    assert explorer.main.value == "path" and explorer.status.value.startswith("<b>kit: error:</b>")
    assert "small_patched.pickle" in bars.layout.title.text  # the last good snapshot stays shown
    good = tmp_path / "mine.pickle"
    good.write_bytes(pickle.dumps(kit.load_snapshot(RECORDED["shared_stream"]).raw))
    explorer.show_or_say(lambda: load_upload(good.read_bytes(), "mine.pickle"))
    assert "upload mine.pickle" in explorer.status.value and "global graph pool" not in explorer.verdicts_html.value
    assert "upload mine.pickle" in bars.layout.title.text


# --- the explorer on a plain snapshot: labels, check, attribution, the what-if panel -----------------------

MiB = 1 << 20
PLAIN = "kit/recordings/plain/two_captures_separate.pickle"
FIRST = "stream of capture_first (two_captures.py:44)"
SECOND = "stream of capture_second (two_captures.py:61)"


def _graph_pool(table: pd.DataFrame) -> pd.DataFrame:
    return table[[p == (0, 1) for p in table["pool"]]]


def test_explorer_whatif_panel_predicts_the_shared_stream_pool_by_default_and_again_on_each_dropdown():
    explorer = SnapshotExplorer(ROOT, PLAIN)
    assert explorer.whatif_from.options == explorer.whatif_to.options == (FIRST, "default stream", SECOND)
    # Default: the second stream that allocated in a graph pool onto the first.
    assert (explorer.whatif_from.value, explorer.whatif_to.value) == (SECOND, FIRST)
    html = explorer.whatif_html.value
    assert "graph pool 1 (0, 1): 56.00 MiB reserved as recorded, 34.00 MiB predicted (saves 22.00 MiB)" in html
    assert "source: simulator (what-if on the trace of recorded snapshot" in html and "two_captures_separate" in html
    assert explorer.whatif.saved[(0, 1)] == 22 * MiB and explorer.whatif.stream_map == {404756496: 357844048}
    predicted = _graph_pool(explorer.whatif.predicted)
    assert predicted["stream_label"].tolist() == [FIRST] and predicted["reserved"].sum() == 34 * MiB
    shared = _graph_pool(kit.segment_table(kit.load_snapshot(shipped_path("two_captures_shared"))))
    assert shared["reserved"].sum() == 34 * MiB  # what the shared-stream run measured
    explorer.whatif_to.value = SECOND  # observed: the identity map, which must reproduce the recording
    html = explorer.whatif_html.value
    assert "identity map" in html and "56.00 MiB reserved as recorded, 56.00 MiB predicted (no change)" in html
    assert explorer.whatif.saved[(0, 1)] == 0 and "correction" not in html
    explorer.whatif_from.value = FIRST  # the other way round: the first capture's stream onto the second's
    assert "56.00 MiB reserved as recorded, 34.00 MiB predicted (saves 22.00 MiB)" in explorer.whatif_html.value
    assert _graph_pool(explorer.whatif.predicted)["stream_label"].tolist() == [SECOND]


def test_explorer_predicts_once_per_snapshot_and_resets_the_pair_for_each(monkeypatch):
    explorer = SnapshotExplorer(ROOT, PLAIN, live=True)
    assert explorer.main.options[:2] == ("live", "path") and explorer.main.value == "path"  # live only on request
    calls = []
    monkeypatch.setattr(explorer_module, "what_if", lambda snap, m: calls.append(m) or kit.what_if(snap, m))
    explorer.main.value = "two_captures_shared"  # one stream in the graph pool: the identity map
    assert calls == [{FIRST: FIRST}]
    assert (explorer.whatif_from.value, explorer.whatif_to.value) == (FIRST, FIRST)
    assert explorer.whatif_from.options == (FIRST, "default stream")
    assert "34.00 MiB reserved as recorded, 34.00 MiB predicted (no change)" in explorer.whatif_html.value
    explorer.main.value = "record_stream_separate"
    assert calls[1:] == [{"stream of forward (record_stream.py:48) #2": "stream of forward (record_stream.py:48)"}]
    assert "64.00 MiB reserved as recorded, 42.00 MiB predicted (saves 22.00 MiB)" in explorer.whatif_html.value


def test_explorer_check_line_and_capture_attribution_say_what_they_read():
    explorer = SnapshotExplorer(ROOT, PLAIN)
    check = explorer.check_html.value
    assert "<code>python -m kit check</code> exits 1" in check and "failed: 1 group(s)" in check
    assert f"graph pool 1 (0, 1), {SECOND} (stream 404756496): 22.00 MiB stranded (23068672 bytes)" in check
    attribution = explorer.attribution_html.value
    assert "capture windows inferred from the trace" in attribution
    assert "source: recorded snapshot" in attribution and "34.00 MiB" in attribution and "22.00 MiB" in attribution
    explorer.main.value = "two_captures_shared"
    assert "exits 0" in explorer.check_html.value and "ok: no graph pool stranded" in explorer.check_html.value
    explorer.main.value = "small_patched"  # the kit's recorder wrote its capture windows
    assert "as the capture recorder wrote them" in explorer.attribution_html.value
    no_trace = {**kit.load_snapshot(RECORDED["two_streams"]).raw, "device_traces": [[]]}
    explorer.show(kit.Snapshot(no_trace, origin="no history"))  # every section says why, in one line
    assert "`check` needs a trace" in explorer.check_html.value
    assert "no trace recorded" in explorer.whatif_html.value and "no trace recorded" in explorer.attribution_html.value
    assert explorer.whatif is None
    # Without a trace the pair still follows the graph pool's streams (by id): replay onto model graphs.
    assert (explorer.whatif_from.value, explorer.whatif_to.value) == ("replay graphs stream", "model graphs stream")

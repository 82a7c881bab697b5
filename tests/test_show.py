"""The notebooks' views in kit/show: the liveness timeline, the safety views, the before/after view, the step view
and the snapshot explorer, each checked against the analysis it draws, on the shipped H200 recordings."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from datetime import datetime

import pandas as pd
import pytest

import kit
from kit.analysis.liveness import BREAK_INPUT, HELD, RELEASED, Liveness, break_allocations
from kit.experiments.alternatives.result import load_graphs_vs_eager
from kit.experiments.alternatives.run import SHARE_ALL
from kit.experiments.dispatch import dispatch_replay_size
from kit.experiments.scenarios import replica_runs
from kit.markup import html_text
from kit.replica.model import PRESETS, replay_rows
from kit.show import explorer as explorer_module
from kit.show.alternatives import (
    DIMMED,
    AlternativesView,
    cap_line,
    checks_table,
    deepseek_table,
    estimate_table,
    extra_diff,
    kv_line,
    pool_figure,
    scenario_table,
)
from kit.show.alternatives import saving_line as scenario_saving_line
from kit.show.before_after import SCENARIO_OF, BeforeAfterView, change_figure, replay_segment_bytes, saving_line
from kit.show.explorer import SHIPPED, SnapshotExplorer, load_path, load_upload, reuse_section, uploaded_file
from kit.show.safety import (
    CHECKS,
    SafetyRecords,
    SafetyView,
    agreement_lines,
    agreement_table,
    attributable,
    bound_break_inputs,
    disagreement_lines,
    liveness_view,
    load_safety,
    overview_table,
    pair_list,
    pairings_table,
    scenario_for,
)
from kit.show.stepthrough import StepThrough, StepView
from kit.show.timeline import (
    AUX_HIDDEN_STATE,
    BREAK_COLOUR,
    BREAK_INPUT_BOUND,
    BREAK_INPUT_RELEASED,
    HELD_AFTER,
    MARKS,
    REPLAY_ACTIVATION,
    REPLAY_COLOUR,
    REPLAY_OUTPUT,
    block_labels,
    block_role,
    block_roles,
    break_bands,
    capture_ticks,
    replay_allocations,
    timeline_figure,
)

from .helpers import FIXTURES, MIB, RECORDED
from .hostile import (
    EXPLORER_HTML,
    GPU,
    MODULE_LABEL,
    POOL_NAME,
    SCRIPT_LABEL,
    SCRIPT_NAME,
    figure_texts,
    hostile_snapshot,
    raw_markup,
)

ROOT = FIXTURES.parents[1]
KIT_RECORDINGS = ("shared_stream", "small_unpatched", "small_patched")  # the kit's own recordings in the explorer


def shipped_path(name: str):
    return FIXTURES / SHIPPED[name]


@pytest.fixture(scope="module")
def runs() -> dict[str, kit.Snapshot]:
    return replica_runs("small", source="recorded")


def replay_graph_of(num_tokens: int) -> int | None:
    """The replay graph the replica's default step of `num_tokens` runs: its N/2 rows padded to vLLM's sizes."""
    return dispatch_replay_size(replay_rows(num_tokens), PRESETS["small"].decoder_replay_cudagraph_capture_sizes)


def _paired(snapshot: kit.Snapshot) -> Liveness:
    return kit.liveness_table(snapshot, replay_size_for=replay_graph_of)


# --- kit.show.timeline ------------------------------------------------------------------------------


def test_timeline_rows_are_roles_and_bars_run_from_each_blocks_allocation_to_its_free(runs):
    snap = runs["early_aux_shared_flat"]
    liveness = _paired(snap)
    fig = timeline_figure(snap, liveness, "title", source="the source")
    rows, roles = liveness.rows, block_roles(liveness)
    held = [t for t in fig.data if t.type == "bar" and not t.name.startswith("replay")]
    assert {t.name for t in held} == {BREAK_INPUT_RELEASED, AUX_HIDDEN_STATE}  # one of each per model graph
    assert sum(len(t.y) for t in held) == len(rows) == 6
    for bar in held:
        mine = rows[[role == bar.name for role in roles]]
        frees = mine["free_index"].fillna(len(snap.trace)).astype(int)
        assert list(bar.base) == list(mine["alloc_index"])
        assert [b + x for b, x in zip(bar.base, bar.x, strict=True)] == list(frees)
        assert list(bar.y) == [f"model graph {size}: {bar.name}" for size in mine["capture_size"]]
    # the aux hidden state is the block held after the break; the break input the one the break released
    assert {(cls, role) for cls, role in zip(rows["class"], roles, strict=True)} == {
        (HELD, AUX_HIDDEN_STATE),
        (RELEASED, BREAK_INPUT_RELEASED),
    }
    labels = list(fig.layout.yaxis.categoryarray)
    assert len(labels) == len(set(labels)) and not any("0x" in label for label in labels)
    assert "title" in fig.layout.title.text and "source: the source" in fig.layout.title.text
    # the hover names the frames that made each block, not one frame for all
    hovers = [h for t in held for h in t.hovertext]
    assert all("_run_layers (model.py:" in h for h in hovers) and len({h.split("freed at ")[1] for h in hovers}) > 1


def test_replay_allocations_are_each_replay_allocation_over_a_held_block_once_with_its_free(runs):
    snap = runs["early_aux_shared_flat"]
    liveness = _paired(snap)
    replays = replay_allocations(snap, liveness)
    overlapping = {index for overlaps in liveness.rows["replay_overlaps"] for _, index in overlaps}
    assert sorted(r["alloc_index"] for r in replays) == sorted(overlapping)
    trace = snap.traces[0]
    for r in replays:
        alloc, free = trace[r["alloc_index"]], trace[r["free_index"]]
        assert free.addr == alloc.addr and free.action.startswith("free") and r["bytes"] == alloc.size
        between = trace[r["alloc_index"] + 1 : r["free_index"]]
        assert not any(e.addr == alloc.addr and e.action.startswith("free") for e in between)  # its first free
        # an output is freed by the capture code that called the replay layers; an activation inside them
        assert (r["role"] == REPLAY_OUTPUT) == r["free_frame"].startswith("_capture (breakable_cudagraph.py")
    assert {r["role"] for r in replays} == {REPLAY_OUTPUT, REPLAY_ACTIVATION}
    fig = timeline_figure(snap, liveness, "t")
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    assert sum(len(bars[role].y) for role in (REPLAY_OUTPUT, REPLAY_ACTIVATION)) == len(replays)
    labels = fig.layout.yaxis.categoryarray
    assert any(label.startswith("replay graph ") and label.endswith(": output") for label in labels)


@pytest.mark.parametrize(
    "cls, alloc, free, role",
    [
        (RELEASED, "forward (model.py:1)", "forward (model.py:2)", BREAK_INPUT_RELEASED),
        (BREAK_INPUT, "forward (model.py:1)", "forward (model.py:2)", BREAK_INPUT_BOUND),
        (HELD, "forward (model.py:1)", "_capture (breakable_cudagraph.py:3)", AUX_HIDDEN_STATE),
        (HELD, "forward (model.py:1)", "", AUX_HIDDEN_STATE),  # never freed: it outlived the forward
        (HELD, "forward (model.py:1)", "forward (model.py:9)", HELD_AFTER),  # dropped by the forward itself
    ],
)
def test_block_role_from_class_and_where_the_block_was_freed(cls, alloc, free, role):
    assert block_role(cls, alloc, free) == role


def test_timeline_of_several_break_inputs_names_each_kept_bound_input_once():
    from .helpers import KIB
    from .test_liveness import A, B, D, Trace, _kept_bound_capture, _replay_capture

    t = Trace()
    _kept_bound_capture(t)
    _replay_capture(t, 32, [(B, 64 * KIB)])
    snap = kit.load_snapshot(t.snapshot())
    reads = {("model graphs 64", 0): [(B, B + 64 * KIB), (D, D + 64 * KIB)]}
    liveness = kit.liveness_table(snap, break_reads=reads)
    labels = block_labels(liveness)
    by_addr = dict(zip(liveness.rows["addr"], labels, strict=True))
    assert by_addr[B] == f"model graph 64: {BREAK_INPUT_BOUND}"
    assert by_addr[D] == f"model graph 64: {BREAK_INPUT_BOUND} (2)"  # repeats numbered, not merged
    assert by_addr[A] == f"model graph 64: {HELD_AFTER}"  # freed in the forward's own file here
    fig = timeline_figure(snap, liveness, "t")
    assert list(fig.layout.yaxis.categoryarray) == [*labels, "replay graph 32: activation"]


def test_timeline_marks_split_replay_allocations_by_whether_their_graph_runs_in_the_break(runs):
    snap = runs["early_aux_shared_flat"]
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
    assert f"model graph {conflict['capture_size']}: {AUX_HIDDEN_STATE}" in set(in_break.y)
    # On separate streams no replay graph allocates over a held block: no marks, no replay rows.
    unpatched = runs["unpatched"]
    quiet = timeline_figure(unpatched, _paired(unpatched), "t")
    assert all(len(t.x) == 0 for t in quiet.data if t.type == "scatter")
    assert not any(label.startswith("replay") for label in quiet.layout.yaxis.categoryarray)


def test_break_bands_shade_each_eager_break_and_each_replay_capture(runs):
    snap = runs["patched"]
    bands = break_bands(snap)
    grey = [(b["x0"], b["x1"]) for b in bands if b["fillcolor"] == BREAK_COLOUR]
    orange = [(b["x0"], b["x1"]) for b in bands if b["fillcolor"] == REPLAY_COLOUR]
    breaks = break_allocations(snap)
    assert grey == list(zip(breaks["break_begin"], breaks["break_end"], strict=True)) and grey
    replay = [w for w in snap.captures if "replay" in w["manager"]]
    assert orange == [(w["trace_begin"], w["trace_end"]) for w in replay] and orange
    assert all(x0 < x1 for x0, x1 in grey + orange)


def test_capture_ticks_name_each_capture_inside_its_windows(runs):
    snap = runs["patched"]
    values, texts = capture_ticks(snap)
    windows = {}
    for w in snap.captures:
        windows.setdefault(w["capture"], []).append(w)
    assert len(values) == len(texts) == len(windows) == 3 + 6  # three model graphs, six replay graphs
    for value, ws in zip(values, windows.values(), strict=True):
        assert ws[0]["trace_begin"] < value < ws[-1]["trace_end"]
    assert texts[0] == "model graph<br>512" and texts[-1] == "replay graph<br>96"


# --- kit.show.safety ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def safety() -> SafetyRecords:
    return load_safety("small", "recorded")


def test_load_safety_reads_both_h200_recordings_with_their_sources(safety):
    assert safety.pairs.attrs["source"].startswith("recorded on NVIDIA H")
    assert safety.readwrite["source"].startswith("recorded on NVIDIA H")
    assert safety.readwrite["source"].endswith("(kit/recordings/readwrite/small.json)")
    checks = safety.checks
    assert len(checks) == 4 * 18
    assert list(checks["scenario"].unique()) == ["pr", "unpatched", "early_aux_shared", "planted_cross_break_read"]
    with pytest.raises(kit.KitError, match="live safety runs need CUDA"):
        load_safety("small", "live GPU")  # no CUDA here


def test_agreement_table_lists_the_pairings_each_check_flags(safety):
    table = agreement_table(safety).set_index("scenario")
    early = safety.pairs[safety.pairs["scenario"] == "early_aux_shared"]
    bad = pair_list(early[~early["bit_exact"].astype(bool)])  # what the GPU measured, as the other checks must flag
    assert bad.startswith("(128, 384)*")
    assert list(table.columns) == ["pairings", *CHECKS]
    # graphs vs eager, the obligation and the lifetime analysis with the breaks' reads flag the same pairings; from
    # the trace alone it flags those and the break inputs' pairings besides
    assert (table.loc["early_aux_shared", list(CHECKS)[:3]] == bad).all()
    assert set(bad.split(", ")) < set(table.loc["early_aux_shared", list(CHECKS)[3]].split(", "))
    assert (table.loc["unpatched", list(CHECKS)] == "none").all()
    pr = table.loc["pr"]
    assert (pr[list(CHECKS)[:3]] == "none").all()
    flagged = pr["lifetime conflict (trace only)"].split(", (")
    trace_only = [p for p in safety.readwrite["pairs"] if p["scenario"] == "pr" and p["trace_only_conflict"]]
    assert len(flagged) == len(trace_only) > 0 and "(512, 96)" in pr["lifetime conflict (trace only)"]
    # the table reads the recordings: one changed verdict moves one cell
    safety.pairs.loc[(safety.pairs["scenario"] == "pr") & (safety.pairs["model_size"] == 512), "bit_exact"] = False
    try:
        pr_512 = safety.pairs[(safety.pairs["scenario"] == "pr") & (safety.pairs["model_size"] == 512)]
        assert agreement_table(safety).set_index("scenario").loc["pr", "graphs differ from eager"] == pair_list(pr_512)
    finally:
        safety.pairs.loc[safety.pairs["scenario"] == "pr", "bit_exact"] = True


def test_pair_list_marks_the_pairings_vllm_cannot_produce():
    rows = pd.DataFrame({"model_size": [128, 256], "replay_size": [128, 64], "dispatchable": [False, True]})
    assert pair_list(rows) == "(128, 128)*, (256, 64)"
    assert pair_list(rows.iloc[:0]) == "none"


def test_agreement_lines_leave_out_only_what_is_not_the_replay_graphs_and_say_so():
    """Recorded since 2026-12-05 every pairing runs as vLLM would (dispatched, under PCP where only PCP dispatches
    it), so all agree over all. A recording made before that ran stress pairings as an adversary (R, then the
    step's own replay graph): where the model graph differs from eager with its own replay graph alone (2048 and
    4096 at the large preset), a difference is not R's, and those pairings are left out, counted and named."""
    large = load_safety("large", "recorded")
    assert set(large.pairs["how"]) == {"dispatched"} and attributable(large.pairs).all()
    assert all("over all 128, " in line and "are exactly" in line for line in agreement_lines(large))
    small = agreement_lines(load_safety("small", "recorded"))
    assert all("over all 18, " in line and "are exactly" in line and "left out" not in line for line in small)

    pairs = large.pairs.copy()
    early = pairs["scenario"] == "early_aux_shared"
    alone_differs = set(pairs.loc[early & ~pairs["alone_bit_exact"].astype(bool), "model_size"])
    assert alone_differs == {2048, 4096}
    stress = early & ~pairs["dispatchable"] & pairs["model_size"].isin(alone_differs)
    pairs.loc[stress, "how"] = "adversary"  # as recorded before stress pairings were forced into R
    own = pairs.index[stress & pairs["bit_exact"].astype(bool)][0]
    pairs.loc[own, ["bit_exact", "max_abs_diff"]] = (False, 1.0)  # its own replay graph's difference, not R's
    left_out = pairs[stress]
    assert not attributable(pairs).loc[left_out.index].any() and attributable(pairs).drop(left_out.index).all()
    lines = agreement_lines(dataclasses.replace(large, pairs=pairs))
    assert lines[2].startswith("early_aux_shared: of the 80 pairings vLLM's dispatch can produce, the obligation fails")
    assert f"over {128 - len(left_out)}, " in lines[2] and "are exactly the pairings that fail it" in lines[2]
    assert f"({len(left_out)} left out: adversary pairings of model graphs 2048, 4096, which differ" in lines[2]
    assert lines[3].startswith("planted_cross_break_read: ") and "over all 128, " in lines[3]


def test_disagreement_lines_explain_the_trace_only_false_positives_in_one_sentence(safety):
    lines = disagreement_lines(safety)
    assert len(lines) == 4 and lines[3].startswith("planted_cross_break_read, lifetime analysis from the trace alone")

    def trace_only(policy: str) -> int:
        pairs = [p for p in safety.readwrite["pairs"] if p["scenario"] == policy]
        return sum(p["trace_only_conflict"] and p["readwrite_holds"] for p in pairs)

    for line, policy in ((lines[0], "pr"), (lines[2], "early_aux_shared")):
        assert line.startswith(
            f"{policy}, lifetime analysis from the trace alone: flags {trace_only(policy)} pairing(s) the obligation "
            "clears"
        )
        assert "residual, post_mix, res_mix" in line and "break inputs the forward keeps bound" in line
    assert lines[1] == "unpatched: the lifetime analysis agrees with the obligation on all 18 pairings"


def test_a_disagreement_of_another_kind_gets_its_recorded_explanation(safety):
    pair = next(p for p in safety.readwrite["pairs"] if p["scenario"] == "pr" and p["model_size"] == 512)
    assert bound_break_inputs(pair)
    changed = copy.deepcopy(safety.readwrite)
    first = next(p for p in changed["pairs"] if p["scenario"] == "pr" and p["trace_only_conflict"])
    first["trace_only_conflict_bytes"] += 1  # no longer exactly the break inputs' bytes
    odd = next(p for p in changed["pairs"] if p["scenario"] == "unpatched")
    odd.update(agree=False, explanation="something else")
    lines = disagreement_lines(SafetyRecords(safety.pairs, changed))
    flagged = sum(p["trace_only_conflict"] for p in safety.readwrite["pairs"] if p["scenario"] == "pr")
    assert f"flags {flagged - 1} pairing(s)" in lines[0]
    pair = f"pr ({first['model_size']}, {first['replay_size']})"
    assert lines[1].startswith(f"{pair}, from the trace alone: the lifetime analysis flags")
    assert f"unpatched ({odd['model_size']}, {odd['replay_size']}), with the breaks' reads: something else" in lines


def test_pairings_table_puts_every_scenario_in_one_table_and_marks_differences(safety):
    page = pairings_table(safety.pairs).to_html()
    early = safety.pairs[(safety.pairs["scenario"] == "early_aux_shared") & ~safety.pairs["dispatchable"]]
    stress = early[~early["bit_exact"].astype(bool)].iloc[0]
    assert page.count("early_aux_shared") == 3 and f"differs {stress['max_abs_diff']:.4g} *" in page
    assert "stress only" in page
    styled = page.split("<style", 1)[1].split("</style>", 1)[0]
    differing = 0
    for policy in ("early_aux_shared", "planted_cross_break_read"):  # the two scenarios that differ from eager
        alone = safety.pairs[safety.pairs["scenario"] == policy]
        own = alone.groupby("model_size")["alone_bit_exact"].first().eq(False).sum()
        differing += (~alone["bit_exact"].astype(bool)).sum() + own
    assert styled.count("#fadbd8") == 1 and styled.count("_col") == differing > 0  # each shaded once


@pytest.mark.parametrize(
    "policy, early_aux, expected",
    [
        ("pr", False, ("patched", True)),
        ("pr", True, ("early_aux_pr", False)),
        ("share", False, ("patched", True)),
        ("share", True, ("early_aux_shared", True)),  # V4.1's nested aux return, the default
        ("separate", False, ("unpatched", False)),
        ("separate", True, ("early_aux_pr", False)),
    ],
)
def test_scenario_for_follows_the_prs_rule(policy, early_aux, expected):
    assert scenario_for(policy, early_aux) == expected
    flat = scenario_for(policy, early_aux, "flat")  # only early aux on the shared stream has a flat capture
    assert flat == (("early_aux_shared_flat", True) if expected[0] == "early_aux_shared" else expected)


def test_overview_table_reads_each_scenarios_three_checks(runs):
    table = overview_table(runs).set_index("scenario")
    assert list(table.index) == list(runs)
    assert table.loc["early_aux_shared_flat", "graphs vs eager"].startswith("differ")
    assert table.loc["early_aux_shared_flat", "of it under a replay graph"] != "0 B"
    for name in ("unpatched", "patched", "early_aux_pr", "early_aux_shared"):
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


def test_liveness_view_shows_roles_bytes_and_replay_graphs_in_few_columns(runs):
    liveness = _paired(runs["early_aux_shared_flat"])
    view = liveness_view(liveness)
    assert len(view.data.columns) <= 7 and "addr" not in view.data.columns
    assert list(view.data["role"]) == block_roles(liveness)
    page = view.to_html()
    first = liveness.rows.iloc[0]
    assert kit.format_bytes(first["bytes"]) in page and f"{first['addr']:#x}" not in page
    assert "512, 480, 384, 288" in page  # model graph 512's aux hidden state, under the larger replay graphs
    assert liveness.source in page


def test_safety_view_shows_the_capture_the_rule_picks_and_redraws_in_place(runs):
    view = SafetyView(runs, replay_size_for=replay_graph_of)
    widget = view.timeline
    assert (view.policy.value, view.early_aux.value, view.scenario) == ("pr", True, "early_aux_pr")
    assert "keep a stream of their own" in view.status.value and "CONFLICT" not in view.status.value
    view.policy.value = "share"  # observed: the view updates; V4.1's nested aux return keeps the aux block
    assert view.scenario == "early_aux_shared" and view.timeline is widget
    assert "CONFLICT" not in view.status.value and "graphs equal eager" in view.status.value
    view.aux_return.value = "flat"  # the hypothetical: the aux block free for the replay captures
    assert view.scenario == "early_aux_shared_flat" and view.timeline is widget
    assert "CONFLICT" in view.status.value and "graphs differ from eager" in view.status.value
    assert "policy share, early aux True, aux returned flat" in widget.layout.title.text
    expected = timeline_figure(runs["early_aux_shared_flat"], _paired(runs["early_aux_shared_flat"]), "t")
    assert [len(t.x) for t in widget.data] == [len(t.x) for t in expected.data]
    assert "overflow-x: auto" in view.blocks_html.value and "aux hidden state" in view.blocks_html.value
    view.early_aux.value = False
    assert view.scenario == "patched" and "share the model graphs' stream" in view.status.value
    assert view.aux_return.disabled and "aux returned" not in widget.layout.title.text
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


# --- kit.show.alternatives ----------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["small", "large"])
def test_alternatives_view_draws_each_scenarios_pool_by_stream_and_what_it_buys(preset):
    data = load_graphs_vs_eager(preset)
    table = scenario_table(data)
    caps = [c for c in data["cap_replay_sizes"] if c["max_replay_size"] is not None]
    kept = [k for k in data["drop_intermediate_sizes"] if k["measured_in"] != "unpatched"]
    assert kept, "the recording measures dropping intermediate sizes"
    assert list(table["scenario"]) == [
        "unpatched",
        "pr",
        "share_all",
        *(f"cap {c['max_replay_size']}" for c in caps),
        *(f"keep {', '.join(map(str, k['kept_replay_sizes']))}" for k in kept),
    ]
    rows = table.set_index("scenario")
    base = data["unpatched"]["graph_pool_bytes"]
    for name in ("unpatched", "pr", "share_all"):
        assert rows.loc[name, "graph_pool_bytes"] == sum(data[name]["graph_pool_by_stream"].values())
        assert rows.loc[name, "saved_bytes"] == data[name]["saved_bytes"] == base - data[name]["graph_pool_bytes"]
        assert rows.loc[name, "safe"] is data[name]["safe"] and rows.loc[name, "eager_replay_sizes"] == []
    for name, freed in data["kv_cache"]["replica"]["freed"].items():  # the recording's own KV figures, again
        assert rows.loc[name, ["kv_freed_bytes", "kv_blocks", "kv_tokens"]].tolist() == list(freed.values())
    for cap in caps:
        row = rows.loc[f"cap {cap['max_replay_size']}"]
        assert (
            row["eager_replay_sizes"] == cap["eager_replay_sizes"]
            and row["graph_pool_bytes"] == cap["graph_pool_bytes"]
        )
        assert row["safe"] is (data[cap["measured_in"]]["safe"] if cap["measured_in"] == "unpatched" else None)
    for k in kept:
        row = rows.loc[f"keep {', '.join(map(str, k['kept_replay_sizes']))}"]
        assert row["graph_pool_bytes"] == k["graph_pool_bytes"] and row["saved_bytes"] == base - k["graph_pool_bytes"]
        assert row["safe"] is None and row["eager_replay_sizes"] == k["eager_replay_sizes"]
    # The figure: per scenario, the streams' bars add up to its graph pool; the picked one solid, the rest dimmed.
    figure = pool_figure(table, "share_all")
    drawn = {name: 0.0 for name in table["scenario"]}
    for trace in figure.data:
        assert list(trace.marker.opacity) == [1.0 if y == "share_all" else DIMMED for y in trace.y]
        for name, mib in zip(trace.y, trace.x, strict=True):
            drawn[name] += mib
    assert drawn == pytest.approx({r.scenario: r.graph_pool_bytes / 2**20 for r in table.itertuples()})
    title = figure.layout.title.text
    share_all = data["share_all"]["graph_pool_bytes"]
    assert f"share_all {kit.format_bytes(share_all)}" in title and f"source: {html_text(data['source'])}" in title
    saved = data["pr"]["saved_bytes"]
    assert f"saves {kit.format_bytes(saved)} ({saved:,} bytes)" in scenario_saving_line(table, "pr")
    # A cap's steps that can go eager follow vLLM's rule: padded to N at or over the threshold, N above the cap.
    cap = next(c for c in caps if c["eager_replay_sizes"])
    threshold = data["config"]["decoder_replay_trim_threshold"]
    steps = [
        n for n in sorted(data["config"]["cudagraph_capture_sizes"]) if n >= threshold and n > cap["max_replay_size"]
    ]
    assert cap_line(table, f"cap {cap['max_replay_size']}", data["config"]).endswith(
        f"replay batches of {', '.join(map(str, cap['eager_replay_sizes']))} rows would run eagerly "
        f"(in steps padded to {', '.join(map(str, steps))} tokens)"
    )
    freed = data["kv_cache"]["replica"]["freed"]["pr"]
    assert kv_line(table, "pr").endswith(
        f"{kit.format_bytes(freed['bytes'])} more KV budget = {freed['blocks']:,} blocks, {freed['tokens']:,} tokens"
    )
    estimates = estimate_table(data).set_index("scenario")
    assert (
        estimates["outside_graph_pool"] == estimates["capture_free_memory_delta"] - estimates["graph_pool_bytes"]
    ).all()
    checks = checks_table(data, "share_all")
    overwritten = int(checks["target_outputs_overwritten"].sum())
    assert len(checks) == len(data["config"]["cudagraph_capture_sizes"]) ** 2 and checks["bit_exact"].all()
    flash = deepseek_table(data).iloc[0]
    assert flash["blocks"] == flash["saved_bytes"] // (flash["bytes per token"] * flash["block size"])
    extra = extra_diff(SHARE_ALL.diff())  # what (a) adds beyond the PR: the speculator's capture, not the replay's
    assert "DSparkSpeculator.capture (alternative (a))" in extra and "capture_replay_graphs" not in extra
    # The view: one main control, the same figure widget redrawn for the scenario picked.
    view = AlternativesView(data)
    widget = view.bars
    assert "kit-main-control" in view.scenario._dom_classes and view.scenario.value == "unpatched"
    name = f"cap {cap['max_replay_size']}"
    view.scenario.value = name
    assert view.bars is widget and f"{name} {kit.format_bytes(cap['graph_pool_bytes'])}" in widget.layout.title.text
    eager = ", ".join(map(str, cap["eager_replay_sizes"]))
    assert f"replay batches that run eagerly: {eager}" in view.details.value and "not checked" in view.details.value
    view.scenario.value = "share_all"
    assert "DFlash speculator graphs on the model graphs stream" in view.details.value
    assert f"overwrote the target&#x27;s outputs in the pool in {overwritten} of them" in view.details.value
    view.scenario.value = f"keep {', '.join(map(str, kept[0]['kept_replay_sizes']))}"
    assert "only replay sizes" in view.details.value and "every replay batch has a graph" in view.details.value


def test_alternatives_figure_shows_stream_names_and_its_source_as_text():
    data = copy.deepcopy(load_graphs_vs_eager("small"))
    for entry in (*(data[name] for name in ("unpatched", "pr", "share_all")), *data["cap_replay_sizes"]):
        held = entry.get("graph_pool_by_stream", {})
        if "model graphs stream" in held:
            held[MODULE_LABEL] = held.pop("model graphs stream")
    data["source"] = f"recorded on {GPU}"
    figure = pool_figure(scenario_table(data), "pr")
    texts = " ".join(figure_texts(figure))
    assert not raw_markup(texts), raw_markup(texts)
    assert html_text(MODULE_LABEL) in {t.name for t in figure.data} and html_text(GPU) in figure.layout.title.text


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
        "global graph pool, replay graphs stream: 42.00 MiB of new segments were cudaMalloc&#x27;ed over the trace "
        "(cumulative churn) while a fitting free block of this pool sat on model graphs stream"
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
    explorer.path_box.value = "kit/recordings/no_such.pickle"  # Enter in the box: observed, loads the path
    assert explorer.main.value == "path" and explorer.status.value.startswith("<b>kit: error:</b>")
    # Nothing of the last good snapshot stays under the error: it would read as the new one's.
    assert "small_patched.pickle" not in bars.layout.title.text and explorer.segments_html.value == ""
    assert explorer.verdicts_html.value == "" and explorer.whatif is None
    explorer.path_box.value = "kit/recordings/two_streams.pickle"
    assert "two_streams.pickle" in explorer.status.value and "two_streams.pickle" in bars.layout.title.text
    explorer.main.value = "small_patched"
    explorer.path_box.value = "kit/recordings/no_such.pickle"
    explorer.on_load()  # the Load button: switches to the path, which fails in one line
    assert explorer.main.value == "path" and explorer.status.value.startswith("<b>kit: error:</b>")
    good = tmp_path / "mine.pickle"
    good.write_bytes(pickle.dumps(kit.load_snapshot(RECORDED["shared_stream"]).raw))
    content = good.read_bytes()
    explorer.upload.value = (
        {
            "name": "mine.pickle",
            "type": "",
            "size": len(content),
            "last_modified": datetime.now(),
            "content": memoryview(content),
        },
    )
    assert "upload mine.pickle" in explorer.status.value and "global graph pool" not in explorer.verdicts_html.value
    assert "upload mine.pickle" in bars.layout.title.text
    assert explorer.main.value == "uploaded file"  # the picker names what is shown


# --- the explorer on a plain snapshot: labels, check, attribution, the what-if panel -----------------------

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
    assert explorer.whatif.saved[(0, 1)] == 22 * MIB and explorer.whatif.stream_map == {404756496: 357844048}
    predicted = _graph_pool(explorer.whatif.predicted)
    assert predicted["stream_label"].tolist() == [FIRST] and predicted["reserved"].sum() == 34 * MIB
    shared = _graph_pool(kit.segment_table(kit.load_snapshot(shipped_path("two_captures_shared"))))
    assert shared["reserved"].sum() == 34 * MIB  # what the shared-stream run measured
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
    assert "no trace recorded" in explorer.check_html.value
    assert "no trace recorded" in explorer.whatif_html.value and "no trace recorded" in explorer.attribution_html.value
    assert explorer.whatif is None
    # Without a trace the pair still follows the graph pool's streams (by id): replay onto model graphs.
    assert (explorer.whatif_from.value, explorer.whatif_to.value) == ("replay graphs stream", "model graphs stream")


# --- a snapshot whose names are markup: every view shows it as text (the browser: tests/test_browser.py) ----


def test_explorer_shows_the_snapshots_markup_as_text(tmp_path):
    (tmp_path / "hostile.pickle").write_bytes(pickle.dumps(hostile_snapshot()))
    explorer = SnapshotExplorer(tmp_path, "hostile.pickle", shipped={})
    assert (explorer.whatif_from.value, explorer.whatif_to.value) == (MODULE_LABEL, SCRIPT_LABEL)  # options: text
    for name in EXPLORER_HTML:
        value = getattr(explorer, name).value
        assert not raw_markup(value), (name, raw_markup(value))
    module, script = html_text(MODULE_LABEL), html_text(SCRIPT_LABEL)
    assert html_text(f"recorded on {GPU}") in explorer.status.value
    for name in ("segments_html", "reuse_html", "attribution_html", "whatif_html"):
        assert module in getattr(explorer, name).value and script in getattr(explorer, name).value, name
    assert f"{html_text(POOL_NAME)}, {module}: 20.00 MiB of new segments" in explorer.verdicts_html.value
    assert module in explorer.check_html.value
    for figure in explorer.figures.values():
        texts = " ".join(figure_texts(figure))
        assert not raw_markup(texts) and module in texts, raw_markup(texts)


def test_change_figure_shows_the_snapshots_markup_as_text():
    table = kit.segment_table(kit.load_snapshot(hostile_snapshot()))
    figure = change_figure(kit.diff_tables(table, table, by="label"))
    texts = " ".join(figure_texts(figure))
    assert not raw_markup(texts) and f"{html_text(POOL_NAME)} / {html_text(MODULE_LABEL)}" in texts


def test_step_view_shows_the_snapshots_pool_name_as_text_and_outlines_its_rows():
    raw = copy.deepcopy(kit.load_snapshot(RECORDED["two_streams"]).raw)
    raw["kit"]["pools"][POOL_NAME] = raw["kit"]["pools"].pop("global graph pool")
    steps = StepThrough(raw, pool_name=POOL_NAME)
    view = StepView(steps, start=steps.first_step_on("replay graphs stream"))
    for value in (view.request.value, view.free_blocks.value, view.groups.value):
        assert not raw_markup(value), raw_markup(value)
    assert html_text(POOL_NAME) in view.request.value and html_text(POOL_NAME) in view.groups.value
    drawn = {row for trace in view.segment_map.data[:-2] for row in trace.y}
    outlined = [row for trace in view.segment_map.data[-2:] for row in trace.y]
    assert outlined and set(outlined) <= drawn  # the outlines land on the map's (escaped) rows
    assert not raw_markup(" ".join(figure_texts(view.segment_map)))


def test_timeline_and_safety_view_show_the_snapshots_markup_as_text(runs):
    raw = copy.deepcopy(runs["early_aux_shared_flat"].raw)
    for entry in raw["device_traces"][0]:
        for frame in entry.get("frames") or ():
            if frame["name"] == "forward":  # the replica's model: the frame every held block was allocated in
                frame["name"] = SCRIPT_NAME
    raw["kit"]["provenance"]["gpu"] = GPU
    for output in raw["kit"]["equivalence"]:
        output["output"] = f"{SCRIPT_NAME}{output['output']}"
    hostile = kit.Snapshot(raw, origin=runs["early_aux_shared_flat"].origin)
    figure = timeline_figure(hostile, _paired(hostile), "title", source=hostile.source_label)
    texts = " ".join(figure_texts(figure))
    assert not raw_markup(texts), raw_markup(texts)
    assert f"allocated at {html_text(SCRIPT_NAME)} (model.py:" in texts and html_text(GPU) in texts
    unsized = copy.deepcopy(raw)  # a capture without a size is named on the x axis by its name
    for window in unsized["kit"]["captures"]:
        window.update(size=None, capture=SCRIPT_NAME + window.get("capture", window["graph"]))
    ticks = capture_ticks(kit.Snapshot(unsized, origin="unsized"))[1]
    assert ticks and all(t.startswith(html_text(SCRIPT_NAME)) for t in ticks), ticks
    view = SafetyView({**runs, "early_aux_shared_flat": hostile}, replay_size_for=replay_graph_of)
    view.policy.value, view.aux_return.value = "share", "flat"
    assert view.scenario == "early_aux_shared_flat" and "CONFLICT" in view.status.value
    assert not raw_markup(view.status.value) and f"allocated at {html_text(SCRIPT_NAME)}" in view.status.value
    assert f"({html_text(SCRIPT_NAME)}aux_hidden_state[1] at size " in view.status.value  # graphs vs eager
    assert not raw_markup(view.blocks_html.value) and html_text(GPU) in view.blocks_html.value

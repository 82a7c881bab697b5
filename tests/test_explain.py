"""`kit explain` and the report's first section: the answer, computed from the snapshot, each part on its own."""

from __future__ import annotations

import copy
import json

import pytest

from kit.allocator.rules import DEFAULT_POOL
from kit.analysis.answer import explain
from kit.analysis.ranking import SHARING_CAVEAT, rank_maps
from kit.analysis.whatif import what_if
from kit.load.snapshot import load_snapshot
from kit.markup import html_text
from kit.recordings import RECORDINGS
from kit.show.report import render_report
from kit.units import format_bytes

from .test_tables import run_kit

PLAIN = sorted((RECORDINGS / "plain").glob("*.pickle"))


@pytest.mark.parametrize("path", PLAIN, ids=lambda p: p.stem)
def test_the_answer_names_the_pool_the_stranded_stream_and_the_best_map_with_its_simulated_saving(path):
    answer = explain(str(path))
    text = answer.paragraph()
    biggest = answer.pools[0]
    assert text.startswith(f"Biggest pools, reserved: {biggest['pool_label']} {tuple(biggest['pool'])} ")
    assert answer.missing == {}
    ranked = rank_maps(str(path))
    if ranked.best is None:
        assert answer.best_map == {} and answer.caveat is None and "saves no" not in text
        return
    top = ranked.rows.iloc[0]
    saved = sum(b for p, b in what_if(str(path), top["moves"]).saved.items() if p != DEFAULT_POOL)
    assert answer.best_map["argument"] == top["argument"] and answer.best_map["graph_pool_saved"] == saved > 0
    assert f"Best map, simulated: --map {top['argument']}, saves {format_bytes(saved)} of graph pool" in text
    assert text.endswith(f"Caveat: {SHARING_CAVEAT}.")
    for s in answer.stranded:  # each stranded group by pool and stream, churn not called a saving
        assert f"In {s['pool_label']}, {s['stream_label']} made {format_bytes(s['bytes'])} of new segments" in text
    assert "not a saving" in text


def test_the_separate_runs_strand_and_their_best_map_moves_the_second_capture_onto_the_first():
    answer = explain(str(RECORDINGS / "plain" / "two_captures_separate.pickle"))
    (group,) = answer.stranded
    assert group["stream_label"].startswith("stream of capture_second") and group["bytes"] > 0
    assert answer.best_map["argument"].startswith("'stream of capture_second")  # the stream that stranded moves


def test_a_part_that_cannot_be_computed_says_why_and_the_rest_is_given():
    raw = copy.deepcopy(load_snapshot(str(RECORDINGS / "plain" / "two_captures_separate.pickle")).raw)
    raw["device_traces"] = [[]]
    answer = explain(raw)
    assert answer.pools and answer.stranded is None and answer.best_map is None
    assert answer.missing["stranded"].startswith("no trace recorded (memory history was off)")
    assert "Stranding: not computed (no trace recorded" in answer.paragraph()
    raw = copy.deepcopy(load_snapshot(str(RECORDINGS / "expandable" / "expandable_300_expandable.pickle")).raw)
    trace = raw["device_traces"][0]
    raw["device_traces"] = [trace[len(trace) // 2 :]]  # expandable pages mapped before the trace began
    cut = explain(raw)
    assert cut.stranded is not None and "starts with nothing mapped" in cut.missing["best_map"]
    assert "Best map: not simulated (what-if simulates expandable segments only from a trace" in cut.paragraph()


def test_the_report_opens_with_the_answer_and_explain_prints_it():
    path = str(RECORDINGS / "plain" / "two_captures_separate.pickle")
    page = render_report(path)
    answer = explain(path)
    first = page.index("<h2>")
    assert page[first:].startswith("<h2>The answer</h2>")
    assert html_text(answer.paragraph()) in page and page.index(html_text(answer.paragraph())) < page.index(
        "Segments by (pool, stream)"
    )
    done = run_kit("explain", path, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["answer"] == answer.paragraph() and out["best_map"] == answer.best_map
    text = run_kit("explain", path)
    assert text.stdout.splitlines()[1] == answer.paragraph()

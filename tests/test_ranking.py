"""`what-if --rank`: every map of a snapshot's graph pools simulated and ranked, held to the merged recordings.

Each merged pair (`kit/recordings/merged`) is a workload recorded on the GPU as written and with stream s2's
work moved onto s1: the real saving of the map `s2=s1` on every graph pool. The ranking must carry that map with
the saving the GPU measured, rank no map above it that saves less, and say what it saves, never what was stranded.
"""

from __future__ import annotations

import json

import pytest

from kit.allocator.rules import DEFAULT_POOL
from kit.analysis.ranking import SHARING_CAVEAT, candidate_maps, rank_maps, saving_text
from kit.analysis.tables import segment_table
from kit.load.snapshot import load_snapshot
from kit.recordings import RECORDINGS

from .test_tables import run_kit
from .test_whatif_merged import PAIRS, reserved_by_pool

MERGED = RECORDINGS / "merged"


def test_candidates_are_each_single_move_and_each_all_in_one_map_once():
    maps = candidate_maps({(1, 0): [1, 2, 3], (2, 0): [1, 2]})
    singles = [m for m in maps if len(m) == 1]
    assert sorted(tuple(m.items())[0] for m in singles) == [(a, b) for a in (1, 2, 3) for b in (1, 2, 3) if a != b]
    assert sorted(sorted(m.items()) for m in maps if len(m) > 1) == sorted(
        [[(1, 3), (2, 3)], [(1, 2), (3, 2)], [(2, 1), (3, 1)]]
    )
    assert len(maps) == 9  # pool (2, 0)'s two moves are pool (1, 0)'s too: each map once
    assert candidate_maps({(1, 0): [5]}) == []


@pytest.mark.parametrize("name", PAIRS)
def test_the_ranking_carries_the_map_the_gpu_ran_with_the_saving_it_measured(name):
    snap = load_snapshot(str(MERGED / f"{name}.pickle"))
    s1, s2 = snap.kit["streams"]["s1"], snap.kit["streams"]["s2"]
    ranked = rank_maps(snap)
    rows = ranked.rows
    ran = rows[[m == {s2: s1} for m in rows["moves"]]]
    assert len(ran) == 1, rows["argument"].tolist()
    before = reserved_by_pool(segment_table(snap))
    after = reserved_by_pool(segment_table(str(MERGED / f"{name}_merged.pickle")))
    measured = sum(before.get(p, 0) - after.get(p, 0) for p in before.keys() | after.keys() if p != DEFAULT_POOL)
    assert int(ran["graph_pool_saved"].iloc[0]) == measured  # graph pools: exact, as what-if's own test holds
    assert rows["graph_pool_saved"].is_monotonic_decreasing  # best first
    assert rows["graph_pool_saved"].iloc[0] >= measured
    if measured > 0:
        best = ranked.best
        assert best is not None and best.stream_map == rows.iloc[0]["moves"]
        assert sum(b for p, b in best.saved.items() if p != DEFAULT_POOL) == rows.iloc[0]["graph_pool_saved"]


def test_the_lines_state_the_simulated_saving_and_the_caveat_never_stranded_bytes():
    ranked = rank_maps(str(MERGED / f"{PAIRS[0]}.pickle"))
    lines = ranked.lines()
    top = ranked.rows.iloc[0]
    assert lines[1] == f"  1. --map {top['argument']}: {saving_text(top)}"
    assert f"saves {top['graph_pool_saved'] / 2**20:.2f} MiB of graph pool" in lines[1]
    assert lines[-1] == f"caveat: {SHARING_CAVEAT}" and not any("stranded" in line for line in lines)


def test_what_if_rank_json_and_its_refusals():
    path = str(MERGED / f"{PAIRS[0]}.pickle")
    done = run_kit("what-if", path, "--rank", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [r["graph_pool_saved"] for r in out["ranked"]] == sorted((r["graph_pool_saved"] for r in out["ranked"]),
                                                                    reverse=True)  # fmt: skip
    assert out["best"]["map"] == out["ranked"][0]["map"] and out["caveat"] == SHARING_CAVEAT
    assert all({"pool", "bytes"} <= set(s) for r in out["ranked"] for s in r["saved"])
    neither = run_kit("what-if", path)
    assert neither.returncode == 2 and "give --map FROM=TO (repeatable), or --rank" in neither.stderr
    both = run_kit("what-if", path, "--rank", "--map", "s2=s1")
    assert both.returncode == 2 and "give it without --map" in both.stderr


def test_with_three_capture_streams_the_maps_differ_and_the_best_comes_first():
    """A corpus workload whose graph pool holds segments on three streams: nine maps, savings that differ, each
    the saving `what_if` gives for that map alone."""
    from kit.analysis.whatif import what_if

    path = str(RECORDINGS / "corpus" / "random_026.pickle")
    ranked = rank_maps(path)
    rows = ranked.rows
    assert len(rows) == 9 and rows["graph_pool_saved"].nunique() > 1
    assert rows["graph_pool_saved"].tolist() == sorted(rows["graph_pool_saved"], reverse=True)
    for row in rows.iloc[[0, -1]].itertuples():
        alone = what_if(path, row.moves)
        assert sum(b for p, b in alone.saved.items() if p != DEFAULT_POOL) == row.graph_pool_saved

"""Snapshots as other torch versions write them: each loads and tabulates, and the trace analyses work or say why not.

The snapshots are hand-built from PyTorch's source history (tests/foreign_snapshots.py
names where each key set comes from); the torch 2.11 key sets are the H200 recordings'.
"""

from __future__ import annotations

import json
import pickle

import pytest

from kit import KitError, load_snapshot, reuse_table, segment_table
from kit.analysis.trace.rows import walk_rows
from kit.analysis.trace.walk import walk_trace

from . import foreign_snapshots as foreign
from .helpers import MIB, RECORDED
from .helpers import run_kit_in_process as run_kit


def test_the_key_sets_are_what_each_version_writes():
    for version in foreign.VERSIONS:
        raw = foreign.snapshot(version)
        assert tuple(raw) == foreign.TOP_KEYS[version]
        assert all(tuple(s) == foreign.SEGMENT_KEYS[version] for s in raw["segments"])
        assert all(tuple(b) == foreign.BLOCK_KEYS[version] for s in raw["segments"] for b in s["blocks"])
        assert all(set(e) == set(foreign.TRACE_KEYS[version]) for e in raw["device_traces"][0])
    recorded = load_snapshot(RECORDED["two_streams"]).raw  # torch 2.11, recorded on the H200
    assert set(recorded) - {"kit"} == set(foreign.TOP_KEYS["2.11"])
    assert set(recorded["segments"][0]) == set(foreign.SEGMENT_KEYS["2.11"])
    assert set(recorded["segments"][0]["blocks"][0]) == set(foreign.BLOCK_KEYS["2.11"])
    assert set(recorded["device_traces"][0][0]) == set(foreign.TRACE_KEYS["2.11"])
    assert set(recorded["allocator_settings"]) == set(foreign.snapshot("2.11")["allocator_settings"])


@pytest.mark.parametrize("version", foreign.VERSIONS)
@pytest.mark.parametrize("encoding", ["pickle", "json"])
def test_every_version_loads_tabulates_and_finds_the_stranded_bytes(tmp_path, capsys, version, encoding):
    raw = foreign.snapshot(version)
    path = tmp_path / f"torch-{version}.{encoding}"
    path.write_bytes(pickle.dumps(raw) if encoding == "pickle" else json.dumps(raw).encode())
    snap = load_snapshot(path)
    table = segment_table(snap).set_index(["pool", "stream"])
    assert table.loc[(foreign.GRAPH_POOL, foreign.S1), "free"] == 12 * MIB
    assert table.loc[(foreign.GRAPH_POOL, foreign.S2), "reserved"] == 12 * MIB
    assert table["reserved"].sum() == 34 * MIB
    reuse = reuse_table(snap).set_index(["pool", "stream"])
    assert reuse.attrs["mismatches"] == []
    assert reuse["stranded_bytes"].to_dict() == {k: foreign.STRANDED.get(k, 0) for k in reuse.index}
    for command in (["table", str(path), "--json"], ["reuse", str(path), "--json"]):
        status, out, err = run_kit(capsys, *command)
        assert status == 0 and json.loads(out), err


def test_an_action_a_newer_torch_adds_is_kept_and_skipped():
    raw = foreign.snapshot("current")
    raw["device_traces"][0].insert(3, {"action": "defragment", "addr": foreign.B, "size": 0, "stream": foreign.S1})
    snap = load_snapshot(raw)
    assert [e.action for e in snap.trace].count("defragment") == 1
    assert "annotate" in {e.action for e in snap.trace}
    assert reuse_table(snap).attrs["mismatches"] == []


@pytest.mark.parametrize("version", ["2.1", "2.11", "current"])
@pytest.mark.parametrize("variant", ["state_only", "no_traces"])
def test_without_a_trace_it_tabulates_and_the_trace_analyses_say_so_in_one_line(tmp_path, capsys, version, variant):
    raw = getattr(foreign, variant)(version)
    snap = load_snapshot(raw)
    assert snap.history == ("state" if variant == "state_only" else "none") and not snap.has_trace
    assert segment_table(snap)["reserved"].sum() == 34 * MIB
    with pytest.raises(KitError, match="enabled='state'" if variant == "state_only" else "no trace recorded"):
        walk_trace(snap)
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(raw))
    assert run_kit(capsys, "table", str(path))[0] == 0
    said = "enabled='state', which keeps no trace" if variant == "state_only" else "no trace recorded"
    for command in (["reuse", str(path)], ["what-if", str(path), "--map", "default=default"]):
        status, out, err = run_kit(capsys, *command)
        assert status == 2 and out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kit: error: ") and said in lines[0]


def test_expandable_segments_load_and_their_mapped_pages_count_as_new_segments():
    snap = load_snapshot(foreign.expandable())
    default = [s for s in snap.segments if s.segment_pool_id == (0, 0)]
    assert len(default) == 1 and default[0].is_expandable and default[0].total_size == 6 * MIB
    table = segment_table(snap).set_index(["pool", "stream"])
    assert table.loc[((0, 0), 0), "reserved"] == 6 * MIB
    walk = walk_trace(snap)
    assert walk.mismatches == []
    assert walk.rewound_segments == 0  # every page was mapped within the trace
    default_allocs = walk.allocs[walk.allocs["pool"] == (0, 0)]
    # Three allocations, each needing pages mapped: 2 MiB, then 4 MiB, then 2 MiB (unmapped again after).
    assert list(default_allocs["served"]) == ["new_segment"] * 3
    assert list(default_allocs["segment_bytes"]) == [2 * MIB, 4 * MIB, 2 * MIB]
    reuse = reuse_table(snap, walk).set_index(["pool", "stream"])
    assert reuse["stranded_bytes"].to_dict() == {k: foreign.STRANDED.get(k, 0) for k in reuse.index}


def test_an_unmap_in_the_middle_splits_the_mapped_range_in_two():
    raw = foreign.expandable()
    # Map a fifth page before the fourth is unmapped: what is left is [0, 6) MiB and [8, 10) MiB, two segments.
    page = {"action": "segment_map", "addr": foreign.A + 8 * MIB, "size": 2 * MIB, "stream": 0}
    raw["device_traces"][0].insert(8, page)
    seg = raw["segments"][0]
    empty = {"allocated_size": 0, "active_size": 0, "requested_size": 0}
    blocks = [{"address": foreign.A + 8 * MIB, "size": 2 * MIB, "requested_size": 0, "state": "inactive"}]
    raw["segments"].insert(1, {**seg, **empty, "address": foreign.A + 8 * MIB, "total_size": 2 * MIB, "blocks": blocks})
    snap = load_snapshot(raw)
    assert [s.total_size for s in snap.segments[:2]] == [6 * MIB, 2 * MIB]
    walk = walk_trace(snap)
    assert walk.mismatches == []


def test_a_trace_that_contradicts_the_snapshot_is_reported_not_fatal():
    raw = foreign.snapshot("2.11")
    trace = raw["device_traces"][0]
    trace.insert(4, {"action": "free_completed", "addr": foreign.B + 5, "size": 99})  # never allocated
    trace.insert(2, {"action": "segment_free", "addr": foreign.A, "size": 2 * MIB})  # a live segment freed
    trace.append({"action": "alloc", "addr": foreign.B, "size": MIB})  # over a live block
    snap = load_snapshot(raw)
    walk = walk_trace(snap)
    # Said, not hidden: the freed segment A is still in the snapshot, and the alloc over B's live block changes its
    # blocks (B starts its segment); the free of a block never allocated changes nothing.
    assert walk.mismatches == [
        f"segment {foreign.A:#x} is in the snapshot but not in the replayed trace",
        f"segment {foreign.B:#x}: blocks differ between the replayed trace and the snapshot",
    ]
    assert walk_rows(snap, 0).mismatches == walk.mismatches  # the walk entry by entry says the same
    assert len(walk.allocs) == 5  # the story's four, and the one over a live block
    assert walk.allocs.iloc[-1][["addr", "size", "served"]].tolist() == [foreign.B, MIB, "reused"]

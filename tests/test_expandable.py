"""The simulator under `expandable_segments:True`, against the recordings made with and without it.

`kit/recordings/expandable/` holds 12 seeded workloads, each as generated and
with stream s2 merged onto s1, each run on an H100 (torch 2.11) with
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (`NAME_expandable.pickle`)
and without (`NAME.pickle`). The simulator must reproduce every one from its
workload with the comparison the fidelity corpus uses (`assert_reproduces`
of tests/test_simulator.py): segments and blocks, and the trace
entry by entry, `segment_map` and `segment_unmap` included. Like the corpus
test it takes what the driver chose from the recording: the virtual ranges'
bases (`recorded_range_bases`) or cudaMalloc's addresses, and the streams'
cudaStream_t values, which order the free blocks `empty_cache` walks.

`what-if --map s2=s1` on each `expandable_SEED_expandable.pickle` re-simulates
its trace with the option on and must predict every pool of
`expandable_SEED_merged_expandable.pickle`, as tests/test_whatif_merged.py
asks of the default allocator's pairs.
"""

from __future__ import annotations

import json

import pytest

from kit import load_snapshot
from kit.allocator.rules import K_LARGE_BUFFER, K_SMALL_BUFFER, expandable_range_size
from kit.allocator.simulator import (
    GPU_MEMORY,
    CachingAllocatorSim,
    recorded_range_bases,
    recorded_segment_addresses,
    simulate,
)
from kit.allocator.workload import load_workload, parse_workload
from kit.analysis.tables import segment_table
from kit.analysis.whatif import EXPANDABLE_CAVEAT, what_if
from kit.errors import KitError
from kit.load.snapshot import Snapshot
from kit.recordings import RECORDINGS

from .helpers import MIB
from .test_simulator import assert_reproduces
from .test_whatif_merged import assert_predicts

EXPANDABLE = RECORDINGS / "expandable"
WORKLOADS = sorted(p for p in EXPANDABLE.glob("expandable_*.json"))


def replay(workload, recorded: dict, expandable: bool) -> dict:
    """The workload simulated with the recording's addresses and stream ids."""
    addresses = recorded_range_bases(recorded) if expandable else recorded_segment_addresses(recorded)
    sim = simulate(
        load_workload(workload),
        addresses=addresses,
        expandable_segments=expandable,
        stream_ids=recorded["kit"]["streams"],
    )
    return sim.snapshot()


def test_the_recordings_are_there_with_their_settings():
    assert len(WORKLOADS) == 24
    prov = json.loads((EXPANDABLE / "PROVENANCE.json").read_text())
    for w in WORKLOADS:
        on, off = prov["runs"][f"{w.stem}_expandable"], prov["runs"][w.stem]
        assert on["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True" and on["segment_allocs"] == 0
        assert off["PYTORCH_CUDA_ALLOC_CONF"] is None and off["segment_maps"] == 0
        settings = load_snapshot(EXPANDABLE / f"{w.stem}_expandable.pickle").raw["allocator_settings"]
        assert settings["expandable_segments"] is True


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda p: p.stem)
def test_simulator_reproduces_expandable_segments(workload):
    recorded = load_snapshot(EXPANDABLE / f"{workload.stem}_expandable.pickle").raw
    sim = replay(workload, recorded, expandable=True)
    assert all(s["is_expandable"] for s in sim["segments"])
    assert_reproduces(sim, recorded)


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda p: p.stem)
def test_default_allocator_still_reproduces_the_same_workloads(workload):
    recorded = load_snapshot(EXPANDABLE / f"{workload.stem}.pickle").raw
    sim = replay(workload, recorded, expandable=False)
    assert not any(s["is_expandable"] for s in sim["segments"])
    assert_reproduces(sim, recorded)


def _ops(*ops):
    return parse_workload({"version": 1, "ops": list(ops)})


def _alloc(tid, size, stream="default"):
    return {"op": "alloc", "id": tid, "bytes": size, "stream": stream}


def _segments(sim: CachingAllocatorSim) -> list[tuple]:
    return [
        (s["address"], s["total_size"], [(b["size"], b["state"]) for b in s["blocks"]])
        for s in sim.snapshot()["segments"]
    ]


def _maps(sim: CachingAllocatorSim) -> list[tuple]:
    return [(a, addr, size) for a, addr, size, _ in sim.trace if a.startswith("segment_")]


def test_pages_are_mapped_as_needed_and_splits_go_down_to_512_bytes():
    sim = simulate(_ops(_alloc("a", 21 * MIB), _alloc("b", 3 * MIB), _alloc("c", 1000)), expandable_segments=True)
    large, small = sorted(sim.ranges)
    # 21 MiB maps two 20 MiB pages; 3 MiB fits in the 19 MiB left; 1000 bytes map one 2 MiB page
    assert _maps(sim) == [("segment_map", large, 2 * K_LARGE_BUFFER), ("segment_map", small, K_SMALL_BUFFER)]
    blocks = [(21 * MIB, "active_allocated"), (3 * MIB, "active_allocated"), (16 * MIB, "inactive")]
    assert _segments(sim) == [
        (large, 40 * MIB, blocks),
        (small, 2 * MIB, [(1024, "active_allocated"), (2 * MIB - 1024, "inactive")]),
    ]
    assert sim.ranges[large].size == expandable_range_size(False, GPU_MEMORY)


def test_a_block_before_unmapped_pages_ranks_by_what_it_could_grow_to():
    ops = _ops(
        _alloc("a", 4 * MIB),
        _alloc("b", 8 * MIB),
        _alloc("c", 4 * MIB),
        {"op": "free", "id": "b"},  # an 8 MiB hole between a and c; 4 MiB free at the end, before unmapped pages
        _alloc("e", 2 * MIB),
    )
    sim = simulate(ops, expandable_segments=True)
    base = min(sim.ranges)
    assert sim.tensors["e"].address == base + 4 * MIB  # the hole, though the 4 MiB at the end fits better


def test_empty_cache_unmaps_whole_pages_and_keeps_partial_ones():
    ops = _ops(
        _alloc("a", 30 * MIB),
        _alloc("b", 25 * MIB),
        _alloc("c", 2 * MIB),
        {"op": "free", "id": "b"},  # [30, 55) MiB free: page [40, 60) is not whole, nothing inside is
        {"op": "free", "id": "a"},  # [0, 55) free: page [0, 20) and [20, 40) are
        {"op": "empty_cache"},
    )
    sim = simulate(ops, expandable_segments=True)
    base = min(sim.ranges)
    assert _maps(sim)[-1] == ("segment_unmap", base, 2 * K_LARGE_BUFFER)
    assert _segments(sim)[0] == (
        base + 40 * MIB,
        20 * MIB,
        [(15 * MIB, "inactive"), (2 * MIB, "active_allocated"), (3 * MIB, "inactive")],
    )


def test_a_range_with_nothing_mapped_is_given_back_and_its_base_found_again():
    ops = _ops(_alloc("a", 4096), {"op": "free", "id": "a"}, {"op": "empty_cache"}, _alloc("b", 4096, "s1"))
    sim = simulate(ops, expandable_segments=True)
    assert len(sim.ranges) == 1
    raw = sim.snapshot()
    assert [e["action"] for e in raw["device_traces"][0] if e["action"].startswith("segment")] == [
        "segment_map",
        "segment_unmap",
        "segment_map",
    ]
    assert recorded_range_bases(raw) == [e["addr"] for e in raw["device_traces"][0] if e["action"] == "segment_map"]
    again = simulate(ops, addresses=[1 << 40, 1 << 40], expandable_segments=True)  # the driver reuses the base
    assert recorded_range_bases(again.snapshot()) == [1 << 40, 1 << 40]


# --- what-if on expandable segments --------------------------------------------------------------

PAIRS = [w.stem for w in WORKLOADS if not w.stem.endswith("_merged")]


def reserved_by_pool(table) -> dict[tuple[int, int], int]:
    return {tuple(p): int(v) for p, v in table.groupby("pool")["reserved"].sum().items()}


@pytest.mark.parametrize("name", PAIRS)
def test_what_if_predicts_every_pool_the_merged_run_reserved_with_expandable_segments(name):
    snap = load_snapshot(EXPANDABLE / f"{name}_expandable.pickle")
    streams = snap.kit["streams"]
    result = what_if(snap, {streams["s2"]: streams["s1"]})
    assert reserved_by_pool(result.baseline) == reserved_by_pool(segment_table(snap))  # the trace replays exactly
    measured = reserved_by_pool(segment_table(load_snapshot(EXPANDABLE / f"{name}_merged_expandable.pickle")))
    assert_predicts(result, measured)  # graph pools exact; the default pool inside its stated range
    assert EXPANDABLE_CAVEAT in result.corrections  # what the simulation cannot know is said


def test_what_if_refuses_an_expandable_trace_that_starts_with_pages_mapped():
    raw = dict(load_snapshot(EXPANDABLE / "expandable_300_expandable.pickle").raw)
    trace = raw["device_traces"][0]
    first_map = next(i for i, e in enumerate(trace) if e["action"] == "segment_map")
    raw["device_traces"] = [trace[:first_map] + trace[first_map + 1 :]]
    snap = Snapshot(raw, origin="a trace without its first segment_map")
    streams = snap.kit["streams"]
    with pytest.raises(KitError, match="pages mapped before it began"):
        what_if(snap, {streams["s2"]: streams["s1"]})


def test_sim_command_simulates_expandable_segments_with_a_recordings_addresses(tmp_path):
    from kit.cli import main

    workload, out = EXPANDABLE / "expandable_305.json", tmp_path / "sim.pickle"
    recorded = EXPANDABLE / "expandable_305_expandable.pickle"
    assert main(["sim", str(workload), "--expandable-segments", "--addresses-from", str(recorded), "-o", str(out)]) == 0
    assert_reproduces(load_snapshot(out).raw, load_snapshot(recorded).raw)


def test_table_and_reuse_say_when_segments_are_expandable_and_verdicts_say_mapped():
    """A new segment of an expandable recording is a mapping of pages, not a cudaMalloc: the text says so."""
    from kit.analysis.trace.reports import EXPANDABLE_NOTE, stranding_report

    from .test_tables import run_kit

    path = str(RECORDINGS / "expandable" / "expandable_306_expandable.pickle")
    assert load_snapshot(path).expandable
    for command in ("table", "reuse"):
        assert f"note: {EXPANDABLE_NOTE}" in run_kit(command, path).stdout.splitlines(), command
    verdicts = stranding_report(path)["verdict"].tolist()
    assert verdicts and all("of new pages were mapped over the trace" in v for v in verdicts)
    plain = str(RECORDINGS / "expandable" / "expandable_306.pickle")  # the same workload, the setting off
    assert not load_snapshot(plain).expandable and "note:" not in run_kit("table", plain).stdout
    assert all("cudaMalloc'ed" in v for v in stranding_report(plain)["verdict"])


# --- the trace walk (reuse, check) on expandable segments ---------------------------------------


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.stem)
def test_the_walk_ends_at_every_expandable_recording(workload):
    """Blocks split as the small pool's do, and one unmap can cover ranges mapped apart: the walk replays the
    H100 recordings to their snapshots, so `check` and `reuse` give verdicts instead of refusing."""
    from kit.analysis.trace.walk import walk_trace

    snap = load_snapshot(str(EXPANDABLE / f"{workload.stem}_expandable.pickle"))
    walk = walk_trace(snap)
    assert walk.mismatches == []
    assert len(walk.allocs) == sum(e.action == "alloc" for e in snap.require_trace(0))


def test_check_gives_a_verdict_on_an_expandable_recording_it_once_refused():
    from .helpers import run_kit

    done = run_kit("check", str(EXPANDABLE / "expandable_306_expandable.pickle"))
    assert done.returncode == 1, done.stderr  # graph pools stranded on a second stream, not a walk that misses
    assert "stranded" in done.stdout + done.stderr

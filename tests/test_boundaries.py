"""Every split rule and the stranding rule on both sides of its boundary, with the answers worked out by hand.

The boundary workloads (`scripts/record_corpus.py`, `boundary_workloads`) put a
request in a free block of known size so that it leaves 0, 511, 512, 513 bytes,
1 MiB - 1, 1 MiB or 1 MiB + 512 bytes of it before rounding, in the small pool
and the large one, outside captures and in them. PyTorch's rules
(`CUDACachingAllocator.cpp`): a request rounds up to a multiple of 512 bytes; a
small-pool block is split when 512 bytes or more are left, a large-pool block
only when more than 1 MiB is. `SPLITS` below is each case's outcome derived by
hand from those rules alone, not from the kit; the simulator must produce it,
and both trace walks (`kit.analysis.trace.rows` and `kit.analysis.trace.columnar`)
must walk its snapshot to the same final state and classify each request as
derived here. The stranding cases put a request one 512-byte step above a free
block of another stream (not stranded) and one exactly its size (stranded).
`tests/test_boundary_recordings.py` holds the same table against the H200.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit import load_snapshot
from kit.allocator.simulator import simulate
from kit.allocator.workload import parse_workload
from kit.analysis.trace.columnar import walk_columns
from kit.analysis.trace.rows import walk_rows

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from record_corpus import boundary_workloads  # noqa: E402

# case -> (bytes requested, the block it gets, bytes split off and left free beside it, the probe that takes them)
SPLITS = {
    # Small pool: a 64 KiB free block (1.5 MiB for the 1 MiB cases); split when 512 B or more are left.
    "small_left_0": (65_536, 65_536, 0, 0),
    "small_left_511": (65_025, 65_536, 0, 0),  # rounds up to the whole block
    "small_left_512": (65_024, 65_024, 512, 512),  # exactly 512 B left: split
    "small_left_513": (65_023, 65_024, 512, 512),  # rounds up to 65,024: 512 B left, split
    "small_left_1048575": (524_289, 524_800, 1_048_064, 1_048_064),
    "small_left_1048576": (524_288, 524_288, 1_048_576, 1_048_576),
    "small_left_1049088": (523_776, 523_776, 1_049_088, 1_048_576),  # the probe asks for 1 MiB of it
    # Large pool, a 4 MiB free block: split only when more than 1 MiB is left.
    "large_left_0": (4_194_304, 4_194_304, 0, 0),
    "large_left_511": (4_193_793, 4_194_304, 0, 0),
    "large_left_512": (4_193_792, 4_194_304, 0, 0),  # 512 B left: kept with the allocation
    "large_left_513": (4_193_791, 4_194_304, 0, 0),
    "large_left_1048575": (3_145_729, 4_194_304, 0, 0),  # rounds to 3,146,240: 1 MiB - 512 left, kept
    "large_left_1048576": (3_145_728, 4_194_304, 0, 0),  # exactly 1 MiB left: kept
    "large_left_1049088": (3_145_216, 3_145_216, 1_049_088, 1_049_088),  # 1 MiB + 512 left: split
    # Large pool, a new segment: 10 MiB or more rounds the segment up to 2 MiB, here 12 MiB.
    "large_fresh_left_0": (12_582_912, 12_582_912, 0, 0),
    "large_fresh_left_511": (12_582_401, 12_582_912, 0, 0),
    "large_fresh_left_512": (12_582_400, 12_582_912, 0, 0),
    "large_fresh_left_513": (12_582_399, 12_582_912, 0, 0),
    "large_fresh_left_1048575": (11_534_337, 12_582_912, 0, 0),
    "large_fresh_left_1048576": (11_534_336, 12_582_912, 0, 0),
    "large_fresh_left_1049088": (11_533_824, 11_533_824, 1_049_088, 1_049_088),
}
# pool -> (the holder's free block, the request one step above it, the request exactly its size)
STRANDED = {"small": (1_048_064, 1_048_065, 1_048_064), "large": (12_582_912, 12_582_913, 12_582_912)}
WORKLOADS = boundary_workloads()
SPLIT_WORKLOADS = ["boundary_small", "boundary_small_capture", "boundary_large", "boundary_large_capture"]
STRANDED_WORKLOADS = ["boundary_stranded", "boundary_stranded_capture"]


def test_the_workloads_hold_every_case_and_only_these():
    assert sorted(WORKLOADS) == sorted(SPLIT_WORKLOADS + STRANDED_WORKLOADS)
    for name in SPLIT_WORKLOADS:
        requests = {
            op["id"].removesuffix(":request"): op["bytes"]
            for op in WORKLOADS[name]["ops"]
            if op["op"] == "alloc" and op["id"].endswith(":request")
        }
        pool = name.split("_")[1]
        assert requests == {case: spec[0] for case, spec in SPLITS.items() if case.startswith(pool)}
        captures = sum(op["op"] == "capture_begin" for op in WORKLOADS[name]["ops"])
        assert captures == (len(requests) if name.endswith("_capture") else 0)


def _simulated(name: str):
    return simulate(parse_workload(WORKLOADS[name], name), explain=True)


@pytest.mark.parametrize("name", SPLIT_WORKLOADS)
def test_the_simulator_splits_as_derived_by_hand(name):
    sim = _simulated(name)
    decisions = {d.id: d for d in sim.decisions}
    for case, (requested, block, left_free, probe) in SPLITS.items():
        if not case.startswith(name.split("_")[1]):
            continue
        request = decisions[f"{case}:request"]
        assert (request.requested, sim.tensors[f"{case}:request"].size) == (requested, block), case
        assert request.split == (left_free > 0), case
        assert request.outcome == ("new_segment" if "fresh" in case else "reused"), case
        if probe:  # the part split off is a free block right after the request, which the probe takes
            taken = decisions[f"{case}:probe"]
            assert (taken.requested, taken.outcome, taken.block) == (probe, "reused", request.block + block), case
        else:
            assert f"{case}:probe" not in decisions, case


def _walks(sim) -> tuple:
    snap = load_snapshot(sim.snapshot())
    rows, columns = walk_rows(snap, 0), walk_columns(snap, 0)
    assert rows.mismatches == [] and columns.mismatches == []
    # One row per allocation, in the order the simulator served them (its decisions, the RNG state's included).
    assert len(rows.allocs) == len(columns.allocs) == len(sim.decisions)
    return rows, columns


@pytest.mark.parametrize("name", SPLIT_WORKLOADS)
def test_both_walks_end_at_the_snapshot_and_serve_each_request_as_derived(name):
    sim = _simulated(name)
    for walk in _walks(sim):
        served = dict(zip((d.id for d in sim.decisions), walk.allocs["served"], strict=True))
        for case, (_, _, _, probe) in SPLITS.items():
            if case.startswith(name.split("_")[1]):
                assert served[f"{case}:request"] == ("new_segment" if "fresh" in case else "reused"), case
                assert not probe or served[f"{case}:probe"] == "reused", case
        assert "stranded" not in set(served.values())  # every case on a stream of its own, nothing to take


@pytest.mark.parametrize("name", STRANDED_WORKLOADS)
def test_a_request_exactly_the_size_of_another_streams_free_block_is_stranded_and_one_step_above_is_not(name):
    sim = _simulated(name)
    for walk in _walks(sim):
        rows = dict(zip((d.id for d in sim.decisions), walk.allocs.to_dict("records"), strict=True))
        for pool, (block, over, exact) in STRANDED.items():
            above, fits = rows[f"{pool}_stranded:over:request"], rows[f"{pool}_stranded:exact:request"]
            assert (above["size"], above["served"]) == (over, "new_segment"), pool
            assert (fits["size"], fits["served"], fits["other_block_size"]) == (exact, "stranded", block), pool
            assert fits["other_stream"] == sim.stream_ids[f"{pool}_stranded:holder"], pool
        assert sum(r["served"] == "stranded" for r in rows.values()) == 2


def test_recording_them_without_cuda_is_one_line_and_writes_nothing(tmp_path):
    script = Path(__file__).resolve().parents[1] / "scripts" / "record_corpus.py"
    out = tmp_path / "corpus"
    done = subprocess.run(
        [sys.executable, str(script), "--boundary-only", "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        timeout=300,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "record_corpus.py: error: recording needs CUDA, which this process has none of; nothing was written"
    ]
    assert not out.exists()

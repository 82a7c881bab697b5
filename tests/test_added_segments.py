"""Each segment the replay captures add, its request and why no free block served it (`kit.analysis.added_segments`).

Known answers first: workloads run on the allocator simulator, a model-graph
capture and then a replay capture into the same pool, where exactly one
segment is added and the reason is known by construction (its own stream's
small blocks too small, a large block it may not take; a fitting block on
another stream; a large request facing only small-pool blocks). Then the
shipped vLLM recordings: what the 2 MiB of the patched replay captures is
(issue 35), and `demo --vllm` printing it, text and JSON.
"""

from __future__ import annotations

import json

import pytest

from kit.allocator.simulator import simulate
from kit.allocator.workload import parse_workload
from kit.analysis.added_segments import (
    ANOTHER_STREAM,
    NO_FITTING_BLOCK,
    OTHER_SIZE_CLASS,
    OTHER_STREAM,
    TOO_SMALL,
    added_segments_lines,
    bytes_by_cause,
    replay_added_segments,
)
from kit.analysis.attribution import replay_captures_added
from kit.analysis.trace.walk import walk_trace
from kit.load.snapshot import Snapshot
from kit.recordings import RECORDINGS

from .helpers import KIB, MIB

POOL = "the pool"


def _snapshot(replay_stream: str, replay_allocs: list[int]) -> tuple[Snapshot, tuple[int, int]]:
    """A model graph captured on "model" (a 1 MiB and a 1 MiB small block, a 4 MiB large one, all freed), then a
    replay graph on `replay_stream` into the same pool allocating `replay_allocs` and keeping them to its end;
    the capture windows are the recorder's, named as vLLM's managers are."""
    model = [
        {"op": "capture_begin", "graph": "model", "pool": POOL, "stream": "model"},
        {"op": "alloc", "id": "m1", "bytes": MIB},
        {"op": "alloc", "id": "m2", "bytes": MIB},
        {"op": "alloc", "id": "m3", "bytes": 4 * MIB},
        *({"op": "free", "id": t} for t in ("m1", "m2", "m3")),
        {"op": "capture_end", "graph": "model"},
    ]
    replay = [
        {"op": "capture_begin", "graph": "replay", "pool": POOL, "stream": replay_stream},
        *({"op": "alloc", "id": f"r{i}", "bytes": n} for i, n in enumerate(replay_allocs)),
        *({"op": "free", "id": f"r{i}"} for i in range(len(replay_allocs))),
        {"op": "capture_end", "graph": "replay"},
    ]
    split = len(simulate(parse_workload({"version": 1, "ops": model})).trace)  # where the replay's entries begin
    raw = simulate(parse_workload({"version": 1, "ops": model + replay})).snapshot()
    pool, streams = raw["kit"]["pools"][POOL], raw["kit"]["streams"]
    end = len(raw["device_traces"][0])
    raw["kit"]["captures"] = [
        {"capture": f"{m} 1", "graph": f"{m} 1 graph 0", "manager": m, "size": 1, "index": 0, "pool": pool,
         "stream": streams[stream], "trace_begin": begin, "trace_end": stop}
        for m, stream, begin, stop in (
            ("model graphs", "model", 0, split), ("decoder replay graphs", replay_stream, split, end)
        )
    ]  # fmt: skip
    raw["kit"]["streams"] = {f"{name} stream": sid for name, sid in streams.items() if name != "default"}
    return Snapshot(raw, origin="simulated"), tuple(raw["kit"]["pools"][POOL])


def _rows(replay_stream: str, replay_allocs: list[int]) -> list[dict]:
    snap, pool = _snapshot(replay_stream, replay_allocs)
    rows = replay_added_segments(snap, pool)
    added = replay_captures_added(snap, pool)
    assert sum(r["segment_bytes"] for r in rows) == int(added["bytes"].sum())  # every added byte has its request
    return rows


def test_a_request_its_own_streams_small_blocks_are_too_small_for_makes_one_small_segment():
    # The model graph left one 2 MiB small segment and one 20 MiB large one free, on "model". On the same stream
    # the replay takes 8 KiB and 1 MiB of the small segment, so its second 1 MiB finds 1 MiB - 8 KiB free there,
    # and the large segment's free blocks are of the other size class: the one added segment, as in vLLM's path.
    (row,) = _rows("model", [8 * KIB, MIB, MIB])
    assert (row["request_bytes"], row["rounded_bytes"], row["segment_bytes"]) == (MIB, MIB, 2 * MIB)
    assert row["segment_type"] == "small" and row["stream"] == "model stream"
    assert row["graph"] == "decoder replay graphs 1 graph 0" and row["served"] == "new_segment"
    free = row["free_blocks"]
    assert free[TOO_SMALL] == {"count": 1, "bytes": MIB - 8 * KIB, "largest": MIB - 8 * KIB, "fitting": 0}
    assert (free[OTHER_SIZE_CLASS]["count"], free[OTHER_SIZE_CLASS]["fitting"]) == (1, 1)
    assert free[OTHER_SIZE_CLASS]["largest"] == 20 * MIB
    assert free[OTHER_STREAM]["count"] == 0
    assert "all smaller than its 1.00 MiB" in row["why"] and "in the large pool" in row["why"]
    assert "another stream" not in row["why"] and "sat on" not in row["why"]
    assert bytes_by_cause([row]) == {ANOTHER_STREAM: 0, NO_FITTING_BLOCK: 2 * MIB}


def test_the_same_replay_on_a_stream_of_its_own_is_refused_the_models_fitting_blocks():
    rows = _rows("replay", [8 * KIB, MIB, MIB])
    # 8 KiB and 1 MiB share a new small segment, the second 1 MiB needs another: two, each for a stream's sake.
    assert [(r["request_bytes"], r["segment_bytes"], r["segment_type"]) for r in rows] == [
        (8 * KIB, 2 * MIB, "small"),
        (MIB, 2 * MIB, "small"),
    ]
    for r in rows:
        assert r["stream"] == "replay stream" and r["served"] == "stranded"
        assert r["free_blocks"][OTHER_STREAM]["fitting"] == 1
        assert r["free_blocks"][OTHER_STREAM]["streams"] == ["model stream"]
        assert "that fit sat on model stream" in r["why"]
    assert "its own stream had no free block in the small pool" in rows[0]["why"]
    assert bytes_by_cause(rows) == {ANOTHER_STREAM: 4 * MIB, NO_FITTING_BLOCK: 0}


def test_a_large_request_facing_only_small_pool_blocks_says_so():
    # 4 MiB and 16 MiB take the large segment whole, 1.5 MiB (a large request) then finds none there; the small
    # segment's 2 MiB block would hold it but belongs to the small pool.
    (row,) = _rows("model", [4 * MIB, 16 * MIB, 3 * MIB // 2])
    assert row["request_bytes"] == 3 * MIB // 2 and row["segment_type"] == "large"
    assert row["free_blocks"][OTHER_SIZE_CLASS]["fitting"] == 1
    assert "was in the small pool, which a large request (over 1.00 MiB) never takes" in row["why"]


def test_a_replay_that_fits_adds_no_segment_and_prints_nothing():
    assert _rows("model", [MIB, 4 * MIB]) == []
    assert added_segments_lines([]) == []


# --- the shipped vLLM recordings ----------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_rows() -> dict:
    from kit.experiments.summary import summarize

    names = ("unpatched", "patched", "early_aux_shared", "early_aux_shared_flat")
    return {name: summarize(RECORDINGS / "vllm" / f"{name}.pickle", segments=True) for name in names}


def test_the_patched_replay_captures_two_mib_is_one_small_pool_segment_for_a_hidden_state(vllm_rows):
    # What the 2 MiB is (recorded 2026-12-04 and again 2026-12-05, the same):
    # replay graph 512's 1 MiB hidden state (512 rows x 1024 x bf16, the residual
    # add of the stand-in's layer), a small-pool request; the pool's small blocks on its stream were too small,
    # its large ones of the other size class, and no block sat on another stream: no stream made it.
    s = vllm_rows["patched"]
    (row,) = s["replay_added_segments"]
    assert s["replay_added_bytes"] == row["segment_bytes"] == 2 * MIB
    assert (row["request_bytes"], row["segment_type"], row["stream"]) == (MIB, "small", "model graphs stream")
    assert row["graph"] == "decoder replay graphs 512 graph 0" and row["trace_index"] == 2317
    assert row["frame"].startswith("forward (vllm_standin.py:")
    free = row["free_blocks"]
    assert (free[TOO_SMALL]["count"], free[TOO_SMALL]["bytes"], free[TOO_SMALL]["fitting"]) == (2, 1040384, 0)
    assert free[OTHER_SIZE_CLASS]["fitting"] == 2 and free[OTHER_STREAM]["count"] == 0
    assert s["replay_added_by_cause"] == {ANOTHER_STREAM: 0, NO_FITTING_BLOCK: 2 * MIB}
    # The pool's small segments then: the model graphs' three of 2 MiB, holding 5 MiB + 8 KiB of the replay graph's
    # own live tensors (docs/vllm.md states these figures).
    made = walk_trace(RECORDINGS / "vllm" / "patched.pickle").new_segments
    small = made[(made["pool"] == (0, 1)) & (made["size"] == 2 * MIB) & (made["addr"] != row["segment_address"])]
    assert len(small) == 3 and 3 * 2 * MIB - free[TOO_SMALL]["bytes"] == 5 * MIB + 8 * KIB
    pinned = vllm_rows["early_aux_shared"]["replay_added_segments"]  # V4.1's nested aux: its blocks kept
    assert vllm_rows["early_aux_shared"]["replay_added_by_cause"] == s["replay_added_by_cause"]
    assert [(r["request_bytes"], r["segment_bytes"], r["graph"]) for r in pinned] == [
        (MIB, 2 * MIB, "decoder replay graphs 512 graph 0")
    ]
    assert vllm_rows["early_aux_shared_flat"]["replay_added_segments"] == []  # the flat aux's freed blocks fit


def test_unpatched_every_replay_segment_was_made_for_another_streams_sake(vllm_rows):
    s = vllm_rows["unpatched"]
    rows = s["replay_added_segments"]
    assert sum(r["segment_bytes"] for r in rows) == s["replay_added_bytes"] == 28 * MIB
    assert all(r["stream"] == "decoder replay graphs stream" and r["served"] == "stranded" for r in rows)
    assert s["replay_added_by_cause"] == {ANOTHER_STREAM: 28 * MIB, NO_FITTING_BLOCK: 0}
    assert sorted(r["segment_type"] for r in rows) == ["large"] + ["small"] * 4


def test_demo_vllm_names_each_added_segment_in_text_and_json(capsys):
    from kit.cli import main

    assert main(["demo", "--vllm", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for name, figures in data.items():
        rows = figures["replay_added_segments"]
        assert sum(r["segment_bytes"] for r in rows) == figures["replay_added_bytes"], name
        assert all({"request_bytes", "segment_bytes", "segment_type", "stream", "capture", "frame", "why"} <= set(r)
                   for r in rows)  # fmt: skip
    assert [r["trace_index"] for r in data["patched"]["replay_added_segments"]] == [2317]
    assert main(["demo", "--vllm"]) == 0
    out = capsys.readouterr().out
    patched = out[out.index("\npatched (") : out.index("\nearly_aux_pr")]  # the next scenario, either shape
    assert "    1 segment, 2.00 MiB: 0 B made while a free block of the pool that fit sat on another stream" in patched
    assert "2.00 MiB small-pool segment for a request of 1,048,576 B (rounded 1,048,576 B) on model graphs stream" in (
        patched
    )
    assert "why no free block served it: the 2 free blocks of the small pool on its own stream were all smaller" in (
        patched
    )

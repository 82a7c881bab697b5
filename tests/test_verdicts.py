"""Stranding verdicts say what happened at the moment each new segment was made, on hand-written traces.

Each test writes a small allocator story one event at a time (`Story`): the
trace torch would record and the final segments it leaves, in torch's format,
with no `kit` key (a plain snapshot). Streams 7 and 9 first allocate from
`capture_a (x.py:30)` and `capture_b (x.py:41)`, so their labels are
"stream of capture_a (x.py:30)" and "stream of capture_b (x.py:41)".
"""

from __future__ import annotations

import json
import pickle

import pytest

from kit import load_snapshot, segment_table, stranding_report
from kit.allocator.rules import round_size
from kit.analysis.trace.reports import WHY_PENDING, WHY_STREAM, reuse_table, stranding_verdicts

from .helpers import MIB, RECORDED
from .test_tables import run_kit

A, B = 7, 9
POOL, POOL_2 = (0, 1), (0, 2)
FRAMES = {A: ("capture_a", 30), B: ("capture_b", 41), 0: ("load", 10)}
LABEL = {A: "stream of capture_a (x.py:30)", B: "stream of capture_b (x.py:41)"}


class Story:
    """A trace and the final segments it leaves, written one allocator event at a time."""

    def __init__(self) -> None:
        self.trace: list[dict] = []
        self.segments: dict[int, dict] = {}
        self.next_address = 0x7F00_0000_0000

    def _entry(self, action: str, addr: int, size: int, stream: int) -> None:
        name, line = FRAMES.get(stream, ("other", 1))
        frames = [{"filename": "/app/x.py", "name": name, "line": line}]
        self.trace.append(
            {
                "action": action,
                "addr": addr,
                "size": size,
                "stream": stream,
                "time_us": len(self.trace),
                "frames": frames,
            }
        )

    def segment(
        self, stream: int, pool: tuple[int, int], size: int, *, before_trace: bool = False, at: int | None = None
    ) -> int:
        """A new segment (cudaMalloc), at `at` or a fresh address; `before_trace`: it was there before history began."""
        addr = at if at is not None else self.next_address
        self.next_address += 0x1000_0000 if at is None else 0
        self.segments[addr] = {"stream": stream, "pool": pool, "size": size, "blocks": {}}
        if not before_trace:
            self._entry("segment_alloc", addr, size, stream)
        return addr

    def alloc(self, segment: int, size: int, offset: int = 0, *, before_trace: bool = False) -> int:
        """An allocation of `size` bytes at `segment + offset` (the caller keeps the allocator's rules)."""
        addr, seg = segment + offset, self.segments[segment]
        seg["blocks"][addr] = [round_size(size), "active_allocated"]
        if not before_trace:
            self._entry("alloc", addr, size, seg["stream"])
        return addr

    def _holder(self, addr: int) -> dict:
        return next(s for a, s in self.segments.items() if a <= addr < a + s["size"])

    def free(self, addr: int, *, pending: bool = False) -> None:
        """Free a block; `pending`: record_stream holds it (free_requested now, `complete` later)."""
        seg = self._holder(addr)
        self._entry("free_requested", addr, seg["blocks"][addr][0], seg["stream"])
        if pending:
            seg["blocks"][addr][1] = "active_pending_free"
        else:
            self.complete(addr)

    def complete(self, addr: int) -> None:
        seg = self._holder(addr)
        self._entry("free_completed", addr, seg["blocks"][addr][0], seg["stream"])
        del seg["blocks"][addr]

    def release(self, segment: int) -> None:
        """empty_cache: a wholly free segment goes back to the driver."""
        seg = self.segments.pop(segment)
        assert not seg["blocks"]
        self._entry("segment_free", segment, seg["size"], seg["stream"])

    def snapshot(self) -> dict:
        segments = []
        for address, seg in sorted(self.segments.items()):
            blocks, cursor = [], address
            for start, (size, state) in sorted(seg["blocks"].items()):
                if start > cursor:
                    blocks.append(_block(cursor, start - cursor, "inactive"))
                blocks.append(_block(start, size, state))
                cursor = start + size
            if cursor < address + seg["size"]:
                blocks.append(_block(cursor, address + seg["size"] - cursor, "inactive"))
            allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
            active = sum(b["size"] for b in blocks if b["state"] != "inactive")
            segments.append(
                {
                    "device": 0,
                    "address": address,
                    "total_size": seg["size"],
                    "allocated_size": allocated,
                    "active_size": active,
                    "requested_size": allocated,
                    "stream": seg["stream"],
                    "segment_type": "small" if seg["size"] <= 2 * MIB else "large",
                    "segment_pool_id": seg["pool"],
                    "is_expandable": False,
                    "frames": [],
                    "blocks": blocks,
                }
            )
        return {"segments": segments, "device_traces": [list(self.trace)], "allocator_settings": {}}


def _block(address: int, size: int, state: str) -> dict:
    return {"address": address, "size": size, "requested_size": size, "state": state, "frames": []}


def _report(story: Story, **kw):
    snap = load_snapshot(story.snapshot())
    report = stranding_report(snap, **kw)
    assert reuse_table(snap).attrs["mismatches"] == []  # the story is one torch could have recorded
    return snap, report


def _free_block_on_a_when_b_allocates(story: Story) -> int:
    """A frees a 20 MiB block of the graph pool; then B makes a 20 MiB segment of its own (stranded)."""
    s1 = story.segment(A, POOL, 20 * MIB)
    story.free(story.alloc(s1, 20 * MIB))
    s2 = story.segment(B, POOL, 20 * MIB)
    story.alloc(s2, 20 * MIB)
    return s1


def test_a_block_free_at_that_moment_counts_though_reallocated_by_the_end():
    story = Story()
    s1 = _free_block_on_a_when_b_allocates(story)
    story.alloc(s1, 20 * MIB)  # A takes its block back: nothing sits free at the end
    snap, report = _report(story)
    assert segment_table(snap)["free"].sum() == 0
    (row,) = report.to_dict(orient="records")
    assert (row["pool"], row["stream"], row["other_streams"]) == (POOL, B, [A])
    assert row["stranded_bytes"] == row["still_reserved"] == 20 * MIB
    assert row["verdict"] == (
        f"graph pool 1, {LABEL[B]}: 20.00 MiB of new segments were cudaMalloc'ed over the trace (cumulative churn) "
        f"while a fitting free block of this pool sat on {LABEL[A]}; 20.00 MiB of them are still reserved at the "
        f"end. Why: {WHY_STREAM}. What to do: capture on the stream that already holds the pool's free blocks, "
        f"{LABEL[A]} (pass that stream to the graph capture); `python -m kit what-if SNAPSHOT --map "
        f"'{LABEL[B]}={LABEL[A]}'` predicts the saving"
    )


def test_a_block_freed_only_after_the_new_segment_does_not_count():
    story = Story()
    s1 = story.segment(A, POOL, 20 * MIB)
    x = story.alloc(s1, 20 * MIB)
    story.alloc(story.segment(B, POOL, 20 * MIB), 20 * MIB)
    story.free(x)  # free on A at the end, but not when B needed memory
    snap, report = _report(story, min_bytes=0)
    assert segment_table(snap).set_index("stream").loc[A, "free"] == 20 * MIB
    assert report.empty
    assert reuse_table(snap)["stranded_bytes"].sum() == 0


def test_still_reserved_counts_only_the_stranded_segments_left_at_the_end():
    story = Story()
    old = story.segment(B, POOL, 40 * MIB, before_trace=True)  # B's, before history began
    story.alloc(old, 40 * MIB, before_trace=True)
    _free_block_on_a_when_b_allocates(story)
    # the default pool: B strands a segment there too, and empty_cache gives it back
    d1 = story.segment(A, (0, 0), 20 * MIB)
    story.free(story.alloc(d1, 20 * MIB))
    d2 = story.segment(B, (0, 0), 20 * MIB)
    story.free(story.alloc(d2, 20 * MIB))
    story.release(d2)
    story.alloc(story.segment(0, (0, 0), 20 * MIB, at=d2), 20 * MIB)  # a later segment at the same address
    snap, report = _report(story)
    table = segment_table(snap).set_index(["pool", "stream"])
    assert table.loc[(POOL, B), "reserved"] == 60 * MIB  # the group's reserved, older segment included
    rows = report.set_index(["pool", "stream"])
    assert rows.loc[(POOL, B), "stranded_bytes"] == rows.loc[(POOL, B), "still_reserved"] == 20 * MIB
    assert rows.loc[((0, 0), B), "stranded_bytes"] == 20 * MIB
    assert rows.loc[((0, 0), B), "still_reserved"] == 0
    assert "0 B of them are still reserved at the end" in rows.loc[((0, 0), B), "verdict"]


def _small_and_large(story: Story) -> None:
    """In the pool first made: B strands one small (2 MiB) segment; in the second pool, 40 MiB."""
    small = story.segment(A, POOL, 2 * MIB)
    story.alloc(small, 512 * 1024)  # the rest of the small segment sits free on A
    story.alloc(story.segment(B, POOL, 2 * MIB), 512 * 1024)
    big = story.segment(A, POOL_2, 40 * MIB)
    story.free(story.alloc(big, 40 * MIB))
    story.alloc(story.segment(B, POOL_2, 40 * MIB), 40 * MIB)


def test_verdicts_are_ordered_by_bytes_largest_first():
    story = Story()
    _small_and_large(story)
    _, report = _report(story)
    assert list(report["pool"]) == [POOL_2, POOL]  # by bytes, not by pool id
    assert list(report["stranded_bytes"]) == [40 * MIB, 2 * MIB]
    assert stranding_verdicts(story.snapshot())[0].startswith(f"graph pool 2, {LABEL[B]}: 40.00 MiB")


def test_groups_below_the_threshold_are_left_out():
    story = Story()
    _small_and_large(story)
    snap = load_snapshot(story.snapshot())
    assert len(stranding_report(snap)) == 2  # the default, 1 MiB: the 2 MiB group stays
    assert list(stranding_report(snap, min_bytes=2 * MIB + 1)["stranded_bytes"]) == [40 * MIB]
    assert stranding_report(snap, min_bytes=40 * MIB + 1).empty
    assert len(stranding_report(snap, min_bytes=0)) == 2


def test_a_block_pending_on_record_stream_is_named():
    story = Story()
    s0 = story.segment(A, POOL, 20 * MIB)
    story.free(story.alloc(s0, 20 * MIB))
    story.alloc(story.segment(B, POOL, 20 * MIB), 20 * MIB)  # B strands: S0 sits free on A
    story.alloc(s0, 20 * MIB)  # A takes S0 back
    s1 = story.segment(A, POOL, 20 * MIB)
    x = story.alloc(s1, 20 * MIB)
    story.free(x, pending=True)  # record_stream: the free waits for another stream's work
    other = story.segment(0, (0, 0), 2 * MIB)
    story.free(story.alloc(other, 512 * 1024))  # another block's free completes meanwhile: X still waits
    story.alloc(story.segment(B, POOL, 20 * MIB), 20 * MIB)  # B: no free block, one pending
    story.alloc(story.segment(A, POOL, 20 * MIB), 20 * MIB)  # A itself cannot reuse it yet either
    story.complete(x)
    story.alloc(s1, 20 * MIB)  # X's block is reused once its free completed
    story.alloc(story.segment(B, POOL, 20 * MIB), 20 * MIB)  # a plain new segment: nothing free, nothing pending
    _, report = _report(story)
    rows = report.set_index("stream")
    assert list(report["stream"]) == [B, A]  # 40 MiB before 20 MiB
    assert rows.loc[A, "pending_bytes"] == 20 * MIB and rows.loc[A, "pending_streams"] == [A]
    assert rows.loc[A, "stranded_bytes"] == 0
    assert rows.loc[A, "verdict"] == (
        f"graph pool 1, {LABEL[A]}: 20.00 MiB of new segments were cudaMalloc'ed over the trace (cumulative churn) "
        f"while a fitting block waited on record_stream (freed but pending) on {LABEL[A]}; 20.00 MiB of them are "
        f"still reserved at the end. Why: {WHY_PENDING}. What to do: free the tensor once that stream's work is done "
        "(synchronize first) instead of record_stream, or reuse it across the steps"
    )
    assert rows.loc[B, "pending_bytes"] == 20 * MIB and rows.loc[B, "pending_streams"] == [A]
    assert rows.loc[B, "stranded_bytes"] == 20 * MIB and rows.loc[B, "other_streams"] == [A]
    assert (
        "20.00 MiB of them are still reserved at the end; 20.00 MiB of its new segments were made while a fitting "
        f"block waited on record_stream (freed but pending) on {LABEL[A]}. Why: {WHY_STREAM}."
    ) in rows.loc[B, "verdict"]


def test_a_segment_both_stranded_and_pending_counts_in_both_figures_once_in_the_threshold():
    story = Story()
    s0 = story.segment(A, POOL, 20 * MIB)
    story.free(story.alloc(s0, 20 * MIB))  # free on A
    x = story.alloc(story.segment(A, POOL, 20 * MIB), 20 * MIB)
    story.free(x, pending=True)  # and one pending on A
    story.alloc(story.segment(B, POOL, 20 * MIB), 20 * MIB)
    story.complete(x)
    snap, report = _report(story)
    (row,) = report.to_dict(orient="records")
    assert row["stranded_bytes"] == row["pending_bytes"] == 20 * MIB
    assert stranding_report(snap, min_bytes=20 * MIB).shape[0] == 1
    assert stranding_report(snap, min_bytes=20 * MIB + 1).empty  # 20 MiB of new segments, not 40


def test_a_block_still_pending_at_the_end_is_named():
    story = Story()
    x = story.alloc(story.segment(A, POOL, 20 * MIB), 20 * MIB)
    story.free(x, pending=True)  # the snapshot is taken before the free completes
    story.alloc(story.segment(B, POOL, 20 * MIB), 20 * MIB)
    snap, report = _report(story)
    assert "active_pending_free" in {b["state"] for s in snap.raw["segments"] for b in s["blocks"]}
    (row,) = report.to_dict(orient="records")
    assert (row["stream"], row["pending_bytes"], row["pending_streams"]) == (B, 20 * MIB, [A])


def test_a_larger_pending_group_comes_before_a_smaller_stranded_one():
    story = Story()
    x = story.alloc(story.segment(A, POOL, 40 * MIB), 40 * MIB)
    story.free(x, pending=True)
    story.alloc(story.segment(B, POOL, 40 * MIB), 40 * MIB)  # 40 MiB, pending only
    story.complete(x)
    story.free(story.alloc(story.segment(B, POOL_2, 20 * MIB), 20 * MIB))
    story.alloc(story.segment(A, POOL_2, 20 * MIB), 20 * MIB)  # 20 MiB, stranded
    _, report = _report(story)
    assert list(zip(report["pool"], report["stream"], strict=True)) == [(POOL, B), (POOL_2, A)]


def test_a_pending_block_too_small_or_of_another_pool_is_not_named():
    story = Story()
    x = story.alloc(story.segment(A, POOL, 20 * MIB), 20 * MIB)
    story.free(x, pending=True)
    story.alloc(story.segment(B, POOL_2, 20 * MIB), 20 * MIB)  # another pool
    story.alloc(story.segment(B, POOL, 22 * MIB), 22 * MIB)  # larger than the pending block
    story.complete(x)
    _, report = _report(story, min_bytes=0)
    assert report.empty


def test_other_streams_are_ints():
    story = Story()
    _free_block_on_a_when_b_allocates(story)
    _, report = _report(story)
    (streams,) = report["other_streams"]
    assert streams == [A] and all(type(s) is int for s in streams)
    assert report["stream"].dtype == "int64"


def test_reuse_prints_mib_and_its_json_carries_the_verdicts(tmp_path):
    story = Story()
    _small_and_large(story)
    path = tmp_path / "plain.pickle"
    path.write_bytes(pickle.dumps(story.snapshot()))
    done = run_kit("reuse", str(path))
    assert done.returncode == 0, done.stderr
    assert "40.00 MiB" in done.stdout and str(40 * MIB) not in done.stdout
    lines = done.stdout.splitlines()
    verdicts = [i for i, line in enumerate(lines) if "of new segments were cudaMalloc'ed" in line]
    assert [lines[i].split(",")[0] for i in verdicts] == ["graph pool 2", "graph pool 1"]
    done = run_kit("reuse", str(path), "--json", "--min-bytes", str(4 * MIB))
    rows = {(tuple(r["pool"]), r["stream"]): r for r in json.loads(done.stdout)}
    assert rows[(POOL_2, B)]["stranded_bytes"] == 40 * MIB  # the rows as before, bytes exact
    assert rows[(POOL_2, B)]["verdicts"][0].startswith(f"graph pool 2, {LABEL[B]}: 40.00 MiB")
    assert rows[(POOL, B)]["verdicts"] == []  # 2 MiB: below --min-bytes
    assert rows[(POOL, A)]["verdicts"] == []
    assert set(rows[(POOL, A)]) == {
        "pool",
        "stream",
        "allocs",
        "reused",
        "new_segments",
        "new_segment_bytes",
        "stranded_bytes",
        "pool_label",
        "stream_label",
        "verdicts",
    }


@pytest.mark.parametrize("bad", ["-1", "lots"])
def test_reuse_refuses_a_bad_min_bytes(bad):
    done = run_kit("reuse", str(RECORDED["two_streams"]), "--min-bytes", bad)
    assert done.returncode == 2 and "--min-bytes" in done.stderr


# -- issue 27: graph pools first; cumulative figures worded as churn; why, and what to do


def _default_pool_churn_beside_graph_pools(story: Story) -> None:
    """Graph pools: B strands 20 MiB in (0, 1) and 40 MiB in (0, 2); the default pool: 80 MiB, more than either."""
    _free_block_on_a_when_b_allocates(story)
    big = story.segment(A, POOL_2, 40 * MIB)
    story.free(story.alloc(big, 40 * MIB))
    story.alloc(story.segment(B, POOL_2, 40 * MIB), 40 * MIB)
    eager = story.segment(A, (0, 0), 80 * MIB)
    story.free(story.alloc(eager, 80 * MIB))
    story.alloc(story.segment(B, (0, 0), 80 * MIB), 80 * MIB)


def test_graph_pool_verdicts_come_before_a_larger_default_pool_one(tmp_path):
    from kit.show.explorer import verdict_lines

    story = Story()
    _default_pool_churn_beside_graph_pools(story)
    snap, report = _report(story)
    assert list(report["pool"]) == [POOL_2, POOL, (0, 0)]  # graph pools largest first, then the default pool
    lines = verdict_lines(snap)
    assert [line.split(",")[0] for line in lines] == ["graph pool 2", "graph pool 1", "default pool"]
    assert lines[2].startswith(f"default pool, {LABEL[B]}: 80.00 MiB of new segments were cudaMalloc'ed")
    assert lines[2].endswith(
        f"What to do: only if this churn matters, run that eager work on {LABEL[A]}, whose free blocks would serve "
        "it; it is not graph-pool memory (`check` counts the default pool only with --pools all)"
    )
    path = tmp_path / "plain.pickle"
    path.write_bytes(pickle.dumps(story.snapshot()))
    done = run_kit("reuse", str(path))
    printed = [line.split(",")[0] for line in done.stdout.splitlines() if "cudaMalloc'ed" in line]
    assert printed == ["graph pool 2", "graph pool 1", "default pool"]
    rows = {(tuple(r["pool"]), r["stream"]): r for r in json.loads(run_kit("reuse", str(path), "--json").stdout)}
    assert rows[((0, 0), B)]["verdicts"] == [lines[2]] and rows[(POOL_2, B)]["verdicts"] == [lines[0]]


def test_a_verdict_words_cumulative_bytes_as_churn_and_says_why_and_what_to_do():
    """B strands three 20 MiB default-pool segments over the trace, two given back: 60 MiB of churn, 20 MiB kept."""
    story = Story()
    s1 = story.segment(A, (0, 0), 20 * MIB)
    x = story.alloc(s1, 20 * MIB)
    for last in (False, False, True):
        story.free(x)  # A's block sits free while B asks
        seg = story.segment(B, (0, 0), 20 * MIB)
        y = story.alloc(seg, 20 * MIB)
        if not last:
            story.free(y)
            x = story.alloc(s1, 20 * MIB)  # A takes its block back
            story.release(seg)  # empty_cache: B's wholly free segment goes back to the driver
    snap, report = _report(story)
    assert segment_table(snap).set_index("stream").loc[B, "reserved"] == 20 * MIB
    (verdict,) = report["verdict"]
    assert verdict == (
        f"default pool, {LABEL[B]}: 60.00 MiB of new segments were cudaMalloc'ed over the trace (cumulative churn) "
        f"while a fitting free block of this pool sat on {LABEL[A]}; 20.00 MiB of them are still reserved at the "
        f"end. Why: {WHY_STREAM}. What to do: only if this churn matters, run that eager work on {LABEL[A]}, whose "
        "free blocks would serve it; it is not graph-pool memory (`check` counts the default pool only with "
        "--pools all)"
    )


def test_a_graph_pool_verdict_suggests_a_what_if_that_runs_as_written():
    from kit.analysis.whatif import what_if

    story = Story()
    _free_block_on_a_when_b_allocates(story)
    snap, report = _report(story)
    (verdict,) = report["verdict"]
    fix = "What to do: capture on the stream that already holds the pool's free blocks, "
    assert f"Why: {WHY_STREAM}. {fix}{LABEL[A]} (pass that stream to the graph capture)" in verdict
    suggested = verdict.split("what-if SNAPSHOT --map '")[1].split("'")[0]
    source, target = suggested.split("=")
    assert (source, target) == (LABEL[B], LABEL[A])
    assert what_if(snap, {source: target}).saved[POOL] == 20 * MIB  # B's segment would not have been made

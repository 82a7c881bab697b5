"""`diff` pairs the graph pools of two runs by id and content, never by the order they were made
(`kit.analysis.pairing`).

Two bugs stand behind these tests. A second file holding a pool left over
from an earlier run (made first, so the kit numbers it "graph pool 1") had the
first file's "graph pool 1" paired with it, and a confident wrong saving
printed; the AFTER snapshots of those tests are the shipped H200 recording of
the shared-stream run (kit/recordings/plain/two_captures_shared.pickle) with
such pools added. And when work moved between streams, the order pools were
made changed, so one pool (2, 0) was "graph pool 1" before and "graph pool 2"
after, and the summary printed a saving and a cost that were one pool; the
H200 recordings of kit/recordings/merged (each workload run as generated and
with stream s2 merged onto s1) are such pairs, and their `kit` key names the
graph each pool belongs to: the truth the pairing is checked against.
"""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path

import pytest

from kit import diff_summary, diff_tables, load_snapshot, pool_summary, segment_table
from kit.analysis.names import pool_frames, user_frame
from kit.load.unpickle import safe_unpickle

from .helpers import MIB, run_kit

PLAIN = Path(__file__).resolve().parents[1] / "kit" / "recordings" / "plain"
MERGED = PLAIN.parent / "merged"
MERGED_PAIRS = sorted(p.stem for p in MERGED.glob("merged_*.pickle") if not p.stem.endswith("_merged"))
SEPARATE, SHARED = PLAIN / "two_captures_separate.pickle", PLAIN / "two_captures_shared.pickle"
README_SAVING = "graph pool 1: 56.00 MiB reserved before, 34.00 MiB after (saved 22.00 MiB)"
OLD_FRAMES = [
    {"name": "forward", "filename": "/opt/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", "line": 125},
    {"name": "old_capture", "filename": "/home/me/old_run.py", "line": 12},
]
LEFTOVER_STREAM = 777_000_000


def raw_of(path: Path) -> dict:
    return safe_unpickle(path.read_bytes())


def capture_frames(raw: dict) -> list[list]:
    """A stack of each capture's allocations into the graph pool: capture_first's, then capture_second's."""
    wanted = ("capture_first (two_captures.py:48)", "capture_second (two_captures.py:65)")
    found = {}
    for e in raw["device_traces"][0]:
        line = user_frame(e.get("frames"))
        if e["action"] == "alloc" and line in wanted:
            found.setdefault(line, e["frames"])
    return [found[w] for w in wanted]


def with_leftovers(
    raw: dict, *leftovers: list[list] | None, size: int = 8 * MIB, used: int = 2 * MIB, streams: int = LEFTOVER_STREAM
) -> dict:
    """`raw` with graph pools left over from an earlier run of its process, made before its own, so numbered first.

    Each leftover is one pool of one segment of `size` bytes on a stream of its
    own (`streams`, `streams + 1`, ...), holding one allocation of `used` bytes
    per stack given: the trace shows each made (a segment_alloc, then the
    allocations) before anything else. `None` is a leftover older than the
    trace: in no entry, its blocks without frames (history was off when it was
    made). The program's own pool moves up to the id after the leftovers', as
    `graph_pool_handle()` counts.
    """
    raw = copy.deepcopy(raw)
    n = len(leftovers)
    for s in raw["segments"]:
        if tuple(s["segment_pool_id"]) != (0, 0):
            s["segment_pool_id"] = (0, s["segment_pool_id"][1] + n)
    top = max(s["address"] + s["total_size"] for s in raw["segments"])
    trace = raw["device_traces"][0]
    t = trace[0]["time_us"] - 1_000_000
    entries = []
    for i, stacks in enumerate(leftovers):
        address, stream = top + (i + 1) * (1 << 30), streams + i
        blocks = [
            {
                "address": address + j * used,
                "size": used,
                "requested_size": used,
                "state": "active_allocated",
                "frames": [],
            }
            for j in range(len(stacks or [[]]))
        ]
        allocated = used * len(blocks)
        blocks.append(
            {
                "address": address + allocated,
                "size": size - allocated,
                "requested_size": 0,
                "state": "inactive",
                "frames": [],
            }
        )
        raw["segments"].append(
            {
                "device": 0,
                "address": address,
                "total_size": size,
                "allocated_size": allocated,
                "active_size": allocated,
                "requested_size": allocated,
                "stream": stream,
                "segment_type": "large",
                "segment_pool_id": (0, i + 1),
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            }
        )
        if stacks is None:
            continue
        base = {"stream": stream, "compile_context": "N/A", "user_metadata": ""}
        entries.append({**base, "action": "segment_alloc", "addr": address, "size": size, "time_us": t, "frames": []})
        for j, frames in enumerate(stacks):
            t += 10
            entries.append(
                {**base, "action": "alloc", "addr": address + j * used, "size": used, "time_us": t, "frames": frames}
            )
    raw["device_traces"][0] = entries + trace
    return raw


def write(tmp_path: Path, name: str, raw: dict) -> str:
    path = tmp_path / f"{name}.pickle"
    path.write_bytes(pickle.dumps(raw))
    return str(path)


def graph_pool_bytes(raw: dict, pool: tuple[int, int]) -> int:
    return sum(s["total_size"] for s in raw["segments"] if tuple(s["segment_pool_id"]) == pool)


def by_pool(diff) -> dict:
    return {(p["before"], p["after"]): p for p in diff.attrs["pool_pairs"]}


def test_the_readme_diff_pairs_and_saves_as_it_always_did():
    diff = diff_tables(segment_table(SEPARATE), segment_table(SHARED), by="label")
    assert README_SAVING in diff_summary(diff)
    assert by_pool(diff)[(0, 1), (0, 1)]["paired_by"] == "id"  # the same id, and captures that overlap
    assert diff.attrs["paired_generated"] == ["stream of capture_first (two_captures.py:44)"]
    done = run_kit("diff", "--by-label", str(SEPARATE), str(SHARED))
    assert done.returncode == 0, done.stderr
    assert README_SAVING in done.stdout.splitlines()
    assert "not names the programs gave: stream of capture_first (two_captures.py:44)" in done.stderr
    assert "paired before's" not in done.stderr  # an id pairing its captures confirm needs no warning


@pytest.mark.parametrize("older_than_the_trace", [False, True], ids=["in_the_trace", "older_than_the_trace"])
def test_a_leftover_pool_numbered_first_is_not_paired_with_the_real_one(tmp_path, older_than_the_trace):
    shared = raw_of(SHARED)
    after_raw = with_leftovers(shared, None if older_than_the_trace else [OLD_FRAMES])
    after = segment_table(load_snapshot(after_raw))
    labels = dict(zip(after["pool"], after["pool_label"], strict=True))
    assert labels[(0, 1)] == "graph pool 1" and labels[(0, 2)] == "graph pool 2"  # the leftover took number 1
    before = segment_table(SEPARATE)
    diff = diff_tables(before, after, by="label")
    truth = graph_pool_bytes(raw_of(SEPARATE), (0, 1)) - graph_pool_bytes(after_raw, (0, 2))
    assert truth == 22 * MIB  # what the README's diff prints: the leftover changes nothing of it
    real = diff[diff["pool_label"] == "graph pool 1 (after: graph pool 2)"]
    assert {tuple(p) for p in real["pool"]} == {(0, 1), (0, 2)}  # after's id where it has the group, else before's
    assert real["reserved_before"].sum() - real["reserved_after"].sum() == truth
    assert by_pool(diff)[(0, 1), (0, 2)]["paired_by"] == "captures"
    leftover = diff[diff["pool_label"] == "graph pool 1 (only after)"]
    assert set(leftover["status"]) == {"added"} and set(leftover["pool"]) == {(0, 1)}
    summary = diff_summary(diff)
    assert "graph pool 1 (after: graph pool 2): 56.00 MiB reserved before, 34.00 MiB after (saved 22.00 MiB)" in summary
    assert not any("saved" in line for line in summary if line.startswith("graph pool 1 (only after)"))

    done = run_kit("diff", "--by-label", str(SEPARATE), write(tmp_path, "after", after_raw))
    assert done.returncode == 0, done.stderr
    assert "(saved 22.00 MiB)" in done.stdout and "saved 48.00 MiB" not in done.stdout  # 56 - the leftover's 8
    warnings = done.stderr.splitlines()
    generated = next(w for w in warnings if "labels the kit generated" in w)
    assert "graph pool 1 (after: graph pool 2)" in generated
    assert "stream of capture_first (two_captures.py:44)" in generated
    assert any("paired before's graph pool 1 (0, 1) with after's graph pool 2 (0, 2) by content" in w for w in warnings)
    assert any("no pool before to pair with after's graph pool 1 (0, 1)" in w for w in warnings)


def test_the_old_pairing_by_number_would_have_printed_a_wrong_saving():
    """The bug's own figures, so the tests above are known to stand on a case that fooled the kit."""
    after_raw = with_leftovers(raw_of(SHARED), [OLD_FRAMES])
    before, after = segment_table(SEPARATE), segment_table(load_snapshot(after_raw))
    first = [t[t["pool_label"] == "graph pool 1"]["reserved"].sum() for t in (before, after)]
    assert first[0] - first[1] == 48 * MIB  # what pairing "graph pool 1" with "graph pool 1" claimed saved


def test_a_leftover_holding_the_same_captures_is_paired_by_id_with_a_warning(tmp_path):
    shared = raw_of(SHARED)
    after_raw = with_leftovers(shared, capture_frames(shared))  # an earlier run of the same program, graphs kept
    frames = pool_frames(load_snapshot(after_raw))
    assert frames[0, (0, 1)] == frames[0, (0, 2)]  # indistinguishable by what went into them
    diff = diff_tables(segment_table(SEPARATE), segment_table(load_snapshot(after_raw)), by="label")
    assert by_pool(diff)[(0, 1), (0, 1)]["paired_by"] == "id"
    done = run_kit("diff", "--by-label", str(SEPARATE), write(tmp_path, "after", after_raw))
    assert done.returncode == 0, done.stderr
    assert (
        "paired before's graph pool 1 (0, 1) with after's graph pool 1 (0, 1) by id; after's graph pool 2 (0, 2) "
        "matches its captures as well: only the id tells them apart"
    ) in done.stderr
    assert "found no pool before to pair with after's graph pool 2 (0, 2)" in done.stderr


def test_two_leftovers_alike_are_told_apart_by_id_and_the_real_pools_pair_by_content(tmp_path):
    before_raw = with_leftovers(raw_of(SEPARATE), [OLD_FRAMES], streams=LEFTOVER_STREAM + 100)  # another process
    after_raw = with_leftovers(raw_of(SHARED), [OLD_FRAMES], [OLD_FRAMES])
    done = run_kit("diff", "--by-label", write(tmp_path, "before", before_raw), write(tmp_path, "after", after_raw))
    assert done.returncode == 0, done.stderr
    assert "graph pool 2 (after: graph pool 3): 56.00 MiB reserved before, 34.00 MiB after (saved 22.00 MiB)" in (
        done.stdout
    )
    assert "after's graph pool 2 (0, 2) matches its captures as well: only the id tells them apart" in done.stderr
    pools = run_kit(
        "diff",
        "--by-label",
        "--pools",
        "--json",
        *(write(tmp_path, n, r) for n, r in (("before", before_raw), ("after", after_raw))),
    )
    rows = {(tuple(r["before"] or ()), tuple(r["after"] or ())): r for r in json.loads(pools.stdout)}
    assert rows[(0, 1), (0, 1)]["paired_by"] == "id"
    assert rows[(0, 2), (0, 3)]["paired_by"] == "captures" and rows[(0, 2), (0, 3)]["saved"] == 22 * MIB
    assert rows[(), (0, 2)]["paired_by"] == "only after" and rows[(), (0, 2)]["saved"] == 0


def test_content_that_matches_two_pools_equally_leaves_the_pool_unpaired_not_refused(tmp_path):
    after_raw = with_leftovers(raw_of(SHARED), [OLD_FRAMES], capture_frames(raw_of(SHARED)))
    diff = diff_tables(segment_table(SEPARATE), segment_table(load_snapshot(after_raw)), by="label")
    assert set(by_pool(diff)) == {
        ((0, 0), (0, 0))
    }  # ids disagree in content, and content cannot tell (0, 2) from (0, 3)
    assert (
        "could not tell which pool after is before's graph pool 1 (0, 1): graph pool 2 (0, 2) and graph pool 3 (0, 3) "
        "match it equally (the same captures"
    ) in " ".join(diff.attrs["pairing_notes"])
    assert not any("saved" in line or "cost" in line for line in diff_summary(diff) if "graph pool" in line)
    done = run_kit("diff", "--by-label", str(SEPARATE), write(tmp_path, "after", after_raw))
    assert done.returncode == 0 and "no pool after pairs with it" in done.stdout, done.stderr


def test_leftovers_on_one_side_only_stay_there_and_the_real_pools_pair():
    after_raw = with_leftovers(raw_of(SHARED), [OLD_FRAMES], [OLD_FRAMES])
    diff = diff_tables(segment_table(SEPARATE), segment_table(load_snapshot(after_raw)), by="label")
    assert set(by_pool(diff)) == {((0, 0), (0, 0)), ((0, 1), (0, 3))}
    leftovers = diff[diff["pool_label"].isin(["graph pool 1 (only after)", "graph pool 2"])]
    assert set(leftovers["status"]) == {"added"} and set(leftovers["pool"]) == {(0, 1), (0, 2)}
    assert "graph pool 1 (after: graph pool 3): 56.00 MiB reserved before, 34.00 MiB after (saved 22.00 MiB)" in (
        diff_summary(diff)
    )


def test_a_pool_of_another_role_is_not_paired():
    after_raw = raw_of(SHARED)
    for s in after_raw["segments"]:
        if tuple(s["segment_pool_id"]) == (0, 1):
            s["segment_pool_id"] = (1, 0)  # a capture's private pool, not a graph_pool_handle() one
    diff = diff_tables(segment_table(SEPARATE), segment_table(load_snapshot(after_raw)), by="label")
    assert set(by_pool(diff)) == {((0, 0), (0, 0))}
    assert set(diff[diff["pool"] == (1, 0)]["status"]) == {"added"}


def test_without_a_trace_pools_pair_by_id_and_say_nothing_confirms_it():
    def traceless(raw: dict) -> dict:
        return {**raw, "device_traces": [[]]}

    before_raw, after_raw = traceless(raw_of(SEPARATE)), traceless(raw_of(SHARED))
    diff = diff_tables(segment_table(load_snapshot(before_raw)), segment_table(load_snapshot(after_raw)), by="label")
    assert by_pool(diff)[(0, 1), (0, 1)]["paired_by"] == "id"
    assert README_SAVING in diff_summary(diff)
    assert any("by id alone, with no allocation frames" in note for note in diff.attrs["pairing_notes"])
    moved = traceless(with_leftovers(raw_of(SHARED), None))  # the real pool now (0, 2); nothing tells them apart
    diff = diff_tables(segment_table(load_snapshot(before_raw)), segment_table(load_snapshot(moved)), by="label")
    assert by_pool(diff)[(0, 1), (0, 1)]["paired_by"] == "id"  # ids agree: never refused


def test_a_snapshot_diffed_with_itself_pairs_every_pool_with_itself():
    raw = with_leftovers(raw_of(SHARED), capture_frames(raw_of(SHARED)))  # two pools alike in content
    table = segment_table(load_snapshot(raw))
    diff = diff_tables(table, table, by="label")
    assert set(diff["status"]) == {"same"}
    assert {p["paired_by"] for p in diff.attrs["pool_pairs"] if p["before"] != (0, 0)} == {"same pool"}


def graph_pools(raw: dict) -> dict[str, tuple[int, int]]:
    """Each graph of a recorded workload and its pool, as the recorder's `kit` key names them."""
    return {graph: tuple(pool) for graph, pool in raw["kit"]["graphs"].items()}


@pytest.mark.parametrize("name", MERGED_PAIRS)
def test_recorded_runs_where_work_moved_pair_every_pool_as_its_graphs_say(name):
    before_raw, after_raw = raw_of(MERGED / f"{name}.pickle"), raw_of(MERGED / f"{name}_merged.pickle")
    before, after = segment_table(load_snapshot(before_raw)), segment_table(load_snapshot(after_raw))
    held = set(before["pool"]) & set(after["pool"])  # a graph whose pool holds no segment is in no table
    truth = {(graph_pools(before_raw)[g], graph_pools(after_raw)[g]) for g in graph_pools(before_raw)}
    truth = {(b, a) for b, a in truth if b in held and a in held}
    assert len(truth) >= 4
    for by in ("stream", "label"):
        diff = diff_tables(before, after, by=by)
        assert truth <= set(by_pool(diff)), by
        assert set(diff.attrs["pool_pairs"][0].keys()) >= {"before", "after", "paired_by"}
        assert not any("no pool" in line for line in diff_summary(diff))
        summary = {(tuple(r.before), tuple(r.after)): r for r in pool_summary(diff).itertuples()}
        for b, a in truth:
            assert summary[b, a].reserved_before == graph_pool_bytes(before_raw, b)
            assert summary[b, a].reserved_after == graph_pool_bytes(after_raw, a)


def test_the_recorded_pairs_renumber_pools_so_pairing_by_number_would_have_been_wrong():
    """The bug's own condition, on the recordings above: labels moved, and a label-grouped summary lied."""
    moved = 0
    for name in MERGED_PAIRS:
        tables = [segment_table(MERGED / f"{name}{s}.pickle") for s in ("", "_merged")]
        labels = [dict(zip(t["pool"], t["pool_label"], strict=True)) for t in tables]
        moved += sum(labels[0][p] != labels[1][p] for p in labels[0] if p in labels[1])
    assert moved >= 10
    before, after = (segment_table(MERGED / f"merged_100{s}.pickle") for s in ("", "_merged"))
    by_number = [t[t["pool_label"] == "graph pool 1"]["reserved"].sum() for t in (before, after)]
    assert by_number[0] - by_number[1] == 22 * MIB  # (2, 0) before, (1, 0) after: 96 vs 74 MiB, no change at all
    diff = diff_tables(before, after, by="label")
    assert {r.saved for r in pool_summary(diff).itertuples() if r.before[0] != 0} == {0}

"""Segment-by-stream tables and diffs, on synthetic snapshots and the recorded fixtures."""

from __future__ import annotations

import collections
import json
import re

from kit import diff_tables, format_bytes, load_snapshot, segment_table, style_table
from kit.analysis.tables import FIGURES
from kit.load.unpickle import safe_unpickle

from .helpers import MIB, RECORDED, run_kit
from .hostile import MODULE_LABEL, hostile_snapshot, raw_markup


def independent_grouping(raw: dict) -> dict:
    """The (pool, stream) figures computed straight from the raw dict, without the kit."""
    groups = collections.defaultdict(lambda: collections.Counter())
    largest = collections.defaultdict(int)
    for s in raw["segments"]:
        key = (tuple(s["segment_pool_id"]), s["stream"])
        g = groups[key]
        g["segments"] += 1
        g["reserved"] += s["total_size"]
        g["allocated"] += s["allocated_size"]
        g["active"] += s["active_size"]
        for b in s["blocks"]:
            if b["state"] == "inactive":
                g["free"] += b["size"]
                largest[key] = max(largest[key], b["size"])
    return {k: dict(v, largest_free=largest[k]) for k, v in groups.items()}


def test_table_json_matches_independent_grouping(recorded_path):
    done = run_kit("table", str(recorded_path), "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    expected = independent_grouping(safe_unpickle(recorded_path.read_bytes()))
    got = {(tuple(r["pool"]), r["stream"]): {k: r[k] for k in FIGURES} for r in rows}
    assert got == {k: {f: v.get(f, 0) for f in got[k]} for k, v in expected.items()}
    assert all(isinstance(r["pool"], list) and len(r["pool"]) == 2 for r in rows)


def test_synthetic_table(synthetic):
    table = segment_table(synthetic)
    assert list(table.columns[:9]) == ["device", "pool", "stream", *FIGURES]
    by_stream = table.set_index("stream")
    assert by_stream.loc[9, "segments"] == 2
    assert by_stream.loc[9, "reserved"] == 34 * MIB
    assert by_stream.loc[9, "free"] == 32 * MIB - 512
    assert by_stream.loc[9, "largest_free"] == 30 * MIB
    assert by_stream.loc[9, "active"] - by_stream.loc[9, "allocated"] == 512
    assert by_stream.loc[0, "pool_label"] == "default pool"
    assert by_stream.loc[7, "pool_label"] == "graph pool 1"
    assert {by_stream.loc[7, "stream_label"], by_stream.loc[9, "stream_label"]} == {"stream A", "stream B"}


def test_names_override_labels(synthetic):
    table = segment_table(synthetic, stream_names={9: "replay graphs stream"}, pool_names={(0, 1): "global pool"})
    row = table[table["stream"] == 9].iloc[0]
    assert (row["stream_label"], row["pool_label"]) == ("replay graphs stream", "global pool")


def test_diff_marks_added_removed_and_changed(synthetic):
    before = segment_table(synthetic)
    after_raw = json.loads(json.dumps(synthetic))
    after_raw["segments"] = after_raw["segments"][:2]  # stream 9 vanishes
    after_raw["segments"][1]["blocks"][1]["state"] = "active_allocated"
    after_raw["segments"][1]["allocated_size"] = after_raw["segments"][1]["active_size"] = 20 * MIB
    diff = diff_tables(before, segment_table(after_raw)).set_index("stream")
    assert diff.loc[9, "status"] == "removed"
    assert diff.loc[9, "reserved"] == -34 * MIB
    assert diff.loc[7, "status"] == "changed"
    assert diff.loc[7, "allocated"] == 12 * MIB and diff.loc[7, "free"] == -12 * MIB
    assert diff.loc[0, "status"] == "same"
    back = diff_tables(segment_table(after_raw), before).set_index("stream")
    assert back.loc[9, "status"] == "added"


def test_styler_renders_bytes_readably(synthetic):
    html = style_table(segment_table(synthetic)).to_html()
    assert "34.00 MiB" in html and "source: recorded snapshot" in html
    assert format_bytes(5.18 * 1024**3) == "5.18 GiB" and format_bytes(-2 * MIB) == "-2.00 MiB"


def test_styler_headers_are_words_while_the_table_keeps_its_column_names(synthetic):
    table = segment_table(synthetic)
    headers = re.findall(r'<th [^>]*class="col_heading[^"]*"[^>]*>([^<]*)</th>', style_table(table).to_html())
    assert headers[:3] == ["device", "pool id", "stream id"] and "largest free" in headers, headers
    assert headers[-2:] == ["pool", "stream"] and not [h for h in headers if "_" in h], headers
    assert "largest_free" in table.columns and "stream_label" in table.columns  # the API's names


def test_styler_shows_the_snapshots_markup_as_text_also_after_a_callers_format():
    table = segment_table(load_snapshot(hostile_snapshot()))
    table.insert(0, "<i>column</i>", 1)
    styled = style_table(table)
    for html in (styled.to_html(), styled.format({"stream": str}).to_html()):  # a dict resets the other columns
        assert not raw_markup(html) and "<i>column" not in html, raw_markup(html)
        assert "<td" in html and "stream of &lt;module&gt; (file.py:46)" in html and "&lt;i&gt;column" in html
        assert "source: recorded on &lt;svg onload=" in html and "&lt;script&gt;window.__pwned=2" in html
    assert MODULE_LABEL in set(styled.data["stream_label"])  # the data stays as the snapshot gives it


def _graph_pool_groups(name: str):
    snap = load_snapshot(RECORDED[name])
    pool = tuple(snap.kit["pools"]["global graph pool"])
    table = segment_table(snap)
    return snap, pool, table[table["pool"] == pool]


def _segments_added_by(snap, capture: dict, pool) -> list[int]:
    """Graph-pool segments whose segment_alloc falls inside the capture's trace window."""
    pool_addresses = {s.address for s in snap.segments if s.segment_pool_id == pool}
    window = snap.traces[0][capture["trace_begin"] : capture["trace_end"]]
    return [e.size for e in window if e.action == "segment_alloc" and e.addr in pool_addresses]


def test_fixture_two_streams_strands_the_replay_capture():
    snap, pool, groups = _graph_pool_groups("two_streams")
    streams = snap.kit["streams"]
    assert len(groups) == 2
    assert set(groups["stream"]) == {streams["model graphs stream"], streams["replay graphs stream"]}
    replay = groups[groups["stream"] == streams["replay graphs stream"]].iloc[0]
    assert replay["stream_label"] == "replay graphs stream"
    assert replay["reserved"] > 0 and replay["free"] > 0.5 * replay["reserved"]
    replay_capture = snap.kit["captures"][1]
    assert sum(_segments_added_by(snap, replay_capture, pool)) == replay["reserved"]


def test_fixture_shared_stream_adds_no_graph_pool_segment():
    snap, pool, groups = _graph_pool_groups("shared_stream")
    assert len(groups) == 1
    assert groups.iloc[0]["stream"] == snap.kit["streams"]["model graphs stream"]
    model_capture, replay_capture = snap.kit["captures"]
    assert _segments_added_by(snap, model_capture, pool)
    assert _segments_added_by(snap, replay_capture, pool) == []


def test_fixtures_differ_by_the_replay_streams_pool(tmp_path):
    two = _graph_pool_groups("two_streams")[2]
    shared = _graph_pool_groups("shared_stream")[2]
    assert two["reserved"].sum() > shared["reserved"].sum()


def test_diff_by_label_matches_streams_across_processes():
    two = segment_table(load_snapshot(RECORDED["two_streams"]))
    shared = segment_table(load_snapshot(RECORDED["shared_stream"]))
    by_id = diff_tables(two, shared)
    assert set(by_id["status"]) == {"added", "removed", "same"}  # different processes, different stream ids
    diff = diff_tables(two, shared, by="label").set_index(["pool_label", "stream_label"])
    assert diff.loc[("global graph pool", "replay graphs stream"), "status"] == "removed"
    replay_reserved = two[two["stream_label"] == "replay graphs stream"]
    assert (
        diff.loc[("global graph pool", "replay graphs stream"), "reserved"]
        == -replay_reserved[replay_reserved["pool_label"] == "global graph pool"]["reserved"].sum()
    )
    assert diff.loc[("global graph pool", "model graphs stream"), "reserved"] == 0
    assert diff.loc[("default pool", "default stream"), "status"] == "same"


def test_cli_diff_by_label_json():
    done = run_kit("diff", str(RECORDED["two_streams"]), str(RECORDED["shared_stream"]), "--by-label", "--json")
    assert done.returncode == 0, done.stderr
    rows = {(r["pool_label"], r["stream_label"]): r for r in json.loads(done.stdout)}
    assert rows[("global graph pool", "replay graphs stream")]["status"] == "removed"
    assert rows[("global graph pool", "replay graphs stream")]["reserved"] < 0


def test_an_empty_snapshots_table_says_so_in_a_line_not_pandas_empty_dataframe(tmp_path, capsys):
    """Issue 27: no segments printed "Empty DataFrame" and pandas' column list; --json prints []."""
    import pickle

    from kit.cli import NO_SEGMENTS, main

    for name, raw in {"empty": {"segments": []}, "empty_with_trace": {"segments": [], "device_traces": [[]]}}.items():
        path = tmp_path / f"{name}.pickle"
        path.write_bytes(pickle.dumps(raw))
        assert main(["table", str(path)]) == 0
        out, err = capsys.readouterr()
        assert out.splitlines() == [f"source: recorded snapshot ({path})", NO_SEGMENTS] and err == ""
        assert NO_SEGMENTS == "no segments: the allocator held no memory when this snapshot was taken"
        assert main(["table", str(path), "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == []
    done = run_kit("table", str(path))  # in a process of its own too
    assert (done.returncode, done.stderr) == (0, "") and "Empty DataFrame" not in done.stdout


def test_unnamed_graph_pools_are_numbered_without_gaps_and_listed_in_natural_order():
    """A workload's named pools (p0, p1) take no number: the others are graph pool 1, 2, ... in the order they
    were made, and the list of made-up labels reads 2 before 10."""
    from kit.analysis.names import natural_order, pool_labels, pool_order
    from kit.load.snapshot import load_snapshot
    from kit.recordings import RECORDINGS

    snap = load_snapshot(str(RECORDINGS / "expandable" / "expandable_305_expandable.pickle"))  # 11 unnamed pools
    labels = pool_labels(snap)
    unnamed = [labels[p] for p in pool_order(snap) if p not in snap.pool_names]
    assert len(unnamed) >= 10 and unnamed == [f"graph pool {n}" for n in range(1, len(unnamed) + 1)]
    assert {labels[p] for p in snap.pool_names} == set(snap.pool_names.values())  # named pools keep their names
    listed = [x for x in segment_table(snap).attrs["generated_labels"] if x.startswith("graph pool")]
    assert listed == sorted(listed, key=natural_order) and listed.index("graph pool 2") < listed.index("graph pool 10")
    assert sorted(["graph pool 10", "graph pool 2", "graph pool 1"], key=natural_order) == [
        "graph pool 1", "graph pool 2", "graph pool 10",
    ]  # fmt: skip


def test_streams_with_no_frame_to_name_them_come_with_a_hint_to_record_frames(tmp_path):
    import pickle

    from kit.recordings import RECORDINGS
    from kit.show.report import write_report

    path = RECORDINGS / "plain" / "two_captures_separate.pickle"
    raw = safe_unpickle(path.read_bytes())
    for entry in raw["device_traces"][0]:
        entry["frames"] = []  # recorded with stacks off: nothing names the capture streams
    bare = tmp_path / "bare.pickle"
    bare.write_bytes(pickle.dumps(raw))
    done = run_kit("table", str(bare))
    assert done.returncode == 0, done.stderr
    hint = next(line for line in done.stdout.splitlines() if line.startswith("hint: "))
    assert hint.startswith("hint: stream A, stream B: no stack frame in the trace names them")
    assert "_record_memory_history(stacks='python')" in hint
    assert "hint:" not in run_kit("table", str(path)).stdout  # frames recorded: every stream is named by one
    write_report(load_snapshot(bare), tmp_path / "bare.html")
    assert "no stack frame in the trace names them" in (tmp_path / "bare.html").read_text()

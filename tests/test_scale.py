"""Scale: the generator of large snapshots, and the columnar code against the per-row code.

Correctness first: every vectorised table and figure must equal what the
per-row implementations they replaced give (tests/rowwise.py), and the
columnar walk (`kit.analysis.trace.columnar`) what the walk entry by entry gives
(`kit.analysis.trace.rows.walk_rows`), on every recorded fixture, on traces cut to start
mid-process, on a generated snapshot, and on inconsistent traces that take
the walk's slow paths.
"""

from __future__ import annotations

import gc
import html
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import kit.load.columns
import kit.load.rows
import kit.load.unpickle
from kit import KitError, Snapshot, load_snapshot
from kit.analysis.tables import segment_table, stream_labels
from kit.analysis.trace import forward
from kit.analysis.trace.columnar import _holders
from kit.analysis.trace.columnar import walk_columns as fast_walk
from kit.analysis.trace.reports import reuse_table, stranding_report
from kit.analysis.trace.rows import walk_rows as _walk_rows
from kit.analysis.trace.walk import walk_trace
from kit.load.columns import _record_columns
from kit.scale import scale_snapshot, summary, write_scale_snapshot
from kit.show.pictures import segment_map_figure

from . import rowwise
from .helpers import FIXTURES, MIB, segment

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_FILES = sorted(FIXTURES.rglob("*.pickle"))
SMALL = 0.02  # of the benchmark's snapshot: about 1,000 segments and 40,000 events


@pytest.fixture(scope="module")
def generated() -> dict:
    return scale_snapshot(seed=1, scale=SMALL)


# -- the generator -------------------------------------------------------------


def test_generator_meets_its_counts_at_small_scale(generated):
    counts = summary(generated)
    # The module's promise: at scale 1 at least 50,000 segments, 500,000 blocks, 2,000,000 events, linearly.
    assert counts["segments"] >= 50_000 * SMALL
    assert counts["blocks"] >= 500_000 * SMALL
    assert counts["events"] >= 2_000_000 * SMALL
    assert counts["streams"] >= 4 and counts["pools"] >= 3


def test_generator_is_deterministic(generated):
    assert pickle.dumps(scale_snapshot(seed=1, scale=SMALL)) == pickle.dumps(generated)
    assert summary(scale_snapshot(seed=2, scale=SMALL)) != summary(generated)


def test_generated_snapshot_loads_tabulates_and_replays(generated, tmp_path):
    path = tmp_path / "scale.pickle"
    info = write_scale_snapshot(path, seed=1, scale=SMALL)
    assert info["bytes"] == path.stat().st_size and info["segments"] == len(generated["segments"])
    snap = load_snapshot(path)
    assert snap.raw == generated
    assert snap.columns.records is None  # torch-shaped: the bulk checks accepted every row
    table = segment_table(snap)
    assert table["reserved"].sum() == sum(s["total_size"] for s in generated["segments"])
    assert table["segments"].sum() == len(generated["segments"])
    walk = walk_trace(snap)
    assert walk.mismatches == []  # the walk ends exactly at the snapshot
    reuse = reuse_table(snap, walk).set_index("stream_label")
    # The replay graphs capture into the model graphs' pool on their own stream: PR 63155's stranding.
    assert reuse.loc["replay graphs stream", "stranded_bytes"] > 0
    assert len(walk.allocs) == sum(e["action"] == "alloc" for e in generated["device_traces"][0])


def test_generated_frames_are_shared_as_torch_shares_them(generated):
    frames = [f for e in generated["device_traces"][0] for f in e["frames"]]
    assert len(frames) > 10 * len({id(f) for f in frames})
    assert all(type(e["time_us"]) is int and e["compile_context"] == "N/A" for e in generated["device_traces"][0])


# -- columns against records -----------------------------------------------------


def _cut(raw: dict, start: int) -> dict:
    """The same snapshot with its trace starting at entry `start` (mid-process)."""
    return {**raw, "device_traces": [raw["device_traces"][0][start:]]}


def _cases(generated: dict) -> list[tuple[str, dict]]:
    cases = [(str(p.relative_to(FIXTURES)), load_snapshot(p).raw) for p in FIXTURE_FILES]
    for name, raw in list(cases[:3]) + [("generated", generated)]:
        events = len(raw["device_traces"][0])
        cases += [(f"{name}@{events // 3}", _cut(raw, events // 3)), (f"{name}@{events // 2}", _cut(raw, events // 2))]
    return cases + [("generated", generated)]


def test_segment_columns_equal_the_records(generated):
    for name, raw in _cases(generated):
        snap = Snapshot(raw)
        fast = vars(snap.columns)
        slow = _record_columns(snap.segments)
        for key, value in slow.items():
            assert np.array_equal(fast[key], value), (name, key)


def test_trace_columns_equal_the_entries(generated):
    for name, raw in _cases(generated):
        snap = Snapshot(raw)
        for device, entries in snap.traces.items():
            tc = snap.trace_columns[device]
            assert [kit.load.rows.TRACE_ACTIONS[a] for a in tc.action] == [e.action for e in entries], name
            for column in ("addr", "size", "stream", "time_us"):
                assert tc.__dict__[column].tolist() == [getattr(e, column) for e in entries], (name, column)
            assert [f if type(f) is list else [] for f in tc.frames] == [e.frames for e in entries], name


def _segment_columns_frame(snap: Snapshot) -> pd.DataFrame:
    """The snapshot's per-segment columns, laid out as `rowwise.segment_frame` builds them from the records."""
    c = snap.columns
    return pd.DataFrame(
        {
            "device": c.device,
            "pool": c.pools(),
            "stream": c.stream,
            "address": c.address,
            "reserved": c.total_size,
            "allocated": c.allocated_size,
            "active": c.active_size,
            "free": c.free,
            "largest_free": c.largest_free,
            "segment_type": np.where(c.small, "small", "large").astype(object),
        }
    )


def test_tables_equal_the_per_row_tables(generated):
    for name, raw in _cases(generated):
        snap = Snapshot(raw)
        pd.testing.assert_frame_equal(_segment_columns_frame(snap), rowwise.segment_frame(snap), obj=name)
        new, old = segment_table(snap), rowwise.segment_table(snap)
        pd.testing.assert_frame_equal(new, old, obj=name)
        assert new.attrs["source"] == old.attrs["source"]
        assert stream_labels(snap) == rowwise.stream_labels(snap)


def _same_replay(snap: Snapshot, name: str) -> None:
    new, old = fast_walk(snap), _walk_rows(snap, 0)
    if any(s.is_expandable for s in snap.segments):  # the columns leave expandable traces to the row walk
        assert new is None, name
        return
    pd.testing.assert_frame_equal(new.allocs, old.allocs, obj=name)
    pd.testing.assert_frame_equal(new.new_segments, old.new_segments, obj=name)
    assert (new.mismatches, new.rewound_segments, new.device) == (old.mismatches, old.rewound_segments, old.device)
    pd.testing.assert_frame_equal(reuse_table(snap, new), reuse_table(snap, old), obj=name)
    pd.testing.assert_frame_equal(stranding_report(snap, new), stranding_report(snap, old), obj=name)


@pytest.fixture(params=["plain", "compiled"])
def forward_pass(request, monkeypatch) -> str:
    """The forward pass as a short trace runs it (plain Python) and as a long one does (compiled by numba)."""
    if request.param == "compiled":
        monkeypatch.setattr(forward, "JIT_EVENTS", 0)
        assert forward._kernel(1, True) is not forward._walk  # numba is installed with the kit: it compiled
    return request.param


def test_walk_equals_the_per_row_walk(generated, forward_pass):
    stranded = 0
    for name, raw in _cases(generated):
        snap = Snapshot(raw)
        if snap.has_trace:
            _same_replay(snap, name)
            stranded += (walk_trace(snap).allocs["served"] == "stranded").sum()
            assert walk_trace(snap).allocs["frames"].map(type).eq(list).all()
    assert stranded > 100  # the stranded search, ties and all, was exercised


def _bars(figure) -> dict:
    """A segment map's bars and text: what the per-row reference computes. Colours, swatches and the legend's
    place are the figure's styling, drawn since the rewrite (tests/test_show.py and the browser test check it)."""
    drawn = figure.to_dict()
    # Names are escaped for plotly's HTML ("estimate's" as "estimate&#x27;s"); the reference does not escape.
    data = [{k: html.unescape(v) if k == "name" else v for k, v in t.items() if k != "marker"} for t in drawn["data"]]
    layout = {k: v for k, v in drawn["layout"].items() if k not in ("template", "legend", "height", "margin")}
    return {"data": data, "layout": layout, "legend title": drawn["layout"]["legend"]["title"]["text"]}


def test_segment_map_equals_the_per_row_figure(generated):
    for name, raw in _cases(generated)[: len(FIXTURE_FILES)] + [("generated", generated)]:
        snap = Snapshot(raw)
        for cap in (2000, 3):
            new = segment_map_figure(snap, max_segments=cap, max_bars=10**9)
            assert _bars(new) == _bars(rowwise.segment_map_figure(snap, max_segments=cap)), name


# -- inconsistent traces: the walk's slow paths ----------------------------------------


def _trace(*events: tuple) -> list[dict]:
    return [
        {"action": a, "addr": addr, "size": size, "stream": stream, "time_us": i, "frames": []}
        for i, (a, addr, size, stream) in enumerate(events)
    ]


BASE = 0x7F00_0000_0000


def _reused_addresses() -> dict:
    """A 40 MiB segment, freed; then ten 2 MiB segments inside its old range, one after another."""
    events = [("segment_alloc", BASE, 40 * MIB, 0), ("alloc", BASE + 30 * MIB, MIB, 0)]
    events += [("free_requested", BASE + 30 * MIB, MIB, 0), ("free_completed", BASE + 30 * MIB, MIB, 0)]
    events += [("alloc", BASE, MIB, 0), ("free_completed", BASE, MIB, 0), ("segment_free", BASE, 40 * MIB, 0)]
    for i in range(1, 11):
        at = BASE + 2 * i * MIB
        events += [("segment_alloc", at, 2 * MIB, 0), ("alloc", at, 4096, 0), ("free_completed", at, 4096, 0)]
        events += [("segment_free", at, 2 * MIB, 0)]
    # Before all that, an allocation in the big segment: its address lies under ten later starts.
    events.insert(2, ("alloc", BASE + 36 * MIB, MIB, 7))
    return {"segments": [], "device_traces": [_trace(*events)]}


def _overlapping() -> dict:
    """Two live segments overlap (no allocator makes this): every lookup falls back to the search."""
    events = [
        ("segment_alloc", BASE, 4 * MIB, 0),
        ("segment_alloc", BASE + 2 * MIB, 2 * MIB, 9),
        ("alloc", BASE + 2 * MIB, 4096, 9),
        ("alloc", BASE, 4096, 0),
        ("free_completed", BASE, 4096, 0),
        ("segment_alloc", BASE, 2 * MIB, 0),  # and one replaces another at the same address
        ("alloc", BASE, 512, 0),
    ]
    final = [segment(BASE, [(512, "active_allocated"), (2 * MIB - 512, "inactive")])]
    return {"segments": final, "device_traces": [_trace(*events)]}


def _replaced_in_place() -> dict:
    """A segment_alloc over a live segment takes its place in the walk's order: it wins a tie with a later one."""
    events = [("segment_alloc", BASE, 2 * MIB, 1), ("segment_alloc", BASE + 4 * MIB, 2 * MIB, 2)]
    events += [("segment_alloc", BASE, 2 * MIB, 1)]  # over the live one, as no allocator does
    events += [("segment_alloc", BASE + 8 * MIB, 2 * MIB, 3), ("alloc", BASE + 8 * MIB, 2 * MIB, 3)]
    final = [segment(BASE, [(2 * MIB, "inactive")]), segment(BASE + 4 * MIB, [(2 * MIB, "inactive")])]
    final += [segment(BASE + 8 * MIB, [(2 * MIB, "active_allocated")])]
    return {"segments": final, "device_traces": [_trace(*events)]}


@pytest.mark.parametrize(
    "make", [_reused_addresses, _overlapping, _replaced_in_place], ids=["address-reuse", "overlap", "replaced"]
)
def test_inconsistent_traces_take_the_search_and_agree(make, forward_pass, monkeypatch):
    snap = Snapshot(make())
    seen = []
    placed = "kit.analysis.trace.columnar._holders"
    monkeypatch.setattr(placed, lambda *a: (h := _holders(*a), seen.append(h.copy()))[0])
    _same_replay(snap, make.__name__)
    assert (seen[0] == -2).any()  # left to the search, which then placed them as the old walk did
    if make is _replaced_in_place:  # of two equal free segments, the one in the replaced segment's place
        assert walk_trace(snap).allocs["other_block"].tolist() == [BASE]


def test_without_numba_a_long_trace_is_walked_plainly(generated, monkeypatch):
    monkeypatch.setitem(sys.modules, "numba", None)  # `import numba` fails, as on the bare GPU machine
    monkeypatch.setattr(forward, "_compiled", None)
    monkeypatch.setattr(forward, "JIT_EVENTS", 0)
    assert forward._kernel(1, True) is forward._walk
    _same_replay(Snapshot(generated), "generated")


def test_expandable_segments_are_walked_entry_by_entry():
    events = [("segment_map", BASE, 2 * MIB, 0), ("alloc", BASE, 4096, 0), ("segment_map", BASE + 2 * MIB, 2 * MIB, 0)]
    events += [("alloc", BASE + 4096, 3 * MIB, 0)]
    # Under expandable_segments:True every pool splits as the small pool does: the 3 MiB block leaves the rest free.
    final = [segment(BASE, [(4096, "active_allocated"), (3 * MIB, "active_allocated"), (MIB - 4096, "inactive")])]
    final[0]["is_expandable"] = True
    snap = Snapshot({"segments": final, "device_traces": [_trace(*events)]})
    assert fast_walk(snap) is None
    walk = walk_trace(snap)
    assert list(walk.allocs["served"]) == ["new_segment", "new_segment"] and walk.mismatches == []


# -- loading -------------------------------------------------------------------------


def _mutations() -> list:
    def strip_block_keys(raw):  # older torch: blocks without address or requested_size
        for s in raw["segments"]:
            for b in s["blocks"]:
                b.pop("address"), b.pop("requested_size")

    def strip_segment_keys(raw):
        for s in raw["segments"]:
            for key in ("device", "allocated_size", "active_size", "requested_size", "stream", "segment_type"):
                s.pop(key)

    def odd_requested(raw):
        raw["segments"][0]["blocks"][0]["requested_size"] = True

    def bool_size(raw):
        raw["segments"][0]["blocks"][0]["size"] = True

    def float_address(raw):
        raw["segments"][1]["address"] = float(raw["segments"][1]["address"])

    def gap_between_blocks(raw):
        next(s for s in raw["segments"] if len(s["blocks"]) > 1)["blocks"][1]["address"] += 512

    def none_stream(raw):
        raw["segments"][0]["stream"] = None

    def odd_segment_type(raw):
        raw["segments"][0]["segment_type"] = ["small"]

    def pool_of_three(raw):
        raw["segments"][0]["segment_pool_id"] = (0, 1, 2)

    def float_trace_size(raw):
        raw["device_traces"][0][3]["size"] = 1.5

    def no_trace_stream(raw):
        for e in raw["device_traces"][0]:
            e.pop("stream")

    def oom_entry(raw):
        raw["device_traces"][0].append({"action": "oom", "size": 8, "device_free": 0, "stream": 0})

    def oom_bool_free(raw):
        raw["device_traces"][0].append({"action": "oom", "size": 8, "device_free": True})

    # Past what the bulk checks take: the row parser decides, whatever it decides.
    def huge_size(raw):
        s = raw["segments"][0]
        s["total_size"] = s["blocks"][0]["size"] = s["allocated_size"] = s["active_size"] = 1 << 55

    def negative_requested(raw):
        raw["segments"][0]["blocks"][0]["requested_size"] = -5

    def overlapping_segments(raw):
        raw["segments"][1]["address"] = raw["segments"][0]["address"] + 512
        for b in raw["segments"][1]["blocks"]:
            b.pop("address")

    def negative_pool(raw):
        raw["segments"][0]["segment_pool_id"] = (-1, 0)

    def far_device(raw):
        raw["segments"][0]["device"] = 5000

    def annotation(raw):
        raw["device_traces"][0][2]["action"] = "annotate"

    def unknown_action(raw):
        raw["device_traces"][0][2]["action"] = "a newer torch's action"

    def huge_device_free(raw):
        raw["device_traces"][0][2]["device_free"] = 1 << 70

    return [
        strip_block_keys,
        strip_segment_keys,
        odd_requested,
        bool_size,
        float_address,
        gap_between_blocks,
        none_stream,
        odd_segment_type,
        pool_of_three,
        float_trace_size,
        no_trace_stream,
        oom_entry,
        oom_bool_free,
        huge_size,
        negative_requested,
        overlapping_segments,
        negative_pool,
        far_device,
        annotation,
        unknown_action,
        huge_device_free,
    ]


@pytest.mark.parametrize("mutate", _mutations(), ids=lambda f: f.__name__)
def test_bulk_checks_accept_and_refuse_what_the_row_parser_does(recorded_path, mutate):
    raw = pickle.loads(pickle.dumps(load_snapshot(recorded_path).raw))
    mutate(raw)
    try:
        records = tuple(kit.load.rows.parse_segment(s, f"x: segment {i}") for i, s in enumerate(raw["segments"]))
        kit.load.rows.check_no_overlap(records, "x")
        entries = [kit.load.rows.parse_trace_entry(e, 0, "x", i) for i, e in enumerate(raw["device_traces"][0])]
    except KitError as e:
        with pytest.raises(KitError) as got:
            Snapshot(raw, origin="x")
        assert str(got.value) == str(e)
        return
    snap = Snapshot(raw, origin="x")
    for key, value in _record_columns(records).items():
        assert np.array_equal(vars(snap.columns)[key], value), key
    assert snap.trace_columns[0].size.tolist() == [e.size for e in entries]


def test_streamed_pickle_loads_as_bytes_do(recorded_path):
    assert load_snapshot(recorded_path).raw == pickle.loads(recorded_path.read_bytes())


def test_a_large_load_leaves_the_collector_on_and_its_objects_frozen(tmp_path, monkeypatch):
    path = tmp_path / "snap.pickle"
    entries = [{"action": "alloc", "frames": []} for _ in range(5000)]  # 10,000 containers the collector tracks
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}))
    monkeypatch.setattr(kit.load.unpickle, "FREEZE_ABOVE", 1000)
    frozen = gc.get_freeze_count()
    try:
        load_snapshot(path)
        assert gc.isenabled() and gc.get_freeze_count() >= frozen + 5000
    finally:
        gc.unfreeze()


def test_segment_map_never_sends_more_than_its_bars():
    runs = [(4096, "active_allocated")] * 3 + [(4096, "inactive")]  # 4 blocks, 2 runs
    raw = {
        "segments": [
            segment(BASE + i * 4 * MIB, runs * 20 + [(4 * MIB - 327680, "active_allocated")]) for i in range(300)
        ]
    }
    blocks, merged_bars = 300 * 81, 300 * 41
    assert sum(len(t.x) for t in segment_map_figure(raw, max_bars=blocks).data) == blocks
    merged = segment_map_figure(raw, max_bars=blocks - 1)  # merging runs is enough: nothing left out
    assert sum(len(t.x) for t in merged.data) == merged_bars
    assert "one bar" in merged.layout.title.text and "not drawn" not in merged.layout.title.text
    assert any(text.startswith("3 blocks, 12.00 KiB allocated") for t in merged.data for text in t.hovertext)
    capped = segment_map_figure(raw, max_bars=5000)  # and past that, the smallest segments go
    assert 0 < sum(len(t.x) for t in capped.data) <= 5000
    assert "smallest segments not drawn" in capped.layout.title.text


def test_benchmark_runs_on_a_recorded_fixture():
    fixture = FIXTURES / "two_streams.pickle"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/scale.py"), str(fixture), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for figure in ("load", "reopen", "segment table", "reuse analysis", "HTML report", "segsum", "trace_plot"):
        assert figure in done.stdout
    figures = json.loads(done.stdout.splitlines()[-1])  # one JSON object, last
    assert figures["load"].keys() == {"kit", "pickle"} and figures["reopen"].keys() == {"kit"}
    assert figures["table"].keys() == {"kit", "segsum"} and figures["reuse"].keys() == {"kit", "trace_plot"}
    assert figures["report"].keys() == {"kit", "segment_plot"}
    assert figures["peak_gib"].keys() == {"pickle", "load", "reopen", "table", "reuse", "report", "torch"}
    timings = [v for k in ("load", "reopen", "table", "reuse", "report") for v in figures[k].values()]
    assert all(isinstance(v, float) and v > 0 for v in timings + list(figures["peak_gib"].values()))
    assert figures["counts"]["events"] == len(load_snapshot(fixture).trace_columns[0])

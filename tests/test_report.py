"""The HTML report and the figures in it."""

from __future__ import annotations

import re

from kit import group_bar_figure, load_snapshot, segment_map_figure

from .test_tables import run_kit


def test_report_is_self_contained(recorded_path, tmp_path):
    out = tmp_path / "report.html"
    done = run_kit("report", str(recorded_path), "-o", str(out))
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    assert "Plotly.newPlot" in page
    assert not re.search(r"<script[^>]+src=", page), "the page must not fetch scripts"
    snap = load_snapshot(recorded_path)
    assert snap.provenance["gpu"] in page
    for label in snap.kit["streams"]:
        assert label in page
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]  # no temporary left behind


def test_group_bars_sum_to_reserved(recorded_path):
    snap = load_snapshot(recorded_path)
    fig = group_bar_figure(snap)
    total_mib = sum(sum(trace.x) for trace in fig.data)
    assert abs(total_mib * 2**20 - sum(s.total_size for s in snap.segments)) < 1
    assert "source: recorded on NVIDIA" in fig.layout.title.text


def test_segment_map_draws_every_block_by_stream(recorded_path):
    snap = load_snapshot(recorded_path)
    fig = segment_map_figure(snap)
    assert sum(len(t.x) for t in fig.data) == sum(len(s.blocks) for s in snap.segments)
    colours = {t.legendgroup: t.marker.color for t in fig.data}
    assert len(set(colours.values())) == len(colours) == len({s.stream for s in snap.segments})


def test_segment_map_caps_what_it_draws(synthetic):
    fig = segment_map_figure(synthetic, max_segments=2)
    assert len({y for t in fig.data for y in t.y}) == 2
    assert "2 smallest segments not drawn" in fig.layout.title.text

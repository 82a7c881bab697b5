"""The HTML report and the figures in it."""

from __future__ import annotations

import html
import pickle
import re

import plotly.offline
import pytest

from kit import group_bar_figure, load_snapshot, segment_map_figure
from kit.analysis.attribution import capture_attribution
from kit.analysis.trace.reports import reuse_table, stranding_report
from kit.analysis.whatif import what_if
from kit.errors import KitError
from kit.markup import html_text
from kit.show.report import render_report, write_report
from kit.units import format_bytes

from .helpers import MIB, RECORDED
from .hostile import GPU, MODULE_LABEL, POOL_NAME, SCRIPT_LABEL, figure_texts, hostile_snapshot, raw_markup
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


# --- the sections: reuse, verdicts, attribution, what-if, each with its source -------------------


def sections(page: str) -> dict[str, str]:
    """The page's sections by heading: each one's HTML up to the next <h2>."""
    parts = re.split(r"<h2>(.*?)</h2>", page)
    return {html.unescape(title): body for title, body in zip(parts[1::2], parts[2::2], strict=True)}


def text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", fragment))


SECTIONS = {  # heading -> what the section's source line names
    "Allocations reused and new segments per group": "kit.analysis.trace.reports.reuse_table",
    "Stranding verdicts": "kit.analysis.trace.reports.stranding_report",
    "Capture attribution": "kit.analysis.attribution.capture_attribution",
    "What-if: streams mapped onto others": "kit.analysis.whatif.what_if",
}
TWO_STREAMS = RECORDED["two_streams"]


@pytest.fixture(scope="module")
def two_streams_page() -> dict[str, str]:
    return sections(render_report(TWO_STREAMS))


@pytest.mark.parametrize("heading", SECTIONS)
def test_each_new_section_names_what_computed_it_and_the_data_source(two_streams_page, heading):
    snap = load_snapshot(TWO_STREAMS)
    line = re.search(r'<p class="source">(.*?)</p>', two_streams_page[heading])
    assert line, f"{heading}: no source line"
    assert SECTIONS[heading] in line.group(1) and html.escape(snap.source_label) in line.group(1)


def test_the_reuse_table_shows_every_group_in_mib(two_streams_page):
    snap = load_snapshot(TWO_STREAMS)
    table = reuse_table(snap)
    section = text_of(two_streams_page["Allocations reused and new segments per group"])
    stranded = table[table["stranded_bytes"] > 0]
    assert len(stranded) >= 1
    for row in table.itertuples():
        assert row.stream_label in section
        assert format_bytes(row.new_segment_bytes) in section
    for row in stranded.itertuples():
        assert format_bytes(row.stranded_bytes) in section
        assert str(row.stranded_bytes) not in section  # bytes in binary units, not raw


def test_the_verdicts_are_stranding_reports_with_the_stranded_figure(two_streams_page):
    report = stranding_report(load_snapshot(TWO_STREAMS))
    section = text_of(two_streams_page["Stranding verdicts"])
    graph_pool = report[report["pool"] == (0, 1)]
    assert len(graph_pool) == 1 and format_bytes(42 * MIB) in graph_pool["verdict"].iloc[0]  # the replay stream's
    for verdict in report["verdict"]:
        assert verdict in section
    assert re.findall(r"<li>", two_streams_page["Stranding verdicts"]) == ["<li>"] * len(report)


def test_capture_attribution_lists_each_graphs_segments(two_streams_page):
    table = capture_attribution(load_snapshot(TWO_STREAMS))
    section = text_of(two_streams_page["Capture attribution"])
    assert len(table) >= 2
    rows = re.findall(r"<tr>.*?</tr>", two_streams_page["Capture attribution"], flags=re.S)
    assert len(rows) == len(table) + 1  # the header
    for row, html_row in zip(table.itertuples(), rows[1:], strict=True):
        cells = text_of(html_row)
        assert row.graph in cells and row.pool_label in cells and format_bytes(row.bytes) in cells
    assert "inferred" not in section  # the recorder's own windows


def test_without_a_map_the_what_if_is_a_self_check_and_a_hint(two_streams_page):
    section = text_of(two_streams_page["What-if: streams mapped onto others"])
    assert "--map FROM=TO" in section
    assert "ends with each pool's recorded reservation exactly" in section


def test_above_the_event_limit_the_self_check_is_left_out_and_says_so(monkeypatch):
    import kit.show.report

    monkeypatch.setattr(kit.show.report, "SELF_CHECK_EVENTS", 10)
    section = text_of(sections(render_report(TWO_STREAMS))["What-if: streams mapped onto others"])
    assert "self-check skipped: the trace has" in section and "more than 10" in section
    assert "ends with each pool's recorded reservation" not in section and "--map FROM=TO" in section


def test_with_a_map_the_what_if_shows_each_pool_as_recorded_and_predicted(tmp_path):
    out = tmp_path / "report.html"
    done = run_kit("report", str(TWO_STREAMS), "-o", str(out), "--map", "replay graphs stream=model graphs stream")
    assert done.returncode == 0, done.stderr
    section = sections(out.read_text())["What-if: streams mapped onto others"]
    result = what_if(TWO_STREAMS, {"replay graphs stream": "model graphs stream"})
    assert result.saved[(0, 1)] == 42 * MIB
    assert "map: replay graphs stream onto model graphs stream" in text_of(section)
    pool_row = next(r for r in re.findall(r"<tr>.*?</tr>", section, flags=re.S) if "global graph pool" in r)
    assert [c.strip() for c in text_of(pool_row).split("  ") if c.strip()] == [
        "global graph pool",
        "(0, 1)",
        "108.00 MiB",
        "66.00 MiB",
        "42.00 MiB",
    ]
    assert "data: kit.analysis.whatif.what_if" in section and "self-check" not in section
    for line in result.corrections:
        assert html.escape(f"correction: {line}") in section


@pytest.mark.parametrize(
    "stream_map", ["nope=model graphs stream", "replay graphs stream"], ids=["unknown stream", "no ="]
)
def test_a_map_the_what_if_cannot_take_exits_2_and_writes_nothing(tmp_path, stream_map):
    out = tmp_path / "report.html"
    done = run_kit("report", str(TWO_STREAMS), "-o", str(out), "--map", stream_map)
    assert done.returncode == 2 and done.stderr.startswith("kit: error: ") and done.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def no_trace_snapshot(tmp_path, synthetic) -> str:
    path = tmp_path / "plain.pickle"
    path.write_bytes(pickle.dumps(synthetic))
    return str(path)


def test_a_snapshot_without_a_trace_gets_one_line_per_trace_section(tmp_path, synthetic):
    out = tmp_path / "report.html"
    done = run_kit("report", no_trace_snapshot(tmp_path, synthetic), "-o", str(out))
    assert done.returncode == 0, done.stderr
    page = sections(out.read_text())
    assert "<table" in page["Segments by (pool, stream)"]
    for heading, what in [
        ("Allocations reused and new segments per group", "reuse table"),
        ("Stranding verdicts", "stranding verdicts"),
        ("Capture attribution", "capture attribution"),
    ]:
        notes = re.findall(r'<p class="note">(.*?)</p>', page[heading])
        assert len(notes) == 1 and "<table" not in page[heading], heading
        assert notes[0].startswith(f"no {what}: ") and "no trace recorded" in notes[0]
    assert "no what-if: " in page["What-if: streams mapped onto others"]


def test_a_map_on_a_snapshot_without_a_trace_is_answered_in_its_section_and_the_page_written(tmp_path, synthetic):
    out = tmp_path / "r.html"
    done = run_kit("report", no_trace_snapshot(tmp_path, synthetic), "-o", str(out), "--map", "9=7")
    assert done.returncode == 0, done.stderr
    page = sections(out.read_text())
    assert "no what-if for this map: " in page["What-if: streams mapped onto others"]
    assert "no trace recorded" in page["What-if: streams mapped onto others"]
    assert "<table" in page["Segments by (pool, stream)"]


def test_a_what_if_refused_for_a_valid_map_leaves_the_rest_of_the_report(tmp_path):
    """The issue's case: a what-if on an expandable trace that starts with pages mapped used to exit 2 with no page."""
    from kit.recordings import RECORDINGS

    raw = dict(load_snapshot(RECORDINGS / "expandable" / "expandable_300_expandable.pickle").raw)
    trace = raw["device_traces"][0]
    first_map = next(i for i, e in enumerate(trace) if e["action"] == "segment_map")
    raw["device_traces"] = [trace[:first_map] + trace[first_map + 1 :]]
    path, out = tmp_path / "cut.pickle", tmp_path / "r.html"
    path.write_bytes(pickle.dumps(raw))
    done = run_kit("report", str(path), "-o", str(out), "--map", "s2=s1")
    assert done.returncode == 0, done.stderr
    page = sections(out.read_text())
    assert "pages mapped before it began" in page["What-if: streams mapped onto others"]
    assert "<table" in page["Allocations reused and new segments per group"]


def test_a_what_if_that_fails_is_a_line_in_its_section_asked_for_or_not(monkeypatch):
    import kit.show.report as report

    def broken(snapshot, stream_map):
        raise KitError("the simulator refused")

    monkeypatch.setattr(report, "what_if", broken)
    section = sections(render_report(TWO_STREAMS))["What-if: streams mapped onto others"]
    assert "no what-if on this snapshot: the simulator refused" in section
    asked = render_report(TWO_STREAMS, stream_map={"replay graphs stream": "model graphs stream"})
    assert "no what-if for this map: the simulator refused" in sections(asked)["What-if: streams mapped onto others"]


def test_write_report_takes_a_stream_map(tmp_path):
    out = tmp_path / "r.html"
    write_report(TWO_STREAMS, out, stream_map={"981736592": "model graphs stream"})  # an id as `table` prints it
    assert "map: 981736592 onto model graphs stream" in text_of(
        sections(out.read_text())["What-if: streams mapped onto others"]
    )


def test_the_bar_legend_sits_above_the_bars_in_room_kept_for_it(recorded_path, synthetic):
    for snap in (recorded_path, synthetic):
        fig = group_bar_figure(snap)
        legend, margin = fig.layout.legend, fig.layout.margin
        assert legend.orientation == "h" and legend.yanchor == "bottom" and legend.y >= 1  # not beside the bars
        assert margin.t >= 100  # the two-line title and the legend's row fit above the plot
        groups = len(fig.data[0].y)
        assert fig.layout.height - margin.t - margin.b >= 30 * groups  # each bar gets its row


# --- a snapshot whose names are markup: shown as text, never run (the browser: tests/test_browser.py) -----


def test_report_shows_the_snapshots_markup_as_text():
    page = render_report(hostile_snapshot()).replace(plotly.offline.get_plotlyjs(), "")
    assert not raw_markup(page), raw_markup(page)
    escaped = html_text(MODULE_LABEL)
    by_heading = sections(page)
    tables = ("Segments by (pool, stream)", "Allocations reused and new segments per group", "Capture attribution")
    for heading in tables:
        assert escaped in by_heading[heading] and "<table" in by_heading[heading], heading
    verdicts = text_of(by_heading["Stranding verdicts"])
    assert f"{POOL_NAME}, {MODULE_LABEL}: 20.00 MiB of new segments" in verdicts and SCRIPT_LABEL in verdicts
    assert f"source: recorded on {GPU}" in text_of(page)


def test_figures_show_the_snapshots_markup_as_text():
    snap = load_snapshot(hostile_snapshot())
    bars, segment_map = group_bar_figure(snap), segment_map_figure(snap)
    for fig in (bars, segment_map):
        texts = figure_texts(fig)
        assert not raw_markup(" ".join(texts)), raw_markup(" ".join(texts))
        assert html_text(f"source: recorded on {GPU}") in fig.layout.title.text
    escaped = html_text(MODULE_LABEL)
    assert f"{html_text(POOL_NAME)} / {escaped}" in bars.data[0].y
    assert f"{escaped}: allocated" in {t.name for t in segment_map.data}


def test_html_text_shows_an_entity_reference_as_written():
    """A label that already holds `&lt;` must show `&lt;`, not `<`: the `&` is escaped first."""
    assert html_text('x &lt;b&gt; & "y"') == "x &amp;lt;b&amp;gt; &amp; &#34;y&#34;"

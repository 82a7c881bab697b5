"""A self-contained HTML page of a snapshot's tables and figures.

The page inlines plotly.js, so it opens offline and can be attached to a bug
report as one file: the segment-by-stream table, the group totals and the
segment map, each labelled with its data source.
"""

from __future__ import annotations

import html
import os

import plotly.offline

from kit.analysis.tables import segment_table, style_table
from kit.fileio import atomic_write
from kit.load.snapshot import Snapshot, load_snapshot
from kit.show.pictures import group_bar_figure, segment_map_figure

_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}} caption{{text-align:left;color:#555}}</style>
<script type="text/javascript">{plotlyjs}</script></head>
<body><h1>{title}</h1><p>source: {source}</p>
<h2>Segments by (pool, stream)</h2>{table}
<h2>Reserved, allocated and free per group</h2>{bars}
<h2>Segment map</h2>{segmap}
</body></html>
"""


def render_report(snapshot: Snapshot | str | dict) -> str:
    """The report page as one HTML string."""
    snapshot = load_snapshot(snapshot)
    table = segment_table(snapshot)
    return _PAGE.format(
        title=html.escape(f"Allocator snapshot: {snapshot.origin}"),
        source=html.escape(snapshot.source_label),
        plotlyjs=plotly.offline.get_plotlyjs(),
        table=style_table(table).to_html(),
        bars=group_bar_figure(snapshot).to_html(full_html=False, include_plotlyjs=False),
        segmap=segment_map_figure(snapshot).to_html(full_html=False, include_plotlyjs=False),
    )


def write_report(snapshot: Snapshot | str | dict, path: str | os.PathLike) -> None:
    """Write the report page to `path`, atomically."""
    page = render_report(snapshot)
    with atomic_write(path) as f:
        f.write(page)

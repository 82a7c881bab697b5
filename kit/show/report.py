"""A self-contained HTML page of a snapshot's tables, figures and verdicts.

The page inlines plotly.js, so it opens offline and can be attached to a bug
report as one file. Each section names what computed it and its data source:

- the answer first (`kit.analysis.answer.explain`, as `python -m kit explain`
  prints it): the biggest pools, what stranded on which stream and why, the
  best map of the graph pools' streams with its simulated saving, the caveat;
- the segment-by-stream table, the group totals and the segment map (the
  snapshot's segments: `segment_table`, `kit.show.pictures`);
- the reuse table and the stranding verdicts, from the trace
  (`kit.analysis.trace.reports.reuse_table`, `stranding_report`);
- capture attribution: the segments each capture added, from the kit's
  capture windows or windows inferred from the trace
  (`kit.analysis.attribution.capture_attribution`);
- the what-if (`kit.analysis.whatif.what_if`): with a stream map, each pool
  as recorded and as predicted had the mapped streams been their targets;
  without one, a self-check that the allocator simulator replays the trace
  to the recorded pools.

A snapshot without a trace gets one line in each trace section instead of
the section, and an analysis that cannot run on the snapshot (a `KitError`)
gets one line saying why; only a what-if the caller asked for (`stream_map`)
raises it. Bytes are shown in binary units (MiB), exact bytes on hover of
the figures and in `python -m kit ... --json`. Labels, frames and source lines
are the snapshot's own text: every one is escaped (`kit.markup`), in the page,
its tables and its figures alike.

    write_report("snap.pickle", "report.html", stream_map={"stream B": "stream A"})
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import pandas as pd
import plotly.offline

from kit.analysis.answer import explain
from kit.analysis.attribution import capture_attribution
from kit.analysis.names import naming_hint, pool_labels
from kit.analysis.tables import segment_table, style_table
from kit.analysis.trace.reports import reuse_table, stranding_report
from kit.analysis.whatif import WhatIf, reserved_by_pool, resolve_stream_map, what_if
from kit.errors import KitError
from kit.fileio import atomic_write
from kit.load.snapshot import Snapshot, load_snapshot
from kit.markup import html_text
from kit.show.pictures import group_bar_figure, segment_map_figure
from kit.units import format_bytes

VERDICT_MIN_BYTES = 1 << 20  # groups that made less than this get no verdict on the page

_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}}
p.source{{color:#555;font-size:90%}} p.note{{font-style:italic}} li{{margin:0.3em 0}}</style>
<script type="text/javascript">{plotlyjs}</script></head>
<body><h1>{title}</h1><p>source: {source}</p>
{sections}
</body></html>
"""


def render_report(snapshot: Snapshot | str | dict, *, stream_map: Mapping[str, str] | None = None) -> str:
    """The report page as one HTML string.

    `stream_map` (streams named as `table` prints them, or ids) adds the
    what-if of those streams moved onto their targets. A map naming a stream
    the snapshot lacks raises `KitError`; a what-if that cannot be made for a
    valid map (a capture moved onto the default stream, an expandable trace
    that starts with pages mapped) is said in its section, and every other
    section is written.
    """
    snapshot = load_snapshot(snapshot)
    sections = [
        _answer_section(snapshot),
        _segments_section(snapshot),
        _section(
            "Reserved, allocated and free per group",
            "kit.show.pictures.group_bar_figure (the snapshot's segments)",
            snapshot.source_label,
            _figure_html(group_bar_figure(snapshot)),
        ),
        _section(
            "Segment map",
            "kit.show.pictures.segment_map_figure (the snapshot's segments)",
            snapshot.source_label,
            _figure_html(segment_map_figure(snapshot)),
        ),
        _trace_section("Allocations reused and new segments per group", "reuse table", snapshot, _reuse_body),
        _trace_section("Stranding verdicts", "stranding verdicts", snapshot, _verdicts_body),
        _trace_section("Capture attribution", "capture attribution", snapshot, _attribution_body),
        _what_if_section(snapshot, stream_map),
    ]
    return _PAGE.format(
        title=html_text(f"Allocator snapshot: {snapshot.origin}"),
        source=html_text(snapshot.source_label),
        plotlyjs=plotly.offline.get_plotlyjs(),
        sections="\n".join(sections),
    )


def write_report(
    snapshot: Snapshot | str | dict, path: str | os.PathLike, *, stream_map: Mapping[str, str] | None = None
) -> None:
    """Write the report page to `path`, atomically (`stream_map`: see `render_report`)."""
    page = render_report(snapshot, stream_map=stream_map)
    with atomic_write(path) as f:
        f.write(page)


# --- the sections ---------------------------------------------------------------------


def _answer_section(snapshot: Snapshot) -> str:
    """The answer first: `kit.analysis.answer.explain`'s paragraph (each part says why where it is missing)."""
    answer = explain(snapshot)
    body = f"<p>{html_text(answer.paragraph())}</p>"
    return _section("The answer", "kit.analysis.answer.explain", answer.source, body)


def _section(title: str, computed_by: str, source: str, body: str) -> str:
    """A section: its heading, one line naming what computed it and its data source, then its body."""
    line = f"data: {html_text(computed_by)}; source: {html_text(source)}"
    return f'<h2>{html_text(title)}</h2>\n<p class="source">{line}</p>\n{body}'


def _note(text: str) -> str:
    return f'<p class="note">{html_text(text)}</p>'


def _figure_html(fig) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False)


def _table_html(table: pd.DataFrame, columns: list[str], byte_columns: tuple[str, ...] = ()) -> str:
    """`table`'s `columns` through `style_table`, bytes in binary units (MiB)."""
    shown = table[[c for c in columns if c in table.columns]].copy()
    named = (*table.attrs.get("byte_columns", ()), *byte_columns)
    shown.attrs = {"byte_columns": named}  # no caption: the section's line names the source
    return style_table(shown).to_html()


def _segments_section(snapshot: Snapshot) -> str:
    table = segment_table(snapshot)
    body = _table_html(table, list(table.columns))
    made_up = table.attrs.get("generated_labels")
    if made_up:
        body += _note(
            "labels made by the kit (streams from their first allocation's frame, graph pools in the order "
            f"they were made): {'; '.join(made_up)}"
        )
        hint = naming_hint(made_up)
        if hint:
            body += _note(f"hint: {hint}")
    return _section("Segments by (pool, stream)", "kit.analysis.tables.segment_table", snapshot.source_label, body)


def _trace_section(title: str, what: str, snapshot: Snapshot, body: Callable[[Snapshot], tuple[str, str, str]]) -> str:
    """A section computed from the trace: one line instead where there is none, or where the analysis fails."""
    computed_by, source = _COMPUTED_BY[what], snapshot.source_label
    reason = _no_trace(snapshot)
    if reason is not None:
        return _section(title, computed_by, source, _note(f"no {what}: {reason}"))
    try:
        computed_by, source, text = body(snapshot)
    except KitError as e:
        return _section(title, computed_by, source, _note(f"no {what}: {e}"))
    return _section(title, computed_by, source, text)


_COMPUTED_BY = {
    "reuse table": "kit.analysis.trace.reports.reuse_table (the trace)",
    "stranding verdicts": "kit.analysis.trace.reports.stranding_report (the trace)",
    "capture attribution": "kit.analysis.attribution.capture_attribution (capture windows and the trace)",
}


def _no_trace(snapshot: Snapshot) -> str | None:
    """Why the snapshot has no trace to analyse, in one line; None when it has one."""
    if snapshot.has_trace:
        return None
    try:
        snapshot.check_trace()
    except KitError as e:
        return str(e)
    return f"{snapshot.origin}: no trace recorded"


def _reuse_body(snapshot: Snapshot) -> tuple[str, str, str]:
    table = reuse_table(snapshot)
    columns = ["pool_label", "stream_label", "stream", "allocs", "reused", "new_segments"]
    body = _table_html(
        table, [*columns, "new_segment_bytes", "stranded_bytes"], ("new_segment_bytes", "stranded_bytes")
    )
    for line in table.attrs.get("mismatches") or ():
        body += _note(f"warning: {line}")
    return _COMPUTED_BY["reuse table"], table.attrs.get("source", snapshot.source_label), body


def _verdicts_body(snapshot: Snapshot) -> tuple[str, str, str]:
    report = stranding_report(snapshot, min_bytes=VERDICT_MIN_BYTES)
    source = report.attrs.get("source", snapshot.source_label)
    if report.empty:
        body = _note(f"no stranded segments (no group with {format_bytes(VERDICT_MIN_BYTES)} or more)")
        return _COMPUTED_BY["stranding verdicts"], source, body
    frames = report["frames"] if "frames" in report.columns else [None] * len(report)
    items = []
    for verdict, frame in zip(report["verdict"], frames, strict=True):
        item = html_text(verdict)
        if isinstance(frame, str) and frame:
            item += f"<br><small>first such allocation: {html_text(frame)}</small>"
        items.append(f"<li>{item}</li>")
    body = "<ul>\n" + "\n".join(items) + "\n</ul>"
    return _COMPUTED_BY["stranding verdicts"], source, body


def _attribution_body(snapshot: Snapshot) -> tuple[str, str, str]:
    table = capture_attribution(snapshot)
    source = table.attrs.get("source", snapshot.source_label)
    body = ""
    inferred = table.attrs.get("inferred")
    if inferred:
        which = "" if inferred is True else f" ({_listed(inferred)})"
        body += _note(
            "capture windows inferred from the trace (allocations on a stream that land in a graph pool's "
            f"segments), as the snapshot's kit key has none{which}"
        )
    if table.empty:
        body += _note("no capture added a segment (or the snapshot has no capture windows, recorded or inferred)")
    else:
        columns = ["graph", "pool_label", "stream_label", "stream", "segments", "bytes"]
        body += _table_html(table, columns, ("bytes",))
    return _COMPUTED_BY["capture attribution"], source, body


def _listed(value: object) -> str:
    if isinstance(value, str):
        return value
    try:
        return ", ".join(str(v) for v in value)  # type: ignore[union-attr]
    except TypeError:
        return str(value)


# --- the what-if ----------------------------------------------------------------------

_WHAT_IF = "kit.analysis.whatif.what_if (the trace, replayed on the allocator simulator)"
# Above this many trace events the report leaves out the identity what-if (a self-check of the
# simulator on this snapshot): it replays the whole trace twice, about 25 s a million events.
SELF_CHECK_EVENTS = 500_000


def _what_if_section(snapshot: Snapshot, stream_map: Mapping[str, str] | None) -> str:
    """With a map, the prediction (a failure raises); without, the identity map as a self-check (a failure: a line)."""
    title = "What-if: streams mapped onto others"
    if stream_map:
        resolve_stream_map(snapshot, dict(stream_map))  # a stream the snapshot lacks: the caller's mistake, raised
        try:
            result = what_if(snapshot, dict(stream_map))
        except KitError as e:  # a map the what-if cannot model here: said in its place, the rest of the page kept
            return _section(title, _WHAT_IF, snapshot.source_label, _note(f"no what-if for this map: {e}"))
        source = result.predicted.attrs.get("source", snapshot.source_label)
        return _section(title, _WHAT_IF, source, _prediction_body(snapshot, stream_map, result))
    hint = _note(
        "no stream map given: `python -m kit report SNAPSHOT -o OUT --map FROM=TO` (streams as the tables "
        "above name them, or their ids) predicts each pool had stream FROM been TO"
    )
    reason = _no_trace(snapshot)
    if reason is not None:
        return _section(title, _WHAT_IF, snapshot.source_label, hint + _note(f"no what-if: {reason}"))
    events = sum(len(columns) for columns in snapshot.trace_columns.values())
    if events > SELF_CHECK_EVENTS:
        skipped = (
            f"self-check skipped: the trace has {events:,} events, more than {SELF_CHECK_EVENTS:,} (replaying it on "
            "the simulator twice would take longer than the rest of the report; `python -m kit what-if SNAPSHOT "
            "--map FROM=TO` replays it for a stream map)"
        )
        return _section(title, _WHAT_IF, snapshot.source_label, hint + _note(skipped))
    try:
        result = what_if(snapshot, {})
    except KitError as e:
        return _section(title, _WHAT_IF, snapshot.source_label, hint + _note(f"no what-if on this snapshot: {e}"))
    return _section(title, _WHAT_IF, snapshot.source_label, hint + _self_check(snapshot, result))


def _prediction_body(snapshot: Snapshot, stream_map: Mapping[str, str], result: WhatIf) -> str:
    """The map, one row per pool (as recorded, predicted, saved), the predicted table, the corrections."""
    moves = "; ".join(f"{a} onto {b}" for a, b in stream_map.items())
    body = _note(f"map: {moves}")
    labels = pool_labels(snapshot)
    before, after = reserved_by_pool(result.baseline), reserved_by_pool(result.predicted)
    rows = [
        {
            "pool_label": labels.get(tuple(pool), str(tuple(pool))),
            "pool": tuple(pool),
            "reserved_as_recorded": before.get(tuple(pool), 0),
            "reserved_predicted": after.get(tuple(pool), 0),
            "saved": saved,
        }
        for pool, saved in result.saved.items()
    ]
    pools = pd.DataFrame(rows, columns=["pool_label", "pool", "reserved_as_recorded", "reserved_predicted", "saved"])
    pools.attrs["source"] = result.predicted.attrs.get("source", snapshot.source_label)
    body += _table_html(pools, list(pools.columns), ("reserved_as_recorded", "reserved_predicted", "saved"))
    body += "<h3>Predicted segments by (pool, stream)</h3>" + _table_html(
        result.predicted, list(result.predicted.columns)
    )
    for line in result.corrections:
        body += _note(f"correction: {line}")
    return body


def _self_check(snapshot: Snapshot, result: WhatIf) -> str:
    """Whether the simulator, replaying the trace as recorded, ends with each pool's recorded reservation."""
    recorded, replayed = reserved_by_pool(segment_table(snapshot)), reserved_by_pool(result.predicted)
    labels = pool_labels(snapshot)
    differ = [
        f"{labels.get(pool, str(pool))}: {format_bytes(replayed.get(pool, 0))} replayed, "
        f"{format_bytes(recorded.get(pool, 0))} recorded"
        for pool in sorted(recorded.keys() | replayed.keys())
        if recorded.get(pool, 0) != replayed.get(pool, 0)
    ]
    if not differ:
        return _note(
            "self-check: the simulator, replaying the trace with every stream onto itself, ends with each "
            "pool's recorded reservation exactly, so a prediction for this snapshot starts from what it recorded"
        )
    return _note("self-check: the simulator's replay of the trace as recorded differs: " + "; ".join(differ))

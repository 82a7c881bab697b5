"""The report of a multi-GPU run: every rank of a folder on one self-contained page.

`python -m kit report DIR` writes it for a folder of per-rank snapshots (the
vLLM plugin's `KIT_CAPTURE_DIR`, or `rank<N>.pickle` files made another way).
It opens with the ranks compared (`kit.analysis.ranks`): per rank the graph
pool by stream, stranded bytes, the replay graphs' own stream, vLLM's
estimate against the graph pool reserved, the ranks that differ, and the
groups side by side. Then each rank gets the first sections of the one-file
report (`kit.show.report`): the answer and its segment-by-stream table. The
per-rank trace sections (reuse, verdicts, attribution, what-if) stay with
`python -m kit report DIR/rank<N>.pickle`: a page per rank would repeat them
for every rank of a large run.
"""

from __future__ import annotations

import os

import plotly.offline

from kit.analysis.ranks import compare_ranks
from kit.fileio import atomic_write
from kit.markup import html_text
from kit.show.report import _PAGE, _answer_section, _section, _segments_section, _table_html


def render_rank_report(folder: str | os.PathLike) -> str:
    """The ranks' page as one HTML string."""
    ranks = compare_ranks(folder)
    summary, groups = ranks.summary, ranks.groups
    lines = [
        *ranks.estimates,
        *(ranks.differences or ["the ranks agree on their graph pools"]),
        *(ranks.verdicts or ["the ranks agree: no group differs by more than 5% and 2 MiB"]),
    ]
    shown = summary.drop(columns=["by_stream", "stranded_why"])
    source = groups.attrs["source"]
    sections = [
        _section(
            "The ranks compared",
            "kit.analysis.ranks.rank_summary, rank_differences",
            source,
            _table_html(shown, list(shown.columns))
            + "<ul>"
            + "".join(f"<li>{html_text(x)}</li>" for x in lines)
            + "</ul>",
        ),
        _section(
            "Groups side by side", "kit.analysis.ranks.rank_table", source, _table_html(groups, list(groups.columns))
        ),
    ]
    for rank, snapshot in ranks.snapshots.items():
        sections += [f"<h1>Rank {rank}</h1>", _answer_section(snapshot), _segments_section(snapshot)]
    return _PAGE.format(
        title=html_text(f"Ranks of {os.fspath(folder)}"),
        source=html_text(source),
        plotlyjs=plotly.offline.get_plotlyjs(),
        sections="\n".join(sections),
    )


def write_rank_report(folder: str | os.PathLike, path: str | os.PathLike) -> None:
    """Write the ranks' page to `path`, atomically."""
    page = render_rank_report(folder)
    with atomic_write(path) as f:
        f.write(page)

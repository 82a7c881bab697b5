"""A snapshot whose names are HTML: what the report, the tables, the figures and the widgets must show as text.

Two streams share a graph pool. Stream 7 first allocates from a frame named
`<script>...</script>` in a file named `<b><img ... onerror=...>.py`, frees its
block, and stream 9 (a plain script's module level: `<module>`) makes a
segment of its own: a stranding verdict, with both labels in it. The kit key
names the graph pool and the GPU with more markup. Rendered as HTML instead
of text anywhere, one of them sets `window.__pwned` in a browser; in a plotly
figure (which runs no script but draws `<b>` and `<br>`) the pool's and the
file's `<b>` would be drawn bold instead of read.
"""

from __future__ import annotations

import re

from .helpers import MIB

SCRIPT_NAME = "<script>window.__pwned=2</script>"
IMG_FILE = '<b><img src=x onerror="window.__pwned=1;alert(1)">.py'  # no "/": the kit keeps a file's name only
POOL_NAME = '<img src=x onerror="window.__pwned=3"> <b>pool</b>'  # plotly would draw <b> as bold: no "<b>"
GPU = '<svg onload="window.__pwned=4"></svg>'
MODULE_LABEL = "stream of <module> (file.py:46)"
SCRIPT_LABEL = f"stream of {SCRIPT_NAME} ({IMG_FILE}:46)"
# The explorer's HTML widgets (kit.show.explorer.SnapshotExplorer), each shown with innerHTML.
EXPLORER_HTML = ("status", "segments_html", "reuse_html", "verdicts_html", "check_html", "attribution_html")
EXPLORER_HTML += ("whatif_html",)
# Markup a page must never hold raw: every tag the snapshot names (plotly's JSON spells `<` as \u003c).
RAW = re.compile(r"<(script>window|img src=x|svg onload|module>|b><img|b>pool)")

A, B = 7, 9
POOL = (0, 1)
FRAMES = {
    A: [{"filename": IMG_FILE, "line": 46, "name": SCRIPT_NAME}],
    B: [{"filename": "/app/file.py", "line": 46, "name": "<module>"}],
    0: [{"filename": "/app/file.py", "line": 10, "name": "<module>"}],
}


def _segment(address: int, stream: int, pool: tuple[int, int], state: str) -> dict:
    allocated = 20 * MIB if state == "active_allocated" else 0
    block = {"address": address, "size": 20 * MIB, "requested_size": 20 * MIB, "state": state, "frames": []}
    return {
        "device": 0,
        "address": address,
        "total_size": 20 * MIB,
        "allocated_size": allocated,
        "active_size": allocated,
        "requested_size": allocated,
        "stream": stream,
        "segment_type": "large",
        "segment_pool_id": pool,
        "is_expandable": False,
        "frames": [],
        "blocks": [block],
    }


def hostile_snapshot() -> dict:
    """The snapshot as torch writes it, plus a kit key that names the graph pool and the GPU."""
    default, first, second = 0x7F00_0000_0000, 0x7F00_1000_0000, 0x7F00_2000_0000
    events = [
        ("segment_alloc", default, 0),
        ("alloc", default, 0),
        ("segment_alloc", first, A),
        ("alloc", first, A),
        ("free_requested", first, A),
        ("free_completed", first, A),
        ("segment_alloc", second, B),  # A's 20 MiB block sits free: B strands it
        ("alloc", second, B),
    ]
    trace = [
        {"action": action, "addr": addr, "size": 20 * MIB, "stream": stream, "time_us": i, "frames": FRAMES[stream]}
        for i, (action, addr, stream) in enumerate(events)
    ]
    return {
        "segments": [
            _segment(default, 0, (0, 0), "active_allocated"),
            _segment(first, A, POOL, "inactive"),
            _segment(second, B, POOL, "active_allocated"),
        ],
        "device_traces": [trace],
        "allocator_settings": {},
        "kit": {
            "pools": {POOL_NAME: list(POOL)},
            "provenance": {"gpu": GPU, "torch": "2.9", "date": "2026-01-01"},
        },
    }


def raw_markup(html: str) -> list[str]:
    """The snapshot's markup found raw (unescaped) in `html`."""
    return [m.group(0) for m in RAW.finditer(html)]


def figure_texts(fig) -> list[str]:
    """Every text of a plotly figure that plotly renders as HTML: title, trace names, categories, hover, ticks."""
    layout = fig.layout
    texts = [layout.title.text or "", *(layout.xaxis.ticktext or ()), *(layout.yaxis.categoryarray or ())]
    for trace in fig.data:
        texts += [trace.name or "", trace.hovertemplate or ""]
        for values in (trace.y, trace.hovertext, trace.text):
            texts += [str(v) for v in values or ()]
    return texts

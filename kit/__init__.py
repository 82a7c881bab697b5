"""An investigation kit for CUDA-graph memory in vLLM, built around vLLM PR 63155.

The public API, by idea:
- snapshots: `load_snapshot`, `Snapshot`, `Segment`, `Block`, `TraceEntry`
- tables: `segment_table`, `diff_tables`, `style_table`, `format_bytes`
- pictures: `group_bar_figure`, `segment_map_figure` (plotly, imported on use)
- report: `write_report`
- errors: `KitError`

Plotly is imported only when a picture is asked for, so the kit's tables load
on a machine (such as the GPU machine) that has pandas but no plotly.
"""

from kit.errors import KitError
from kit.snapshot import Block, Segment, Snapshot, TraceEntry, load_snapshot
from kit.tables import diff_tables, format_bytes, segment_table, style_table

__all__ = [
    "Block",
    "KitError",
    "Segment",
    "Snapshot",
    "TraceEntry",
    "diff_tables",
    "format_bytes",
    "group_bar_figure",
    "load_snapshot",
    "segment_map_figure",
    "segment_table",
    "style_table",
    "write_report",
]


def __getattr__(name: str):
    if name in ("group_bar_figure", "segment_map_figure"):
        from kit import pictures

        return getattr(pictures, name)
    if name == "write_report":
        from kit.report import write_report

        return write_report
    raise AttributeError(f"module 'kit' has no attribute {name!r}")

"""An investigation kit for CUDA-graph memory in vLLM, built around vLLM PR 63155.

The public API: what the notebooks, the README and the docs call as `kit.X`, by idea.
- snapshots: `load_snapshot`, `Snapshot`
- tables: `segment_table`, `diff_tables`, `diff_summary`, `pool_summary`, `style_table`, `format_bytes`
- names: `stream_labels`, `pool_labels` (the same everywhere, stable across processes)
- pictures: `group_bar_figure`, `segment_map_figure`, `show_in` (plotly, imported on use)
- report: `write_report`
- simulator and workloads: `simulate`, `parse_workload`, `load_workload`, `generate_workload`,
  `pr_scenario`, `run_on_gpu`
- trace analysis: `walk_trace`, `reuse_table`, `stranding_report`, `capture_attribution`,
  `what_if` (a `WhatIf`), `simulate_trace`
- a guard for CI: `check_snapshot`, `assert_no_stranding` (for a pytest test)
- capture recorder: `CaptureRecorder`, `capture_table`
- ranks of a multi-GPU run: `load_ranks`, `rank_table`, `rank_verdicts`
- safety: `liveness_table`, `check_equivalence`, `Equivalence` (graphs against eager),
  `ReadWriteRecorder`, `readwrite_table` (the bytes each op reads and writes)
- errors: `KitError`

Everything else is imported from its module (`from kit.load.rows import Segment`,
`from kit.analysis.liveness import liveness_verdicts`); `docs/architecture.md` maps the
modules. Plotly is imported only when a picture is asked for, so the kit's tables load
on a machine (such as the GPU machine) that has pandas but no plotly.
"""

from kit.allocator.simulator import simulate
from kit.allocator.workload import generate_workload, load_workload, parse_workload, pr_scenario
from kit.analysis.attribution import capture_attribution, capture_table
from kit.analysis.check import assert_no_stranding, check_snapshot
from kit.analysis.equivalence import Equivalence, check_equivalence
from kit.analysis.liveness import liveness_table
from kit.analysis.names import pool_labels, stream_labels
from kit.analysis.ranks import load_ranks, rank_table, rank_verdicts
from kit.analysis.readwrite import readwrite_table
from kit.analysis.tables import diff_summary, diff_tables, format_bytes, pool_summary, segment_table, style_table
from kit.analysis.trace.reports import reuse_table, stranding_report
from kit.analysis.trace.walk import walk_trace
from kit.analysis.whatif import WhatIf, simulate_trace, what_if
from kit.errors import KitError
from kit.load.snapshot import Snapshot, load_snapshot
from kit.record.readwrite import ReadWriteRecorder
from kit.record.recorder import CaptureRecorder

__all__ = [
    # snapshots and tables
    "load_snapshot",
    "Snapshot",
    "segment_table",
    "diff_tables",
    "diff_summary",
    "pool_summary",
    "style_table",
    "format_bytes",
    "stream_labels",
    "pool_labels",
    # pictures and the report (imported on use)
    "group_bar_figure",
    "segment_map_figure",
    "show_in",
    "write_report",
    # simulator and workloads
    "simulate",
    "parse_workload",
    "load_workload",
    "generate_workload",
    "pr_scenario",
    "run_on_gpu",
    # trace analysis
    "walk_trace",
    "reuse_table",
    "stranding_report",
    "capture_attribution",
    "what_if",
    "WhatIf",
    "simulate_trace",
    "check_snapshot",
    "assert_no_stranding",
    # recording, ranks, safety
    "CaptureRecorder",
    "capture_table",
    "load_ranks",
    "rank_table",
    "rank_verdicts",
    "liveness_table",
    "check_equivalence",
    "Equivalence",
    "ReadWriteRecorder",
    "readwrite_table",
    "KitError",
]


def __getattr__(name: str):
    if name in ("group_bar_figure", "segment_map_figure", "show_in"):
        from kit.show import pictures

        return getattr(pictures, name)
    if name == "run_on_gpu":
        from kit.record.workload import run_on_gpu

        return run_on_gpu
    if name == "write_report":
        from kit.show.report import write_report

        return write_report
    raise AttributeError(f"module 'kit' has no attribute {name!r}")

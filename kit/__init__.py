"""An investigation kit for CUDA-graph memory in vLLM, built around vLLM PR 63155.

The public API, by idea:
- snapshots: `load_snapshot`, `Snapshot`, `Segment`, `Block`, `TraceEntry`
- tables: `segment_table`, `diff_tables`, `diff_summary`, `style_table`, `format_bytes`
- names: `stream_labels`, `pool_labels`, `resolve_stream` (the same everywhere, stable across processes)
- pictures: `group_bar_figure`, `segment_map_figure`, `show_in` (plotly, imported on use)
- report: `write_report`
- simulator: `CachingAllocatorSim`, `simulate`, `Decision`
- trace analysis: `replay_trace`, `reuse_table`, `stranding_report`, `capture_attribution`,
  `capture_windows` (recorded or inferred), `what_if` (a `WhatIf`), `simulate_trace`
- a guard for CI: `check_snapshot` (a `CheckResult`), `assert_no_stranding` (for a pytest test)
- workloads: `parse_workload`, `load_workload`, `generate_workload`, `pr_scenario`, `run_on_gpu`
- capture recorder: `CaptureRecorder`, `capture_table`
- ranks of a multi-GPU run: `load_ranks`, `rank_table`, `rank_verdicts`
- safety: `liveness_table` (a `Liveness`), `liveness_verdicts`, `break_allocations` (what is live
  across the eager break, from a recorded trace), `check_equivalence`, `Equivalence` (graphs
  against eager), `ReadWriteRecorder`, `readwrite_table`, `obligation_verdicts` (the proof
  obligation from the bytes each op reads and writes)
- errors: `KitError`

Where things live (`docs/architecture.md` draws the data flow):
- `kit.load`: reading snapshots safely into checked numpy columns;
- `kit.allocator`: the caching allocator's rules, its simulator, workloads;
- `kit.analysis`: tables, the trace walk, what-if, attribution, liveness, ranks;
- `kit.record`: the capture recorder and memory history, on a GPU;
- `kit.patch`: PR 63155 applied in-process to the replica and to vLLM;
- `kit.replica`: a small vLLM-shaped runner (needs torch, imported on use);
- `kit.experiments`: the two-capture experiment and the replica's scenarios;
- `kit.show`: figures, the HTML report and the notebooks' views (plotly);
- `kit.recordings`: the H200 recordings shipped with the kit.

Plotly is imported only when a picture is asked for, so the kit's tables load
on a machine (such as the GPU machine) that has pandas but no plotly.
"""

from kit.allocator.simulator import CachingAllocatorSim, Decision, simulate
from kit.allocator.workload import generate_workload, load_workload, parse_workload, pr_scenario
from kit.analysis.attribution import capture_attribution, capture_table, capture_windows
from kit.analysis.check import CheckResult, assert_no_stranding, check_snapshot
from kit.analysis.equivalence import Equivalence, check_equivalence
from kit.analysis.liveness import Liveness, break_allocations, liveness_table, liveness_verdicts
from kit.analysis.names import pool_labels, resolve_stream, stream_labels
from kit.analysis.ranks import load_ranks, rank_table, rank_verdicts
from kit.analysis.readwrite import obligation_verdicts, readwrite_table
from kit.analysis.tables import diff_summary, diff_tables, format_bytes, segment_table, style_table
from kit.analysis.trace.replay import replay_trace
from kit.analysis.trace.reports import reuse_table, stranding_report
from kit.analysis.whatif import WhatIf, simulate_trace, what_if
from kit.errors import KitError
from kit.load.rows import Block, Segment, TraceEntry
from kit.load.snapshot import Snapshot, load_snapshot
from kit.record.readwrite import ReadWriteRecorder
from kit.record.recorder import CaptureRecorder

__all__ = [
    "WhatIf",
    "simulate_trace",
    "capture_windows",
    "diff_summary",
    "pool_labels",
    "resolve_stream",
    "stream_labels",
    "Block",
    "CaptureRecorder",
    "Equivalence",
    "capture_table",
    "check_equivalence",
    "break_allocations",
    "Liveness",
    "liveness_table",
    "liveness_verdicts",
    "ReadWriteRecorder",
    "readwrite_table",
    "obligation_verdicts",
    "load_ranks",
    "rank_table",
    "rank_verdicts",
    "CachingAllocatorSim",
    "Decision",
    "generate_workload",
    "load_workload",
    "parse_workload",
    "pr_scenario",
    "run_on_gpu",
    "simulate",
    "KitError",
    "Segment",
    "Snapshot",
    "TraceEntry",
    "capture_attribution",
    "CheckResult",
    "assert_no_stranding",
    "check_snapshot",
    "replay_trace",
    "reuse_table",
    "stranding_report",
    "what_if",
    "diff_tables",
    "format_bytes",
    "group_bar_figure",
    "load_snapshot",
    "segment_map_figure",
    "show_in",
    "segment_table",
    "style_table",
    "write_report",
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

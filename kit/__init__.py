"""An investigation kit for CUDA-graph memory in vLLM, built around vLLM PR 63155.

The public API: what the notebooks, the README and the docs call as `kit.X`, by idea.
- snapshots: `load_snapshot`, `Snapshot`
- tables: `segment_table`, `diff_tables`, `diff_summary`, `pool_summary`, `style_table`; bytes: `format_bytes`
- names: `stream_labels`, `pool_labels` (the same everywhere, stable across processes)
- pictures: `group_bar_figure`, `segment_map_figure`, `show_in` (plotly, imported on use)
- report: `write_report`
- simulator and workloads: `simulate`, `parse_workload`, `load_workload`, `generate_workload`,
  `pr_scenario`, `run_on_gpu`
- trace analysis: `walk_trace`, `reuse_table`, `stranding_report`, `capture_attribution`,
  `what_if` (a `WhatIf`), `simulate_trace`
- a guard for CI: `check_snapshot`, `assert_no_stranding` (for a pytest test)
- capture recorder: `CaptureRecorder`, `capture_table`
- ranks of a multi-GPU run: `load_ranks`, `rank_table`, `rank_verdicts`, `compare_ranks` (a folder the
  vLLM plugin wrote: per rank the graph pool, stranded bytes and vLLM's estimate)
- safety: `liveness_table`, `check_equivalence`, `Equivalence` (graphs against eager),
  `ReadWriteRecorder`, `readwrite_table` (the bytes each op reads and writes)
- errors: `KitError`

Everything else is imported from its module (`from kit.load.rows import Segment`,
`from kit.analysis.liveness import liveness_verdicts`); `docs/architecture.md` maps the
modules. Each public name is imported from its module on first use (`kit.__getattr__`), so
`import kit` loads nothing heavy: vLLM's plugin loader imports `kit.vllm_plugin` in every
process it starts, the API front end included. Plotly is imported only when a picture is
asked for, so the kit's tables load on a machine (such as the GPU machine) that has pandas
but no plotly.
"""

import importlib

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
    "compare_ranks",
    "rank_table",
    "rank_verdicts",
    "liveness_table",
    "check_equivalence",
    "Equivalence",
    "ReadWriteRecorder",
    "readwrite_table",
    "KitError",
]


_HOMES = {  # public name -> the module it lives in, imported on first use
    "simulate": "kit.allocator.simulator",
    "generate_workload": "kit.allocator.workload",
    "load_workload": "kit.allocator.workload",
    "parse_workload": "kit.allocator.workload",
    "pr_scenario": "kit.allocator.workload",
    "capture_attribution": "kit.analysis.attribution",
    "capture_table": "kit.analysis.attribution",
    "assert_no_stranding": "kit.analysis.check",
    "check_snapshot": "kit.analysis.check",
    "Equivalence": "kit.analysis.equivalence",
    "check_equivalence": "kit.analysis.equivalence",
    "liveness_table": "kit.analysis.liveness",
    "pool_labels": "kit.analysis.names",
    "stream_labels": "kit.analysis.names",
    "load_ranks": "kit.analysis.ranks",
    "compare_ranks": "kit.analysis.ranks",
    "rank_table": "kit.analysis.ranks",
    "rank_verdicts": "kit.analysis.ranks",
    "readwrite_table": "kit.analysis.readwrite",
    "diff_summary": "kit.analysis.tables",
    "diff_tables": "kit.analysis.tables",
    "format_bytes": "kit.units",
    "pool_summary": "kit.analysis.tables",
    "segment_table": "kit.analysis.tables",
    "style_table": "kit.analysis.tables",
    "reuse_table": "kit.analysis.trace.reports",
    "stranding_report": "kit.analysis.trace.reports",
    "walk_trace": "kit.analysis.trace.walk",
    "WhatIf": "kit.analysis.whatif",
    "simulate_trace": "kit.analysis.whatif",
    "what_if": "kit.analysis.whatif",
    "KitError": "kit.errors",
    "Snapshot": "kit.load.snapshot",
    "load_snapshot": "kit.load.snapshot",
    "ReadWriteRecorder": "kit.record.readwrite",
    "CaptureRecorder": "kit.record.recorder",
    "group_bar_figure": "kit.show.pictures",
    "segment_map_figure": "kit.show.pictures",
    "show_in": "kit.show.pictures",
    "run_on_gpu": "kit.record.workload",
    "write_report": "kit.show.report",
}


def __getattr__(name: str):
    """Import a public name's module on first use: `import kit` (a vLLM plugin, the CLI) stays light."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'kit' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

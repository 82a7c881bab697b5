"""`python -m kit.experiments.alternatives`: record the alternatives, or run one scenario (see the package)."""

from __future__ import annotations

import sys

from kit.experiments import recorded
from kit.experiments.alternatives.result import alternatives_lines, load_graphs_vs_eager, mib
from kit.experiments.alternatives.run import record, run_scenario


def main(argv: list[str] | None = None) -> int:
    return recorded.recording_main(
        argv,
        description="PR 63155's alternatives on the replica with its speculator.",
        old_flag="--variant",
        names="unpatched, pr, share_all, cap_<N>, keep_<a>_<b>...",
        run_one=run_scenario,
        said=lambda name, result: f"{name}: graph pool {mib(result['graph_pool_bytes'])}",
        record=record,
        summary=lambda preset, path: alternatives_lines(load_graphs_vs_eager(preset, path)),
    )


if __name__ == "__main__":
    sys.exit(main())

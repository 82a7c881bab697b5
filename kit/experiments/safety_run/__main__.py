"""`python -m kit.experiments.safety_run`: record the pairings, or run one scenario (see the package)."""

from __future__ import annotations

import sys

from kit.experiments import recorded
from kit.experiments.safety_run.result import SAFETY_SCENARIOS, load_pairs, pair_verdicts, pairs_frame
from kit.experiments.safety_run.run import record, run_scenario


def scenario_said(name: str, result: dict) -> str:
    """What one scenario's process prints: its verdict line, or that its preset has no pairing at all."""
    lines = pair_verdicts(pairs_frame(result))
    return lines[0] if lines else f"{name}: no pairing: no model graph reaches the trim threshold, none breaks out"


def main(argv: list[str] | None = None) -> int:
    return recorded.recording_main(
        argv,
        description="Adversarial pairings of the replica's graphs, on this GPU.",
        old_flag="--policy",
        names=", ".join(SAFETY_SCENARIOS),
        run_one=run_scenario,
        said=scenario_said,
        record=record,
        summary=lambda preset, path: pair_verdicts(load_pairs(preset, path)),
    )


if __name__ == "__main__":
    sys.exit(main())

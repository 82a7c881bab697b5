"""`python -m kit.experiments.readwrite_run`: record reads and writes, or capture one scenario (see the package)."""

from __future__ import annotations

import sys

from kit.experiments import recorded
from kit.experiments.readwrite_run.result import load_recording, summary_lines
from kit.experiments.readwrite_run.run import record, run_scenario
from kit.experiments.safety_run.result import SAFETY_SCENARIOS


def main(argv: list[str] | None = None) -> int:
    return recorded.recording_main(
        argv,
        description="Reads and writes against lifetimes, per pairing, on this GPU.",
        old_flag="--policy",
        names=", ".join(SAFETY_SCENARIOS),
        run_one=run_scenario,
        said=lambda name, result: result["obligation"],
        record=record,
        summary=lambda preset, path: summary_lines(load_recording(preset, path)),
    )


if __name__ == "__main__":
    sys.exit(main())

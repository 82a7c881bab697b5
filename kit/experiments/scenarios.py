"""The replica's five experiments, each in a fresh process, and their figures.

- `unpatched`: vLLM 0.33, the replay graphs on a stream of their own;
- `patched`: PR 63155, the replay graphs on the model graphs' stream;
- `early_aux_pr`: an aux hidden state before the replay layers, under the PR
  (which then keeps the replay graphs on their own stream);
- `early_aux_shared`: the same model with the replay graphs forced to share,
  the case the PR's exception exists for, its aux returned as V4.1 returns
  them, `(hidden_states, aux_list)`: vLLM's wrapper weak-references only
  top-level outputs, so it keeps the early aux block allocated;
- `early_aux_shared_flat`: hypothetical, the same with each aux a top-level
  output (`ReplicaConfig.aux_return="flat"`): weak, its block free for the
  replay captures, as under a vLLM whose model returned its aux flattened or
  whose `weak_ref_tensors` recursed.

The replica's weak references recursed into nested outputs before
`aux_return` existed: a recording without it in its config handed every aux
out weak, the flat case (`aux_return_of` in `kit.experiments.summary`).

`run_scenario` captures with the capture recorder and checks the graphs
against eager execution; the snapshot it returns carries the scenario, the
config and the check in its `kit` key. `summarize` (`kit.experiments.summary`)
reads the figures back from such a snapshot, live or recorded, so the CPU
tests assert the same numbers the GPU printed. Run one scenario here with
`python -m kit.experiments.scenarios NAME --preset small -o OUT.pickle`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import pickle
import sys
import tempfile
from pathlib import Path

from kit import progress
from kit.analysis.equivalence import check_equivalence
from kit.errors import KitError, check_one_of
from kit.experiments.early_aux import RETURN_SHAPES
from kit.experiments.recorded import child_error, run_fresh
from kit.experiments.summary import summarize
from kit.fileio import atomic_write
from kit.load.snapshot import Snapshot, load_snapshot
from kit.record.provenance import require_cuda
from kit.record.recorder import CaptureRecorder
from kit.recordings import RECORDED, RECORDINGS, check_source, default_source
from kit.units import format_bytes

SCENARIOS = {
    "unpatched": (None, False, "vLLM 0.33: replay graphs on a new stream"),
    "patched": ("pr", False, "PR 63155: replay graphs on the model graphs' stream"),
    "early_aux_pr": ("pr", True, "early aux under PR 63155: replay graphs keep their own stream"),
    "early_aux_shared": (
        "share", True, "early aux forced onto the model graphs' stream, returned as V4.1 does (hidden_states, aux_list)"
    ),
    "early_aux_shared_flat": (
        "share", True, "hypothetical: early aux forced to share, returned flattened (each aux a top-level output)"
    ),
}  # fmt: skip
# Scenarios whose forward returns its aux flattened (ReplicaConfig.aux_return); every other returns V4.1's shape.
FLAT_AUX_SCENARIOS = ("early_aux_shared_flat",)
EARLY_AUX_LAYER = 1


def check_preset(preset: str) -> None:
    """Refuse a replica size that `kit.replica.model.PRESETS` does not have, naming those it has."""
    from kit.replica.model import PRESETS

    check_one_of(preset, PRESETS, "preset")


LIVE_NEEDS_CUDA = (
    "live replica runs need CUDA, and this process has none; without --live, demo shows the H200 recordings"
)


def scenario_config(name: str, preset: str):
    from kit.replica.model import PRESETS

    check_one_of(name, SCENARIOS, "scenario")
    check_preset(preset)
    config = PRESETS[preset]
    if SCENARIOS[name][1]:
        config = dataclasses.replace(config, aux_hidden_state_layers=(EARLY_AUX_LAYER, *config.aux_hidden_state_layers))
    if name in FLAT_AUX_SCENARIOS:
        config = dataclasses.replace(config, aux_return="flat")
    return config


def run_scenario(name: str, preset: str = "small", speculator: bool = False) -> dict:
    """Build the replica, capture it under the scenario's patch, check it; the snapshot dict.

    `speculator`: with the DSpark drafter on (`ReplicaConfig(speculator=True)`), its graphs captured last.
    """
    import torch

    from kit.patch import replica as replica_patch
    from kit.replica.model_runner import GPUModelRunner

    config = scenario_config(name, preset)
    if speculator:
        config = dataclasses.replace(config, speculator=True)
    policy, _, description = SCENARIOS[name]
    patch = replica_patch.patched(policy) if policy else contextlib.nullcontext()
    # Recording from the first allocation, so the trace replays from an empty allocator (what-if needs that).
    with patch, CaptureRecorder() as recorder:
        runner = GPUModelRunner(config)
        torch.cuda.synchronize()
        runner.capture_model()
    equivalence = check_equivalence(runner)
    raw = recorder.snapshot.raw
    raw["kit"]["scenario"] = {
        "name": name,
        "preset": preset,
        "policy": policy or "unpatched",
        "description": description,
        "config": dataclasses.asdict(config),
        "has_early_aux": replica_patch.has_early_aux(runner.model_state),
    }
    raw["kit"]["equivalence"] = equivalence.to_records()
    raw["kit"]["provenance"]["command"] = f"python -m kit.experiments.scenarios {name} --preset {preset}" + (
        " --speculator" if speculator else ""
    )
    return raw


def run_all(preset: str, out_dir, names=tuple(SCENARIOS)) -> dict[str, dict]:
    """Each scenario in a fresh process (its allocator starts empty); their summaries."""
    check_preset(preset)
    require_cuda(LIVE_NEEDS_CUDA)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = {}
    for name in progress.track(list(names), f"replica scenarios ({preset}), one process each"):
        path = out_dir / f"{preset}_{name}.pickle"
        done = run_fresh([sys.executable, "-m", "kit.experiments.scenarios", name, "--preset", preset, "-o", str(path)])
        if done.returncode != 0:
            raise KitError(f"scenario {name} ({preset}) failed: {child_error(done.stderr or done.stdout)}")
        summaries[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return summaries


def replica_runs(
    preset: str, names: tuple[str, ...] = tuple(SCENARIOS), *, source: str | None = None, out_dir=None
) -> dict[str, Snapshot]:
    """The replica's scenarios from `source`: captured now, each in a fresh process, or their H200 recordings.

    Live, the snapshots go to `out_dir` (a new temporary folder by default)
    and a progress bar shows the runs. Recorded, scenarios without a
    recording at this preset are left out; none at all is an error.
    """
    source = check_source(source or default_source())
    check_preset(preset)
    if source == RECORDED:
        paths = {name: RECORDINGS / "replica" / f"{preset}_{name}.pickle" for name in names}
        runs = {name: load_snapshot(path) for name, path in paths.items() if path.exists()}
        if not runs:
            raise KitError(f"no recorded replica fixtures for preset {preset!r}; run with --live on a GPU")
        return runs
    require_cuda(LIVE_NEEDS_CUDA)
    out = Path(out_dir or tempfile.mkdtemp(prefix="kit-replica-"))
    runs = {}
    for name in progress.track(list(names), f"replica {preset}, a fresh process each"):
        run_all(preset, out, names=(name,))
        raw = load_snapshot(out / f"{preset}_{name}.pickle").raw
        runs[name] = Snapshot(raw, origin=f"{preset} {name}, captured just now in a fresh process", live=True)
    return runs


def scenario_lines(summary: dict) -> list[str]:
    """The figures of one scenario as lines for a terminal."""
    lines = [f"{summary['scenario']} (policy {summary['policy']}): {summary['source']}"]
    for label in ("model_group", "replay_group"):
        g = summary[label]
        name = label.replace("_group", " graphs stream").replace("_", " ")
        if g is None:
            lines.append(f"  graph pool, {name}: no segments")
        else:
            lines.append(
                f"  graph pool, {name}: {g['segments']} segments, reserved {format_bytes(g['reserved'])}, "
                f"allocated {format_bytes(g['allocated'])}, free {format_bytes(g['free'])}"
            )
    added = ", ".join(f"{k} {format_bytes(v)}" for k, v in summary["replay_added_by_stream"].items()) or "nothing"
    lines.append(f"  replay captures ran on: {', '.join(summary['replay_stream_names'])}")
    lines.append(f"  graph-pool segments the replay captures added: {added}")
    lines.append(f"  graph pool reserved in all: {format_bytes(summary['graph_pool_bytes'])}")
    verdict = "bit-exact" if summary["bit_exact"] else f"DIFFERS, largest difference {summary['max_abs_diff']:.4g}"
    lines.append(f"  graphs vs eager: {verdict}")
    if summary.get("has_early_aux") and summary.get("aux_return") in RETURN_SHAPES:
        lines.append(f"  early aux handed out {summary['aux_return']}: {RETURN_SHAPES[summary['aux_return']]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one replica scenario on this GPU.")
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--preset", default="small")
    parser.add_argument("-o", "--output", required=True, help="snapshot pickle to write")
    parser.add_argument(
        "--speculator", action="store_true", help="with the DSpark drafter on (ReplicaConfig(speculator=True))"
    )
    args = parser.parse_args(argv)
    try:
        raw = run_scenario(args.scenario, args.preset, speculator=args.speculator)
    except KitError as e:
        print(f"kit: error: {e}", file=sys.stderr)
        return 2
    with atomic_write(args.output, "wb") as f:
        pickle.dump(raw, f)
    print(json.dumps(summarize(raw)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Alternative (a)'s own lifetime argument: what the drafter's graphs write against what the step still reads.

PR 63155's alternative (a), one `graph_capture()` for every capture, also puts
the speculator's capture on the model graphs' stream; the PR says the
speculator "needs its own lifetime argument" because it runs after the target
forward and reads its outputs. This makes that argument on the replica with its
speculator (`kit.experiments.alternatives`: scenarios `pr`, the drafter on a
stream of its own, and `share_all`, every capture on one stream), each in a
fresh process, by the two analyses the replay graphs get:

- reads and writes (`kit.analysis.readwrite.drafter_table`): the capture is
  recorded under the read/write recorder with the model and replay graphs'
  phases (`readwrite_run.run.replica_phases`) and the drafter's (`drafter_phases`:
  drafter graph D while `DFlashCudaGraphManager` captures size D); then one
  real step of every capture size is recorded: what the sampler and `propose`
  read before the drafter graph replays, and what the step reads after it.
  The obligation (`DRAFTER_OBLIGATION`): the bytes D writes are not read
  after D with a value model graph N wrote;
- lifetimes (`kit.analysis.liveness.drafter_liveness_table`): the graph-pool
  blocks each model capture leaves when its forward ends, the drafter
  captures that allocate over them, with the step's reads attached
  (`kit["step_reads"]`) and from the trace alone;

side by side per (model graph, drafter graph) pairing, with the model graphs'
own obligation on the same run (`readwrite_run.result.compare_analyses`). The
snapshot of each run ships inside the recording (`compact_snapshot`: the
program's own frames only), so the lifetime analysis can be run again on it.

    python -m kit.experiments.drafter_run --preset small --out DIR        # both scenarios into DIR/small.json
    python -m kit.experiments.drafter_run --scenario share_all --preset small --out share_all.json
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kit.analysis.liveness import (
    DrafterLiveness,
    drafter_liveness_table,
    drafter_liveness_verdicts,
    target_captures,
)
from kit.analysis.readwrite import (
    DRAFTER_OBLIGATION,
    ReadWriteRecording,
    attach_break_reads,
    drafter_graph,
    drafter_summary,
    drafter_table,
    drafter_verdicts,
    obligation_summary,
    readwrite_table,
    step_after_drafter,
    step_before_drafter,
    step_read_entries,
)
from kit.errors import check_one_of
from kit.experiments import recorded
from kit.patch.install import Patch
from kit.record.provenance import provenance, require_cuda
from kit.recordings import RECORDINGS, shipped

DRAFTER_SCENARIOS = ("pr", "share_all")
RECORDINGS_DIR = RECORDINGS / "drafter"
SEED = 4321
PAIR_KEYS = ("scenario", "model_size", "drafter_size", "dispatchable", "readwrite_holds", "lifetime_conflict")


# --- phases of the drafter's capture and of a step ----------------------------------------------


@contextlib.contextmanager
def drafter_phases(runner, recorder) -> Iterator[None]:
    """While open, `recorder` records the drafter's captures and each step's reads around the drafter graph.

    - `DFlashCudaGraphManager._capture_full(num_tokens, ...)`: drafter graph `num_tokens`;
    - `runner.execute_model`: nothing (the target forward replays its graphs);
      after it, the step reads before the drafter (the sampler, `propose`'s staging);
    - `run_fullgraph(size)`: nothing (a replay); after it, the step's reads after the drafter;
    - `runner.propose` returning: nothing more (what the caller does next is not vLLM's step).
    The runner's methods are put back as found.
    """
    manager = runner.speculator.query_cudagraph_manager
    capture_full, execute_model, run_fullgraph, propose = (
        manager._capture_full,
        runner.execute_model,
        manager.run_fullgraph,
        runner.propose,
    )
    step = {"size": None}

    def capture_by_phase(num_tokens, fn):
        with recorder.phase(drafter_graph(num_tokens)):
            return capture_full(num_tokens, fn)

    def execute_by_phase(input_ids, use_cudagraph=True):
        with recorder.phase(None):
            out = execute_model(input_ids, use_cudagraph)
        step["size"] = input_ids.shape[0]
        recorder.set_phase(step_before_drafter(step["size"]))
        return out

    def replay_by_phase(num_tokens):
        with recorder.phase(None):
            run_fullgraph(num_tokens)
        if step["size"] is not None:
            recorder.set_phase(step_after_drafter(step["size"]))

    def propose_by_phase(*args, **kwargs):
        try:
            return propose(*args, **kwargs)
        finally:
            recorder.set_phase(None)
            step["size"] = None

    replacements = [
        (manager, "_capture_full", capture_by_phase),
        (manager, "run_fullgraph", replay_by_phase),
        (runner, "execute_model", execute_by_phase),
        (runner, "propose", propose_by_phase),
    ]
    try:
        with Patch("the drafter's phases", replacements):
            yield
    finally:
        recorder.set_phase(None)


# --- the two analyses side by side --------------------------------------------------------------


def _without_step_reads(raw: dict) -> dict:
    return {**raw, "kit": {k: v for k, v in raw["kit"].items() if k != "step_reads"}}


def target_sizes(raw: dict) -> dict[int, str]:
    """`size -> capture name` of the target model's captures (`target_captures`: broken or whole)."""
    captures: dict[str, list[dict]] = {}
    for c in raw["kit"]["captures"]:
        captures.setdefault(c["capture"], []).append(c)
    return {captures[name][0]["size"]: name for name in target_captures(captures)}


def drafter_names(raw: dict) -> dict[int, str]:
    """Drafter graph size -> its capture name, from the capture recorder's windows."""
    from kit.analysis.liveness import is_drafter_capture

    return {c["size"]: c["capture"] for c in raw["kit"]["captures"] if is_drafter_capture(c.get("manager", ""))}


def lifetime_verdict(found: DrafterLiveness, model: str, drafter: str) -> dict:
    """The lifetime analysis on one pairing: the outputs of `model` that `drafter` allocates over, by class."""
    rows = found.rows[(found.rows["capture"] == model) & (found.rows["drafter"] == drafter)]
    over, bad = rows[rows["drafter_overlaps"]], rows[rows["conflict"]]
    return {
        "conflict": bool(len(bad)),
        "conflict_bytes": int(bad["bytes"].sum()),
        "overlapped_bytes": int(over["bytes"].sum()),
        "output_bytes": int(rows["bytes"].sum()),
        "classes": {str(c): int(b) for c, b in over.groupby("class")["bytes"].sum().items()},
    }


def explain(row: dict, lifetime: dict, trace_only: bool) -> str | None:
    """Why the lifetime analysis and the read/write analysis disagree on a pairing; None when they agree."""
    if lifetime["conflict"] == (not row["holds"]):
        return None
    drafter = f"drafter graph {row['drafter_size']}"
    if lifetime["conflict"] and trace_only:
        return (
            f"from the trace alone, the lifetime analysis flags {lifetime['conflict_bytes']:,} B of the target's "
            f"outputs that {drafter} allocates over: the trace shows them allocated until the capture dropped "
            "them for weak references, not that the sampler and propose read them before the drafter replays "
            "(the reads the step records)"
        )
    if lifetime["conflict"]:
        return (
            f"{drafter} allocates over outputs read after it, but writes none of the bytes that are read "
            "(an allocation it does not fill where the reads are)"
        )
    return (
        f"{drafter} writes {row['overlap_bytes']:,} B read after it with the model graph's values, in no output "
        "block of the model capture (bytes it wrote outside its capture's outputs)"
    )


def compare_drafter(raw: dict, recording: ReadWriteRecording, can_run=None) -> list[dict]:
    """Per (model graph, drafter graph): the read/write verdict and the lifetime verdicts, with and without reads."""
    table = drafter_table(recording, can_run=can_run)
    models = target_sizes(raw)
    drafters = drafter_names(raw)
    with_reads = drafter_liveness_table(raw)
    trace_only = drafter_liveness_table(_without_step_reads(raw))
    pairs = []
    for _, row in table.iterrows():
        model, drafter = models[row["model_size"]], drafters[row["drafter_size"]]
        found = row.to_dict()
        lifetime = lifetime_verdict(with_reads, model, drafter)
        trace = lifetime_verdict(trace_only, model, drafter)
        pairs.append(
            {
                "model_size": int(row["model_size"]),
                "drafter_size": int(row["drafter_size"]),
                "dispatchable": bool(row["can_run"]),
                "readwrite_holds": bool(row["holds"]),
                "overlap_bytes": int(row["overlap_bytes"]),
                "output_bytes": int(row["output_bytes"]),
                "read_before_bytes": int(row["read_before_bytes"]),
                "read_after_bytes": int(row["read_after_bytes"]),
                "drafter_write_bytes": int(row["drafter_write_bytes"]),
                "outputs_overwritten_bytes": int(row["outputs_overwritten_bytes"]),
                "reading_ops": list(row["reading_ops"]),
                "writing_ops": list(row["writing_ops"]),
                "lifetime_conflict": lifetime["conflict"],
                "lifetime": lifetime,
                "agree": lifetime["conflict"] == (not row["holds"]),
                "explanation": explain(found, lifetime, trace_only=False),
                "trace_only_conflict": trace["conflict"],
                "trace_only": trace,
                "agree_trace_only": trace["conflict"] == (not row["holds"]),
                "explanation_trace_only": explain(found, trace, trace_only=True),
            }
        )
    return pairs


# --- running a scenario (CUDA) -------------------------------------------------------------------


def run_scenario(scenario: str, preset: str = "small", seed: int = SEED) -> dict:
    """Capture the replica with its speculator under `scenario`, record reads and writes, run a step of each size."""
    import torch

    from kit.experiments.alternatives.run import LIVE_NEEDS_CUDA, build_runner, scenario_patch
    from kit.experiments.alternatives.scenarios import alternatives_config
    from kit.experiments.dispatch import can_run
    from kit.experiments.readwrite_run.result import compare_analyses
    from kit.experiments.readwrite_run.run import replica_phases
    from kit.record.readwrite import ReadWriteRecorder
    from kit.record.recorder import CaptureRecorder

    check_one_of(scenario, DRAFTER_SCENARIOS, "drafter scenario")
    config = alternatives_config(preset)
    require_cuda(LIVE_NEEDS_CUDA)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    sizes = sorted(config.cudagraph_capture_sizes)
    # Recording from the first allocation, so the trace replays from an empty allocator.
    with scenario_patch(scenario), CaptureRecorder() as capture_recorder:
        runner = build_runner(config)
        torch.cuda.synchronize()
        with ReadWriteRecorder() as rw, replica_phases(runner, rw), drafter_phases(runner, rw):
            runner.capture_model()
            steps = [runner.step(torch.randint(config.vocab_size, (n,), generator=generator).cuda()) for n in sizes]
    recording = rw.recording()
    raw = attach_break_reads(capture_recorder.snapshot.raw, recording)
    models = target_sizes(raw)
    raw["kit"]["step_reads"] = step_read_entries(recording, models)

    def drafter_can_run(model_size: int, drafter_size: int) -> bool:
        return runner.speculator.dispatch(model_size) == drafter_size

    table = drafter_table(recording, can_run=drafter_can_run)
    model_table = readwrite_table(recording, can_run=can_run(config))
    return {
        "scenario": scenario,
        "preset": preset,
        "config": dataclasses.asdict(config),
        "pairs": [{"scenario": scenario, **pair} for pair in compare_drafter(raw, recording, drafter_can_run)],
        "obligation": drafter_summary(table),
        "verdicts": drafter_verdicts(table),
        "lifetime_verdicts": drafter_liveness_verdicts(drafter_liveness_table(raw)),
        "trace_only_verdicts": drafter_liveness_verdicts(drafter_liveness_table(_without_step_reads(raw))),
        "steps": [
            {"size": n, "drafter_size": s.draft_graph_size, "target_outputs_overwritten": s.target_outputs_overwritten}
            for n, s in zip(sizes, steps, strict=True)
        ],
        "model_graphs": {
            "obligation": obligation_summary(model_table),
            "pairs": compare_analyses(raw, recording, can_run(config)),
        },
        "capture_streams": _capture_streams(raw),
        "accesses": recording.to_records(),
        "snapshot": compact_snapshot(raw),
        "seed": seed,
        "provenance": provenance(f"python -m kit.experiments.drafter_run --scenario {scenario} --preset {preset}"),
    }


def compact_snapshot(raw: dict, frames: int = 1) -> dict:
    """The snapshot as the recording ships it: each trace entry keeps only the program's own first `frames` frames.

    The analyses read the program's own frames only (`alloc_frame`); torch's and
    the recorder's frames are most of the file's bytes.
    """
    from kit.analysis.frames import is_user_frame

    def entry(e: dict) -> dict:
        return {**e, "frames": [f for f in e.get("frames") or () if is_user_frame(f)][:frames]}

    return {**raw, "device_traces": [[entry(e) for e in trace] for trace in raw.get("device_traces", [])]}


def _capture_streams(raw: dict) -> dict[str, str]:
    from kit.experiments.alternatives.run import pool_figures

    return pool_figures(raw)["capture_streams"]


def run_scenario_in_subprocess(scenario: str, preset: str, out: Path) -> dict:
    """`run_scenario` in a fresh process (its own patch and graph pool); what it wrote to `out`."""
    failed = f"drafter read/write run for {scenario} ({preset})"
    return recorded.run_in_subprocess("kit.experiments.drafter_run", scenario, preset, out, failed)


def record(preset: str, out_dir: Path) -> Path:
    """Both scenarios, each in a fresh process, into `out_dir/<preset>.json`; its `PROVENANCE.json` entry too."""
    from kit.experiments.alternatives.run import LIVE_NEEDS_CUDA
    from kit.experiments.alternatives.scenarios import alternatives_config

    alternatives_config(preset)  # an unknown preset first
    require_cuda(LIVE_NEEDS_CUDA)  # before any folder or process is made
    out_dir, runs, provenance = recorded.record_each(
        "kit.experiments.drafter_run", DRAFTER_SCENARIOS, run_scenario_in_subprocess, preset, out_dir
    )
    pairs, scenarios = recorded.split_pairs(runs)
    data = {
        "preset": preset,
        "obligation": DRAFTER_OBLIGATION,
        "pairs": pairs,
        "scenarios": scenarios,
        "provenance": provenance,
    }
    return recorded.write_recording(data, out_dir, preset, agreement=summary_lines(data))


# --- reading ------------------------------------------------------------------------------------


def _schema_problem(data: Any) -> str | None:
    pairs = data.get("pairs") if isinstance(data, dict) else None
    if not isinstance(pairs, list) or not pairs or not all(isinstance(p, dict) for p in pairs):
        return "no 'pairs' list"
    missing = sorted({k for p in pairs for k in PAIR_KEYS if k not in p})
    if missing or not isinstance(data.get("provenance"), dict) or not isinstance(data.get("scenarios"), dict):
        return f"lacks {', '.join(missing) or 'provenance or scenarios'}"
    return None


def load_recording(preset: str = "small", path: str | Path | None = None) -> dict:
    """A drafter read/write recording (the shipped one for `preset` by default), checked."""
    path = Path(path) if path is not None else RECORDINGS_DIR / f"{preset}.json"
    missing = f"no drafter read/write recording for preset {preset!r} at {recorded.repo_path(path)}; record it on a GPU"
    data = recorded.read_recording(path, "a drafter read/write recording", missing, _schema_problem)
    data["source"] = recorded.source_line(data, path)
    return data


def summary_lines(data: dict) -> list[str]:
    """Per scenario: the drafter's obligation on the dispatchable pairings, and where the analyses agree."""
    lines = []
    for scenario in data["scenarios"]:
        rows = [p for p in data["pairs"] if p["scenario"] == scenario]
        running = [p for p in rows if p["dispatchable"]]
        violated = [p for p in running if not p["readwrite_holds"]]
        overwritten = sum(p["outputs_overwritten_bytes"] > 0 for p in running)
        lines.append(
            f"{scenario}: drafter obligation {'holds' if not violated else 'VIOLATED'} on "
            f"{len(violated) if violated else len(running)} of {len(running)} dispatchable pairings (the drafter "
            "overwrites the "
            f"target's outputs in {overwritten}); the lifetime analysis agrees on "
            f"{sum(p['agree'] for p in rows)} of {len(rows)} pairings with the step's reads, "
            f"{sum(p['agree_trace_only'] for p in rows)} from the trace alone"
        )
    return lines


def safety_evidence(data: dict, scenario: str) -> tuple[bool, str] | None:
    """The drafter's verdict for `scenario` from both analyses, in one line; None when the recording lacks it."""
    rows = [p for p in data["pairs"] if p["scenario"] == scenario]
    if not rows:
        return None
    running = [p for p in rows if p["dispatchable"]]
    holds = all(p["readwrite_holds"] for p in running)
    lifetime_safe = not any(p["lifetime_conflict"] for p in running)
    overwritten = max((p["outputs_overwritten_bytes"] for p in running), default=0)
    text = (
        f"drafter read/write obligation {'holds' if holds else 'VIOLATED'} on {len(running)} dispatchable pairings "
        f"(up to {overwritten:,} B of the target's outputs overwritten, every read of them before the drafter); "
        f"lifetime analysis with the step's reads: {'no conflict' if lifetime_safe else 'CONFLICT'}"
    )
    return holds and lifetime_safe, text


def with_drafter_analyses(data: dict, drafter: dict) -> dict:
    """Back share_all's verdict by the drafter's two analyses besides graphs vs eager.

    `share_all.safe` becomes graphs vs eager AND the drafter's read/write
    obligation AND the lifetime analysis with the step's reads; the graphs-vs-eager
    verdict alone stays in `graphs_vs_eager`, the drafter's in `drafter_analyses`.
    """
    found = safety_evidence(drafter, "share_all")
    if found is None:
        return data
    safe, text = found
    entry = data["share_all"]
    entry.setdefault("graphs_vs_eager", {"safe": entry["safe"], "evidence": entry["evidence"]})
    graphs = entry["graphs_vs_eager"]
    keep = ("scenario", "model_size", "drafter_size", "dispatchable", "outputs_overwritten_bytes", "read_after_bytes")
    keep += ("readwrite_holds", "lifetime_conflict", "trace_only_conflict", "agree", "explanation_trace_only")
    entry["drafter_analyses"] = {
        "safe": safe,
        "evidence": text,
        "obligation": drafter.get("obligation", ""),
        "source": drafter.get("source", "?"),
        "pairs": [{k: p.get(k) for k in keep} for p in drafter["pairs"]],
    }
    entry["safe"] = graphs["safe"] and safe
    entry["evidence"] = f"{graphs['evidence']}; {text}"
    return data


def load_alternatives(preset: str = "small", path: str | Path | None = None, drafter_path: str | Path | None = None):
    """The alternatives recording with share_all's verdict backed by the drafter's analyses (`with_drafter_analyses`).

    `path`: the alternatives recording (the shipped one by default); `drafter_path`: the
    drafter's (by default the shipped one beside the shipped alternatives, else `drafter/<preset>.json`
    beside `path`, as `run_alternatives_live` writes it). Without a drafter recording, the
    alternatives as recorded.
    """
    from kit.experiments.alternatives.result import load_graphs_vs_eager, recording_path

    data = load_graphs_vs_eager(preset, path)
    if drafter_path is None:
        beside_shipped = path is None or Path(path) == recording_path(preset)
        drafter_path = (RECORDINGS_DIR if beside_shipped else Path(path).parent / "drafter") / f"{preset}.json"
    if shipped(Path(drafter_path)) is not None:  # NAME or NAME.gz
        with_drafter_analyses(data, load_recording(preset, drafter_path))
    return data


def run_alternatives_live(preset: str = "small") -> dict:
    """Record the alternatives and the drafter's analyses on this GPU now; share_all backed by both."""
    from kit.experiments.alternatives.run import run_live

    out = Path(tempfile.mkdtemp(prefix="kit-alternatives-"))
    data = run_live(preset, out)
    with_drafter_analyses(data, load_recording(preset, record(preset, out / "drafter")))
    return data


def main(argv: list[str] | None = None) -> int:
    return recorded.recording_main(
        argv,
        description="The drafter's lifetime argument (alternative (a)), on this GPU.",
        old_flag="--variant",
        names=", ".join(DRAFTER_SCENARIOS),
        run_one=run_scenario,
        said=lambda name, result: result["obligation"],
        record=record,
        summary=lambda preset, path: summary_lines(load_recording(preset, path)),
    )


if __name__ == "__main__":
    sys.exit(main())

"""The read/write experiment run on CUDA: phases from a breakable capture, one scenario captured under the capture
and read/write recorders, and the recording of every scenario, each in a fresh process (`record`)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

from kit.analysis.invariant import (
    INVARIANT,
)
from kit.analysis.liveness import liveness_table, liveness_verdicts
from kit.analysis.readwrite import (
    AFTER_REPLAY,
    BREAK,
    MODEL,
    OBLIGATION,
    OUTPUT,
    REPLAY,
    RUNS_REPLAY,
    SEGMENT,
    Phase,
    attach_break_reads,
    obligation_summary,
    obligation_verdicts,
    readwrite_table,
    unseen_writer_lines,
)
from kit.errors import check_one_of
from kit.experiments import recorded
from kit.experiments.readwrite_run.result import (
    OUTPUTS_READ,
    _without_break_reads,
    break_inputs,
    compare_analyses,
    replica_invariant,
    summary_lines,
    with_invariant,
)
from kit.experiments.safety_run.result import SAFETY_SCENARIOS
from kit.patch.install import Patch
from kit.record.provenance import provenance as _provenance
from kit.record.provenance import require_cuda


@contextlib.contextmanager
def capture_phases(recorder, breakable, layers, graph_of: Callable, size_of: Callable, name: str) -> Iterator[None]:
    """While open, `recorder` records captures by phase: segments, breaks, outputs, replay graphs.

    `breakable` is the module of the breakable CUDA graphs (the replica's
    `kit.replica.breakable_cudagraph` or vLLM's `vllm.compilation.breakable_cudagraph`).
    Wraps its `BreakableCUDAGraphWrapper._capture` (a capture of the wrapper
    `graph_of` calls MODEL is model graph N, `size_of` of the capture's
    arguments, whose outputs are read after the forward; of REPLAY, replay
    graph R; any other is left unrecorded), `BreakableCUDAGraphCapture.add_eager`
    (the break between segments J and J + 1) and, on the instance, the replay
    layers' `run_layers` as the break calls it: from there to its return the
    break is `RUNS_REPLAY` (where R runs), after it `AFTER_REPLAY`. All three
    are put back as found (`Patch`), on an error too.
    """
    wrapper_cls, capture_cls = breakable.BreakableCUDAGraphWrapper, breakable.BreakableCUDAGraphCapture
    capture, add_eager = wrapper_cls._capture, capture_cls.add_eager

    def capture_by_phase(wrapper, *args):
        graph = graph_of(wrapper)
        if graph is None:
            return capture(wrapper, *args)
        size = size_of(*args)
        with recorder.phase(Phase(graph, size)):
            output = capture(wrapper, *args)
            if graph == MODEL:
                recorder.set_phase(Phase(MODEL, size, OUTPUT))
                recorder.note_reads(output, OUTPUTS_READ)
        return output

    replacements = [
        (wrapper_cls, "_capture", capture_by_phase),
        (capture_cls, "add_eager", break_by_phase(recorder, add_eager)),
        (layers, "run_layers", replay_layers_by_phase(recorder, layers.run_layers)),
    ]
    with Patch(name, replacements):
        yield


def replica_phases(runner, recorder) -> contextlib.AbstractContextManager:
    """`capture_phases` on the replica: its model runnable is the model graphs' wrapper, a capture's size its first
    argument (`BreakableCUDAGraphWrapper._capture(num_tokens, args)`)."""
    from kit.replica import breakable_cudagraph

    replay_graphs = runner.model_state.replay_cudagraphs
    graphs = {id(runner.model_runnable): MODEL, id(getattr(replay_graphs, "breakable_cg_runner", None)): REPLAY}
    layers = runner.model_state.decoder_replay_layers
    return capture_phases(
        recorder, breakable_cudagraph, layers, lambda w: graphs.get(id(w)), lambda num_tokens, args: num_tokens,
        "the replica's read/write phases",
    )  # fmt: skip


def break_by_phase(recorder, add_eager):
    """`add_eager` (a breakable capture's eager break) recorded as break J of the graph being captured, and
    what follows it as segment J + 1; the replica's and vLLM's breakable captures alike."""

    def wrapped(graph_capture, fn):
        phase = recorder.current_phase
        if phase is None:
            return add_eager(graph_capture, fn)
        index = graph_capture.num_eager_breaks
        with recorder.phase(dataclasses.replace(phase, part=BREAK, index=index)):
            result = add_eager(graph_capture, fn)
        recorder.set_phase(dataclasses.replace(phase, part=SEGMENT, index=index + 1))
        return result

    return wrapped


def replay_layers_by_phase(recorder, run_layers):
    """The replay layers' `run_layers` as a model graph's break calls it, recorded as `RUNS_REPLAY` (where a
    replay graph runs) and what follows it in the break as `AFTER_REPLAY`; elsewhere left as it is."""

    def wrapped(*inputs):
        phase = recorder.current_phase
        if phase is None or phase.graph != MODEL or phase.part != BREAK:
            return run_layers(*inputs)
        recorder.set_phase(dataclasses.replace(phase, part=RUNS_REPLAY))
        try:
            return run_layers(*inputs)
        finally:
            recorder.set_phase(dataclasses.replace(phase, part=AFTER_REPLAY))

    return wrapped


def run_scenario(scenario: str, preset: str = "small") -> dict:
    """Capture the replica as `scenario` says in this process, recording reads, writes and the trace; the comparison."""
    import torch

    from kit.analysis.equivalence import check_equivalence
    from kit.experiments.dispatch import can_run
    from kit.experiments.safety_run.result import SCENARIO_OF, scenario_description, scenario_safety_config
    from kit.experiments.scenarios import SCENARIOS, check_preset
    from kit.patch import replica as replica_patch
    from kit.record.readwrite import ReadWriteRecorder
    from kit.record.recorder import CaptureRecorder
    from kit.replica.model_runner import GPUModelRunner

    check_one_of(scenario, SAFETY_SCENARIOS, "read/write scenario")
    check_preset(preset)
    require_cuda(LIVE_NEEDS_CUDA)
    replica_scenario = SCENARIO_OF[scenario]
    patch_policy, _, _ = SCENARIOS[replica_scenario]
    description = scenario_description(scenario)
    config = scenario_safety_config(scenario, preset)  # V4.1's break inputs, and a break at every attention
    patch = replica_patch.patched(patch_policy) if patch_policy else contextlib.nullcontext()
    # Recording from the first allocation, so the trace replays from an empty allocator.
    with patch, CaptureRecorder() as capture_recorder:
        runner = GPUModelRunner(config)
        torch.cuda.synchronize()
        with ReadWriteRecorder() as rw, replica_phases(runner, rw):
            runner.capture_model()
    recording = rw.recording()
    raw = attach_break_reads(capture_recorder.snapshot.raw, recording)
    pairs = compare_analyses(raw, recording, can_run(config))
    table = readwrite_table(recording, can_run=can_run(config))
    invariant = replica_invariant(recording, raw, config, can_run(config))
    pairs = with_invariant(pairs, invariant)
    command = f"python -m kit.experiments.readwrite_run --scenario {scenario} --preset {preset}"
    return {
        "scenario": scenario,
        "replica_scenario": replica_scenario,
        "description": description,
        "preset": preset,
        "config": dataclasses.asdict(config),
        "has_early_aux": replica_patch.has_early_aux(runner.model_state),
        "pairs": [{"scenario": scenario, **pair} for pair in pairs],
        "obligation": obligation_summary(table),
        "verdicts": obligation_verdicts(table),
        "unseen_writers": unseen_writer_lines(recording),
        "invariant": invariant,
        "lifetime_verdicts": liveness_verdicts(liveness_table(raw)),
        "trace_only_verdicts": liveness_verdicts(liveness_table(_without_break_reads(raw))),
        "break_inputs": break_inputs(raw),
        "break_reads": raw["kit"]["break_reads"],
        "equivalence": check_equivalence(runner).to_records(),
        "accesses": recording.to_records(),
        "provenance": _provenance(command),
    }


def run_scenario_in_subprocess(scenario: str, preset: str, out: Path) -> dict:
    """`run_scenario` in a fresh process (its own patch and graph pool); what it wrote to `out`."""
    failed = f"read/write run for {scenario} ({preset})"
    return recorded.run_in_subprocess("kit.experiments.readwrite_run", scenario, preset, out, failed)


def record(preset: str, out_dir: Path) -> Path:
    """Every scenario, each in a fresh process, into `out_dir/<preset>.json`; its `PROVENANCE.json` entry too."""
    from kit.experiments.dispatch import RULE as DISPATCH_RULE
    from kit.experiments.scenarios import check_preset

    check_preset(preset)
    require_cuda(LIVE_NEEDS_CUDA)  # before any folder or process is made
    out_dir, runs, provenance = recorded.record_each(
        "kit.experiments.readwrite_run", SAFETY_SCENARIOS, run_scenario_in_subprocess, preset, out_dir
    )
    pairs, scenarios = recorded.split_pairs(runs)
    data = {
        "preset": preset,
        "obligation": OBLIGATION,
        "invariant": INVARIANT,
        "rule": DISPATCH_RULE,
        "pairs": pairs,
        "scenarios": scenarios,
        "provenance": provenance,
    }
    obligation = {scenario: run["obligation"] for scenario, run in runs.items()}
    invariant = {scenario: run["invariant"]["summary"] for scenario, run in runs.items()}
    return recorded.write_recording(
        data, out_dir, preset, obligation=obligation, invariant=invariant, agreement=summary_lines(data)
    )


LIVE_NEEDS_CUDA = "recording reads and writes during capture needs CUDA, and this process has none"

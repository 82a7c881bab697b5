"""The proof obligation on the replica's captures: reads and writes against lifetimes, per pairing.

Each scenario (`pr`, `unpatched`, `early_aux_shared`, the scenarios of
`kit.experiments.scenarios`) is captured in a fresh process under the
capture recorder (the allocator trace) and the read/write recorder
(`kit.record.readwrite`), with phases set from the replica's breakable
capture (`replica_phases`; `capture_phases` is the one phase recorder, for
the replica's breakable graphs and, through `vllm.safety.vllm_phases`,
vLLM's): model graph N segment J, its break J, its outputs (read by the
caller after the forward), replay graph R. Then, side
by side for every (model graph, replay graph) pairing:

- the read/write analysis (`kit.analysis.readwrite.readwrite_table`): do the
  bytes R writes overlap the bytes N carries across its break;
- the lifetime analysis (`kit.analysis.liveness.liveness_table`) with what
  each break read attached to the snapshot (`break input` is a block the
  break read), and as a trace alone would give it (`trace_only`: no block is
  a break input);
- whether they agree, and for each disagreement an `explanation` built from
  the blocks involved;
- the structural invariant (`kit.analysis.invariant`): the graph-pool bytes
  read after R starts whose value came before it, from the capture
  recorder's segments in the same process, early aux told apart
  (`invariant` per scenario; `graph_pool_carried_bytes`,
  `early_aux_carried_bytes`, `invariant_holds` per pairing). A recording made
  before it lacks them, and says "not recorded" (`invariant_lines`).

`dispatchable` marks the pairings vLLM's dispatch can produce
(`kit.experiments.dispatch`); the rest are stress. Model graphs break at every
attention (`ReplicaConfig.attention_breaks`) as V4.1's do, and R is paired
with the break where the replay layers ran; the break is recorded in three
parts (before the replay layers, while they run, after them), so reads after
R starts, in the break too, are checked.
`record(preset, out_dir)` writes `<preset>.json` and its `PROVENANCE.json`
entry to `out_dir`; the shipped recordings are `readwrite/<preset>.json` in
the kit's recordings (`kit.recordings.RECORDINGS`, `RECORDINGS_DIR` here):

    python -m kit.experiments.readwrite_run --preset small --out OUT   # every scenario into OUT/small.json
    python -m kit.experiments.readwrite_run --scenario pr --preset small --out pr.json   # one scenario, this process
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from kit.analysis.invariant import (
    INVARIANT,
    INVARIANT_PAIR_KEYS,
    NOT_RECORDED,
    early_aux_count,
    invariant_result,
    verdict_line,
)
from kit.analysis.liveness import BREAK_INPUT, HELD, RELEASED, Liveness, liveness_table, liveness_verdicts
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
    Ranges,
    ReadWriteRecording,
    attach_break_reads,
    capture_names,
    carried_reads,
    obligation_summary,
    obligation_verdicts,
    readwrite_table,
    unseen_writer_lines,
)
from kit.errors import check_one_of
from kit.experiments import recorded
from kit.experiments.safety_run.result import SAFETY_SCENARIOS
from kit.patch.install import Patch
from kit.record.provenance import provenance as _provenance
from kit.record.provenance import require_cuda
from kit.recordings import RECORDINGS
from kit.units import format_bytes

RECORDINGS_DIR = RECORDINGS / "readwrite"
OUTPUTS_READ = "the forward's caller"  # the op name of the reads of a model graph's outputs
PAIR_KEYS = ("scenario", "model_size", "replay_size", "dispatchable", "readwrite_holds", "lifetime_conflict", "agree")


# --- phases from the replica's breakable capture ----------------------------------


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


# --- the two analyses side by side ----------------------------------------------


def _without_break_reads(raw: dict) -> dict:
    return {**raw, "kit": {k: v for k, v in raw["kit"].items() if k != "break_reads"}}


def lifetime_pair(liveness: Liveness, model_capture: str, replay_capture: str) -> dict:
    """The lifetime analysis's verdict on one pairing: the held blocks of N that R allocates over."""
    rows = liveness.rows[liveness.rows["capture"] == model_capture]
    over = rows[rows["overlapping_replay"].map(lambda names: replay_capture in names).astype(bool)]
    hits = over[over["class"] == HELD]
    return {
        "conflict": bool(len(hits)),
        "conflict_bytes": int(hits["bytes"].sum()),
        "blocks": [
            {"addr": int(r["addr"]), "bytes": int(r["bytes"]), "class": r["class"], "alloc_frame": r["alloc_frame"]}
            for _, r in over.iterrows()
        ],
    }


def _block_of(liveness: Liveness, model_capture: str, addr: int) -> pd.Series | None:
    rows = liveness.rows[liveness.rows["capture"] == model_capture]
    inside = rows[(rows["addr"] <= addr) & (addr < rows["addr"] + rows["bytes"])]
    return None if inside.empty else inside.iloc[0]


def explain(row: dict, lifetime: dict, liveness: Liveness, model_capture: str, carried: Ranges) -> str | None:
    """Why the lifetime analysis and the read/write analysis disagree on a pairing; None when they agree."""
    if lifetime["conflict"] == (not row["holds"]):
        return None
    replay = f"replay graph {row['replay_size']}"
    if lifetime["conflict"]:
        held = [b for b in lifetime["blocks"] if b["class"] == HELD]
        unread = [b for b in held if not carried.intersects(b["addr"], b["addr"] + b["bytes"])]
        if len(unread) == len(held):
            why = (
                "what the break read was not given to the lifetime analysis, so it could not call them break inputs"
                if not liveness.break_reads_known
                else "not even the break reads them"
            )
            return (
                f"the lifetime analysis flags {format_bytes(sum(b['bytes'] for b in held))} in {len(held)} block(s) "
                f"held across the break that {replay} allocates over, but nothing after the break reads them: the "
                f"forward keeps them bound without reading them (as V4.1 keeps residual, post_mix and res_mix); {why}"
            )
        return (
            f"{replay} allocates over blocks read after the break, but writes none of the bytes that are read "
            "(an allocation it does not fill where the reads are)"
        )
    addr = int(row["first_overlap"])
    block = _block_of(liveness, model_capture, addr)
    ops = ", ".join(row["reading_ops"])
    if block is None:
        return (
            f"the bytes at {addr:#x} that {replay} writes and {ops} reads after the break are in no graph-pool "
            "block the model graph holds across the break in the trace (allocated outside its capture windows)"
        )
    if block["class"] in (BREAK_INPUT, RELEASED):
        return (
            f"the lifetime analysis takes the block at {int(block['addr']):#x} for the break's ({block['class']}), "
            f"but {ops} reads it after the break too: a break input that is also read later"
        )
    return (
        f"the block at {int(block['addr']):#x} is held after the break, but {replay} writes it without an "
        "allocation over it in its capture window"
    )


def compare_analyses(raw: dict, recording: ReadWriteRecording, can_run=None) -> list[dict]:
    """Per pairing: the read/write verdict, the lifetime verdicts (with and without the break's reads), agreement.

    `raw` is the capture recorder's snapshot dict with `kit["break_reads"]`
    attached (`attach_break_reads`), `can_run(model_size, replay_size)` the
    dispatch rule (None: every pairing). `unseen_writer_bytes` (read after R
    starts, written outside the dispatcher, so not carried) and
    `unseen_overlap_bytes` (where that blind spot meets R) say what the
    recorder could not see (`kit.analysis.readwrite.readwrite_table`).
    """
    table = readwrite_table(recording, can_run=can_run)
    names = capture_names(raw["kit"]["captures"])
    with_reads = liveness_table(raw)
    trace_only = liveness_table(_without_break_reads(raw))
    pairs = []
    for _, row in table.iterrows():
        model, replay = names[(MODEL, row["model_size"])], names[(REPLAY, row["replay_size"])]
        carried = Ranges((p.start, p.end) for p in carried_reads(recording, row["model_size"], row["break"]))
        lifetime = lifetime_pair(with_reads, model, replay)
        trace = lifetime_pair(trace_only, model, replay)
        found = row.to_dict()
        pairs.append(
            {
                "model_size": int(row["model_size"]),
                "replay_size": int(row["replay_size"]),
                "break": int(row["break"]),
                "dispatchable": bool(row["can_run"]),
                "readwrite_holds": bool(row["holds"]),
                "overlap_bytes": int(row["overlap_bytes"]),
                "first_overlap": None if row["holds"] else int(row["first_overlap"]),
                "carried_bytes": int(row["carried_bytes"]),
                "replay_write_bytes": int(row["replay_write_bytes"]),
                "reading_ops": list(row["reading_ops"]),
                "writing_ops": list(row["writing_ops"]),
                "unseen_writer_bytes": int(row["unseen_writer_bytes"]),
                "unseen_writer_ops": list(row["unseen_writer_ops"]),
                "unseen_overlap_bytes": int(row["unseen_overlap_bytes"]),
                "lifetime_conflict": lifetime["conflict"],
                "lifetime_conflict_bytes": lifetime["conflict_bytes"],
                "lifetime_blocks": lifetime["blocks"],
                "agree": lifetime["conflict"] == (not row["holds"]),
                "explanation": explain(found, lifetime, with_reads, model, carried),
                "trace_only_conflict": trace["conflict"],
                "trace_only_conflict_bytes": trace["conflict_bytes"],
                "agree_trace_only": trace["conflict"] == (not row["holds"]),
                "explanation_trace_only": explain(found, trace, trace_only, model, carried),
            }
        )
    return pairs


def break_inputs(raw: dict) -> list[dict]:
    """Per model capture and break: the blocks held across it by class, with and without the break's reads."""
    out = []
    for analysis, liveness in (
        ("with_break_reads", liveness_table(raw)),
        ("trace_only", liveness_table(_without_break_reads(raw))),
    ):
        for (capture, j), rows in liveness.rows.groupby(["capture", "break"], sort=False):
            by_class = rows.groupby("class")["bytes"]
            classes = {
                c: {"blocks": int(n), "bytes": int(b)}
                for (c, n), b in zip(by_class.count().items(), by_class.sum(), strict=True)
            }
            out.append({"analysis": analysis, "capture": capture, "break": int(j), "classes": classes})
    return out


# --- the structural invariant beside the obligation -------------------------------------------


def replica_invariant(recording: ReadWriteRecording, raw: dict, config, can_run=None) -> dict:
    """The invariant (`kit.analysis.invariant`) over a replica capture: the graph pool's ranges from `raw`, the
    snapshot recorded in the same process as `recording`; the early aux outputs from `config`."""
    early = early_aux_count(config.aux_hidden_state_layers, config.decoder_replay_start)
    return invariant_result(recording, raw, early, can_run=can_run)


def with_invariant(pairs: list[dict], invariant: dict) -> list[dict]:
    """Each pairing with the invariant's figures for its (model graph, break, replay graph) added."""
    rows = {(r["model_size"], r["break"], r["replay_size"]): r for r in invariant["rows"]}
    out = []
    for pair in pairs:
        row = rows.get((pair["model_size"], pair["break"], pair["replay_size"]))
        out.append({**pair, **{k: (row[k] if row else None) for k in INVARIANT_PAIR_KEYS}})
    return out


def invariant_lines(data: dict) -> list[str]:
    """Per scenario: the invariant's verdict and its list of graph-pool reads, or that the recording lacks it."""
    lines = [INVARIANT]
    for scenario, run in (data.get("scenarios") or {}).items():
        invariant = run.get("invariant") if isinstance(run, dict) else None
        if not invariant:
            lines.append(f"{scenario}: invariant {NOT_RECORDED}")
            continue
        lines.append(verdict_line(scenario, invariant["holds"], invariant["summary"]))
        lines += [f"  {line}" for line in invariant["verdicts"]]
    return lines


# --- running a scenario (CUDA) --------------------------------------------------------


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


# --- reading ---------------------------------------------------------------------------


LIVE_NEEDS_CUDA = "recording reads and writes during capture needs CUDA, and this process has none"


def load_recording(preset: str, path: str | Path | None = None) -> dict:
    """A read/write recording (the shipped one for `preset` by default), checked."""
    path = Path(path) if path is not None else RECORDINGS_DIR / f"{preset}.json"
    missing = f"no read/write recording for preset {preset!r} at {path}; record it on a GPU"
    return recorded.read_recording(path, "a read/write recording", missing, _schema_problem, where=str)


def recorded_if_any(preset: str) -> dict | None:
    """The shipped read/write recording at `preset` with its `source` line, or None when there is none."""
    path = RECORDINGS_DIR / f"{preset}.json"
    if not path.is_file():
        return None
    data = load_recording(preset, path)
    data["source"] = recorded.source_line(data, path)
    return data


def _schema_problem(data: Any) -> str | None:
    from kit.experiments.safety_run.result import pairless_preset

    pairs = data.get("pairs") if isinstance(data, dict) else None
    if not isinstance(pairs, list) or not all(isinstance(p, dict) for p in pairs):
        return "no 'pairs' list"
    if not pairs and not pairless_preset(data):
        return "no 'pairs' list"
    missing = sorted({k for p in pairs for k in PAIR_KEYS if k not in p})
    if missing or not isinstance(data.get("provenance"), dict):
        return f"lacks {', '.join(missing) or 'provenance'}"
    return None


def summary_lines(data: dict) -> list[str]:
    """Per scenario: the obligation's result on the dispatchable pairings, and where the analyses agree."""
    from kit.experiments.safety_run.result import no_pairs_line

    if not data["pairs"] or not any(p["dispatchable"] for p in data["pairs"]):
        # Stress pairings only (a replay graph replayed in a model graph's attention break, which vLLM never does):
        # nothing to claim of the obligation, whatever the stress rows say.
        stress = f" ({len(data['pairs'])} stress pairings recorded, none claimed)" if data["pairs"] else ""
        return [no_pairs_line(data) + stress]
    lines = []
    df = pd.DataFrame(data["pairs"])
    for scenario, rows in df.groupby("scenario", sort=False):
        running = rows[rows["dispatchable"]]
        violated = running[~running["readwrite_holds"]]
        agree = int(rows["agree"].sum())
        trace_agree = int(rows["agree_trace_only"].sum())
        lines.append(
            f"{scenario}: obligation {'holds' if violated.empty else 'VIOLATED'} on "
            f"{len(running) - len(violated) if violated.empty else len(violated)} of {len(running)} dispatchable "
            "pairings; the lifetime analysis agrees "
            f"on {agree} of {len(rows)} pairings with the breaks' reads, {trace_agree} from the trace alone"
        )
    return lines


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

"""The safety argument on vLLM 0.33's own path: the read/write obligation per pairing, and the pairings against eager.

`kit.experiments.vllm.capture` runs vLLM's own capture path around a stand-in
DeepSeek-V4.1 (`GPUModelRunner.capture_model`, `BreakableCUDAGraphWrapper`,
`DecoderReplayLayers`, `DecoderReplayCudaGraphManager`); this module adds,
in the same fresh process as each scenario's capture:

- **the read/write recording** of the capture (`vllm_phases`): the bytes every
  aten op reads and writes (`kit.record.readwrite.ReadWriteRecorder`), tagged
  with the phase vLLM's own code is in. vLLM's `BreakableCUDAGraphWrapper._capture`
  is wrapped: a capture by the model graphs' wrapper
  (`ModelCudaGraphManager.breakable_cg_runner`) is model graph N, whose
  outputs its caller reads after the forward (`model_outputs(N)`); one by the
  replay graphs' wrapper (`DecoderReplayCudaGraphManager.breakable_cg_runner`)
  is replay graph R. `BreakableCUDAGraphCapture.add_eager` (what
  `eager_break_during_capture` calls to end a segment, run the break and
  start the next) is break J, between segments J and J + 1. Inside the break,
  the instance attribute `DecoderReplayLayers.run_layers` (which `_run` calls
  as `self.run_layers(*row_inputs)` once it has gathered the rows) marks where
  the replay layers run (`model_runs_replay`, where a replay graph runs at
  runtime) and the rest of the break (`model_after_replay`: the scatter back
  to batch rows, the copy into the break's buffers). The replay graphs'
  wrapper holds its own reference to `run_layers`, so their captures are not
  affected. vLLM's `weak_ref_tensor` op is left out of the recording (the
  recorder's `NO_DATA`): it makes a view of the same memory and touches no
  data, but its schema has no alias annotation, so the recorder would count
  its output as written (the model graph's outputs, rewritten after the
  break, would never be carried).
  Everything is put back as found;
- **the obligation** (`kit.analysis.readwrite.readwrite_table`) over the
  pairings vLLM's dispatch can produce (`kit.experiments.dispatch`), with
  the replay sizes and trim threshold read back from vLLM's own replay graph
  manager: `readwrite_result`;
- **the pairings** (`run_pairings`): for every model graph N and every replay
  graph R that can run in N's break, N's forward through vLLM's path with a
  replay batch of `rows_for(N, R)` rows, which vLLM's own
  `DecoderReplayCudaGraphManager.dispatch` pads to R and whose `run` replays
  R in N's break, against the eager forward of the same ids with the same rows
  (padded with zeros to R, vLLM's `num_padded` path, so the replay layers run
  the same shapes: a difference is one of memory, not of a GEMM picked for
  another row count). Pairings vLLM's dispatch cannot produce are not run:
  on vLLM's path `run` replays only the graph `dispatch` picks for the batch's
  rows; the replica's adversarial runs (`kit.experiments.safety_run`) stress
  those. The pairings only prefill context parallelism dispatches (the rows
  counted over the global batch, up to pcp_size x N) run the same way in
  `run_pcp_pairings`: N's step with the global row count, its own rows padded
  to the graph that count dispatches to (`kit/experiments/dispatch.py`).
  Each pairing carries its power (`kit.experiments.power`, the same
  positive control as the replica's): the graph forward again with every
  byte of vLLM's global graph pool but R's outputs poisoned right after R
  replays (`poisoned_replays`, around the replay wrapper's `_replay`),
  against the unpoisoned forward; a pairing whose outputs survive the poison
  could not have failed and is not counted as shown (`pairings_verdict`).

`summary(meta)` reads both back from a recording's `kit` key (None for a
recording made before them).
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from kit.analysis.equivalence import compare_forward
from kit.analysis.invariant import INVARIANT, early_aux_count, invariant_result, verdict_line
from kit.analysis.readwrite import (
    AFTER_REPLAY,
    BREAK,
    MODEL,
    OBLIGATION,
    REPLAY,
    RUNS_REPLAY,
    SEGMENT,
    ReadWriteRecording,
    obligation_summary,
    obligation_verdicts,
    readwrite_table,
    unseen_writer_lines,
)
from kit.analysis.tables import table_records
from kit.experiments import dispatch
from kit.experiments.power import CONTROL, PoolPoison, not_run, power_clause, power_fields
from kit.experiments.readwrite_run.run import capture_phases
from kit.experiments.summary import vllm_scenario_of
from kit.patch.install import Patch
from kit.units import format_bytes

SEED = 4321
NOT_RUN = (
    "pairings vLLM's dispatch cannot produce (a replay graph above the one N's rows, or under PCP the global batch's, "
    "can reach, or N below the trim threshold) are not run on vLLM's path: DecoderReplayCudaGraphManager.run "
    "replays only the graph its dispatch picks for the batch's rows (the replica's adversarial pairings, "
    "kit.experiments.safety_run, stress them)"
)
REFERENCE = (
    "graph: N's forward through its breakable graph, the replay batch (the step's last rows_for(N, R) rows) padded "
    "to R by vLLM's dispatch and replayed in N's break by DecoderReplayCudaGraphManager.run; eager: the same ids "
    "and rows, eagerly, padded with zeros to R (ReplayBatch.num_padded), so both run the same shapes"
)


# --- phases on vLLM's breakable capture ------------------------------------------


def vllm_phases(runner, recorder) -> contextlib.AbstractContextManager:
    """`readwrite_run.run.capture_phases` on vLLM's capture path (see the module docstring).

    The model graphs' wrapper is the one `ModelCudaGraphManager.capture` made
    (`init_breakable_cg_runner`), the replay graphs' the replay manager's; a
    capture's size is its entry's batch descriptor (`_capture(entry, args, kwargs)`).
    """
    from vllm.compilation import breakable_cudagraph

    state = runner.model_state
    replay_wrapper = state.replay_cudagraphs.breakable_cg_runner

    def graph_of(wrapper) -> str | None:
        if wrapper is replay_wrapper:
            return REPLAY
        if wrapper is getattr(runner.cudagraph_manager, "breakable_cg_runner", None):
            return MODEL
        return None

    def size_of(entry, args, kwargs) -> int:
        return entry.batch_descriptor.num_tokens

    layers = state.decoder_replay_layers  # its run_layers is an instance attribute, set by DecoderReplayLayers.__init__
    return capture_phases(recorder, breakable_cudagraph, layers, graph_of, size_of, "vLLM's read/write phases")


def phases_seen(recording: ReadWriteRecording) -> dict:
    """Which phases the recording holds: per model graph its parts (`segment 0`, `break 0`, `runs_replay 0`, ...,
    `output 0`), and the replay graphs' sizes. A model graph whose break never ran the replay layers lacks
    `runs_replay`."""
    model: dict[int, set[str]] = {}
    for a in recording.accesses:
        if a.phase.graph == MODEL:
            model.setdefault(a.phase.size, set()).add(f"{a.phase.part} {a.phase.index}")
    order = {p: i for i, p in enumerate((SEGMENT, BREAK, RUNS_REPLAY, AFTER_REPLAY))}

    def key(label: str) -> tuple:
        part, index = label.split(" ")
        return (part == "output", int(index), order.get(part, 9))

    return {
        "model_graphs": {str(size): sorted(parts, key=key) for size, parts in sorted(model.items())},
        "replay_graphs": recording.sizes(REPLAY),
    }


# --- the dispatch rule, from vLLM's own replay graph manager ------------------------------


def replay_sizes(runner) -> list[int]:
    """The replay capture sizes vLLM's `DecoderReplayCudaGraphManager.__init__` settled on (its config's)."""
    return sorted(runner.model_state.replay_cudagraphs.compilation_config.cudagraph_capture_sizes)


def trim_threshold(runner) -> int:
    """The trim threshold the replay layers break out at (`DecoderReplayLayers.trim_threshold`)."""
    return int(runner.model_state.decoder_replay_layers.trim_threshold)


def row_bounds(runner) -> dict:
    """The replay window (`DecoderReplayLayers.window`) and model capture sizes that bound a step's replay rows."""
    return {
        "window": int(runner.model_state.decoder_replay_layers.window),
        "model_sizes": tuple(runner.stand_in.cudagraph_capture_sizes),
    }


def can_run(runner) -> Callable[[int, int], bool]:
    """`can_run(model_size, replay_size)`: vLLM 0.33's dispatch rule (without PCP) on the runner's sizes."""
    sizes, threshold, bounds = replay_sizes(runner), trim_threshold(runner), row_bounds(runner)

    def check(model_size: int, replay_size: int) -> bool:
        return replay_size in dispatch.dispatchable_replay_sizes(model_size, sizes, threshold, **bounds)

    return check


def dispatchable_pairs(runner) -> list[tuple[int, int, int | None]]:
    """Every (model size, replay size, rows) vLLM's dispatch can run without PCP, small first (`dispatch.rows_for`)."""
    sizes, threshold, bounds = replay_sizes(runner), trim_threshold(runner), row_bounds(runner)
    return [
        (n, r, dispatch.rows_for(n, r, sizes, **bounds))
        for n in sorted(runner.stand_in.cudagraph_capture_sizes)
        for r in sorted(dispatch.dispatchable_replay_sizes(n, sizes, threshold, **bounds))
    ]


# --- the obligation -----------------------------------------------------------------


def readwrite_records(table) -> list[dict]:
    """`readwrite_table`'s rows as JSON-able records (`table_records`), its lists of names as strings."""
    return [
        {k: [str(v) for v in value] if isinstance(value, list) else value for k, value in row.items()}
        for row in table_records(table)
    ]


def vllm_invariant(recording: ReadWriteRecording, raw: dict, runner) -> dict:
    """The structural invariant (`kit.analysis.invariant`) over the capture, on vLLM's dispatch: the graph pool's
    ranges from `raw`, the capture recorder's snapshot made in the same process as `recording`."""
    backbone = runner.model.model
    early = early_aux_count(backbone.aux_hidden_state_layers, backbone.decoder_replay_start)
    return invariant_result(recording, raw, early, can_run=can_run(runner))


def invariant_of_snapshot(raw: dict) -> dict | None:
    """The invariant of a vLLM recording: as recorded (`kit["readwrite"]["invariant"]`), else computed from what
    it has (its read/write accesses, its graph-pool segments, its config and dispatch rule: `computed` True),
    else None (a recording without the read/write accesses: not recorded)."""
    meta = raw.get("kit") or {}
    readwrite = meta.get("readwrite") if isinstance(meta.get("readwrite"), dict) else None
    if readwrite is None or "accesses" not in readwrite:
        return None
    if readwrite.get("invariant"):
        return {**readwrite["invariant"], "computed": False}
    config = vllm_scenario_of(meta).get("config") or {}
    if "aux_hidden_state_layers" not in config or "replay_sizes" not in readwrite:
        return None
    early = early_aux_count(config["aux_hidden_state_layers"], config["decoder_replay_start"])
    sizes, threshold = readwrite["replay_sizes"], readwrite["trim_threshold"]

    def check(model_size: int, replay_size: int) -> bool:
        return replay_size in dispatch.dispatchable_replay_sizes(model_size, sizes, threshold)

    recording = ReadWriteRecording.from_records(readwrite["accesses"])
    return {**invariant_result(recording, raw, early, can_run=check), "computed": True}


def vllm_invariant_lines(found: dict[str, dict]) -> list[str]:
    """The invariant on vLLM's path, per recorded scenario: verdict, how it was had, its list."""
    lines = [f"the structural invariant on vLLM's path (kit/recordings/vllm): {INVARIANT}"]
    for name, inv in found.items():
        how = " (computed from the recording's reads, writes and segments)" if inv.get("computed") else ""
        line = verdict_line(name, inv["holds"], inv["summary"])
        verdict, _, rest = line.partition(": ")[2].partition(": ")
        lines.append(f"{name}: {verdict}{how}: {rest}")
        lines += [f"  {line}" for line in inv["verdicts"]]
    return lines


def readwrite_result(recording: ReadWriteRecording, runner) -> dict:
    """The obligation over the runner's dispatchable pairings: the table's rows, the verdicts, and whether it holds.

    `holds` is None when no pairing can run (or the recording marked no
    replay break): nothing was checked, so nothing is claimed.
    """
    table = readwrite_table(recording, can_run=can_run(runner))
    running = table[table["can_run"].astype(bool)]
    empty = table.empty  # no replay break was recorded (an empty frame's columns cannot be masked)
    return {
        "obligation": OBLIGATION,
        "rule": dispatch.RULE,
        "replay_sizes": replay_sizes(runner),
        "trim_threshold": trim_threshold(runner),
        "rows": readwrite_records(table),
        "verdicts": [] if empty else obligation_verdicts(table),
        "summary": f"{OBLIGATION} Nothing to check: no pairing can run." if empty else obligation_summary(table),
        "holds": bool(running["holds"].all()) if len(running) else None,
        "unseen_writers": unseen_writer_lines(recording),
        "phases": phases_seen(recording),
        "accesses": recording.to_records(),
    }


# --- the pairings ---------------------------------------------------------------------


@contextlib.contextmanager
def replays_seen(runner) -> Iterator[list[int]]:
    """While open, the size of every replay graph replayed (`DecoderReplayCudaGraphManager`'s wrapper, `_replay`)."""
    wrapper = runner.model_state.replay_cudagraphs.breakable_cg_runner
    replay, seen = wrapper._replay, []

    def spy(entry, args, kwargs):
        seen.append(int(entry.batch_descriptor.num_tokens))
        return replay(entry, args, kwargs)

    with Patch("replays seen", [(wrapper, "_replay", spy)]):  # reverted: the class's method again
        yield seen


@contextlib.contextmanager
def poisoned_replays(runner, poison: Callable[[Any], None]) -> Iterator[None]:
    """While open, every replay graph replayed is followed by `poison(its outputs)` (the wrapper's `_replay`)."""
    wrapper = runner.model_state.replay_cudagraphs.breakable_cg_runner
    replay = wrapper._replay

    def replay_then_poison(entry, args, kwargs):
        outputs = replay(entry, args, kwargs)
        poison(outputs)  # R's outputs keep their values: the break reads them as R's result
        return outputs

    with Patch("poisoned replays", [(wrapper, "_replay", replay_then_poison)]):
        yield


def vllm_pool_poison(runner) -> PoolPoison:
    """The positive control's poison over the replay graphs' graph pool (vLLM's global pool)."""
    import torch

    return PoolPoison.of(runner.model_state.replay_cudagraphs.breakable_cg_runner.graph_pool, torch.device("cuda"))


def output_names(runner) -> list[str]:
    return ["hidden_states", *(f"aux_hidden_state[{i}]" for i in runner.model.model.aux_hidden_state_layers)]


def run_pairings(
    runner, forward: Callable[..., tuple], seed: int = SEED, to_run=None, poison: PoolPoison | None = None
) -> dict:
    """Every dispatchable (N, R) through vLLM's path, graphs against eager; the rows, the verdict, how they ran.

    `forward(runner, input_ids, use_cudagraph, rows=..., pad=...)` is
    `kit.experiments.vllm.capture.run_forward`. A pairing whose replay batch
    did not replay exactly graph R once is kept with an `error`. `to_run`:
    (N, R, rows) to run instead of `dispatchable_pairs(runner)`. Each pairing
    carries its power (`kit.experiments.power`): its graph forward again with
    the graph pool (`poison`, default `vllm_pool_poison`) poisoned right after R
    replays, R's outputs kept, against the unpoisoned forward. R is N's one
    replay graph here, so nothing in the break runs after it to mask it.
    """
    import torch

    poison = vllm_pool_poison(runner) if poison is None else poison
    cfg = runner.stand_in
    names = output_names(runner)
    layers = runner.model.decoder_replay_layers
    generator = torch.Generator(device="cpu").manual_seed(seed)
    pairs = []
    for model_size, replay_size, rows in dispatchable_pairs(runner) if to_run is None else to_run:
        row: dict[str, Any] = {"model_size": model_size, "replay_size": replay_size, "rows": rows, "dispatchable": True}
        if rows is None:
            pairs.append({**row, "bit_exact": None, "error": "no row count of this step dispatches to R"})
            continue
        ids = torch.randint(cfg.vocab_size, (model_size,), generator=generator, dtype=torch.int32).to(runner.device)
        with replays_seen(runner) as replayed:
            graph = forward(runner, ids, True, rows=rows)
        batch = layers.replay_batch
        eager = forward(runner, ids, False, rows=rows, pad=True)
        row.update(
            dispatched=int(batch.forward_context.batch_descriptor.num_tokens) if batch.run_graph else None,
            replayed=list(replayed),
            **compare_forward(names, graph, eager),
        )
        if replayed != [replay_size]:
            row["error"] = f"the replay batch of {rows} rows replayed {replayed or 'no graph'}, not [{replay_size}]"
            row.update(not_run("the replay batch did not replay R"))
        else:
            row.update(power_of(runner, forward, ids, rows, names, graph, poison, failed=not row["bit_exact"]))
        pairs.append(row)
    return {
        "seed": seed,
        "rule": dispatch.RULE,
        "replay_sizes": replay_sizes(runner),
        "trim_threshold": trim_threshold(runner),
        "reference": REFERENCE,
        "not_run": NOT_RUN,
        "power_control": CONTROL,
        "poisoned_pool_bytes": poison.nbytes,
        "outputs": names,
        "pairs": pairs,
        "verdict": pairings_verdict(pairs),
    }


def pcp_pairs(runner) -> list[tuple[int, int, int, int]]:
    """Every (N, R, rows, pcp_size) vLLM's dispatch runs only under prefill context parallelism, small first.

    pcp_size is the smallest of `dispatch.PCP_SIZES` that dispatches R in N's break; rows
    (`dispatch.rows_for` at that size) may exceed N: the global batch's kept rows.
    """
    sizes, threshold, bounds = replay_sizes(runner), trim_threshold(runner), row_bounds(runner)
    found = []
    for n in sorted(runner.stand_in.cudagraph_capture_sizes):
        without = dispatch.dispatchable_replay_sizes(n, sizes, threshold, **bounds)
        for r in sorted(set(sizes) - without):
            for k in dispatch.PCP_SIZES[1:]:
                if r in dispatch.dispatchable_replay_sizes(n, sizes, threshold, pcp_size=k, **bounds):
                    found.append((n, r, dispatch.rows_for(n, r, sizes, pcp_size=k, **bounds), k))
                    break
    return found


def run_pcp_pairings(runner, forward: Callable[..., tuple], seed: int = SEED, poison: PoolPoison | None = None) -> dict:
    """The pairings vLLM dispatches only under PCP (`pcp_pairs`), through vLLM's path: N's step with the global
    row count, its own rows padded to the replay graph that count dispatches to, graphs against eager."""
    found = pcp_pairs(runner)
    result = run_pairings(runner, forward, seed, to_run=[(n, r, rows) for n, r, rows, _ in found], poison=poison)
    for pair, (_, _, _, k) in zip(result["pairs"], found, strict=True):
        pair["pcp_size"] = k
    result["rule"] = f"{dispatch.RULE}; here only the pairings a pcp_size above 1 adds"
    return result


def power_of(runner, forward: Callable[..., tuple], ids, rows: int, names: list[str], graph, poison, failed) -> dict:
    """The positive control of one pairing: the graph forward with the pool poisoned right after R, against `graph`."""
    try:
        with poisoned_replays(runner, poison):
            poisoned = forward(runner, ids, True, rows=rows)
    finally:
        poison.restore()
    if not poison.calls:
        return not_run("no replay graph replayed")
    return power_fields(names, poisoned, graph, failed)


def pairings_verdict(pairs: list[dict]) -> str:
    """One line: all dispatchable pairings bit-exact against eager, or which differ and by how much; then how many
    are shown (with power), and which are not and why (`kit.experiments.power.power_clause`)."""
    if not pairs:
        return "no pairing can run: no model graph breaks out to a replay batch"
    errors = [p for p in pairs if p.get("error")]
    differ = [p for p in pairs if p.get("bit_exact") is False]
    said = f"{len(pairs)} dispatchable pairings on vLLM's path (model graph N, replay graph R replayed in its break)"
    if not differ:
        line = f"graphs equal eager bit for bit on all {said}"
    else:
        pairs_said = ", ".join(f"({p['model_size']}, {p['replay_size']}) {p['max_abs_diff']:.4g}" for p in differ)
        outputs = sorted({o for p in differ for o in p["differing_outputs"]})
        line = (
            f"graphs DIFFER from eager on {len(differ)} of {said}: {pairs_said} (largest difference); "
            f"outputs that differ: {', '.join(outputs)}"
        )
    if errors:
        line += f"; {len(errors)} did not replay the graph they asked for: " + "; ".join(p["error"] for p in errors)
    return f"{line}; {power_clause(pairs)}"


def guarded(step: Callable[..., Any], *args: Any) -> Any:
    """`step(*args)`, or, if it raises, what stopped it (the capture is kept either way)."""
    try:
        return step(*args)
    except Exception as e:  # noqa: BLE001 - the recording keeps the error; the captures are recorded regardless
        return {"error": f"{type(e).__name__}: {e}"[:500], "where": traceback.format_exc().splitlines()[-8:]}


# --- reading a recording back ------------------------------------------------------


def short_obligation(rows: list[dict] | None, holds: bool | None) -> str:
    """The obligation's result in a few words, for a terminal line."""
    if rows is None:
        return "not in this recording"
    running = [r for r in rows if r.get("can_run")]
    bad = [r for r in running if not r.get("holds")]
    if holds is None or not running:
        return "nothing checked (no pairing can run)"
    if not bad:
        return f"holds on all {len(running)} dispatchable pairings"
    pairs = ", ".join(f"({r['model_size']}, {r['replay_size']})" for r in bad)
    total = format_bytes(sum(int(r.get("overlap_bytes") or 0) for r in bad))
    return f"VIOLATED on {len(bad)} of {len(running)} dispatchable pairings (N, R): {pairs}, {total} in all"

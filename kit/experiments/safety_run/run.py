"""The safety experiment run on CUDA: the adversary, every pairing against eager, one scenario in this process, and
the recording of every scenario, each in a fresh process (`record`, `run_live`)."""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kit.errors import KitError, check_one_of
from kit.experiments import recorded
from kit.experiments.dispatch import RULE as DISPATCH_RULE
from kit.experiments.dispatch import (
    config_rows_for,
    smallest_pcp,
)
from kit.experiments.power import CONTROL, PoolPoison, power_fields
from kit.experiments.safety_run.result import (
    SAFETY_SCENARIOS,
    SCENARIO_OF,
    SEED,
    enumerate_pairs,
    load_recording,
    no_break_sizes,
    pair_verdicts,
    pairs_frame,
    scenario_description,
    scenario_safety_config,
)
from kit.patch.install import Patch
from kit.record.provenance import provenance as _provenance
from kit.record.provenance import require_cuda


@dataclass
class Adversary:
    """What a pairing does to N's step: its replay batch runs in replay graph `replay_size` (None: the one vLLM's
    dispatch picks for its rows), and, with `poison`, the graph pool is poisoned right after that replay.

    Eagerly the batch's rows are padded with zeros to `replay_size`, so graphs and eager run the replay layers on
    the same shapes. `replayed` lists the replay graph every armed replay batch ran in.
    """

    replay_size: int | None = None
    poison: Callable[[tuple], None] | None = None
    replayed: list[int] = dataclasses.field(default_factory=list)

    @property
    def replays(self) -> int:
        return len(self.replayed)

    def arm(self, batch) -> None:
        """Set a step's replay batch (a `ReplayBatch`) to run as this pairing runs it."""
        from kit.replica.forward_context import CUDAGraphMode, ForwardContext

        if batch.run_graph is None:
            if self.replay_size is not None:
                batch.num_padded = self.replay_size
            return
        if self.replay_size is not None:
            batch.forward_context = ForwardContext(self.replay_size, CUDAGraphMode.PIECEWISE)
        batch.run_graph = self.then(batch.run_graph, batch.forward_context.num_tokens)

    def then(self, real: Callable[..., tuple], size: int) -> Callable[..., tuple]:
        """A replay batch's `run_graph`: `real` (the gather, then the replay of graph `size`), then the poison."""

        def run_graph(rows, inputs):
            outputs = real(rows, inputs)
            self.replayed.append(size)
            if self.poison is not None:
                self.poison(outputs)  # R's outputs keep their values: the break reads them as R's result
            return outputs

        return run_graph


@contextlib.contextmanager
def adversary(
    model_state, replay_size: int | None = None, poison: Callable[[tuple], None] | None = None
) -> Iterator[Adversary]:
    """While open, every replay batch runs as `Adversary(replay_size, poison)` says (graphs and eager alike)."""
    graphs = model_state.replay_cudagraphs
    if replay_size is not None and (graphs is None or replay_size not in graphs.breakable_cg_runner.captures):
        raise KitError(f"no replay graph of {replay_size} rows was captured to replay as an adversary")
    hook = Adversary(replay_size, poison)
    prepare = model_state.prepare_replay_batch

    def prepare_then_arm(*args, **kwargs) -> None:
        prepare(*args, **kwargs)
        batch = model_state.decoder_replay_layers.replay_batch
        if batch is not None:
            hook.arm(batch)

    with Patch("the adversary", [(model_state, "prepare_replay_batch", prepare_then_arm)]):
        yield hook


def output_names(config) -> list[str]:
    return ["hidden_states", *(f"aux_hidden_state[{layer}]" for layer in sorted(set(config.aux_hidden_state_layers)))]


def compare_outputs(config, graph: tuple, eager: tuple) -> dict:
    """Graph outputs against eager ones, bit for bit: the pair's row figures."""
    from kit.analysis.equivalence import compare_forward

    return compare_forward(output_names(config), graph, eager)


def replica_pool_poison(runner) -> PoolPoison:
    """The positive control's poison over the runner's graph pool (`kit.experiments.power`)."""
    return PoolPoison.of(runner.model_state.replay_cudagraphs.pool, runner.device)


def run_pairs(runner, seed: int = SEED, poison: PoolPoison | None = None) -> list[dict]:
    """Every pair of a captured runner, against eager, each with its power (`kit.experiments.power`).

    A pairing vLLM's dispatch can produce runs `rows_for(N, R)` replay rows,
    dispatched to R (`how`: `dispatched`); any other runs all N rows in
    replay graph R, forced (`how`: `forced`). Either way R is the one replay
    graph in N's break, as in vLLM, so nothing after R can mask what it wrote.
    Each row also says how the model graph fares with its default replay
    graph alone (`alone_bit_exact`). `poison` (default: the runner's graph
    pool, `replica_pool_poison`) is the positive control's: the pairing's graph run
    again with the pool poisoned right after R, against the unpoisoned one.
    """
    import torch

    config = runner.config
    names = output_names(config)
    poison = replica_pool_poison(runner) if poison is None else poison
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def fresh_ids(size: int):
        return torch.randint(config.vocab_size, (size,), generator=generator).to(runner.device)

    alone = {}
    for model_size in sorted(config.cudagraph_capture_sizes):
        ids = fresh_ids(model_size)
        alone[model_size] = compare_outputs(config, runner.run(ids), runner.run(ids, use_cudagraph=False))
    rows = []
    state = runner.model_state
    for model_size, replay_size, dispatchable in enumerate_pairs(config):
        ids = fresh_ids(model_size)
        # vLLM runs it without PCP (pcp 1), or with prefill context parallelism, its rows counted over the global
        # batch (more than N): the replica pads N's rows to the same replay graph (model_state.prepare_replay_batch).
        # A pairing no pcp_size dispatches runs N's rows forced into R.
        pcp_size = smallest_pcp(config, model_size, replay_size)
        if pcp_size is not None:
            num_rows, forced = config_rows_for(config, model_size, replay_size, pcp_size), None
        else:
            num_rows, forced = min(replay_size, model_size), replay_size
        with adversary(state, forced):
            eager = runner.run(ids, use_cudagraph=False, num_replay_rows=num_rows)
        with adversary(state, forced) as hook:
            graph = runner.run(ids, num_replay_rows=num_rows)
        if hook.replayed != [replay_size]:
            raise KitError(
                f"{num_rows} replay rows in model graph {model_size} ran replay graph {hook.replayed or 'none'}, "
                f"not [{replay_size}]"
            )
        try:
            with adversary(state, forced, poison):
                poisoned = runner.run(ids, num_replay_rows=num_rows)
        finally:
            poison.restore()
        rows.append(
            {
                "model_size": model_size,
                "replay_size": replay_size,
                "dispatchable": dispatchable,
                "dispatch_pcp": pcp_size,
                "how": "forced" if forced else "dispatched",
                "replay_rows": num_rows,
                **(checked := compare_outputs(config, graph, eager)),
                **power_fields(names, poisoned, graph, failed=not checked["bit_exact"]),
                "alone_bit_exact": alone[model_size]["bit_exact"],
                "alone_max_abs_diff": alone[model_size]["max_abs_diff"],
            }
        )
    return rows


def _shares_model_stream(runner) -> bool:
    """Whether the replay graphs were captured on the model graphs' stream (the patch records `capture_stream`)."""
    model = getattr(runner.cudagraph_manager, "capture_stream", None)
    replay = getattr(runner.model_state.replay_cudagraphs, "capture_stream", None)
    return model is not None and replay is not None and model == replay


def run_scenario(scenario: str, preset: str = "small", seed: int = SEED) -> dict:
    """Capture the replica as `scenario` says in this process and run every pair; its rows and metadata."""
    from kit.experiments.scenarios import SCENARIOS, check_preset
    from kit.patch import replica as replica_patch
    from kit.replica.model_runner import GPUModelRunner

    check_one_of(scenario, SAFETY_SCENARIOS, "safety scenario")
    check_preset(preset)
    require_cuda(LIVE_NEEDS_CUDA)
    replica_scenario = SCENARIO_OF[scenario]
    patch_policy = SCENARIOS[replica_scenario][0]
    description = scenario_description(scenario)
    config = scenario_safety_config(scenario, preset)
    with replica_patch.patched(patch_policy) if patch_policy else contextlib.nullcontext():
        runner = GPUModelRunner(config)
        runner.capture_model()
    poison = replica_pool_poison(runner)
    pairs = [{"scenario": scenario, **row} for row in run_pairs(runner, seed, poison)]
    command = f"python -m kit.experiments.safety_run --scenario {scenario} --preset {preset}"
    return {
        "scenario": scenario,
        "replica_scenario": replica_scenario,
        "description": description,
        "preset": preset,
        "config": dataclasses.asdict(config),
        "has_early_aux": replica_patch.has_early_aux(runner.model_state),
        "shares_model_stream": _shares_model_stream(runner),
        "outputs": output_names(config),
        "no_break": no_break_sizes(config),
        "power_control": CONTROL,
        "poisoned_pool_bytes": poison.nbytes,
        "seed": seed,
        "pairs": pairs,
        "provenance": _provenance(command),
    }


def run_scenario_in_subprocess(scenario: str, preset: str, out: Path) -> dict:
    """`run_scenario` in a fresh process (its own patch and graph pool); what it wrote to `out`."""
    failed = f"pairings for {scenario} ({preset})"
    return recorded.run_in_subprocess("kit.experiments.safety_run", scenario, preset, out, failed)


def record(preset: str, out_dir: Path) -> Path:
    """Every scenario, each in a fresh process, into `out_dir/<preset>.json`; its `PROVENANCE.json` entry too."""
    from kit.experiments.scenarios import check_preset

    check_preset(preset)
    require_cuda(LIVE_NEEDS_CUDA)
    out_dir, runs, provenance = recorded.record_each(
        "kit.experiments.safety_run", SAFETY_SCENARIOS, run_scenario_in_subprocess, preset, out_dir
    )
    pairs, scenarios = recorded.split_pairs(runs)
    data = {"preset": preset, "rule": DISPATCH_RULE, "pairs": pairs, "scenarios": scenarios, "provenance": provenance}
    return recorded.write_recording(data, out_dir, preset, verdicts=pair_verdicts(pairs_frame(data)))


LIVE_NEEDS_CUDA = (
    "live safety runs need CUDA, and this process has none; without --live, safety shows the H200 recording"
)


def run_live(preset: str, out_dir: str | Path | None = None) -> dict:
    """Record `preset` on this GPU now (each scenario in a fresh process) and read it back."""
    from kit.experiments.scenarios import check_preset

    check_preset(preset)
    require_cuda(LIVE_NEEDS_CUDA)  # before any folder or process is made
    out = Path(out_dir or tempfile.mkdtemp(prefix="kit-safety-"))
    path = record(preset, out)
    data = load_recording(preset, path)
    data["source"] = (
        f"live GPU ({data['provenance']['gpu']}: captured just now, each scenario in a fresh process; {path})"
    )
    return data

"""Pairings: every replay graph run in every model graph's break, against eager.

The safety argument for sharing a stream is that, for every model graph N and
every replay graph R that can run in N's eager break, what R writes does not
change what is read after R starts. Here every pairing is run, on fresh
random token ids, and N's outputs (hidden states and aux hidden states) are
compared bit for bit with an eager forward of the same ids and replay rows:

- a pairing vLLM's dispatch can produce (`kit.experiments.dispatch`: N at or
  above the trim threshold, R = dispatch(r) for some r in 1..N, R = N and
  R > N included) runs as vLLM runs it: N's step is given `rows_for(N, R)`
  replay rows, which the replica's dispatch pads to R, and nothing else is
  added (`how`: `dispatched`);
- any other pairing is stress: N runs its own replay batch, and inside N's
  break, before N's own replay graph, replay graph R is replayed on random
  inputs (`Adversary`: random values copied into the replay manager's static
  input buffers, then R replayed; `how`: `adversary`). The break's inputs are
  read first, as the real gather reads them before any replay graph runs.

Model graphs below the trim threshold keep the replay layers inside the graph
and have no break for R (`no_break`); they are listed, not paired.

The hook leaves the replica's modules alone, so the PR's hunks still apply
to them: `adversary()` shadows the model state's `prepare_replay_batch` on
the instance, and wraps the `run_graph` of each replay batch it sets in
`Adversary.then(real)`.

Scenarios, each captured in a fresh process (patches and the graph pool are
per process): `pr` (PR 63155), `unpatched` (vLLM 0.33) and
`early_aux_shared` (an aux hidden state at layer 1, before the replay
layers, with the replay graphs forced onto the model graphs' stream), the
scenarios of `kit.experiments.scenarios`. The replica runs with V4.1's
hyper-connection inputs to the break and an eager break at every layer's
attention (`ReplicaConfig.attention_breaks`), so model graphs break several
times and replay graphs have breaks of their own. `record(preset, out_dir)`
writes `<preset>.json` and its `PROVENANCE.json` entry to `out_dir`; the
shipped recordings are `safety/<preset>.json` under `kit/recordings/`:

    python -m kit.experiments.safety_run --preset small --out DIR   # the shipped: DIR = the recordings' safety/
    python -m kit.experiments.safety_run --scenario pr --preset small --out pr.json   # one scenario, this process
    python -m kit safety [--preset small|large] [--live] [--json]
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kit.errors import KitError, check_one_of
from kit.experiments import recorded
from kit.experiments.dispatch import RULE as DISPATCH_RULE
from kit.experiments.dispatch import breaks_out, config_rule, dispatchable_replay_sizes, rows_for
from kit.record.provenance import provenance as _provenance
from kit.record.provenance import require_cuda
from kit.recordings import RECORDINGS

# The safety and read/write experiments' scenarios -> the replica scenario of
# kit.experiments.scenarios that captures it (the PR's run is `patched` there). Their early-aux scenario is the
# hypothetical flat return (each aux weak, its block free for R), the case the checks exist to catch: with V4.1's
# nested return vLLM's wrapper keeps the block (`kit.experiments.early_aux`); its recorded config says which ran.
SCENARIO_OF = {"pr": "patched", "unpatched": "unpatched", "early_aux_shared": "early_aux_shared_flat"}
SAFETY_SCENARIOS = tuple(SCENARIO_OF)
RECORDINGS_DIR = RECORDINGS / "safety"
SEED = 1234
PAIR_KEYS = ("policy", "model_size", "replay_size", "dispatchable", "bit_exact", "max_abs_diff", "outputs")
_MISSING = object()


# --- which pairs ---------------------------------------------------------------


def enumerate_pairs(config) -> list[tuple[int, int, bool]]:
    """Every (model graph size, replay graph size, dispatchable) of a replica config, small first.

    Model graphs below the trim threshold have no break for a replay graph and are left out (`no_break_sizes`).
    """
    replay_sizes, threshold = config_rule(config)
    pairs = []
    for model_size in sorted(config.cudagraph_capture_sizes):
        if not breaks_out(model_size, threshold):
            continue
        reachable = dispatchable_replay_sizes(model_size, replay_sizes, threshold)
        pairs += [(model_size, r, r in reachable) for r in replay_sizes]
    return pairs


def no_break_sizes(config) -> list[int]:
    """The model graphs that keep the replay layers inside the graph (below the trim threshold)."""
    _, threshold = config_rule(config)
    return [n for n in sorted(config.cudagraph_capture_sizes) if not breaks_out(n, threshold)]


# --- the adversary -------------------------------------------------------------


@dataclass
class Adversary:
    """Replays replay graph `replay_size` of `graphs` on `inputs` (one tensor per static input buffer)."""

    graphs: Any  # a DecoderReplayCudaGraphManager
    replay_size: int
    inputs: list
    replays: int = 0

    def replay(self) -> None:
        from kit.replica.forward_context import CUDAGraphMode, ForwardContext, override_forward_context

        size = self.replay_size
        for buf, values in zip(self.graphs.input_buffers, self.inputs, strict=True):
            buf[:size].copy_(values)
        with override_forward_context(ForwardContext(size, CUDAGraphMode.PIECEWISE)):
            self.graphs.breakable_cg_runner(*(buf[:size] for buf in self.graphs.input_buffers))
        self.replays += 1

    def then(self, real: Callable[..., tuple]) -> Callable[..., tuple]:
        """A replay batch's `run_graph`: this adversary's replay first, then `real` as normal.

        The break's inputs are read first (copied), as the real gather reads them
        before any replay graph runs: R stands for a replay graph run in the break,
        not for one that runs before the break has read its inputs.
        """

        def run_graph(rows, inputs):
            inputs = tuple(t.clone() for t in inputs)
            self.replay()
            return real(rows, inputs)

        return run_graph


@contextlib.contextmanager
def adversary(model_state, replay_size: int, inputs: list) -> Iterator[Adversary]:
    """While open, every replay batch that runs in a replay graph first replays graph `replay_size` on `inputs`."""
    graphs = model_state.replay_cudagraphs
    if graphs is None or replay_size not in graphs.breakable_cg_runner.captures:
        raise KitError(f"no replay graph of {replay_size} rows was captured to replay as an adversary")
    hook = Adversary(graphs, replay_size, inputs)
    saved = vars(model_state).get("prepare_replay_batch", _MISSING)
    prepare = model_state.prepare_replay_batch

    def prepare_then_arm(*args, **kwargs) -> None:
        prepare(*args, **kwargs)
        batch = model_state.decoder_replay_layers.replay_batch
        if batch is not None and batch.run_graph is not None:
            batch.run_graph = hook.then(batch.run_graph)

    model_state.prepare_replay_batch = prepare_then_arm
    try:
        yield hook
    finally:
        if saved is _MISSING:
            del model_state.prepare_replay_batch
        else:
            model_state.prepare_replay_batch = saved


# --- running the pairs (CUDA) ------------------------------------------------------


def output_names(config) -> list[str]:
    return ["hidden_states", *(f"aux_hidden_state[{layer}]" for layer in sorted(set(config.aux_hidden_state_layers)))]


def compare_outputs(config, graph: tuple, eager: tuple) -> dict:
    """Graph outputs against eager ones, bit for bit: the pair's row figures."""
    from kit.analysis.equivalence import compare_forward

    return compare_forward(output_names(config), graph, eager)


def run_pairs(runner, seed: int = SEED) -> list[dict]:
    """Every pair of a captured runner, against eager: dispatched where vLLM can run it, else the adversary.

    Each row also says how the model graph fares with its own replay graph
    alone (`alone_bit_exact`), so a difference can be told apart from one the
    model graph makes anyway.
    """
    import torch

    config = runner.config
    replay_sizes, _ = config_rule(config)
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def fresh_ids(size: int):
        return torch.randint(config.vocab_size, (size,), generator=generator).to(runner.device)

    alone = {}
    for model_size in sorted(config.cudagraph_capture_sizes):
        ids = fresh_ids(model_size)
        alone[model_size] = compare_outputs(config, runner.run(ids), runner.run(ids, use_cudagraph=False))
    rows = []
    graphs = runner.model_state.replay_cudagraphs
    for model_size, replay_size, dispatchable in enumerate_pairs(config):
        ids = fresh_ids(model_size)
        if dispatchable:
            num_rows = rows_for(model_size, replay_size, replay_sizes)
            eager = runner.run(ids, use_cudagraph=False, num_replay_rows=num_rows)
            graph = runner.run(ids, num_replay_rows=num_rows)
            ran = runner.model_state.decoder_replay_layers.replay_batch.forward_context.num_tokens
            if ran != replay_size:
                raise KitError(
                    f"{num_rows} replay rows in model graph {model_size} ran replay graph {ran}, not {replay_size}"
                )
            how = "dispatched"
        else:
            num_rows = None
            noise = [
                torch.randn((replay_size, *buf.shape[1:]), generator=generator).to(buf.device, buf.dtype)
                for buf in graphs.input_buffers
            ]
            eager = runner.run(ids, use_cudagraph=False)
            with adversary(runner.model_state, replay_size, noise) as hook:
                graph = runner.run(ids)
            if hook.replays != 1:
                raise KitError(
                    f"replay graph {replay_size} ran {hook.replays} times in model graph {model_size}, not once"
                )
            how = "adversary"
        rows.append(
            {
                "model_size": model_size,
                "replay_size": replay_size,
                "dispatchable": dispatchable,
                "how": how,
                "replay_rows": num_rows,
                **compare_outputs(config, graph, eager),
                "alone_bit_exact": alone[model_size]["bit_exact"],
                "alone_max_abs_diff": alone[model_size]["max_abs_diff"],
            }
        )
    return rows


def safety_config(replica_scenario: str, preset: str):
    """The scenario's replica with V4.1's break inputs and an eager break at every attention."""
    from kit.experiments.scenarios import scenario_config

    return dataclasses.replace(scenario_config(replica_scenario, preset), hyper_connections=True, attention_breaks=True)


def _shares_model_stream(runner) -> bool:
    """Whether the replay graphs were captured on the model graphs' stream (the patch records `capture_stream`)."""
    model = getattr(runner.cudagraph_manager, "capture_stream", None)
    replay = getattr(runner.model_state.replay_cudagraphs, "capture_stream", None)
    return model is not None and replay is not None and model == replay


def run_scenario(scenario: str, preset: str = "small", seed: int = SEED) -> dict:
    """Capture the replica under `policy` in this process and run every pair; its rows and metadata."""
    from kit.experiments.scenarios import SCENARIOS, check_preset
    from kit.patch import replica as replica_patch
    from kit.replica.model_runner import GPUModelRunner

    check_one_of(scenario, SAFETY_SCENARIOS, "safety scenario")
    check_preset(preset)
    require_cuda(LIVE_NEEDS_CUDA)
    replica_scenario = SCENARIO_OF[scenario]
    patch_policy, _, description = SCENARIOS[replica_scenario]
    config = safety_config(replica_scenario, preset)
    with replica_patch.patched(patch_policy) if patch_policy else contextlib.nullcontext():
        runner = GPUModelRunner(config)
        runner.capture_model()
    pairs = [{"policy": scenario, **row} for row in run_pairs(runner, seed)]
    command = f"python -m kit.experiments.safety_run --scenario {scenario} --preset {preset}"
    return {
        "policy": scenario,
        "scenario": replica_scenario,
        "description": description,
        "preset": preset,
        "config": dataclasses.asdict(config),
        "has_early_aux": replica_patch.has_early_aux(runner.model_state),
        "shares_model_stream": _shares_model_stream(runner),
        "outputs": output_names(config),
        "no_break": no_break_sizes(config),
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
    pairs, policies = recorded.split_pairs(runs)
    data = {"preset": preset, "rule": DISPATCH_RULE, "pairs": pairs, "policies": policies, "provenance": provenance}
    return recorded.write_recording(data, out_dir, preset, verdicts=pair_verdicts(pairs_frame(data)))


# --- reading and showing ---------------------------------------------------------


LIVE_NEEDS_CUDA = (
    "live safety runs need CUDA, and this process has none; without --live, safety shows the H200 recording"
)


def recording_path(preset: str) -> Path:
    return RECORDINGS_DIR / f"{preset}.json"


def load_recording(preset: str, path: str | Path | None = None) -> dict:
    """A safety recording (the shipped one for `preset` by default), checked, with its `source` line."""
    from kit.experiments.scenarios import check_preset

    check_preset(preset)
    path = Path(path) if path is not None else recording_path(preset)
    return recorded.load_shipped(path, preset, "safety", _schema_problem)


def _schema_problem(data: Any) -> str | None:
    if not isinstance(data, dict) or not isinstance(data.get("pairs"), list) or not data["pairs"]:
        return "no 'pairs' list"
    if not isinstance(data.get("provenance"), dict):
        return "no 'provenance'"
    for row in data["pairs"]:
        missing = [k for k in PAIR_KEYS if not isinstance(row, dict) or k not in row]
        if missing:
            return f"a pair lacks {', '.join(missing)}"
    return None


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


def pairs_frame(data: dict) -> pd.DataFrame:
    """A recording's pairs, one row each, scenarios in `SAFETY_SCENARIOS` order; `attrs` keep source and provenance."""
    df = pd.DataFrame(data["pairs"])
    order = {p: i for i, p in enumerate(SAFETY_SCENARIOS)}
    df = df.sort_values(
        ["policy", "model_size", "replay_size"],
        key=lambda c: c.map(order).fillna(len(order)) if c.name == "policy" else c,
    ).reset_index(drop=True)
    df.attrs["source"] = data.get("source", "?")
    df.attrs["provenance"] = data.get("provenance", {})
    return df


def load_pairs(preset: str, path: str | Path | None = None) -> pd.DataFrame:
    """The shipped recording's pairs at `preset` (or the recording at `path`) as a frame."""
    return pairs_frame(load_recording(preset, path))


def _cell(row) -> str:
    text = "bit-exact" if row["bit_exact"] else f"differs {row['max_abs_diff']:.4g}"
    return text if row["dispatchable"] else f"{text} *"


def pair_tables(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per scenario: model graphs down, replay graphs across, each cell bit-exact or the largest difference."""
    tables = {}
    for scenario, rows in df.groupby("policy", sort=False):
        cells = rows.assign(cell=rows.apply(_cell, axis=1))
        table = cells.pivot(index="model_size", columns="replay_size", values="cell")
        if "alone_bit_exact" in rows:
            alone = rows.groupby("model_size")[["alone_bit_exact", "alone_max_abs_diff"]].first()
            table["own replay alone"] = [
                "bit-exact" if exact else f"differs {diff:.4g}"
                for exact, diff in zip(alone["alone_bit_exact"], alone["alone_max_abs_diff"], strict=True)
            ]
        table.columns = [str(c) for c in table.columns]
        tables[scenario] = table.rename_axis("N \\ R").reset_index()
    return tables


def pair_verdicts(df: pd.DataFrame) -> list[str]:
    """One line per scenario: all pairings bit-exact, or which differ from eager and by how much."""
    lines = []
    for scenario, rows in df.groupby("policy", sort=False):
        n, dispatchable = len(rows), int(rows["dispatchable"].sum())
        bad = rows[~rows["bit_exact"].astype(bool)]
        if bad.empty:
            lines.append(f"{scenario}: all {n} pairings bit-exact ({dispatchable} dispatchable)")
            continue
        pairs = ", ".join(f"({m}, {r})" for m, r in zip(bad["model_size"], bad["replay_size"], strict=True))
        line = (
            f"{scenario}: {len(bad)} of {n} pairings differ from eager ({int(bad['dispatchable'].sum())} of them "
            f"dispatchable): {pairs} — largest difference {float(bad['max_abs_diff'].max()):.4g}"
        )
        if "alone_bit_exact" in rows:
            alone = sorted(set(rows.loc[~rows["alone_bit_exact"].astype(bool), "model_size"]))
            if alone:
                line += f"; with only its own replay graph, model graph {', '.join(map(str, alone))} differs too"
        lines.append(line)
    return lines


def safety_lines(data: dict) -> list[str]:
    """The `python -m kit safety` text: source, rule, a table per scenario, the verdicts."""
    df = pairs_frame(data)
    lines = [
        f"source: {data.get('source', '?')}",
        "rows: model graph N, run on fresh token ids; columns: replay graph R, replayed on random inputs in N's "
        "break before N's own; cells: N's outputs against eager, bit-exact or the largest difference",
        data.get("rule", DISPATCH_RULE),
    ]
    described = data.get("policies", {})
    for scenario, table in pair_tables(df).items():
        about = described.get(scenario, {}).get("description")
        lines += ["", f"{scenario} ({about})" if about else scenario, *table.to_string(index=False).splitlines()]
    lines += ["* stress only: vLLM's dispatch never runs that replay graph in that model graph's break"]
    no_break = sorted({n for about in described.values() for n in about.get("no_break", [])})
    if no_break:
        sizes = ", ".join(map(str, no_break))
        lines.append(f"model graph {sizes}: below the trim threshold, the replay layers stay in the graph (no break)")
    lines.append("")
    return lines + pair_verdicts(df)


def safety_json(data: dict) -> dict:
    df = pairs_frame(data)
    return {
        "pairs": data["pairs"],
        "source": data.get("source"),
        "provenance": data.get("provenance"),
        "rule": data.get("rule", DISPATCH_RULE),
        "verdicts": pair_verdicts(df),
    }


def main(argv: list[str] | None = None) -> int:
    return recorded.recording_main(
        argv,
        description="Adversarial pairings of the replica's graphs, on this GPU.",
        old_flag="--policy",
        names=", ".join(SAFETY_SCENARIOS),
        run_one=run_scenario,
        said=lambda name, result: pair_verdicts(pairs_frame(result))[0],
        record=record,
        summary=lambda preset, path: pair_verdicts(load_pairs(preset, path)),
    )


if __name__ == "__main__":
    sys.exit(main())

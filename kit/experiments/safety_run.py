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
- any other pairing is stress: N's step runs all its N rows in replay graph
  R, forced past the dispatch (`Adversary`; `how`: `forced`), as vLLM would
  run them if its dispatch picked R (under prefill context parallelism it
  can pick R > N); the eager reference pads the same rows with zeros to R.

Either way R is the one replay graph in N's break, as in vLLM. An earlier
adversary replayed R on random inputs and then N's own replay graph; where
that own graph rewrote what R could reach (model graph 2048 at the large
preset: its own replay graph 1024 overwrites the whole early aux output) the
check could not fail, on 24 pairings at the large preset and 3 at the small.
With R the last writer in the break nothing can mask it, and running R on
N's own rows keeps the comparison one against eager (a graph-vs-graph
comparison with the same inputs' run without R would need another replay
graph in the break, the masking writer itself).

Every pairing carries its power (`kit.experiments.power`): the pairing's
graph run again with every graph-pool byte but R's outputs poisoned right
after R, against the unpoisoned run, graph against graph, bit for bit. A
pairing whose outputs survive the poison (`power` false) could not have
failed, and the verdicts never count it as shown: they say how many
pairings are shown (with power), and which are not, and why.

Model graphs below the trim threshold keep the replay layers inside the graph
and have no break for R (`no_break`); they are listed, not paired.

The hook leaves the replica's modules alone, so the PR's hunks still apply
to them: `adversary()` shadows the model state's `prepare_replay_batch` on
the instance, and arms each replay batch it sets (`Adversary.arm`: the
forced graph, the eager padding, `run_graph` wrapped to record the replay
and poison after it).

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

import numpy as np
import pandas as pd

from kit.analysis.invariant import (
    INVARIANT,
    INVARIANT_PAIR_KEYS,
    invariant_by_scenario,
    invariant_of_pairs,
    verdict_line,
)
from kit.analysis.invariant import (
    NOT_RECORDED as INVARIANT_NOT_RECORDED,
)
from kit.analysis.readwrite import OBLIGATION
from kit.errors import KitError, check_one_of
from kit.experiments import recorded
from kit.experiments.dispatch import (
    PCP_SIZES,
    breaks_out,
    config_dispatchable,
    config_rows_for,
    config_rule,
    dispatchable_under,
    smallest_pcp,
)
from kit.experiments.dispatch import RULE as DISPATCH_RULE
from kit.experiments.power import CONTROL, NOT_RECORDED, NOTHING_READ, PoolPoison, power_clause, power_fields
from kit.patch.install import Patch
from kit.record.provenance import provenance as _provenance
from kit.record.provenance import require_cuda
from kit.recordings import RECORDINGS

# The safety and read/write experiments' scenarios -> the replica scenario of
# kit.experiments.scenarios that captures it (the PR's run is `patched` there). Their early-aux scenario is the
# hypothetical flat return (each aux weak, its block free for R), the case the checks exist to catch: with V4.1's
# nested return vLLM's wrapper keeps the block (`kit.experiments.early_aux`); its recorded config says which ran.
SCENARIO_OF = {"pr": "patched", "unpatched": "unpatched", "early_aux_shared": "early_aux_shared_flat"}
# PLANTED scenarios: the PR's capture (its replica scenario above) of a model with a bug put in on purpose
# (`ReplicaConfig.planted_cross_break_read`: a graph-pool intermediate read after the replay break), to show the
# structural invariant (kit.analysis.invariant) and graphs-vs-eager failing.
PLANTED = {"planted_cross_break_read": "patched"}
PLANTED_DESCRIPTION = (
    "PLANTED: PR 63155 on a model that keeps a graph-pool intermediate made before the replay break and reads it "
    "after the break (ReplicaConfig.planted_cross_break_read)"
)
SCENARIO_OF.update(PLANTED)
SAFETY_SCENARIOS = tuple(SCENARIO_OF)
UNPLANTED = tuple(s for s in SAFETY_SCENARIOS if s not in PLANTED)  # what recordings made before PLANTED hold
RECORDINGS_DIR = RECORDINGS / "safety"
SEED = 1234
PAIR_KEYS = ("scenario", "model_size", "replay_size", "dispatchable", "bit_exact", "max_abs_diff", "outputs")


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
        reachable = config_dispatchable(config, model_size)
        pairs += [(model_size, r, r in reachable) for r in replay_sizes]
    return pairs


def no_break_sizes(config) -> list[int]:
    """The model graphs that keep the replay layers inside the graph (below the trim threshold)."""
    _, threshold = config_rule(config)
    return [n for n in sorted(config.cudagraph_capture_sizes) if not breaks_out(n, threshold)]


# --- the adversary ---------------------------------------------------------------


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


# --- running the pairs (CUDA) ------------------------------------------------------


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


def safety_config(replica_scenario: str, preset: str):
    """The scenario's replica with V4.1's break inputs and an eager break at every attention."""
    from kit.experiments.scenarios import scenario_config

    return dataclasses.replace(scenario_config(replica_scenario, preset), hyper_connections=True, attention_breaks=True)


def scenario_safety_config(scenario: str, preset: str):
    """`safety_config` of a safety scenario's replica scenario, with the planted bug where the scenario plants it."""
    config = safety_config(SCENARIO_OF[scenario], preset)
    return dataclasses.replace(config, planted_cross_break_read=True) if scenario in PLANTED else config


def scenario_description(scenario: str) -> str:
    """What a safety scenario shows: its replica scenario's description, or the planted one's."""
    from kit.experiments.scenarios import SCENARIOS

    return PLANTED_DESCRIPTION if scenario in PLANTED else SCENARIOS[SCENARIO_OF[scenario]][2]


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


def pairless_preset(data: Any) -> bool:
    """Whether the recording's preset has no model graph at or above the trim threshold, so no pairing at all
    (h200-default: vLLM's default largest capture size on an H200, 512, is below the threshold of 768)."""
    from kit.replica.model import PRESETS

    config = PRESETS.get(data.get("preset")) if isinstance(data, dict) else None
    return config is not None and not enumerate_pairs(config)


def _schema_problem(data: Any) -> str | None:
    if not isinstance(data, dict) or not isinstance(data.get("pairs"), list):
        return "no 'pairs' list"
    if not data["pairs"] and not pairless_preset(data):
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
    df = pd.DataFrame(with_dispatch(data), columns=None if data["pairs"] else [*PAIR_KEYS, "dispatch_pcp"])
    order = {p: i for i, p in enumerate(SAFETY_SCENARIOS)}
    df = df.sort_values(
        ["scenario", "model_size", "replay_size"],
        key=lambda c: c.map(order).fillna(len(order)) if c.name == "scenario" else c,
    ).reset_index(drop=True)
    df.attrs["source"] = data.get("source", "?")
    df.attrs["provenance"] = data.get("provenance", {})
    return df


def load_pairs(preset: str, path: str | Path | None = None) -> pd.DataFrame:
    """The shipped recording's pairs at `preset` (or the recording at `path`) as a frame."""
    return pairs_frame(load_recording(preset, path))


def _cell(row) -> str:
    text = "bit-exact" if row["bit_exact"] else f"differs {row['max_abs_diff']:.4g}"
    if row.get("power") is False or row.get("power") is np.False_:
        text += " †"  # measured without power: not shown
    if row["dispatchable"]:
        return text
    pcp = row.get("dispatch_pcp")
    return f"{text} *" if pcp is None or pd.isna(pcp) else f"{text} *{int(pcp)}"


def with_dispatch(data: dict) -> list[dict]:
    """The recording's pairs, each with `dispatchable_under` ({'pcp1': ..., 'pcp2': ...}) and `dispatch_pcp` (the
    smallest PCP size vLLM runs it under, None if none of `PCP_SIZES` does), by the rule of the recording's preset."""
    from kit.replica.model import PRESETS

    config = PRESETS.get(data.get("preset"))
    if config is None:
        return [dict(pair) for pair in data["pairs"]]
    return [
        {
            **pair,
            "dispatchable_under": dispatchable_under(config, pair["model_size"], pair["replay_size"]),
            "dispatch_pcp": smallest_pcp(config, pair["model_size"], pair["replay_size"]),
        }
        for pair in data["pairs"]
    ]


def no_pairs_line(data: dict) -> str:
    """What a recording without pairings shows: no model graph breaks out, replay graphs run only in eager steps."""
    from kit.replica.model import PRESETS

    config = PRESETS.get(data.get("preset"))
    if config is None:
        return "no pairings"
    return (
        f"no pairings: every model graph of {data['preset']} (up to {max(config.cudagraph_capture_sizes)} tokens) is "
        f"below the trim threshold of {config.decoder_replay_trim_threshold} and keeps the replay layers inside it; "
        "the replay graphs run only in eager steps, where no model graph is running"
    )


def pcp_line(df: pd.DataFrame) -> str:
    """How many of a scenario's pairings vLLM dispatches under each PCP size (the same for every scenario)."""
    rows = df[df["scenario"] == df["scenario"].iloc[0]] if not df.empty else df
    counts = ", ".join(
        f"pcp {k}: {int((rows['dispatch_pcp'] <= k).sum()) if 'dispatch_pcp' in rows else '?'}" for k in PCP_SIZES
    )
    return f"pairings vLLM's dispatch runs, of {len(rows)} per scenario: {counts}"


STRESS_NOTE = (
    f"*k: not dispatched without prefill context parallelism (pcp 1: stress only there); vLLM's dispatch runs that "
    f"replay graph in that model graph's break with pcp_size k, its rows counted over the global batch (up to k x N); "
    f"* alone: stress only, no pcp_size in {', '.join(map(str, PCP_SIZES))} dispatches it"
)


def pair_tables(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per scenario: model graphs down, replay graphs across, each cell bit-exact or the largest difference."""
    tables = {}
    for scenario, rows in df.groupby("scenario", sort=False):
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
    """One line per scenario: all pairings bit-exact, or which differ from eager and by how much; then how many
    are shown (with power), and which are not and why (`kit.experiments.power.power_clause`)."""
    lines = []
    groups = list(df.groupby("scenario", sort=False))
    for scenario, rows in groups:
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
    return [f"{line}; {power_clause(pair_records(rows))}" for line, (_, rows) in zip(lines, groups, strict=True)]


def pair_records(rows: pd.DataFrame) -> list[dict]:
    """A frame's rows as dicts, with `power` None where a recording has none (made before the positive control)."""
    out = rows.to_dict("records")
    for row in out:
        if "power" not in row or not isinstance(row["power"], bool | np.bool_):
            row["power"] = None
    return out


def safety_lines(data: dict, readwrite: dict | None = None, more: list[str] | None = None) -> list[str]:
    """The `python -m kit safety` text: source, rule, a table per scenario, the structural invariant per scenario
    (its verdict and list, from `readwrite`, the read/write recording at the same preset, beside the obligation;
    "not recorded" where that recording lacks it or there is none), `more` lines, then the verdicts, last."""
    df = pairs_frame(data)
    lines = [
        f"source: {data.get('source', '?')}",
        _how_line(df),
        DISPATCH_RULE,  # the rule the marks follow (a recording keeps the one it was run under in `rule`)
    ]
    if "power" in df and df["power"].map(lambda p: isinstance(p, bool | np.bool_)).any():
        lines.append(CONTROL)
    described = data.get("scenarios", {})
    for scenario, table in pair_tables(df).items():
        about = described.get(scenario, {}).get("description")
        lines += ["", f"{scenario} ({about})" if about else scenario, *table.to_string(index=False).splitlines()]
    if df.empty:
        lines.append(no_pairs_line(data))
    else:
        lines += [STRESS_NOTE, pcp_line(df)]
    if "power" in df and (df["power"].astype(object) == False).any():  # noqa: E712 - False, not None or NaN
        lines.append(f"† without power, not shown: {NOTHING_READ}")
    no_break = sorted({n for about in described.values() for n in about.get("no_break", [])})
    if no_break:
        sizes = ", ".join(map(str, no_break))
        lines.append(f"model graph {sizes}: below the trim threshold, the replay layers stay in the graph (no break)")
    lines += ["", *safety_invariant_lines(data, readwrite), *(["", *more] if more else []), ""]
    return lines + pair_verdicts(df)


HOW_FORCED = (
    "rows: model graph N, run on fresh token ids; columns: replay graph R, the one replay graph in N's break "
    "(dispatched, or forced where vLLM's dispatch does not pick it); cells: N's outputs against eager, bit-exact or "
    "the largest difference"
)
HOW_ADVERSARY = (
    "rows: model graph N, run on fresh token ids; columns: replay graph R, replayed on random inputs in N's "
    "break before N's own; cells: N's outputs against eager, bit-exact or the largest difference"
)


def _how_line(df: pd.DataFrame) -> str:
    """What the rows, columns and cells are: a recording's stress pairings were forced, or (older) an adversary's."""
    return HOW_ADVERSARY if "how" in df and (df["how"] == "adversary").any() else HOW_FORCED


def json_pairs(pairs: list[dict]) -> list[dict]:
    """A recording's pairs with `power` and `power_reason` on each: "power not recorded" where it was not."""
    return [p if "power" in p else {**p, "power": None, "power_reason": NOT_RECORDED} for p in pairs]


def safety_invariant_lines(data: dict, readwrite: dict | None) -> list[str]:
    """Per scenario of the pairings: the structural invariant's verdict and list, the obligation beside it."""
    found = invariant_by_scenario(readwrite)
    source = (readwrite or {}).get("source", "no read/write recording at this preset")
    lines = [f"the structural invariant ({source}): {INVARIANT}"]
    for scenario in pairs_frame(data)["scenario"].unique():
        mine = found.get(scenario)
        if mine is None or not mine["invariant_recorded"]:
            lines.append(f"{scenario}: invariant {INVARIANT_NOT_RECORDED}")
        else:
            lines.append(verdict_line(scenario, mine["invariant_holds"], mine["invariant"]))
            lines += [f"  {line}" for line in mine["invariant_verdicts"]]
        if mine is not None and mine["obligation"]:
            obligation = mine["obligation"].removeprefix(OBLIGATION).strip()
            lines.append(f"  beside it, the byte-overlap obligation: {obligation}")
    return lines


def safety_json(data: dict, readwrite: dict | None = None) -> dict:
    """`kit safety --json`: the pairings, each with the invariant's `graph_pool_carried_bytes` (early aux apart in
    `early_aux_carried_bytes`) and `invariant_holds` (None: not recorded), and per scenario the invariant's
    verdict beside the obligation, from `readwrite`, the read/write recording at the same preset."""
    df = pairs_frame(data)
    found = invariant_of_pairs(readwrite)
    pairs = []
    for pair in with_dispatch(data):
        row = found.get((pair["scenario"], int(pair["model_size"]), int(pair["replay_size"]))) or {}
        figures = {k: row.get(k) for k in (*INVARIANT_PAIR_KEYS, "readwrite_holds")}
        pairs.append({**pair, **figures, "policy": pair["scenario"]})  # `policy`: the key the contract names
    return {
        "pairs": json_pairs(pairs),
        "pcp_sizes": list(PCP_SIZES),
        "source": data.get("source"),
        "provenance": data.get("provenance"),
        "rule": data.get("rule", DISPATCH_RULE),
        "dispatch_rule": DISPATCH_RULE,  # the rule `dispatchable_under` and `dispatch_pcp` follow (the kit's now)
        "verdicts": pair_verdicts(df),
        "invariant": INVARIANT,
        "invariant_source": (readwrite or {}).get("source"),
        "scenarios": invariant_by_scenario(readwrite),
    }


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

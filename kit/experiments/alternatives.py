"""PR 63155's two alternatives measured on the replica with its speculator, and what the saving buys.

The PR's "Alternatives" section names two other ways to stop the replay graphs stranding a
graph-pool group of their own:

- (a) one `graph_capture()` for every capture, which also puts the speculator's capture on the
  model graphs' stream. The speculator runs after the target forward and reads its outputs, "so
  it needs its own lifetime argument". Here `SHARE_ALL` is the PR plus that: the replay graphs on
  the model graphs' stream (policy `share`), and the speculator's `capture()` handed the same
  stream (two more hunks, on `DSparkSpeculator.capture` and `DFlashCudaGraphManager.capture`,
  and one on `GPUModelRunner.capture_model`). `kit.patch.policy.STREAM_POLICIES` is left as it is.
- (b) shrinking `decoder_replay_cudagraph_capture_sizes`, which the PR says saves
  "proportionally": vLLM 0.33 (unpatched) capturing fewer replay sizes, two ways. `cap_<N>`
  caps them at N: every replay batch of more than N rows runs eagerly (vLLM's dispatch finds
  no graph), which under vLLM's rule any step padded to a model graph above N and at or over
  the trim threshold can make (its replay batch holds 1 up to all of its rows). `keep_<a>_<b>...`
  keeps only the sizes named and drops the ones in between: a replay batch runs in the
  smallest kept size that fits it (padded further), eagerly only above the largest kept.
  Which sizes each leaves to eager is a property of the config (`eager_replay_sizes`); the
  graph pool each leaves is measured, and from the figures the text says whether dropping
  intermediate sizes shrank the replay graphs' group or only capping the largest did
  (`replay_group_lines`).

  The sweep is a handful of fresh processes, not one per replay size: with vLLM's default
  sizing the large preset has about 30 replay sizes. Caps (`cap_sweep`): the smallest replay
  size, and for each model capture size the largest replay size at or below it (the model
  capture sizes that are replay sizes), then none. Kept sets (`keep_sweep`): the largest
  alone, the smallest and the largest, then every size (vLLM as it is, `unpatched`).

Every scenario runs the replica with its speculator (`ReplicaConfig.speculator`, a DSpark
drafter whose FULL graphs are captured last, `kit/replica/speculator.py`), each in a fresh
process (patches and the graph pool are per process):

- `unpatched`, `pr`, `share_all`: the graph pool after the capture (`graph_pool_bytes`, by
  stream), and graphs against eager, step by step: for every capture size after a step of every
  size, the target's outputs as the sampler reads them and the drafter's output (run on the
  target's real outputs, as they are left in the graph pool after a graph forward) compared bit
  for bit with an eager step (`safe`, `evidence`). Each step also says whether the drafter's
  graph overwrote the target's outputs in the pool (it may: `propose` copies them out first).
  `safe` is safe in the replica's step only (`SAFE_IN_THE_REPLICAS_STEP`): vLLM's
  `sample_tokens` also starts asynchronous output copies on a side stream before `propose`,
  which the replica does not model;
- `cap_<N>`, `keep_<sizes>`: the graph pool with fewer replay capture sizes (no graphs-vs-eager
  run: neither moves a capture to another stream, so their streams, and what is at risk, are
  `unpatched`'s; they change only which replay batches have a graph);
- every scenario: `capture_model(profile_only=True)`'s estimate (`profile_cudagraph_memory`,
  as vLLM sizes the KV cache), and from the estimates the KV cache each scenario frees
  (`kit.analysis.kv_cache`), and what the PR's 5.18 GiB buys on DeepSeek-V4.1-Flash.

The phases an analysis of reads and writes can wrap are named in `kit/replica/speculator.py`.
`record(preset, out_dir)` writes `<preset>.json` and its `PROVENANCE.json` entry to `out_dir`;
the shipped recordings are `alternatives/<preset>.json` under `kit/recordings/`:

    python -m kit.experiments.alternatives --preset small --out DIR
    python -m kit.experiments.alternatives --scenario share_all --preset small --out share_all.json
    python -m kit alternatives [--preset small|large] [--live] [--json]
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from kit.analysis.names import GRAPH_POOL_LABEL, SPECULATOR_GRAPHS_LABEL
from kit.errors import KitError
from kit.experiments import recorded
from kit.patch import replica as replica_patch
from kit.patch import vllm as vllm_patch
from kit.patch.pr import Codebase, Target
from kit.patch.source import Hunk
from kit.record.provenance import provenance, require_cuda
from kit.recordings import RECORDINGS
from kit.units import GIB, format_bytes

RECORDINGS_DIR = RECORDINGS / "alternatives"
SEED = 1234
MAIN_SCENARIOS = ("unpatched", "pr", "share_all")
DRAFTER = SPECULATOR_GRAPHS_LABEL  # the speculator manager's name, as the capture recorder labels it
SCENARIO_KEYS = ("graph_pool_bytes", "saved_bytes", "safe", "evidence")
CAP_KEYS = ("max_replay_size", "graph_pool_bytes", "eager_replay_sizes")
DROP_KEY = "drop_intermediate_sizes"  # added after the first recordings: a recording without it still reads
KEEP_KEYS = ("kept_replay_sizes", "graph_pool_bytes", "eager_replay_sizes")
SAFE_IN_THE_REPLICAS_STEP = (
    "safe means safe in the replica's step (forward, the sampler's read, propose); not modelled: vLLM's "
    "sample_tokens (vllm/v1/worker/gpu/model_runner.py) starts asynchronous output copies on a side stream "
    "(AsyncOutput on output_copy_stream) before propose, to overlap with it, and whether they read what the "
    "drafter's graphs write under share_all is not shown"
)
_STREAM_PARAM = "stream: torch.cuda.Stream | None = None"

# --- alternative (a): one stream for every capture ------------------------------------------


def _replica_target(qualname: str) -> Target:
    return next(t for t in replica_patch.TARGETS if t.qualname == qualname)


SPECULATOR_GETS_THE_STREAM = Hunk(
    "self.speculator.capture()",
    """
    # Alternative (a): the speculator too on the model graphs' stream.
    self.speculator.capture(stream=self.cudagraph_manager.capture_stream)
    """,
)
_CAPTURE_MODEL = _replica_target("GPUModelRunner.capture_model")
SHARE_ALL_TARGETS = (
    *(
        replace(
            t,
            hunks=(*t.hunks, SPECULATOR_GETS_THE_STREAM),
            change="hands the model graphs' `capture_stream` to the replay graphs and to the speculator",
        )
        if t is _CAPTURE_MODEL
        else t
        for t in replica_patch.TARGETS
    ),
    Target(
        "kit.replica.speculator",
        "DSparkSpeculator.capture",
        ("self",),
        (
            Hunk("def capture(self) -> None:", f"def capture(self, {_STREAM_PARAM}) -> None:"),
            Hunk(
                'manager.capture(self._generate_draft, self._prepare_graph_forward, "Capturing dspark CUDA graphs")',
                """
                manager.capture(
                    self._generate_draft, self._prepare_graph_forward, "Capturing dspark CUDA graphs", stream=stream
                )
                """,
            ),
        ),
        "captures the drafter's graphs on `stream` when one is given",
    ),
    Target(
        "kit.replica.speculator",
        "DFlashCudaGraphManager.capture",
        ("self", "forward_fn", "prepare_forward", "progress_bar_desc"),
        (
            vllm_patch.CAPTURE_TAKES_A_STREAM,
            Hunk(
                "super().capture(create_forward_fn, progress_bar_desc)",
                "super().capture(create_forward_fn, progress_bar_desc, stream=stream)",
            ),
        ),
        "hands `stream` to the base `CudaGraphManager.capture`",
    ),
)
SHARE_ALL = Codebase("kit.replica", lambda: "replica, alternative (a): one capture stream for all", SHARE_ALL_TARGETS)


# --- alternative (b): fewer replay capture sizes ------------------------------------------------


def replay_batch_sizes(config) -> list[int]:
    """The replay capture sizes, sorted: a replay batch of r rows runs in the smallest that fits, eagerly above all.

    vLLM's dispatch (`CudaGraphManager.dispatch`, called from `_prepare_replay_batch`); a step
    padded to a model graph of N tokens at or above the trim threshold makes 1 up to N rows.
    """
    return sorted(config.decoder_replay_cudagraph_capture_sizes)


def capped_replay_sizes(config, max_replay_size: int | None) -> list[int]:
    """The replay capture sizes left under a cap (None: no cap)."""
    return [s for s in replay_batch_sizes(config) if max_replay_size is None or s <= max_replay_size]


def eager_replay_sizes(config, max_replay_size: int | None) -> list[int]:
    """The replay capture sizes a cap drops: a batch that would have run in one runs eagerly (no graph fits it)."""
    return [s for s in replay_batch_sizes(config) if max_replay_size is not None and s > max_replay_size]


def cap_sweep(config) -> list[int | None]:
    """The caps swept, a handful: the smallest replay size, for each model capture size the largest replay size at
    or below it, then none.

    Not every replay size: with vLLM's default sizing the large preset has about 30, and each
    cap is a fresh process that captures the whole replica. A model capture size that is a
    replay size is its own cap; a cap at the largest replay size leaves every size (`unpatched`).
    """
    sizes = replay_batch_sizes(config)
    caps = {sizes[0]}
    for model_size in config.cudagraph_capture_sizes:
        below = [s for s in sizes if s <= model_size]
        if below:
            caps.add(below[-1])
    return [*sorted(caps), None]


def cap_scenario(config, max_replay_size: int | None) -> str:
    """The scenario that measures a cap: a cap that leaves every size is vLLM 0.33 as it is (`unpatched`)."""
    if max_replay_size is None or not eager_replay_sizes(config, max_replay_size):
        return "unpatched"
    return f"cap_{max_replay_size}"


def keep_sweep(config) -> list[list[int]]:
    """The kept sets measured for dropping intermediate sizes: the largest alone, the smallest and the largest, then
    every size (vLLM as it is); each once."""
    sizes = replay_batch_sizes(config)
    kept = [[sizes[-1]], [sizes[0], sizes[-1]], sizes]
    return [list(k) for k in dict.fromkeys(tuple(k) for k in kept)]


def keep_scenario(config, kept: list[int]) -> str:
    """The scenario that captures only the replay sizes `kept`: every size kept is `unpatched`."""
    kept = sorted(set(kept))
    if kept == replay_batch_sizes(config):
        return "unpatched"
    return "keep_" + "_".join(map(str, kept))


def dropped_replay_sizes(config, kept: list[int]) -> list[int]:
    """The replay capture sizes a kept set leaves out."""
    return [s for s in replay_batch_sizes(config) if s not in kept]


def kept_eager_replay_sizes(config, kept: list[int]) -> list[int]:
    """The dropped sizes no kept size fits: those above the largest kept (their batches run eagerly)."""
    return [s for s in dropped_replay_sizes(config, kept) if s > max(kept)]


def padded_replay_sizes(config, kept: list[int]) -> list[list[int]]:
    """[dropped size, the kept size its batches run in instead] for each dropped size a kept one fits."""
    return [[s, min(k for k in kept if k >= s)] for s in dropped_replay_sizes(config, kept) if s <= max(kept)]


def parse_scenario(scenario: str) -> tuple[str, int | tuple[int, ...] | None]:
    """`unpatched`, `pr`, `share_all`, `cap_<N>` or `keep_<a>_<b>...`: the kind and its cap or kept sizes."""
    if scenario in MAIN_SCENARIOS:
        return scenario, None
    head, _, rest = scenario.partition("_")
    numbers = rest.split("_")
    if all(n.isdigit() and int(n) > 0 for n in numbers):
        sizes = tuple(int(n) for n in numbers)
        if head == "cap" and len(sizes) == 1:
            return "cap", sizes[0]
        if head == "keep" and list(sizes) == sorted(set(sizes)):
            return "keep", sizes
    raise KitError(
        f"unknown scenario {scenario!r}: one of {', '.join(MAIN_SCENARIOS)}, cap_<N> (N > 0), "
        "or keep_<a>_<b>... (replay sizes, ascending, each once)"
    )


def scenario_replay_sizes(config, scenario: str) -> list[int] | None:
    """The replay sizes `scenario` captures (None: the config's own), each checked against the config's sizes."""
    kind, arg = parse_scenario(scenario)
    sizes = replay_batch_sizes(config)
    if kind == "cap":
        kept = capped_replay_sizes(config, arg)
        if not kept:
            raise KitError(f"{scenario} leaves no replay size: the smallest is {sizes[0]}")
        return kept
    if kind == "keep":
        unknown = [s for s in arg if s not in sizes]
        if unknown:
            raise KitError(
                f"{scenario}: {_sizes(unknown)} not among the config's replay capture sizes ({_sizes(sizes)})"
            )
        return list(arg)
    return None


def scenarios_to_run(config) -> list[str]:
    """Each distinct configuration once: the three scenarios, then every cap and kept set that leaves some size out."""
    caps = [cap_scenario(config, cap) for cap in cap_sweep(config)]
    keeps = [keep_scenario(config, kept) for kept in keep_sweep(config)]
    return [*MAIN_SCENARIOS, *dict.fromkeys(v for v in (*caps, *keeps) if v not in MAIN_SCENARIOS)]


def steps_with_eager_replay(config: dict, max_replay_size: int) -> list[int]:
    """The model capture sizes whose steps can make a replay batch above `max_replay_size` (so run it eagerly).

    `config` as a recording holds it. Under vLLM's rule a step padded to N tokens breaks out
    to a replay batch when N is at or above `decoder_replay_trim_threshold` (a recording made
    before the kit modelled it: every size), and the batch holds 1 up to N rows.
    """
    threshold = config.get("decoder_replay_trim_threshold", 0)
    return [n for n in sorted(config["cudagraph_capture_sizes"]) if n >= threshold and n > max_replay_size]


# --- the config --------------------------------------------------------------------------------


def alternatives_config(preset: str):
    """The preset's replica with the speculator on."""
    from kit.experiments.scenarios import check_preset
    from kit.replica.model import PRESETS

    check_preset(preset)
    return replace(PRESETS[preset], speculator=True)


def speculator_summary(config) -> dict:
    from kit.replica.speculator import MAX_NUM_REQS, NUM_DRAFT_LAYERS, NUM_SPECULATIVE_STEPS, speculator_capture_sizes

    return {
        "kind": "DSpark (FULL graphs, DFlashCudaGraphManager)",
        "draft_layers": NUM_DRAFT_LAYERS,
        "num_query_per_req": NUM_SPECULATIVE_STEPS,
        "max_num_reqs": MAX_NUM_REQS,
        "capture_sizes": speculator_capture_sizes(config.cudagraph_capture_sizes, NUM_SPECULATIVE_STEPS),
        "reads": [f"aux_hidden_state[{i}]" for i in sorted(set(config.aux_hidden_state_layers))],
    }


def kv_layout(config):
    """The replica's KV layout: the target's layers and the drafter's (vLLM sizes both from one budget)."""
    from kit.analysis.kv_cache import replica_layout
    from kit.replica.speculator import NUM_DRAFT_LAYERS

    layers = config.num_layers + (NUM_DRAFT_LAYERS if config.speculator else 0)
    return replica_layout(config.hidden_size, layers, config.dtype)


# --- one scenario (CUDA) -----------------------------------------------------------------------


def scenario_patch(kind: str):
    if kind == "pr":
        return replica_patch.patched("pr")
    if kind == "share_all":
        return SHARE_ALL.patched("share")
    return contextlib.nullcontext()  # unpatched, the caps and the kept sets: vLLM 0.33


def pool_figures(raw: dict) -> dict:
    """The global graph pool of a recorder's snapshot: bytes reserved, by stream, and the stream each manager used."""
    meta = raw.get("kit", {})
    pool = meta.get("pools", {}).get(GRAPH_POOL_LABEL)
    if pool is None:
        raise KitError("the recording names no global graph pool: no manager captured into it")
    labels = {stream: name for name, stream in meta.get("streams", {}).items()}
    by_stream: dict[str, int] = {}
    for seg in raw.get("segments", []):
        if tuple(seg["segment_pool_id"]) == tuple(pool):
            label = labels.get(seg["stream"], f"stream {seg['stream']:#x}")
            by_stream[label] = by_stream.get(label, 0) + int(seg["total_size"])
    streams = {}
    for capture in meta.get("captures", []):
        streams.setdefault(capture["manager"], labels.get(capture["stream"], f"stream {capture['stream']:#x}"))
    return {"graph_pool_bytes": sum(by_stream.values()), "graph_pool_by_stream": by_stream, "capture_streams": streams}


def compare_step(config, graph, eager) -> dict:
    """A graph step against an eager one: the target's outputs and the draft, bit for bit."""
    from kit.analysis.equivalence import compare

    names = ["hidden_states", *(f"aux_hidden_state[{i}]" for i in sorted(set(config.aux_hidden_state_layers)))]
    graphs, eagers = (graph.hidden_states, *graph.aux_hidden_states), (eager.hidden_states, *eager.aux_hidden_states)
    target = [compare(0, name, g, e) for name, g, e in zip(names, graphs, eagers, strict=True)]
    draft = compare(0, "draft_hidden_states", graph.draft_hidden_states, eager.draft_hidden_states)
    checks = [*target, draft]
    return {
        "bit_exact": all(c["bit_exact"] for c in checks),
        "draft_bit_exact": draft["bit_exact"],
        "max_abs_diff": max(c["max_abs_diff"] for c in checks),
        "draft_max_abs_diff": draft["max_abs_diff"],
        "differing_outputs": [c["output"] for c in checks if not c["bit_exact"]],
    }


def run_checks(runner, seed: int = SEED) -> list[dict]:
    """Every capture size, after a graph step of every size (whose graphs wrote the pool), against an eager step."""
    import torch

    config = runner.config
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def fresh_ids(size: int):
        return torch.randint(config.vocab_size, (size,), generator=generator).to(runner.device)

    sizes = sorted(config.cudagraph_capture_sizes)
    rows = []
    for size in sizes:
        ids = fresh_ids(size)
        eager = runner.step(ids, use_cudagraph=False)
        for previous in sizes:
            runner.step(fresh_ids(previous))
            graph = runner.step(ids)
            rows.append(
                {
                    "size": size,
                    "previous_size": previous,
                    "draft_graph_size": graph.draft_graph_size,
                    "target_outputs_overwritten": graph.target_outputs_overwritten,
                    **compare_step(config, graph, eager),
                }
            )
    return rows


def build_runner(config, replay_sizes: list[int] | None = None):
    """The replica on CUDA, capturing only the replay sizes `replay_sizes` (None: as the config has them)."""
    from kit.replica.model_runner import GPUModelRunner

    runner = GPUModelRunner(config)
    if replay_sizes is not None:
        set_replay_capture_sizes(runner, replay_sizes)
    return runner


def set_replay_capture_sizes(runner, replay_sizes: list[int]) -> None:
    """Have the runner's replay graph manager capture (and dispatch to) only `replay_sizes`, largest first."""
    runner.model_state.replay_cudagraphs.capture_sizes = sorted(replay_sizes, reverse=True)


def captured_runner(scenario: str, preset: str = "small"):
    """The replica with its speculator captured under `scenario` in this process, nothing else run.

    For an analysis that wraps the phases `kit/replica/speculator.py` names (the target forward,
    the reads of its outputs, the drafter's graph, the speculator capture): patch them, then call
    this, then `runner.step(ids)`.
    """
    kind, _ = parse_scenario(scenario)
    config = alternatives_config(preset)
    sizes = scenario_replay_sizes(config, scenario)
    require_cuda(LIVE_NEEDS_CUDA)
    with scenario_patch(kind):
        runner = build_runner(config, sizes)
        runner.capture_model()
    return runner


def run_scenario(scenario: str, preset: str = "small", seed: int = SEED) -> dict:
    """Capture the replica with its speculator under `scenario` in this process: pool, estimate, checks."""
    import torch

    from kit.record.recorder import CaptureRecorder
    from kit.replica.model_runner import free_device_memory

    kind, arg = parse_scenario(scenario)
    config = alternatives_config(preset)
    sizes = scenario_replay_sizes(config, scenario)
    require_cuda(LIVE_NEEDS_CUDA)
    with scenario_patch(kind) as patch:
        runner = build_runner(config, sizes)
        replay = runner.model_state.replay_cudagraphs
        torch.cuda.synchronize()
        estimate = runner.profile_cudagraph_memory()
        free_before = free_device_memory(runner.device)
        with CaptureRecorder() as recorder:
            runner.capture_model()
        capture_delta = free_before - free_device_memory(runner.device, empty_cache=False)
        decisions = [d.reason for d in patch.decisions] if patch is not None else []
    return {
        "scenario": scenario,
        "preset": preset,
        "max_replay_size": arg if kind == "cap" else None,
        "kept_replay_sizes": list(arg) if kind == "keep" else None,
        "replay_capture_sizes": sorted(replay.capture_sizes),
        "speculator_capture_sizes": sorted(runner.speculator.capture_sizes),
        **pool_figures(recorder.snapshot.raw),
        "profile_estimate_bytes": int(estimate),
        "capture_free_memory_delta": int(capture_delta),
        "replay_decisions": decisions,
        "checks": run_checks(runner, seed) if kind in MAIN_SCENARIOS else [],
        "seed": seed,
        "provenance": provenance(f"python -m kit.experiments.alternatives --scenario {scenario} --preset {preset}"),
    }


def run_scenario_in_subprocess(scenario: str, preset: str, out: Path) -> dict:
    """`run_scenario` in a fresh process; what it wrote to `out`."""
    failed = f"alternative {scenario} ({preset})"
    return recorded.run_in_subprocess("kit.experiments.alternatives", scenario, preset, out, failed)


# --- the recording ------------------------------------------------------------------------------


def safety_verdict(run: dict) -> tuple[bool, str]:
    """Whether a scenario's graphs equal eager, target and drafter, and the evidence in one line."""
    checks = run.get("checks") or []
    if not checks:
        return False, "not checked: no graphs-vs-eager steps were run"
    n = len(checks)
    graphs = sorted({c["draft_graph_size"] for c in checks if c["draft_graph_size"] is not None})
    stream = run.get("capture_streams", {}).get(DRAFTER, "?")
    drafter = f"drafter graphs {', '.join(map(str, graphs))} captured on the {stream}" if graphs else ""
    bad = [c for c in checks if not c["bit_exact"]]
    if bad:
        steps = ", ".join(f"{c['size']} after {c['previous_size']}" for c in bad)
        outputs = sorted({o for c in bad for o in c["differing_outputs"]})
        worst = max(c["max_abs_diff"] for c in bad)
        return False, (
            f"graphs differ from eager in {len(bad)} of {n} steps ({steps}): {', '.join(outputs)}, "
            f"largest difference {worst:.4g}; {drafter or 'no drafter graph replayed'}"
        )
    if not graphs:
        return False, f"target graphs equal eager in all {n} steps, but no drafter graph replayed: the drafter unshown"
    overwritten = sum(bool(c["target_outputs_overwritten"]) for c in checks)
    if overwritten:
        note = (
            f"the drafter's graph overwrote the target's outputs in the pool in {overwritten} of them, "
            "after propose had copied them out (read before the drafter's graph runs)"
        )
    else:
        note = "the drafter's graphs never overwrote the target's outputs in the pool"
    return True, (
        f"graphs equal eager bit for bit in all {n} steps (each size after each size), target outputs and "
        f"drafts; {drafter}; {note}"
    )


def assemble(preset: str, config, runs: dict[str, dict], prov: dict) -> dict:
    """The alternatives JSON from the scenarios' runs (`runs[scenario]`, as `run_scenario` returns them)."""
    from kit.analysis.kv_cache import kv_cache_section

    missing = [v for v in scenarios_to_run(config) if v not in runs]
    if missing:
        raise KitError(f"no run of {', '.join(missing)} to assemble the alternatives from")
    base = runs["unpatched"]["graph_pool_bytes"]
    data: dict[str, Any] = {
        "preset": preset,
        "config": dataclasses.asdict(config),
        "speculator": speculator_summary(config),
    }
    for scenario in MAIN_SCENARIOS:
        run = runs[scenario]
        safe, evidence = safety_verdict(run)
        data[scenario] = {
            "graph_pool_bytes": run["graph_pool_bytes"],
            "saved_bytes": base - run["graph_pool_bytes"],
            "safe": safe,
            "evidence": evidence,
            **{k: run[k] for k in ("graph_pool_by_stream", "capture_streams", "replay_decisions", "checks")},
            "profile_estimate_bytes": run["profile_estimate_bytes"],
            "capture_free_memory_delta": run["capture_free_memory_delta"],
        }
    data["cap_replay_sizes"] = []
    for cap in cap_sweep(config):
        scenario = cap_scenario(config, cap)
        run = runs[scenario]
        data["cap_replay_sizes"].append(
            {
                "max_replay_size": cap,
                "graph_pool_bytes": run["graph_pool_bytes"],
                "eager_replay_sizes": eager_replay_sizes(config, cap),
                "replay_capture_sizes": capped_replay_sizes(config, cap),
                "saved_bytes": base - run["graph_pool_bytes"],
                "graph_pool_by_stream": run["graph_pool_by_stream"],
                "profile_estimate_bytes": run["profile_estimate_bytes"],
                "measured_in": scenario,
            }
        )
    data["replay_capture_sizes"] = replay_batch_sizes(config)
    data[DROP_KEY] = []
    for kept in keep_sweep(config):
        scenario = keep_scenario(config, kept)
        run = runs[scenario]
        data[DROP_KEY].append(
            {
                "kept_replay_sizes": kept,
                "graph_pool_bytes": run["graph_pool_bytes"],
                "eager_replay_sizes": kept_eager_replay_sizes(config, kept),
                "dropped_replay_sizes": dropped_replay_sizes(config, kept),
                "padded_to": padded_replay_sizes(config, kept),
                "saved_bytes": base - run["graph_pool_bytes"],
                "graph_pool_by_stream": run["graph_pool_by_stream"],
                "profile_estimate_bytes": run["profile_estimate_bytes"],
                "measured_in": scenario,
            }
        )
    estimates = {v: runs[v]["profile_estimate_bytes"] for v in MAIN_SCENARIOS}
    data["kv_cache"] = kv_cache_section(estimates, kv_layout(config))
    data["provenance"] = prov
    return data


def record(preset: str, out_dir: Path) -> Path:
    """Every scenario, each in a fresh process, into `out_dir/<preset>.json`; its `PROVENANCE.json` entry too."""
    config = alternatives_config(preset)
    require_cuda(LIVE_NEEDS_CUDA)
    out_dir, runs, provenance = recorded.record_each(
        "kit.experiments.alternatives", scenarios_to_run(config), run_scenario_in_subprocess, preset, out_dir
    )
    data = assemble(preset, config, runs, provenance)
    figures = {v: {k: data[v][k] for k in SCENARIO_KEYS} for v in MAIN_SCENARIOS}
    return recorded.write_recording(data, out_dir, preset, figures=figures)


# --- reading and showing ---------------------------------------------------------------------


LIVE_NEEDS_CUDA = (
    "live alternatives runs need CUDA, and this process has none; without --live, alternatives shows the H200 recording"
)


def recording_path(preset: str) -> Path:
    return RECORDINGS_DIR / f"{preset}.json"


def _schema_problem(data: Any) -> str | None:
    if not isinstance(data, dict):
        return "not a JSON object"
    for scenario in MAIN_SCENARIOS:
        entry = data.get(scenario)
        missing = [k for k in SCENARIO_KEYS if not isinstance(entry, dict) or k not in entry]
        if missing:
            return f"{scenario!r} lacks {', '.join(missing)}"
    caps = data.get("cap_replay_sizes")
    if not isinstance(caps, list) or not caps:
        return "no 'cap_replay_sizes' list"
    for row in caps:
        missing = [k for k in CAP_KEYS if not isinstance(row, dict) or k not in row]
        if missing:
            return f"a cap_replay_sizes row lacks {', '.join(missing)}"
    drops = data.get(DROP_KEY, [{k: None for k in KEEP_KEYS}])  # absent in recordings made before it
    if not isinstance(drops, list) or not drops:
        return f"{DROP_KEY!r} is not a list of rows"
    for row in drops:
        missing = [k for k in KEEP_KEYS if not isinstance(row, dict) or k not in row]
        if missing:
            return f"a {DROP_KEY} row lacks {', '.join(missing)}"
    if not isinstance(data.get("kv_cache"), dict):
        return "no 'kv_cache'"
    if not isinstance(data.get("provenance"), dict):
        return "no 'provenance'"
    return None


def load_graphs_vs_eager(preset: str, path: str | Path | None = None) -> dict:
    """An alternatives recording as made (the shipped one for `preset` by default), checked, with its `source` line.

    share_all's verdict here is graphs vs eager alone. What the kit shows and prints reads
    `kit.experiments.drafter_run.load_alternatives`, the one loader that backs it by the
    drafter's two analyses too.
    """
    from kit.experiments.scenarios import check_preset

    check_preset(preset)
    path = Path(path) if path is not None else recording_path(preset)
    return recorded.load_shipped(path, preset, "alternatives", _schema_problem)


def run_live(preset: str, out_dir: str | Path | None = None) -> dict:
    """Record `preset` on this GPU now (each scenario in a fresh process) and read it back."""
    alternatives_config(preset)  # an unknown preset first
    require_cuda(LIVE_NEEDS_CUDA)  # before any folder or process is made
    out = Path(out_dir or tempfile.mkdtemp(prefix="kit-alternatives-"))
    path = record(preset, out)
    data = load_graphs_vs_eager(preset, path)
    gpu = data["provenance"]["gpu"]
    data["source"] = f"live GPU ({gpu}: captured just now, each scenario in a fresh process; {path})"
    return data


def _mib(n: int) -> str:
    """The alternatives' figures, all in MiB to one place so that they line up (`format_bytes` with a unit)."""
    return format_bytes(n, "MiB", 1)


def _sizes(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes)) or "none"


def alternatives_lines(data: dict) -> list[str]:
    """The `python -m kit alternatives` text: source, the scenarios, the caps, the kept sets, the KV cache."""
    import pandas as pd

    config, spec = data.get("config", {}), data.get("speculator", {})
    lines = [f"source: {data.get('source', '?')}"]
    if config:
        lines.append(
            f"replica {data.get('preset', '?')}: hidden {config['hidden_size']}, {config['num_layers']} layers, "
            f"capture sizes {_sizes(config['cudagraph_capture_sizes'])}; speculator: {spec.get('kind', '?')}, "
            f"{spec.get('draft_layers', '?')} layers, graphs of {_sizes(spec.get('capture_sizes', []))} tokens, "
            "captured last"
        )
    scenarios = pd.DataFrame(
        [
            {
                "scenario": v,
                "graph pool": _mib(data[v]["graph_pool_bytes"]),
                "saved": _mib(data[v]["saved_bytes"]),
                "safe in the replica's step": "yes" if data[v]["safe"] else "NO",
            }
            for v in MAIN_SCENARIOS
        ]
    )
    lines += ["", "unpatched (vLLM 0.33), pr (PR 63155), share_all (alternative (a): every capture on one stream)"]
    lines += scenarios.to_string(index=False).splitlines()
    lines += [f"  {v}: {data[v]['evidence']}" for v in MAIN_SCENARIOS]
    lines += [f"  {SAFE_IN_THE_REPLICAS_STEP}"]
    lines += ["", *cap_lines(data), "", *fewer_sizes_lines(data)]
    lines += ["", *kv_cache_lines(data["kv_cache"])]
    return lines


def _saved(data: dict, row: dict) -> int:
    return row.get("saved_bytes", data["unpatched"]["graph_pool_bytes"] - row["graph_pool_bytes"])


def cap_lines(data: dict) -> list[str]:
    """Alternative (b) capped: per cap the graph pool, the sizes it drops and the model steps that can go eager."""
    import pandas as pd

    config = data.get("config", {})

    def steps(cap: int | None) -> str:
        if cap is None or "cudagraph_capture_sizes" not in config:
            return "none" if cap is None else "?"
        return _sizes(steps_with_eager_replay(config, cap))

    caps = pd.DataFrame(
        [
            {
                "max replay size": "none" if row["max_replay_size"] is None else row["max_replay_size"],
                "graph pool": _mib(row["graph_pool_bytes"]),
                "saved": _mib(_saved(data, row)),
                "eager replay sizes": _sizes(row["eager_replay_sizes"]),
                "steps that can go eager": steps(row["max_replay_size"]) if row["eager_replay_sizes"] else "none",
            }
            for row in data["cap_replay_sizes"]
        ]
    )
    header = (
        "alternative (b), capped: vLLM 0.33 with the replay capture sizes capped; a replay batch of more rows than "
        "the cap runs eagerly (a step padded to N tokens at or over the trim threshold makes 1 up to N rows)"
    )
    return [header, *caps.to_string(index=False).splitlines()]


def _kept(sizes: list[int], every: list[int]) -> str:
    if len(sizes) == len(every) and len(every) > 3:
        return f"all {len(every)} ({every[0]} to {every[-1]})"
    return _sizes(sizes)


def fewer_sizes_lines(data: dict) -> list[str]:
    """Alternative (b) with intermediate sizes dropped: per kept set the graph pool, then what the figures say."""
    import pandas as pd

    header = (
        "alternative (b), fewer sizes: vLLM 0.33 capturing only the replay sizes kept (the PR: shrinking them saves "
        '"proportionally"); a replay batch runs in the smallest kept size that fits it, eagerly above the largest'
    )
    rows = data.get(DROP_KEY)
    if not rows:
        return [header, "  not measured: this recording predates the measurement (python -m kit alternatives --live)"]
    every = _every_replay_size(data)
    kept = pd.DataFrame(
        [
            {
                "kept replay sizes": _kept(row["kept_replay_sizes"], every),
                "graph pool": _mib(row["graph_pool_bytes"]),
                "saved": _mib(_saved(data, row)),
                "eager replay sizes": _sizes(row["eager_replay_sizes"]),
            }
            for row in rows
        ]
    )
    return [header, *kept.to_string(index=False).splitlines(), *replay_group_lines(data)]


def _every_replay_size(data: dict) -> list[int]:
    rows = data.get(DROP_KEY) or []
    return sorted(data.get("replay_capture_sizes") or max((r["kept_replay_sizes"] for r in rows), key=len, default=[]))


def replay_group_lines(data: dict) -> list[str]:
    """Whether dropping intermediate replay sizes shrank the graph pool, or only capping the largest did: from the
    figures of `drop_intermediate_sizes` and `cap_replay_sizes` (nothing when the recording lacks the first)."""
    rows = data.get(DROP_KEY) or []
    every = _every_replay_size(data)
    if not rows or not every:
        return []
    n, largest = len(every), every[-1]
    base = data["unpatched"]["graph_pool_bytes"]
    group = base - data["pr"]["graph_pool_bytes"]
    dropped = [r for r in rows if largest in r["kept_replay_sizes"] and len(r["kept_replay_sizes"]) < n]
    if not dropped:
        return [f"  only {n} replay size(s): no size below the largest to drop"]
    lines = [f"  the replay graphs' own group, every size captured: {_mib(group)} (what the PR saves)"]
    for row in dropped:
        k, saved = len(row["kept_replay_sizes"]), base - row["graph_pool_bytes"]
        lines.append(
            f"  keeping {_sizes(row['kept_replay_sizes'])} ({k} of {n} sizes) saves {_mib(saved)}; in proportion to "
            f"the sizes dropped it would save {_mib(group * (n - k) // n)}"
        )
    best = max(base - row["graph_pool_bytes"] for row in dropped)
    caps = [
        (row["max_replay_size"], base - row["graph_pool_bytes"])
        for row in data["cap_replay_sizes"]
        if row["max_replay_size"] is not None and row["max_replay_size"] < largest
    ]
    capped = ", ".join(f"cap {cap} saves {_mib(saved)}" for cap, saved in caps)
    if best <= 0:
        verdict = (
            f"  so: dropping intermediate sizes did not shrink the graph pool (it saved at most {_mib(best)}): the "
            f"replay graphs' group follows the largest captured replay size ({largest}), not the number of sizes"
        )
        if any(saved > 0 for _, saved in caps):
            verdict += f"; only capping the largest shrank it ({capped}; batches above the cap run eagerly)"
        elif caps:
            verdict += f"; no cap shrank it either ({capped})"
    else:
        verdict = (
            f"  so: dropping intermediate sizes did shrink the graph pool, by up to {_mib(best)}: the replay graphs' "
            "group does not follow the largest captured size alone"
        )
        if caps:
            verdict += f"; capping the largest: {capped}"
    return [*lines, verdict]


def kv_cache_lines(kv: dict) -> list[str]:
    """What the saving buys, in lines: the replica's estimates and freed KV cache, then DeepSeek's."""
    lines = ["what the saving buys: capture_model(profile_only=True)'s estimate is taken off the KV cache budget"]
    replica = kv.get("replica")
    if replica:
        layout = replica["layout"]
        estimates = ", ".join(f"{v} {_mib(b)}" for v, b in replica["profile_estimate_bytes"].items())
        lines.append(f"  replica estimate: {estimates}")
        for scenario, freed in replica["freed"].items():
            lines.append(
                f"  {scenario} frees {_mib(freed['bytes'])} of KV budget: {freed['blocks']:,} blocks, "
                f"{freed['tokens']:,} tokens"
            )
        per_token, block = layout["bytes_per_token"], layout["block_size"]
        lines.append(f"  (replica layout {per_token:,} B/token, block {block}: {layout['source']})")
    for key in ("deepseek_v41_flash", "deepseek_v3_mla"):
        entry = kv.get(key)
        if not entry:
            continue
        layout = entry["layout"]
        line = (
            f"  {layout['name']}: the PR's {entry['saved_bytes'] / GIB:.2f} GiB = {entry['blocks']:,} blocks of "
            f"{layout['block_size']}, {entry['tokens']:,} tokens at {layout['bytes_per_token']:,} B/token"
        )
        if "or_swa_requests" in entry:
            line += f", or the sliding windows of {entry['or_swa_requests']:,} more requests"
        lines += [line, f"    ({layout['source']})"]
    return lines


def alternatives_json(data: dict) -> dict:
    """The recording as `python -m kit alternatives --json` prints it, with its `source` line."""
    return data


def main(argv: list[str] | None = None) -> int:
    return recorded.recording_main(
        argv,
        description="PR 63155's alternatives on the replica with its speculator.",
        old_flag="--variant",
        names="unpatched, pr, share_all, cap_<N>, keep_<a>_<b>...",
        run_one=run_scenario,
        said=lambda name, result: f"{name}: graph pool {_mib(result['graph_pool_bytes'])}",
        record=record,
        summary=lambda preset, path: alternatives_lines(load_graphs_vs_eager(preset, path)),
    )


if __name__ == "__main__":
    sys.exit(main())

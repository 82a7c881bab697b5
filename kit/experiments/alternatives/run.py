"""The alternatives run on CUDA: alternative (a)'s patch (`SHARE_ALL`), one scenario in this process, and the
recording of every scenario, each in a fresh process (`record`, `run_live`)."""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from kit.analysis.names import GRAPH_POOL_LABEL
from kit.errors import KitError
from kit.experiments import recorded
from kit.experiments.alternatives.result import load_graphs_vs_eager
from kit.experiments.alternatives.scenarios import (
    DRAFTER,
    DROP_KEY,
    MAIN_SCENARIOS,
    SCENARIO_KEYS,
    SEED,
    alternatives_config,
    cap_scenario,
    cap_sweep,
    capped_replay_sizes,
    dropped_replay_sizes,
    eager_replay_sizes,
    keep_scenario,
    keep_sweep,
    kept_eager_replay_sizes,
    kv_layout,
    padded_replay_sizes,
    parse_scenario,
    replay_batch_sizes,
    scenario_replay_sizes,
    scenarios_to_run,
    speculator_summary,
)
from kit.patch import replica as replica_patch
from kit.patch import vllm as vllm_patch
from kit.patch.pr import Codebase, Target
from kit.patch.source import Hunk
from kit.record.provenance import provenance, require_cuda

LIVE_NEEDS_CUDA = (
    "live alternatives runs need CUDA, and this process has none; without --live, alternatives shows the H200 recording"
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

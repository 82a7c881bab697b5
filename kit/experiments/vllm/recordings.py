"""vLLM's scenarios, and their shipped recordings read back: the snapshots, their summaries and invariants, and
`kit demo --vllm`'s text and JSON. Nothing here needs torch or vLLM; `kit.experiments.vllm.capture` records them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from kit.errors import KitError
from kit.experiments import early_aux
from kit.experiments.summary import saved_by_the_patch, summarize, vllm_scenario_of


class VllmScenario(NamedTuple):
    """A scenario: the patch policy (None: unpatched), whether an aux id comes before the replay layers, what it
    shows, how the aux leaves the forward (`aux_return`: "nested" as V4.1 does, vLLM's wrapper then keeps it;
    "flat", hypothetical, weak), and whether the stand-in carries the planted cross-break read
    (`StandInConfig.planted_cross_break_read`)."""

    policy: str | None
    early_aux: bool
    description: str
    aux_return: str = "nested"
    planted: bool = False
    preset: str | None = None  # one of vLLM's default presets (`vllm_standin.preset_config`); None: StandInConfig()


VLLM_SCENARIOS = {
    "unpatched": VllmScenario(None, False, "vLLM 0.33: replay graphs on a stream graph_capture() makes for them"),
    "patched": VllmScenario("pr", False, "PR 63155: replay graphs on the model graphs' stream"),
    "early_aux_pr": VllmScenario(
        "pr", True, "early aux returned as V4.1 does, under PR 63155: the replay graphs keep their own stream"
    ),
    "early_aux_pr_flat": VllmScenario(
        "pr", True, "hypothetical: early aux returned flattened, under PR 63155: replay graphs keep their own stream",
        "flat",
    ),
    "early_aux_shared": VllmScenario(
        "share", True, "early aux forced to share, returned as V4.1 does, (hidden_states, aux_list): vLLM's wrapper "
        "keeps its block",
    ),
    "early_aux_shared_flat": VllmScenario(
        "share", True, "hypothetical: a vLLM whose model returned aux flattened: early aux forced to share, its block "
        "weak", "flat",
    ),
    "planted_cross_break_read": VllmScenario(
        "pr", False, "PLANTED: PR 63155 on a stand-in that reads a graph-pool intermediate after the replay break",
        planted=True,
    ),
    "h200_default": VllmScenario(
        "pr", False, "PR 63155 at vLLM's H200 defaults: model graphs up to 512, below the trim threshold of 768",
        preset="h200-default",
    ),
    "gb200_default": VllmScenario(
        "pr", False, "PR 63155 at vLLM's GB200 defaults: model graphs 768..1024 (step 16) break out, most to a replay "
        "graph larger than themselves", preset="gb200-default",
    ),
}  # fmt: skip


# Scenario names recordings were written under before the return shapes were named: old name -> scenario.
OLD_NAMES = {"early_aux_shared_pinned": "early_aux_shared"}


FLAT_SUFFIX = "_flat"


def recording_path(name: str) -> Path:
    from kit.recordings import RECORDINGS

    return RECORDINGS / "vllm" / f"{name}.pickle"


def recorded_as(stem: str, about: dict) -> str:
    """The scenario a recording named `stem` ran, from what its `kit["vllm_scenario"]` (`about`) says it handed out.

    A recording made before the return shapes were named ran `early_aux_pr` and
    `early_aux_shared` with the early aux weak (`early_aux_pinned` False: the flat
    case), and `early_aux_shared_pinned` as V4.1 does (nested).
    """
    from kit.experiments.summary import aux_return_of

    name = OLD_NAMES.get(stem, stem)
    if not about.get("has_early_aux"):
        return name
    base = name.removesuffix(FLAT_SUFFIX)
    return base + FLAT_SUFFIX if aux_return_of({"vllm_scenario": about}) == "flat" else base


def load_recordings(folder: str | Path | None = None) -> dict:
    """The shipped H200 recordings of every scenario (or those in `folder`), as snapshots, in `VLLM_SCENARIOS` order;
    KitError naming how to make them if none. Each is keyed by the scenario it ran (`recorded_as`); of two that ran
    one, the file named so."""
    found = {}
    for stem in (*VLLM_SCENARIOS, *OLD_NAMES):
        path = Path(folder) / f"{stem}.pickle" if folder is not None else recording_path(stem)
        snap = load_shipped_snapshot(path)
        if snap is None:
            continue
        name = recorded_as(stem, vllm_scenario_of(snap.kit))
        if name in VLLM_SCENARIOS and (name not in found or stem == name):
            found[name] = snap
    runs = {name: found[name] for name in VLLM_SCENARIOS if name in found}
    if not runs:
        raise KitError(
            "no vLLM recordings in kit/recordings/vllm: record them on the H200 with "
            "`bash scripts/vllm_on_device.sh OUT` (docs/vllm.md)"
        )
    return runs


def load_shipped_snapshot(path: Path):
    """The snapshot at `path`, or at `path.gz` (shipped compressed: `kit.recordings.shipped_bytes`), read as any
    snapshot is (no code runs); None if neither is there."""
    from kit.experiments.recorded import repo_path
    from kit.load.snapshot import load_snapshot, snapshot_from_bytes
    from kit.recordings import shipped, shipped_bytes

    found = shipped(path)
    if found is None:
        return None
    if found == Path(path):
        return load_snapshot(found, label=repo_path(found))
    return snapshot_from_bytes(shipped_bytes(path), origin=repo_path(found))


def shipped_invariants() -> dict[str, dict]:
    """Per shipped vLLM recording, keyed by the scenario it ran: the structural invariant
    (`vllm_safety.invariant_of_snapshot`: as recorded, or computed from the recording), or
    `{"holds": None, "summary": "... not recorded ..."}` (`kit safety` shows it)."""
    from kit.analysis.invariant import INVARIANT, NOT_RECORDED
    from kit.experiments.vllm.safety import invariant_of_snapshot

    out = {}
    for stem in (*VLLM_SCENARIOS, *OLD_NAMES):  # each file read as the scenario it ran (`recorded_as`)
        snap = load_shipped_snapshot(recording_path(stem))
        if snap is None:
            continue
        raw = snap.raw
        name = recorded_as(stem, vllm_scenario_of(raw.get("kit") or {}))
        if name not in VLLM_SCENARIOS or (name in out and stem != name):
            continue
        found = invariant_of_snapshot(raw)
        out[name] = found or {"holds": None, "summary": f"{INVARIANT} {NOT_RECORDED}", "verdicts": [], "rows": []}
    return {name: out[name] for name in VLLM_SCENARIOS if name in out}


def demo_json(summaries: dict, provenance_by_name: dict) -> dict:
    """`{scenario: {"replay_added_bytes", "replay_added_segments", "graph_pool_bytes", ..., "pairings", "readwrite",
    ..., "provenance"}}`, as `demo --vllm --json` prints; the pairings' and obligation's keys are None for a
    recording made before them, `replay_added_segments` for summaries made without `segments`."""
    keys = (
        "replay_added_bytes", "replay_added_segments", "replay_added_by_cause", "graph_pool_bytes",
        "graph_pool_segments", "replay_on_model_stream",
        "replay_streams_from_graph_capture", "replay_stream_names", "bit_exact", "max_abs_diff", "path", "source",
        "has_early_aux", "early_aux_pinned", "aux_return", "replay_sizes", "pairings", "pairings_verdict", "readwrite",
        "readwrite_verdict", "readwrite_verdicts", "readwrite_holds",
    )  # fmt: skip
    early = early_aux.early_aux_verdict(summaries)  # in each early-aux scenario's entry: every entry is a scenario's
    return {
        name: {
            **{k: summary.get(k) for k in keys},
            "early_aux_verdict": early if summary.get("has_early_aux") else None,
            "provenance": provenance_by_name[name],
        }
        for name, summary in summaries.items()
    }


def demo_lines(summaries: dict) -> list[str]:
    """The figures of every scenario for a terminal: where the replay graphs captured, what they added, the check,
    the read/write obligation and the pairings on vLLM's path."""
    from kit.analysis.added_segments import added_segments_lines
    from kit.analysis.readwrite import OBLIGATION
    from kit.experiments.vllm.safety import short_obligation
    from kit.units import format_bytes

    lines = []
    for name, s in summaries.items():
        where = "the model graphs' stream" if s["replay_on_model_stream"] else "a stream of their own"
        made = "made by graph_capture()" if s["replay_streams_from_graph_capture"] else "NOT made by graph_capture()"
        check = "bit-exact" if s["bit_exact"] else f"DIFFERS, largest difference {s['max_abs_diff']:.4g}"
        about = VLLM_SCENARIOS[name].description if name in VLLM_SCENARIOS else s.get("policy")
        lines += [
            f"{name} ({about}): {s['source']}",
            f"  vLLM path: {s['path']}; replay graphs captured on {where} ({made})",
            f"  graph-pool bytes the replay captures added: {format_bytes(s['replay_added_bytes'])}",
            *added_segments_lines(s.get("replay_added_segments") or []),
            f"  global graph pool: {format_bytes(s['graph_pool_bytes'])} in {s['graph_pool_segments']} segments",
            f"  graphs vs eager: {check}",
            "  read/write obligation: "
            + (s.get("readwrite_error") or short_obligation(s.get("readwrite"), s.get("readwrite_holds"))),
            f"  pairings: {s.get('pairings_verdict') or s.get('pairings_error') or 'not in this recording'}",
        ]
    saved = saved_by_the_patch(summaries)
    if saved is not None:
        lines.append(f"graph pool saved by the patch on vLLM's own code: {format_bytes(saved)} ({saved} bytes)")
    if any(s.get("readwrite") is not None for s in summaries.values()):
        lines.append(f"the obligation: {OBLIGATION}")
    if any(s.get("has_early_aux") for s in summaries.values()):
        lines += early_aux.early_aux_lines(early_aux.early_aux_verdict(summaries))
    return lines


def demo(*, live: bool = False, as_json: bool = False, vllm: bool = True) -> None:
    """`python -m kit demo --vllm [--json]`: the shipped recordings' figures."""
    if not vllm:
        raise KitError("--json goes with --vllm (the replica's demo prints text)")
    if live:
        raise KitError("vLLM's capture runs on a GPU machine from the bundle: bash scripts/vllm_on_device.sh OUT")
    runs = load_recordings()
    summaries = {name: summarize(snap, segments=True) for name, snap in runs.items()}
    if as_json:
        provenance_by_name = {name: snap.kit["provenance"] for name, snap in runs.items()}
        print(json.dumps(demo_json(summaries, provenance_by_name), indent=1, default=str))
        return
    print("\n".join(demo_lines(summaries)))


def recorded_summaries() -> dict[str, dict]:
    """`summarize` of every shipped recording, by the scenario it ran (`load_recordings`)."""
    return {name: summarize(snap) for name, snap in load_recordings().items()}


def recorded_early_aux_verdict() -> dict:
    """`early_aux.early_aux_verdict` of the shipped recordings, with `source` naming them; every figure None where
    there are none."""
    try:
        summaries = recorded_summaries()
    except KitError as e:
        return {**early_aux.early_aux_verdict({}), "source": str(e)}
    source = "vLLM 0.33's own capture path, recorded (kit/recordings/vllm)"
    return {**early_aux.early_aux_verdict(summaries), "source": source}

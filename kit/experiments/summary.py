"""The figures of one capture experiment's snapshot, read one way for the replica's scenarios and vLLM's.

`kit.experiments.scenarios` (the replica) and `kit.experiments.vllm.capture`
(vLLM 0.33's own capture path) record the same kind of snapshot: a global
graph pool, the model graphs' and replay graphs' streams in its `kit` key,
each capture's window, and the graphs-versus-eager check. `summarize` reads
the figures back from such a snapshot, live or recorded, so the CPU tests,
`python -m kit demo` and the notebooks assert and print the numbers the GPU
measured; `graph_pool_saved` is what a change (the patch, a shared stream)
saved in the graph pool, the one figure `kit demo`, `demo --vllm` and
notebook 01 print.

The replica's recordings were made when its summary named three figures
otherwise; `OLD_NAMES` keeps those keys in a replica scenario's summary (its
shipped `PROVENANCE.json` figures and `kit.show.safety` read them).
"""

from __future__ import annotations

from typing import Any

from kit.analysis.names import GRAPH_POOL_LABEL, MODEL_STREAM_LABEL, REPLAY_STREAM_LABEL

# The names the replica's summary gave three figures before there was one summary: old name -> name.
OLD_NAMES = {
    "graph_pool_reserved": "graph_pool_bytes",
    "replay_capture_stream": "replay_stream_names",
    "replay_added_pool_bytes": "replay_added_bytes",
}


def summarize(snapshot: Any, *, segments: bool = False) -> dict:
    """One experiment's figures: the graph pool, where the replay graphs captured and what they added, the check;
    the scenario it ran (the replica keeps it under `scenario`, vLLM's recordings under `variant`), and the
    pairings and obligation a vLLM recording holds.

    With `segments`, also `replay_added_segments`: each segment the replay captures added to the graph pool, the
    request that made it and why no free block served it, and `replay_added_by_cause`, their bytes by cause
    (`kit.analysis.added_segments`; it replays the trace on the simulator, so only where asked).
    """
    from kit.analysis.added_segments import bytes_by_cause, replay_added_segments
    from kit.analysis.attribution import is_replay_capture, replay_captures_added
    from kit.load.snapshot import load_snapshot

    snap = load_snapshot(snapshot)
    meta = snap.kit
    pool, in_pool = graph_pool_rows(snap)
    streams = meta["streams"]
    replay = [c for c in meta.get("captures", []) if is_replay_capture(c["manager"])]
    model_stream = streams.get(MODEL_STREAM_LABEL)
    names = {stream: name for name, stream in streams.items()}
    replay_streams = sorted({c["stream"] for c in replay})
    added = replay_captures_added(snap, pool)
    by_stream = added.groupby("stream_label")["bytes"].sum() if len(added) else {}
    equivalence = meta.get("equivalence", [])
    scenario, vllm_run = meta.get("scenario", {}), vllm_scenario_of(meta)

    def group(stream_name: str) -> dict | None:
        rows = in_pool[in_pool["stream"] == streams.get(stream_name, -1)]
        if rows.empty:
            return None
        return {k: int(rows.iloc[0][k]) for k in ("segments", "reserved", "allocated", "free")}

    figures = {
        "scenario": scenario.get("name"),
        "vllm_scenario": vllm_run.get("name"),
        "policy": scenario.get("policy") or vllm_run.get("policy"),
        "path": vllm_run.get("path"),
        "source": snap.source_label,
        "graph_pool_bytes": int(in_pool["reserved"].sum()),
        "graph_pool_segments": int(in_pool["segments"].sum()),
        "model_group": group(MODEL_STREAM_LABEL),
        "replay_group": group(REPLAY_STREAM_LABEL),
        "model_stream": model_stream,
        "replay_streams": replay_streams,
        "replay_stream_names": sorted({names.get(c["stream"], str(c["stream"])) for c in replay}),
        "replay_on_model_stream": replay_streams == [model_stream],
        "replay_streams_from_graph_capture": all(
            s in vllm_run.get("graph_capture_streams", []) for s in replay_streams
        ),
        "replay_added_bytes": int(added["bytes"].sum()) if len(added) else 0,
        "replay_added_by_stream": {str(k): int(v) for k, v in dict(by_stream).items()},
        "replay_graphs": len(replay),
        "bit_exact": all(r.get("bit_exact", False) for r in equivalence) if equivalence else None,
        "max_abs_diff": max((r["max_abs_diff"] for r in equivalence if "max_abs_diff" in r), default=None),
        "equivalence_error": next((r["error"] for r in equivalence if "error" in r), None),
        "has_early_aux": scenario.get("has_early_aux", vllm_run.get("has_early_aux")),
        "early_aux_pinned": vllm_run.get("early_aux_pinned"),
        "aux_return": aux_return_of(meta),
        "replay_sizes": vllm_run.get("replay_sizes"),
        **safety_figures(meta),
    }
    if segments:
        figures["replay_added_segments"] = replay_added_segments(snap, pool)
        figures["replay_added_by_cause"] = bytes_by_cause(figures["replay_added_segments"])
    if scenario:
        figures.update({old: figures[new] for old, new in OLD_NAMES.items()})
    return figures


def vllm_scenario_of(meta: dict) -> dict:
    """The vLLM-path scenario a snapshot's `kit` key says it ran (`vllm_scenario`); {} for a replica's.

    Recordings made before the kit settled on one word call it `variant`; this is the one place that reads it.
    """
    found = meta.get("vllm_scenario") or meta.get("variant")
    return found if isinstance(found, dict) else {}


def aux_return_of(meta: dict) -> str | None:
    """How a recording's forward handed out its aux hidden states under capture: `"nested"` or `"flat"`.

    `"nested"` is V4.1's `(hidden_states, aux_list)`: vLLM 0.33's `weak_ref_tensors`
    (`vllm/utils/torch_utils.py`) weak-references top-level tensors only, so the
    wrapper keeps every aux block allocated. `"flat"`: each aux weak, its block
    free for later captures (a hypothetical vLLM). Read from the recorded config's
    `aux_return`; before it, a vLLM recording said `early_aux_pinned` (True: nested;
    None: no early aux, so None), and the replica's weak references recursed (flat).
    """
    scenario, vllm_run = meta.get("scenario") or {}, vllm_scenario_of(meta)
    config = scenario.get("config") or vllm_run.get("config") or {}
    if config.get("aux_return") in ("nested", "flat"):
        return config["aux_return"]
    if vllm_run:
        pinned = vllm_run.get("early_aux_pinned")
        return None if pinned is None else ("nested" if pinned else "flat")
    return "flat" if scenario else None


def safety_figures(meta: dict) -> dict:
    """The pairings and the obligation from a recording's `kit` key; every key None for a recording without them."""
    pairings = meta.get("pairings") if isinstance(meta.get("pairings"), dict) else {}
    readwrite = meta.get("readwrite") if isinstance(meta.get("readwrite"), dict) else {}
    return {
        "pairings": pairings.get("pairs"),
        "pairings_verdict": pairings.get("verdict"),
        "pairings_error": pairings.get("error"),
        "readwrite": readwrite.get("rows"),
        "readwrite_verdict": readwrite.get("summary"),
        "readwrite_verdicts": readwrite.get("verdicts"),
        "readwrite_holds": readwrite.get("holds"),
        "readwrite_error": readwrite.get("error"),
    }


def graph_pool_saved(before: Any, after: Any) -> int:
    """The global graph pool's reserved bytes in `before` minus those in `after`: what the change between them saved.

    Each is a summary (`summarize`) or a snapshot (anything `load_snapshot` takes).
    """
    return _graph_pool_bytes(before) - _graph_pool_bytes(after)


def saved_by_the_patch(summaries: dict[str, dict]) -> int | None:
    """`graph_pool_saved` from the unpatched run to the patched one, or None where either is missing."""
    if "unpatched" not in summaries or "patched" not in summaries:
        return None
    return graph_pool_saved(summaries["unpatched"], summaries["patched"])


def graph_pool_rows(snapshot: Any) -> tuple[tuple[int, int], Any]:
    """The global graph pool's id (the `kit` key names it) and its rows of the segment-by-stream table."""
    from kit.analysis.tables import segment_table
    from kit.load.snapshot import load_snapshot

    snap = load_snapshot(snapshot)
    pool = tuple(snap.kit["pools"][GRAPH_POOL_LABEL])
    table = segment_table(snap)
    return pool, table[table["pool"] == pool]


def _graph_pool_bytes(run: Any) -> int:
    if isinstance(run, dict) and "graph_pool_bytes" in run:
        return int(run["graph_pool_bytes"])
    return int(graph_pool_rows(run)[1]["reserved"].sum())

"""An alternatives recording read back and checked (`load_graphs_vs_eager`), and the text and JSON the kit prints
of it. Nothing here needs torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kit.experiments import recorded
from kit.experiments.alternatives.scenarios import (
    CAP_KEYS,
    DROP_KEY,
    KEEP_KEYS,
    MAIN_SCENARIOS,
    SAFE_IN_THE_REPLICAS_STEP,
    SCENARIO_KEYS,
    sizes_text,
    steps_with_eager_replay,
)
from kit.recordings import RECORDINGS
from kit.units import GIB, format_bytes

RECORDINGS_DIR = RECORDINGS / "alternatives"
# --- reading and showing ---------------------------------------------------------------------


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


def mib(n: int) -> str:
    """The alternatives' figures, all in MiB to one place so that they line up (`format_bytes` with a unit)."""
    return format_bytes(n, "MiB", 1)


def alternatives_lines(data: dict) -> list[str]:
    """The `python -m kit alternatives` text: source, the scenarios, the caps, the kept sets, the KV cache."""
    import pandas as pd

    config, spec = data.get("config", {}), data.get("speculator", {})
    lines = [f"source: {data.get('source', '?')}"]
    if config:
        lines.append(
            f"replica {data.get('preset', '?')}: hidden {config['hidden_size']}, {config['num_layers']} layers, "
            f"capture sizes {sizes_text(config['cudagraph_capture_sizes'])}; speculator: {spec.get('kind', '?')}, "
            f"{spec.get('draft_layers', '?')} layers, graphs of {sizes_text(spec.get('capture_sizes', []))} tokens, "
            "captured last"
        )
    scenarios = pd.DataFrame(
        [
            {
                "scenario": v,
                "graph pool": mib(data[v]["graph_pool_bytes"]),
                "saved": mib(data[v]["saved_bytes"]),
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
        return sizes_text(steps_with_eager_replay(config, cap))

    caps = pd.DataFrame(
        [
            {
                "max replay size": "none" if row["max_replay_size"] is None else row["max_replay_size"],
                "graph pool": mib(row["graph_pool_bytes"]),
                "saved": mib(_saved(data, row)),
                "eager replay sizes": sizes_text(row["eager_replay_sizes"]),
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
    return sizes_text(sizes)


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
                "graph pool": mib(row["graph_pool_bytes"]),
                "saved": mib(_saved(data, row)),
                "eager replay sizes": sizes_text(row["eager_replay_sizes"]),
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
    lines = [f"  the replay graphs' own group, every size captured: {mib(group)} (what the PR saves)"]
    for row in dropped:
        k, saved = len(row["kept_replay_sizes"]), base - row["graph_pool_bytes"]
        lines.append(
            f"  keeping {sizes_text(row['kept_replay_sizes'])} ({k} of {n} sizes) saves {mib(saved)}; in proportion to "
            f"the sizes dropped it would save {mib(group * (n - k) // n)}"
        )
    best = max(base - row["graph_pool_bytes"] for row in dropped)
    caps = [
        (row["max_replay_size"], base - row["graph_pool_bytes"])
        for row in data["cap_replay_sizes"]
        if row["max_replay_size"] is not None and row["max_replay_size"] < largest
    ]
    capped = ", ".join(f"cap {cap} saves {mib(saved)}" for cap, saved in caps)
    if best <= 0:
        verdict = (
            f"  so: dropping intermediate sizes did not shrink the graph pool (it saved at most {mib(best)}): the "
            f"replay graphs' group follows the largest captured replay size ({largest}), not the number of sizes"
        )
        if any(saved > 0 for _, saved in caps):
            verdict += f"; only capping the largest shrank it ({capped}; batches above the cap run eagerly)"
        elif caps:
            verdict += f"; no cap shrank it either ({capped})"
    else:
        verdict = (
            f"  so: dropping intermediate sizes did shrink the graph pool, by up to {mib(best)}: the replay graphs' "
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
        estimates = ", ".join(f"{v} {mib(b)}" for v, b in replica["profile_estimate_bytes"].items())
        lines.append(f"  replica estimate: {estimates}")
        for scenario, freed in replica["freed"].items():
            lines.append(
                f"  {scenario} frees {mib(freed['bytes'])} of KV budget: {freed['blocks']:,} blocks, "
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

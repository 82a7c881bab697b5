"""The alternatives' scenarios: their names, the replay sizes each captures or leaves to eager, and the replica
config they run on. Nothing here needs torch: `kit.show` and `kit.cli` read it beside the recordings."""

from __future__ import annotations

from dataclasses import replace

from kit.analysis.names import SPECULATOR_GRAPHS_LABEL
from kit.errors import KitError

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

# --- alternative (b): fewer replay capture sizes ------------------------------------------------


def sizes_text(sizes: list[int]) -> str:
    """Replay sizes as the text names them: "8, 16, 32", or "none"."""
    return ", ".join(map(str, sizes)) or "none"


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
                f"{scenario}: {sizes_text(unknown)} not among the config's replay capture sizes ({sizes_text(sizes)})"
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

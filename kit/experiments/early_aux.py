"""PR 63155's early-aux exception on vLLM 0.33's own semantics: needed or defensive, its cost, what would need it.

The PR keeps the replay graphs on a stream of their own when an aux hidden
state is made before the replay layers (`has_early_aux`): the forward returns
it, so its graph-pool block is carried across the replay break, and a replay
graph captured on the model graphs' stream might take that block. Whether one
can depends on how the block leaves the capture. vLLM 0.33's
`BreakableCUDAGraphWrapper._capture` (`vllm/compilation/breakable_cudagraph.py`)
hands its caller `weak_ref_tensors(output)`, and `weak_ref_tensors`
(`vllm/utils/torch_utils.py`) weak-references a tensor or the tensors of a
list or tuple, without recursing. DeepSeek-V4.1's backbone
(`DeepseekV4Model.forward`, `vllm/models/deepseek_v41/nvidia/model.py`)
returns `(hidden_states, aux_hidden_states)`, a list inside the tuple: the
wrapper's stored output keeps every aux tensor, and its block, allocated.

So the kit records early aux in both return shapes (`RETURN_SHAPES`) on
vLLM's path (`kit.experiments.vllm.capture`): `nested`, V4.1's, and `flat`,
hypothetical (each aux weak, as a model returning its aux flattened or a
recursing `weak_ref_tensors` would hand it out). `early_aux_verdict(summaries)` reads
from those recordings' summaries, never from a constant: per shape, the run
forced to share (graphs against eager, the read/write obligation's rows, the
pairings) and the graph pool under the PR against forced sharing; then
whether on vLLM 0.33 (the nested shape) the exception is needed or
defensive, what it costs, and under which change to vLLM it would become
necessary (the flat shape). `early_aux_lines` says it for a terminal.
"""

from __future__ import annotations

from kit.units import format_bytes

# How a forward hands its aux hidden states out of a captured graph; "nested" is what vLLM 0.33 runs.
RETURN_SHAPES = {
    "nested": "as V4.1 returns them, (hidden_states, aux_list): vLLM's wrapper keeps every aux block allocated",
    "flat": (
        "hypothetical: each aux handed out weak, as from a model returning them flattened or a weak_ref_tensors "
        "that recursed, its block free for later captures"
    ),
}
# The changes to vLLM 0.33 under which an early aux block would be handed out weak, the flat shape's case.
CHANGES = (
    "a model whose forward returns its aux hidden states flattened (each a top-level output of the graph, which "
    "BreakableCUDAGraphWrapper._capture weak-references)",
    "a weak_ref_tensors (vllm/utils/torch_utils.py) that recursed into the lists and tuples of an output",
)
DEFENSIVE, NEEDED = "defensive", "needed"


def recorded_run(summaries: dict[str, dict], policy: str, shape: str) -> tuple[str, dict] | None:
    """The recorded run with early aux under `policy` (`pr` or `share`) whose aux left in `shape`; None if none."""
    for name, s in summaries.items():
        if s.get("has_early_aux") and s.get("policy") == policy and s.get("aux_return") == shape:
            return name, s
    return None


def share_checks(s: dict) -> dict:
    """A run's safety checks: graphs against eager, the obligation's and the pairings' counts; whether shown safe.

    `shown_safe` is True when every check the recording holds passed (graphs against eager always among them),
    False when any failed, None when graphs against eager is missing.
    """
    running = [r for r in s.get("readwrite") or [] if r.get("can_run")]
    pairings = [p for p in s.get("pairings") or [] if p.get("dispatchable", True)]
    has_rows, has_pairings = s.get("readwrite") is not None, s.get("pairings") is not None
    found = {
        "bit_exact": s.get("bit_exact"),
        "max_abs_diff": s.get("max_abs_diff"),
        "obligation_pairings": len(running) if has_rows else None,
        "obligation_holds_on": sum(bool(r.get("holds")) for r in running) if has_rows else None,
        "pairings": len(pairings) if has_pairings else None,
        "pairings_bit_exact": sum(bool(p.get("bit_exact")) for p in pairings) if has_pairings else None,
    }
    passed = [found["bit_exact"]]
    if found["obligation_pairings"]:
        passed.append(found["obligation_holds_on"] == found["obligation_pairings"])
    if found["pairings"]:
        passed.append(found["pairings_bit_exact"] == found["pairings"])
    found["shown_safe"] = None if found["bit_exact"] is None else all(bool(p) for p in passed)
    return found


def shape_result(summaries: dict[str, dict], shape: str) -> dict:
    """One return shape: its forced-share run's checks and graph pool, the PR's run's graph pool, the difference.

    Where the PR's run of this shape is not recorded, the other shape's is used and `pr_shape` says so.
    """
    shared, pr = recorded_run(summaries, "share", shape), recorded_run(summaries, "pr", shape)
    pr_shape = shape
    if pr is None:
        pr_shape = next(other for other in RETURN_SHAPES if other != shape)
        pr = recorded_run(summaries, "pr", pr_shape)
        pr_shape = pr_shape if pr is not None else None
    result = {"shape": shape, "about": RETURN_SHAPES[shape], "shared": None, "pr": None, "pr_shape": pr_shape}
    if shared is not None:
        name, s = shared
        result.update(shared=name, shared_source=s.get("source"), graph_pool_shared=s["graph_pool_bytes"])
        result.update(share_checks(s))
    if pr is not None:
        name, s = pr
        result.update(pr=name, pr_source=s.get("source"), graph_pool_pr=s["graph_pool_bytes"])
    if shared is not None and pr is not None:
        result["exception_costs"] = result["graph_pool_pr"] - result["graph_pool_shared"]
    return result


def early_aux_verdict(summaries: dict[str, dict]) -> dict:
    """The early-aux verdict from vLLM-path summaries (`kit.experiments.summary.summarize` of each recording).

    `shapes`: `shape_result` per return shape. `on_vllm_0_33`: `"defensive"` when
    forced sharing with V4.1's nested return was shown safe, `"needed"` when it
    was shown unsafe, None when not recorded. `exception_costs`: the graph pool the
    exception keeps on vLLM 0.33 (PR minus forced sharing, nested shape).
    `necessary_under`: the changes to vLLM (`CHANGES`) under which the exception
    would be needed, when the flat shape was shown unsafe; empty when it was shown
    safe too; None when not recorded.
    """
    nested, flat = (shape_result(summaries, shape) for shape in RETURN_SHAPES)
    safe_nested, safe_flat = nested.get("shown_safe"), flat.get("shown_safe")
    return {
        "shapes": {"nested": nested, "flat": flat},
        "on_vllm_0_33": None if safe_nested is None else (DEFENSIVE if safe_nested else NEEDED),
        "exception_costs": nested.get("exception_costs"),
        "necessary_under": None if safe_flat is None else ([] if safe_flat else list(CHANGES)),
    }


def check_words(r: dict) -> str:
    """A shape's forced-share checks in a few words."""
    if r.get("shared") is None:
        return "not recorded"
    said = ["graphs equal eager bit for bit" if r["bit_exact"] else f"graphs DIFFER from eager (largest difference "
            f"{r['max_abs_diff']:.4g})"]  # fmt: skip
    if r.get("obligation_pairings"):
        holds, n = r["obligation_holds_on"], r["obligation_pairings"]
        said.append(f"the obligation holds on {holds} of {n} dispatchable pairings" if holds == n else
                    f"the obligation VIOLATED on {n - holds} of {n} dispatchable pairings")  # fmt: skip
    if r.get("pairings"):
        same, n = r["pairings_bit_exact"], r["pairings"]
        said.append(f"{same} of {n} pairings bit-exact")
    return ", ".join(said)


def cost_words(r: dict) -> str:
    """What the PR's exception keeps in graph pool for one shape, and from which runs."""
    if r.get("exception_costs") is None:
        return "graph pool under the PR against forced sharing: not recorded"
    other = "" if r["pr_shape"] == r["shape"] else f", aux {r['pr_shape']}: no {r['shape']} run under the PR recorded"
    return (
        f"graph pool {format_bytes(r['graph_pool_pr'])} under the PR ({r['pr']}{other}) against "
        f"{format_bytes(r['graph_pool_shared'])} forced to share: the exception costs "
        f"{format_bytes(r['exception_costs'])}"
    )


def early_aux_lines(v: dict) -> list[str]:
    """The verdict as terminal lines: per shape the forced-share checks and cost; the verdict on 0.33; what needs it."""
    lines = [
        "early aux on vLLM 0.33's own path: PR 63155 keeps the replay graphs on their own stream when an aux hidden "
        "state is made before the replay layers; forced to share, in both return shapes:"
    ]
    for shape, r in v["shapes"].items():
        lines.append(f"  {shape}, {r['about']}: {r['shared'] or 'no recording'}")
        if r.get("shared"):
            lines.append(f"    {r['shared_source']}")
        lines += [f"    forced to share: {check_words(r)}", f"    {cost_words(r)}"]
    on, nested = v["on_vllm_0_33"], v["shapes"]["nested"]
    if on is None:
        lines.append("  on vLLM 0.33: not shown (no recording forced to share with V4.1's return shape)")
    elif on == DEFENSIVE:
        cost = format_bytes(v["exception_costs"]) if v["exception_costs"] is not None else "an unrecorded amount"
        lines.append(
            f"  on vLLM 0.33 the exception is DEFENSIVE, not needed: with V4.1's nested aux list vLLM's wrapper keeps "
            f"the early aux block allocated (weak_ref_tensors weak-references top-level tensors only), so no replay "
            f"capture takes it ({nested['shared']} shown safe); it costs {cost} of graph pool"
        )
    else:
        lines.append(
            f"  on vLLM 0.33 the exception is NEEDED: forced to share with V4.1's own return shape, {nested['shared']} "
            f"is not safe ({check_words(nested)})"
        )
    need, flat = v["necessary_under"], v["shapes"]["flat"]
    if need is None:
        lines.append("  the flat case: not recorded, so no change to vLLM is shown to need the exception")
    elif need:
        lines.append(
            f"  it becomes NECESSARY under a change that hands the early aux out weak ({flat['shared']} shows it "
            f"fail): {'; or '.join(need)}"
        )
    else:
        lines.append(f"  the flat case is safe too ({flat['shared']}): no recorded change to vLLM needs the exception")
    return lines


def replica_shapes(scenarios: dict[str, dict]) -> dict[str, str]:
    """How each early-aux scenario of a replica recording (`kit safety`'s `scenarios`) handed its aux out: its
    `aux_return`, or `"flat"` where its config predates it (the replica's weak references then recursed)."""
    from kit.experiments.summary import aux_return_of

    return {
        name: aux_return_of({"scenario": {"config": about.get("config") or {}}})
        for name, about in scenarios.items()
        if about.get("has_early_aux")
    }


def replica_shape_lines(scenarios: dict[str, dict]) -> list[str]:
    """One line per early-aux scenario of a replica recording: the return shape its rows ran, and whether vLLM 0.33
    runs that shape."""
    lines = []
    for name, shape in replica_shapes(scenarios).items():
        recorded = (scenarios[name].get("config") or {}).get("aux_return") is not None
        how = "" if recorded else ", recorded when the replica's weak references recursed into nested outputs"
        on = "vLLM 0.33's own" if shape == "nested" else "hypothetical on vLLM 0.33"
        lines.append(f"replica's {name} rows: aux handed out {shape}{how} ({on})")
    return lines

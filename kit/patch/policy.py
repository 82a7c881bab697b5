"""Which stream the replay graphs capture on: PR 63155's rule, and the two policies the experiments need.

The PR hands the model graphs' capture stream to the decoder replay graphs,
unless the model makes aux hidden states before its replay layers: the
forward holds those across the eager break, in the graph pool, where a
replay graph on the same stream could overwrite them. `policy` picks:

- `pr`: the PR's rule;
- `share`: the model graphs' stream always, early aux or not (the case the
  PR's exception exists for);
- `separate`: a stream of their own always (vLLM 0.33 as released).

The patched model states decide by `replay_stream` and `has_early_aux`, in
the replica and in vLLM alike (`kit.patch.pr`).
"""

from __future__ import annotations

from typing import Any

from kit.errors import check_one_of

STREAM_POLICIES = ("pr", "share", "separate")


def check_policy(policy: str) -> str:
    """`policy`, if it is one of `STREAM_POLICIES`; KitError naming them otherwise."""
    return check_one_of(policy, STREAM_POLICIES, "stream policy")


def replay_stream(policy: str, has_early_aux: bool | None, stream: Any) -> Any:
    """The stream the replay graphs capture on under `policy`: `stream`, or None for a new one.

    `has_early_aux` None means it could not be told; the PR's rule then keeps
    a stream of their own, to be safe.
    """
    if policy == "share" or (policy == "pr" and has_early_aux is False):
        return stream
    return None


def has_early_aux(model_state: Any) -> bool | None:
    """Whether the model makes aux hidden states before its replay layers; None if it cannot tell.

    The aux layer ids (`aux_hidden_state_layers`) and `decoder_replay_start`
    live on the backbone that owns the state's `decoder_replay_layers`
    (`model_state.model.model` for vLLM's DeepSeek-V4.1, `model_state.model`
    for the replica's decoder).

    Early means `layer_id < decoder_replay_start`, strictly: vLLM's V4.1
    records aux id `idx` while it runs layer `idx` (`_run_layers` keeps the
    `previous_aux` that layer `idx`'s fused pre reads back), and the forward
    runs layers `range(start_layer, decoder_replay_start)` before the break
    and `range(decoder_replay_start, end_layer)` inside it. So id
    `decoder_replay_start - 1` is made before the break and held across it,
    while id `decoder_replay_start` (and every id up to the last layer) is
    made by the replay layers themselves, in the break, into buffers outside
    the graph pool. The replica records aux id `i` as layer `i`'s input, while
    running layer `i`, the same way.
    """
    layers = getattr(model_state, "decoder_replay_layers", None)
    candidate, seen = getattr(model_state, "model", None), set()
    while candidate is not None and id(candidate) not in seen:
        seen.add(id(candidate))
        start = getattr(candidate, "decoder_replay_start", None)
        aux = getattr(candidate, "aux_hidden_state_layers", None)
        if isinstance(start, int) and aux is not None and getattr(candidate, "decoder_replay_layers", None) is layers:
            return any(layer_id < start for layer_id in aux)
        candidate = getattr(candidate, "model", None)
    return None

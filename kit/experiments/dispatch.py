"""Which replay graph can run in which model graph's break: vLLM 0.33's dispatch rule, from its code.

Every safety experiment asks it of a pairing (model graph N, replay graph R).
The rule, and the lines of vLLM 0.33.0 it comes from:

1. A PIECEWISE model graph breaks out to a replay batch only at or above the
   trim threshold: `force_replay_batch` in `_prepare_replay_batch`
   (vllm/models/deepseek_v41/nvidia/model_state.py, lines 503-508) is
   `cudagraph_mode == PIECEWISE and layers.graph_uses_replay_batch(...)`, and
   `graph_uses_replay_batch` (vllm/models/deepseek_v41/decoder_replay_layers.py,
   lines 90-93) is `num_tokens >= trim_threshold`
   (`decoder_replay_trim_threshold`, 768 by default: vllm/config/compilation.py,
   line 571). Smaller PIECEWISE graphs (and FULL ones) keep the replay layers
   inside the graph on the whole batch: no replay graph runs in them.
2. The replay batch's rows are each request's kept rows: `kept_lens` is the
   query length for requests that keep every row (prompt logprobs, routed
   experts: `_keeps_rows_np`, set in `add_request`) and `min(query_len,
   window)` for the others (model_state.py, lines 537-539); a forced replay
   batch is made "trimmed or not" (the docstring, lines 496-499). A step
   padded to N holds T tokens with P < T <= N, P the next smaller model
   capture size (the model graph is the smallest capture size that fits), so
   it keeps r rows with min(P + 1, window) <= r <= N: a request of T_i >=
   window tokens keeps the window, and if none has that many every row is
   kept. The bottom is one request of P + 1 tokens; the top, requests that
   keep every row (`max_num_seqs` bounds only the trimmed ones, to
   max_num_seqs * window, which is why vLLM's default replay sizes stop
   there). The bound is `row_range`.
3. The DP dummy batch (an idle data-parallel rank's step: no prefill, no
   context) keeps one row (lines 540-546, `is_dummy`), but "every rank runs
   the graph that fits the largest rank's batch" (lines 570-572: the dispatch
   is of `dp_max_tokens`, the largest rank's `num_padded` from
   `_agree_across_dp`), and every DP rank pads to the same model graph N
   (`sync_cudagraph_and_dp_padding`, vllm/v1/worker/gpu/dp_utils.py). So the
   dummy runs one real row (`DP_DUMMY_ROWS`) in a replay graph another rank's
   rows reach: it adds no replay graph to N's, only a row count of 1.
4. Prefill context parallelism (PCP, `pcp_size` ranks): N is the rank's local
   padded size, at least every rank's local tokens
   (`PCPManager.get_num_tokens_for_dispatch`, `_build_batch_layout` refuses a
   smaller one: vllm/v1/worker/gpu/pcp_manager.py), but the replay rows are
   counted over the whole batch: `num_padded = pcp.global_num_tokens -
   num_dropped_tokens` (model_state.py, lines 518-535), the global count of
   kept rows, and the replay graph is `dispatch(num_padded)`; the rank's own
   kept rows are padded to it (`_kept_input_batch`). The global batch holds
   at most pcp_size * N tokens, so r reaches pcp_size * N: with pcp_size 2,
   64 untrimmed 64-token prefills give local N = 2048 and r = 4096. (On
   V4.1, a sparse-MLA model, `PCPManager.validate_config` allows CUDA graphs
   under PCP only with decode context parallelism too.)
5. The rows are padded to a replay graph by the replay manager's `dispatch`
   (model_state.py, line 572; vllm/v1/worker/gpu/cudagraph_utils.py,
   `CudaGraphManager.dispatch`, lines 523-553, over the candidates
   `_init_candidates` builds): the smallest replay capture size at least the
   row count; above the largest the rows run eagerly.

So replay graph R can run in model graph N's break iff N >= the threshold and
R = dispatch(r) for some r in `row_range(N)`: every replay size from
dispatch(min(P + 1, window)) up to dispatch(pcp_size * N), which includes
R = N when N is a replay size and R > N when it is not, and, under PCP, R up
to pcp_size * N. The default replay sizes (`kit.replica.model.default_replay_capture_sizes`,
`DecoderReplayCudaGraphManager.__init__`, decoder_replay_cudagraph.py lines
29-40) step by the window up to 16 windows, then by an eighth of the
power-of-two interval (window 96: ..., 1536, 1664, ...; window 128: ...,
2048, 2304, ...), so a model size that is not one of them dispatches a
replay graph larger than itself.

Eager steps (NONE mode) take the same path without `force_replay_batch`
(line 507): they trim, and their replay batch may run in a replay graph too.
No model graph is running then: the step's tensors are eager allocations
outside the graph pool, so a replay graph's writes can reach only graph-pool
blocks, which in an eager step hold nothing but an earlier step's graph
outputs, consumed before the next forward (the assumption every model graph
already makes of the others in the shared pool).
"""

from __future__ import annotations

from collections.abc import Iterable

TRIM_THRESHOLD_DEFAULT = 768  # vllm/config/compilation.py: decoder_replay_trim_threshold
PCP_SIZES = (1, 2, 4, 8)  # the prefill context parallel sizes the kit reports dispatchability under
DP_DUMMY_ROWS = 1  # an idle DP rank's dummy batch keeps one row (model_state.py, `is_dummy`)
RULE = (
    "dispatchable (vLLM 0.33's _prepare_replay_batch): model graph N breaks out to the replay batch iff "
    "N >= decoder_replay_trim_threshold; its replay rows, r from min(P + 1, window) (P the next smaller model "
    "graph) up to N, or pcp_size x N under prefill context parallelism (counted over the global batch), are "
    "padded to the smallest replay capture size that fits, so R can run in N's break iff R = dispatch(r) for such "
    "an r (R = N and R > N included; a DP dummy batch keeps one row but runs the largest rank's graph); the other "
    "pairings are stress only"
)


def pcp_key(pcp_size: int) -> str:
    """The key of `pcp_size` in `dispatchable_under`: 'pcp1', 'pcp2', ..."""
    return f"pcp{pcp_size}"


def dispatch_replay_size(num_rows: int, replay_sizes: Iterable[int]) -> int | None:
    """The replay graph vLLM's dispatch runs `num_rows` rows in: the smallest size that fits; None (eager) above all."""
    return min((s for s in replay_sizes if s >= num_rows), default=None)


def breaks_out(model_size: int, trim_threshold: int) -> bool:
    """Whether a PIECEWISE model graph of `model_size` tokens runs its replay layers in a break."""
    return model_size >= trim_threshold


def row_range(
    model_size: int, *, window: int | None = None, model_sizes: Iterable[int] = (), pcp_size: int = 1
) -> tuple[int, int]:
    """The fewest and most replay rows (vLLM's `num_padded` before dispatch) of a step padded to `model_size`.

    The fewest: min(P + 1, window), P the largest model size below `model_size`
    (no window: 1); the most: `pcp_size * model_size`. The DP dummy batch keeps
    `DP_DUMMY_ROWS` but runs another rank's replay graph, so it is not in this range.
    """
    if pcp_size < 1:
        raise ValueError(f"pcp_size must be at least 1, not {pcp_size}")
    smallest_step = max((s for s in model_sizes if s < model_size), default=0) + 1
    fewest = smallest_step if window is None else min(smallest_step, window)
    return fewest, pcp_size * model_size


def dp_replay_size(rank_rows: Iterable[int | None], replay_sizes: Iterable[int]) -> int | None:
    """The replay graph every data-parallel rank runs: the one the largest rank's rows dispatch to.

    `rank_rows` holds each rank's replay rows (`num_padded`), None for an idle rank, whose
    dummy batch keeps `DP_DUMMY_ROWS` (vLLM's `_agree_across_dp`, then the dispatch of `dp_max_tokens`).
    """
    rows = [DP_DUMMY_ROWS if r is None else r for r in rank_rows]
    return dispatch_replay_size(max(rows), replay_sizes)


def dispatchable_replay_sizes(
    model_size: int,
    replay_sizes: Iterable[int],
    trim_threshold: int = 0,
    *,
    window: int | None = None,
    model_sizes: Iterable[int] = (),
    pcp_size: int = 1,
) -> set[int]:
    """The replay graphs a step padded to `model_size` tokens can run in its break (empty below the threshold).

    Under data parallelism the same: a DP dummy batch runs the graph of the largest rank's rows, which are in
    `row_range` of the same N.
    """
    replay_sizes = sorted(replay_sizes)
    if not breaks_out(model_size, trim_threshold) or not replay_sizes:
        return set()
    fewest, most = row_range(model_size, window=window, model_sizes=model_sizes, pcp_size=pcp_size)
    smallest = dispatch_replay_size(fewest, replay_sizes)
    if smallest is None:
        return set()  # even the fewest rows run eagerly
    largest = dispatch_replay_size(most, replay_sizes)
    return {s for s in replay_sizes if s >= smallest and (largest is None or s <= largest)}


def rows_for(
    model_size: int,
    replay_size: int,
    replay_sizes: Iterable[int],
    *,
    window: int | None = None,
    model_sizes: Iterable[int] = (),
    pcp_size: int = 1,
) -> int | None:
    """A replay row count a step of `model_size` tokens can make that dispatches to `replay_size`, or None.

    Under PCP it may exceed `model_size`: the rows are counted over the global batch.
    """
    replay_sizes = sorted(replay_sizes)
    fewest, most = row_range(model_size, window=window, model_sizes=model_sizes, pcp_size=pcp_size)
    rows = min(replay_size, most)
    return rows if rows >= fewest and dispatch_replay_size(rows, replay_sizes) == replay_size else None


def config_rule(config) -> tuple[list[int], int]:
    """A replica config's replay sizes and trim threshold, as the rule takes them."""
    return sorted(config.decoder_replay_cudagraph_capture_sizes), config.decoder_replay_trim_threshold


def config_bounds(config) -> dict:
    """A replica config's row bounds, as `row_range` and the functions after it take them."""
    return {"window": config.window, "model_sizes": tuple(config.cudagraph_capture_sizes)}


def config_dispatchable(config, model_size: int, pcp_size: int = 1) -> set[int]:
    """The replay graphs vLLM can run in `model_size`'s break for a replica config, at `pcp_size`."""
    replay_sizes, threshold = config_rule(config)
    return dispatchable_replay_sizes(model_size, replay_sizes, threshold, pcp_size=pcp_size, **config_bounds(config))


def config_rows_for(config, model_size: int, replay_size: int, pcp_size: int = 1) -> int | None:
    """`rows_for` for a replica config."""
    replay_sizes, _ = config_rule(config)
    return rows_for(model_size, replay_size, replay_sizes, pcp_size=pcp_size, **config_bounds(config))


def can_run(config, pcp_size: int = 1):
    """`can_run(model_size, replay_size)` for a replica config, at `pcp_size`."""

    def check(model_size: int, replay_size: int) -> bool:
        return replay_size in config_dispatchable(config, model_size, pcp_size)

    return check


def dispatchable_under(config, model_size: int, replay_size: int, pcp_sizes=PCP_SIZES) -> dict[str, bool]:
    """Whether vLLM can run the pairing under the config's rule, per PCP size: {'pcp1': ..., 'pcp2': ...}."""
    return {pcp_key(k): replay_size in config_dispatchable(config, model_size, k) for k in pcp_sizes}


def smallest_pcp(config, model_size: int, replay_size: int, pcp_sizes=PCP_SIZES) -> int | None:
    """The smallest PCP size under which vLLM can run the pairing, None if none of `pcp_sizes` can."""
    return next((k for k in pcp_sizes if replay_size in config_dispatchable(config, model_size, k)), None)


def default_step_replay_graph(config):
    """`replay_graph(num_tokens)`: the replay graph the replica's default step runs (its `replay_rows` padded to
    the config's replay sizes), None where the model graph keeps its replay layers or the rows run eagerly."""
    from kit.replica.model import replay_rows

    replay_sizes, threshold = config_rule(config)

    def replay_graph(num_tokens: int) -> int | None:
        if not breaks_out(num_tokens, threshold):
            return None
        return dispatch_replay_size(replay_rows(num_tokens), replay_sizes)

    return replay_graph

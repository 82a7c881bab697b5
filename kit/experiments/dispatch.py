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
   query length for requests that keep every row (decodes, prompt logprobs)
   and `min(query_len, window)` for the others (model_state.py, lines
   537-539); a forced replay batch is made "trimmed or not" (the docstring,
   lines 496-499). So a step padded to N tokens holds from 1 up to N rows.
3. The rows are padded to a replay graph by the replay manager's `dispatch`
   (model_state.py, line 572; vllm/v1/worker/gpu/cudagraph_utils.py,
   `CudaGraphManager.dispatch`, lines 523-553, over the candidates
   `_init_candidates` builds): the smallest replay capture size at least the
   row count; above the largest the rows run eagerly.

So replay graph R can run in model graph N's break iff N >= the threshold and
R = dispatch(r) for some r in 1..N: every replay size up to dispatch(N), which
includes R = N when N is a replay size and R > N when it is not. The default
replay sizes (`kit.replica.model.default_replay_capture_sizes`,
`DecoderReplayCudaGraphManager.__init__`, decoder_replay_cudagraph.py lines
29-40) step by the window, so a model size that is not a multiple of it
dispatches a replay graph larger than itself.

Eager steps (NONE mode) take the same path without `force_replay_batch`
(line 507): they trim, and their replay batch may run in a replay graph too.
No model graph is running then: the step's tensors are eager allocations
outside the graph pool, so a replay graph's writes can reach only graph-pool
blocks, which in an eager step hold nothing but an earlier step's graph
outputs, consumed before the next forward (the assumption every model graph
already makes of the others in the shared pool).
"""

from __future__ import annotations

TRIM_THRESHOLD_DEFAULT = 768  # vllm/config/compilation.py: decoder_replay_trim_threshold
RULE = (
    "dispatchable (vLLM 0.33's _prepare_replay_batch): model graph N breaks out to the replay batch iff "
    "N >= decoder_replay_trim_threshold; its 1..N replay rows are padded to the smallest replay capture size "
    "that fits, so R can run in N's break iff R = dispatch(r) for some r in 1..N (R = N and R > N included); "
    "the other pairings are stress only"
)


def dispatch_replay_size(num_rows: int, replay_sizes: list[int]) -> int | None:
    """The replay graph vLLM's dispatch runs `num_rows` rows in: the smallest size that fits; None (eager) above all."""
    return min((s for s in replay_sizes if s >= num_rows), default=None)


def breaks_out(model_size: int, trim_threshold: int) -> bool:
    """Whether a PIECEWISE model graph of `model_size` tokens runs its replay layers in a break."""
    return model_size >= trim_threshold


def dispatchable_replay_sizes(model_size: int, replay_sizes: list[int], trim_threshold: int = 0) -> set[int]:
    """The replay graphs a step padded to `model_size` tokens can run in its break (empty below the threshold)."""
    if not breaks_out(model_size, trim_threshold) or not replay_sizes:
        return set()
    largest = dispatch_replay_size(model_size, replay_sizes)
    return {s for s in replay_sizes if largest is None or s <= largest}


def rows_for(model_size: int, replay_size: int, replay_sizes: list[int]) -> int | None:
    """A replay row count a step of `model_size` tokens can hold that dispatches to `replay_size`, or None."""
    rows = min(replay_size, model_size)
    return rows if dispatch_replay_size(rows, replay_sizes) == replay_size else None


def config_rule(config) -> tuple[list[int], int]:
    """A replica config's replay sizes and trim threshold, as the rule takes them."""
    return sorted(config.decoder_replay_cudagraph_capture_sizes), config.decoder_replay_trim_threshold


def can_run(config):
    """`can_run(model_size, replay_size)` for a replica config."""
    replay_sizes, threshold = config_rule(config)

    def check(model_size: int, replay_size: int) -> bool:
        return replay_size in dispatchable_replay_sizes(model_size, replay_sizes, threshold)

    return check


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

"""Decoder replay layers: the layers from the replay start, run on a step's replay rows.

vLLM's `vllm/models/deepseek_v41/decoder_replay_layers.py` in miniature: the
layers from the replay start run on a subset of the batch's rows (vLLM: each
request's last `window` rows; here: the rows the model state picks). Inside
a PIECEWISE model graph they run in an eager break: the break's inputs (the
hidden states and the hyper-connection state, as V4.1 passes them) are
merged into the layers' one input (`merge_inputs`) and gathered by row, the
layers run (eagerly, or as a replay graph, `decoder_replay_cudagraph.py`),
and the per-row outputs are scattered into fixed buffers (`_break_outputs`)
that the model graph's next segment reads. Those buffers are allocated in the
break, outside any capture, so outside the graph pool. V4.1 gathers its seven
inputs into seven static buffers and merges them inside the replay graph;
merging first keeps the replica's replay graphs at one static input, while
the model graph's break still reads every input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kit.replica.breakable_cudagraph import eager_break_during_capture
from kit.replica.forward_context import (
    ForwardContext,
    get_forward_context,
    in_piecewise_cudagraph,
    override_forward_context,
)


@dataclass
class ReplayBatch:
    """One forward's replay rows; `run_graph` is set when they run in a replay graph."""

    rows: torch.Tensor
    forward_context: ForwardContext
    run_graph: Callable[..., tuple[torch.Tensor, ...]] | None = None
    # Eagerly, the rows padded with zero rows to this many (vLLM pads so under context parallelism).
    num_padded: int | None = None


class DecoderReplayLayers:
    """Runs the replay layers (`run_layers`) on the step's replay batch, on the input `merge_inputs` makes."""

    def __init__(
        self, run_layers: Callable[..., tuple[torch.Tensor, ...]], merge_inputs: Callable[..., torch.Tensor]
    ) -> None:
        self.run_layers = run_layers
        self.merge_inputs = merge_inputs
        self.replay_batch: ReplayBatch | None = None  # set by the model state every step
        # Set by the model state: PIECEWISE model graphs of this many tokens or more break out to the replay batch.
        self.trim_threshold: int | None = None
        self._break_outputs: list[torch.Tensor] | None = None

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if in_piecewise_cudagraph() and self.graph_uses_replay_batch(get_forward_context().num_tokens):
            return self._run_in_graph_break(*inputs)
        return self._run(*inputs)

    def graph_uses_replay_batch(self, num_tokens: int) -> bool:
        """Whether a PIECEWISE graph of `num_tokens` breaks out to the replay batch (smaller ones keep the layers)."""
        return self.trim_threshold is not None and num_tokens >= self.trim_threshold

    @eager_break_during_capture
    def _run_in_graph_break(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A graph break: the outputs land in fixed buffers the next segment reads."""
        outputs = self._run(*inputs)
        if self._break_outputs is None:
            # Sized by the first call: the largest model graph is captured first.
            self._break_outputs = [torch.empty_like(out) for out in outputs]
        return tuple(buf[: out.shape[0]].copy_(out) for buf, out in zip(self._break_outputs, outputs, strict=True))

    def _run(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden_states = self.merge_inputs(*inputs)
        replay_batch = self.replay_batch
        if replay_batch is None:
            return self.run_layers(hidden_states)
        rows = replay_batch.rows
        with override_forward_context(replay_batch.forward_context):
            if replay_batch.run_graph is not None:
                row_outputs = replay_batch.run_graph(rows, (hidden_states,))
            else:
                row_inputs = hidden_states.index_select(0, rows)
                if replay_batch.num_padded is not None:
                    padding = replay_batch.num_padded - rows.numel()
                    row_inputs = torch.cat((row_inputs, row_inputs.new_zeros((padding, *row_inputs.shape[1:]))))
                row_outputs = self.run_layers(row_inputs)
        # The other rows' outputs stay zero; nothing reads them.
        num_tokens = hidden_states.shape[0]
        return tuple(
            out.new_zeros((num_tokens, *out.shape[1:])).index_copy_(0, rows, out[: rows.numel()]) for out in row_outputs
        )

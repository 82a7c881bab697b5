"""Decoder replay layers and their CUDA graphs.

From vLLM's `decoder_replay_layers.py` and `decoder_replay_cudagraph.py`: the
layers from the replay start run on a subset of the batch's rows (vLLM: each
request's last `window` rows). Inside a PIECEWISE model graph they run in an
eager break: the inputs are gathered by row, the layers run (eagerly, or as a
replay graph), and the per-row outputs are scattered into fixed buffers
(`_break_outputs`) that the model graph's next segment reads. Those buffers
are allocated in the break, outside any capture, so outside the graph pool.

`DecoderReplayCudaGraphManager` captures the replay layers after the model
graphs, into the same global pool, reading static `input_buffers`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from kit.replica.breakable_cudagraph import BreakableCUDAGraphWrapper, eager_break_during_capture
from kit.replica.cudagraph_utils import CudaGraphManager
from kit.replica.forward_context import (
    CUDAGraphMode,
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


class DecoderReplayLayers:
    """Runs layers `start_layer..` on the step's replay batch."""

    def __init__(
        self, run_layers: Callable[..., tuple[torch.Tensor, ...]], start_layer: int, aux_layer_ids: Sequence[int]
    ) -> None:
        self.run_layers = run_layers
        self.start_layer = start_layer
        self.aux_layer_ids = tuple(aux_layer_ids)
        self.replay_batch: ReplayBatch | None = None  # set by the model state every step
        self._break_outputs: list[torch.Tensor] | None = None

    def has_early_aux(self) -> bool:
        """Whether an aux hidden state is produced before the replay layers (PR 63155).

        The forward holds such a state, a graph-pool tensor, across the break,
        so the replay graphs must not share the model graphs' stream then.
        """
        return any(i < self.start_layer for i in self.aux_layer_ids)

    def __call__(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if in_piecewise_cudagraph():
            return self._run_in_graph_break(hidden_states)
        return self._run(hidden_states)

    @eager_break_during_capture
    def _run_in_graph_break(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A graph break: the outputs land in fixed buffers the next segment reads."""
        outputs = self._run(hidden_states)
        if self._break_outputs is None:
            # Sized by the first call: the largest model graph is captured first.
            self._break_outputs = [torch.empty_like(out) for out in outputs]
        return tuple(buf[: out.shape[0]].copy_(out) for buf, out in zip(self._break_outputs, outputs, strict=True))

    def _run(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        replay_batch = self.replay_batch
        if replay_batch is None:
            return self.run_layers(hidden_states)
        rows = replay_batch.rows
        with override_forward_context(replay_batch.forward_context):
            if replay_batch.run_graph is not None:
                row_outputs = replay_batch.run_graph(rows, (hidden_states,))
            else:
                row_outputs = self.run_layers(hidden_states.index_select(0, rows))
        # The other rows' outputs stay zero; nothing reads them.
        num_tokens = hidden_states.shape[0]
        return tuple(
            out.new_zeros((num_tokens, *out.shape[1:])).index_copy_(0, rows, out[: rows.numel()]) for out in row_outputs
        )


class DecoderReplayCudaGraphManager(CudaGraphManager):
    """PIECEWISE graphs of the replay layers, keyed by replay-batch size; static inputs."""

    def __init__(
        self, device: torch.device, layers: DecoderReplayLayers, capture_sizes: list[int], hidden_size: int, dtype
    ) -> None:
        super().__init__(device, capture_sizes, "replay graphs")
        self.layers = layers
        self.breakable_cg_runner = BreakableCUDAGraphWrapper(layers.run_layers, self.pool)
        n = max(capture_sizes)
        self.input_buffers = [torch.zeros(n, hidden_size, dtype=dtype, device=device)]

    def capture_replay_graphs(self, prepare: Callable[[int], None]) -> None:
        """Capture each size on the replay batch `prepare` sets on the layers."""
        self.capture(self._create_forward_fn(prepare))
        self.layers.replay_batch = None

    def _create_forward_fn(self, prepare: Callable[[int], None]):
        def create_forward_fn(num_tokens: int, warmup: bool):
            prepare(num_tokens)
            context = self.layers.replay_batch.forward_context
            inputs = [buf[:num_tokens] for buf in self.input_buffers]

            def forward_fn(cg_mode: CUDAGraphMode) -> None:
                with override_forward_context(replace(context, cudagraph_runtime_mode=cg_mode)):
                    self.breakable_cg_runner(*inputs)

            return forward_fn

        return create_forward_fn

    def run(self, rows: torch.Tensor, inputs: tuple) -> tuple[torch.Tensor, ...]:
        """Gather `rows` of `inputs` into the static buffers, then replay the graph."""
        num_rows = rows.shape[0]
        for buf, t in zip(self.input_buffers, inputs, strict=True):
            torch.index_select(t, 0, rows, out=buf[:num_rows])
        num_tokens = get_forward_context().num_tokens
        outputs = self.breakable_cg_runner(*(buf[:num_tokens] for buf in self.input_buffers))
        return tuple(out[:num_rows] for out in outputs)

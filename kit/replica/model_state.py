"""`DeepseekV41ModelState`: owns the replay graphs and sets each step's replay batch.

vLLM's `vllm/models/deepseek_v41/nvidia/model_state.py` in miniature. The
state holds the model's `decoder_replay_layers` and, on CUDA, their graph
manager; `prepare_replay_batch` sets a step's replay batch as vLLM's
`_prepare_replay_batch` does: none for a PIECEWISE model graph below the trim
threshold (the layers stay inside the graph), else the step's replay rows
(the last half of its tokens by default, standing in for each request's last
`window` rows; vLLM makes any count from min(P + 1, window) to the step's
tokens, `kit.experiments.dispatch.row_range`), padded to the smallest replay
graph that fits them (`dispatch`), eager above the largest.

Under prefill context parallelism vLLM counts the replay rows over the global
batch (`num_padded = pcp.global_num_tokens - num_dropped_tokens`), up to
pcp_size times the step's local tokens, dispatches that count, and pads the
rank's own kept rows to it (`_kept_input_batch`). The replica stands in for
that when asked for more rows than the step has: `num_rows` above the
step's tokens is the global count, the step's own rows are all its tokens,
and the replay graph (or, eagerly, the zero padding) is sized by `num_rows`.
`capture_inner_cudagraphs()` captures the replay graphs after the model
graphs, on a stream of their own in vLLM 0.33; PR 63155 hands them the model
graphs' stream, unless aux hidden states are made before the replay layers
(`kit.patch.replica`).
"""

from __future__ import annotations

import torch

from kit.errors import KitError
from kit.replica.decoder_replay_cudagraph import DecoderReplayCudaGraphManager
from kit.replica.decoder_replay_layers import ReplayBatch
from kit.replica.forward_context import CUDAGraphMode, ForwardContext
from kit.replica.model import Decoder, replay_rows


class DeepseekV41ModelState:
    """Owns the replay graphs and sets each step's replay batch."""

    def __init__(self, model: Decoder, device: torch.device) -> None:
        config = model.config
        self.model = model
        self.decoder_replay_layers = model.decoder_replay_layers
        self.replay_cudagraphs: DecoderReplayCudaGraphManager | None = None
        if device.type == "cuda":
            self.replay_cudagraphs = DecoderReplayCudaGraphManager(
                device,
                self.decoder_replay_layers,
                config.decoder_replay_cudagraph_capture_sizes,
                config.hidden_size,
                config.torch_dtype,
            )
        self.decoder_replay_layers.trim_threshold = config.decoder_replay_trim_threshold
        # Persistent, like vLLM's replay batch metadata: allocated before any capture.
        max_rows = max(config.cudagraph_capture_sizes + tuple(config.decoder_replay_cudagraph_capture_sizes))
        self._replay_rows = torch.zeros(max_rows, dtype=torch.int64, device=device)

    def prepare_replay_batch(
        self, num_tokens: int, use_replay_graphs: bool, *, piecewise: bool = False, num_rows: int | None = None
    ) -> None:
        """Set the step's replay batch: its last `num_rows` rows (default `replay_rows`), or none.

        A PIECEWISE model graph (`piecewise`) below the trim threshold keeps the
        whole batch. Otherwise the rows run in the replay graph vLLM's dispatch
        pads them to, when `use_replay_graphs` and one fits, else eagerly.
        `num_rows` above `num_tokens` is a PCP step's global row count: the
        step's every row, padded to the graph `num_rows` dispatches to.
        """
        layers = self.decoder_replay_layers
        layers.replay_batch = None
        if piecewise and not layers.graph_uses_replay_batch(num_tokens):
            return
        num_rows = replay_rows(num_tokens) if num_rows is None else num_rows
        if num_rows < 1:
            raise KitError(f"a replay batch holds at least one row, not {num_rows}")
        local_rows = min(num_rows, num_tokens)  # under PCP the rank's own rows; the rest is the other ranks'
        rows = self._replay_rows[:local_rows]
        torch.arange(num_tokens - local_rows, num_tokens, out=rows)
        graphs = self.replay_cudagraphs
        size = graphs.dispatch(num_rows) if graphs is not None else None
        if use_replay_graphs and size is not None:
            layers.replay_batch = ReplayBatch(rows, ForwardContext(size, CUDAGraphMode.PIECEWISE), graphs.run)
        else:
            # Eagerly the rows are padded to the replay graph's size, so an eager forward multiplies matrices of
            # the graph's shapes: a GEMM's rounding depends on its shape, not on the other rows' values. Above the
            # largest graph a PCP step still pads its own rows to the global count (vLLM's `num_padded`).
            padded = size if size is not None else (num_rows if num_rows > local_rows else None)
            layers.replay_batch = ReplayBatch(rows, ForwardContext(num_rows, CUDAGraphMode.NONE), num_padded=padded)

    def capture_inner_cudagraphs(self) -> None:
        """Capture the replay graphs, after the model graphs, on the replay batch `prepare` sets."""

        def prepare(num_rows: int) -> None:
            # Capture reuses the runtime path on a dummy batch whose every row is replayed.
            self.prepare_replay_batch(num_rows, use_replay_graphs=False, num_rows=num_rows)

        if self.replay_cudagraphs is not None:
            self.replay_cudagraphs.capture_replay_graphs(prepare)

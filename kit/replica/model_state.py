"""`DeepseekV41ModelState`: owns the replay graphs and sets each step's replay batch.

vLLM's `vllm/models/deepseek_v41/nvidia/model_state.py` in miniature. The
state holds the model's `decoder_replay_layers` and, on CUDA, their graph
manager; `prepare_replay_batch` picks a step's replay rows (the last half of
its tokens) and says whether they run in a replay graph.
`capture_inner_cudagraphs()` captures the replay graphs after the model
graphs, on a stream of their own in vLLM 0.33; PR 63155 hands them the model
graphs' stream, unless aux hidden states are made before the replay layers
(`kit.patch.replica`).
"""

from __future__ import annotations

import torch

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
        # Persistent, like vLLM's replay batch metadata: allocated before any capture.
        self._replay_rows = torch.zeros(max(config.cudagraph_capture_sizes), dtype=torch.int64, device=device)

    def prepare_replay_batch(self, num_tokens: int, use_replay_graphs: bool) -> None:
        """Pick the step's replay rows: the last half of its tokens."""
        num_rows = replay_rows(num_tokens)
        rows = self._replay_rows[:num_rows]
        torch.arange(num_tokens - num_rows, num_tokens, out=rows)
        graphs = self.replay_cudagraphs
        run_graph = graphs.run if use_replay_graphs and graphs is not None and graphs.graphs_captured else None
        mode = CUDAGraphMode.PIECEWISE if run_graph is not None else CUDAGraphMode.NONE
        self.decoder_replay_layers.replay_batch = ReplayBatch(rows, ForwardContext(num_rows, mode), run_graph)

    def capture_inner_cudagraphs(self) -> None:
        """Capture the replay graphs, after the model graphs, on the replay batch `prepare` sets."""

        def prepare(num_rows: int) -> None:
            # Capture reuses the runtime path on a dummy batch of twice the rows.
            self.prepare_replay_batch(2 * num_rows, use_replay_graphs=False)

        if self.replay_cudagraphs is not None:
            self.replay_cudagraphs.capture_replay_graphs(prepare)

"""CUDA graphs of the decoder replay layers on a step's replay batch.

vLLM's `vllm/models/deepseek_v41/nvidia/decoder_replay_cudagraph.py` in
miniature: `DecoderReplayCudaGraphManager` captures the replay layers after
the model graphs, into the same global pool, reading static `input_buffers`.
vLLM 0.33 captures them on a new stream, as every manager's `capture()` does;
PR 63155 hands them the model graphs' stream (`kit.patch.replica`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from kit.replica.breakable_cudagraph import BreakableCUDAGraphWrapper
from kit.replica.cudagraph_utils import CudaGraphManager
from kit.replica.decoder_replay_layers import DecoderReplayLayers
from kit.replica.forward_context import CUDAGraphMode, get_forward_context, override_forward_context


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

        def create_forward_fn(num_tokens: int, warmup: bool):
            prepare(num_tokens)
            context = self.layers.replay_batch.forward_context
            inputs = [buf[:num_tokens] for buf in self.input_buffers]

            def forward_fn(cg_mode: CUDAGraphMode) -> None:
                with override_forward_context(replace(context, cudagraph_runtime_mode=cg_mode)):
                    self.breakable_cg_runner(*inputs)

            return forward_fn

        self.capture(create_forward_fn, "Capturing decoder replay CUDA graphs")
        self.layers.replay_batch = None

    def run(self, rows: torch.Tensor, inputs: tuple) -> tuple[torch.Tensor, ...]:
        """Gather `rows` of `inputs` into the static buffers, then replay the graph."""
        num_rows = rows.shape[0]
        for buf, t in zip(self.input_buffers, inputs, strict=True):
            torch.index_select(t, 0, rows, out=buf[:num_rows])
        num_tokens = get_forward_context().num_tokens
        outputs = self.breakable_cg_runner(*(buf[:num_tokens] for buf in self.input_buffers))
        return tuple(out[:num_rows] for out in outputs)

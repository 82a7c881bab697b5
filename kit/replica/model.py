"""The decoder and its model state: real layers, aux hidden states, replay rows.

`Decoder` is N pre-norm MLP layers (RMSNorm, up projection, SiLU, down
projection, residual) over an embedding. Layers from `decoder_replay_start`
on are `DecoderReplayLayers`: in a PIECEWISE graph they run in an eager break
on the replay rows, which the model state picks for each step (here: the
last half of the batch, standing in for each request's last `window` rows).
Aux hidden states (the input of each layer in `aux_hidden_state_layers`) are
returned with the output, as for an EAGLE-style speculator. Under tensor
parallelism (`parallel_state.init_distributed_environment`) each layer's FFN
is split over the ranks and its output all-reduced, inside the graphs.

`DeepseekV41ModelState` owns the replay graphs and sets the replay batch, as
vLLM's `vllm/models/deepseek_v41/nvidia/model_state.py` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from kit.errors import KitError
from kit.replica.decoder_replay import DecoderReplayCudaGraphManager, DecoderReplayLayers, ReplayBatch
from kit.replica.forward_context import CUDAGraphMode, ForwardContext
from kit.replica.parallel_state import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)


@dataclass(frozen=True)
class ReplicaConfig:
    hidden_size: int = 1024
    num_layers: int = 6
    decoder_replay_start: int = 3
    aux_hidden_state_layers: tuple[int, ...] = (4,)
    cudagraph_capture_sizes: tuple[int, ...] = (128, 256, 512)
    vocab_size: int = 4096
    dtype: str = "bfloat16"
    seed: int = 0
    intermediate_size: int = field(default=0)  # 0: four times the hidden size

    def __post_init__(self) -> None:
        if not 0 < self.decoder_replay_start < self.num_layers:
            raise KitError(f"decoder_replay_start must be in 1..{self.num_layers - 1}, not {self.decoder_replay_start}")
        if any(not 0 <= i < self.num_layers for i in self.aux_hidden_state_layers):
            raise KitError(f"aux_hidden_state_layers must be layer ids below {self.num_layers}")
        if not self.cudagraph_capture_sizes or any(s < 2 or s % 2 for s in self.cudagraph_capture_sizes):
            raise KitError("cudagraph_capture_sizes must be even sizes of at least 2")
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise KitError(f"dtype must be bfloat16, float16 or float32, not {self.dtype!r}")

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def decoder_replay_cudagraph_capture_sizes(self) -> list[int]:
        """One replay graph per model graph: half its rows."""
        return sorted({replay_rows(n) for n in self.cudagraph_capture_sizes})


PRESETS = {
    "small": ReplicaConfig(),
    # DeepSeek-V3's hidden size, standing in for V4.1's; capture sizes up to 8192 tokens.
    "large": ReplicaConfig(
        hidden_size=7168,
        num_layers=8,
        decoder_replay_start=4,
        aux_hidden_state_layers=(6,),
        cudagraph_capture_sizes=(512, 1024, 2048, 4096, 8192),
        vocab_size=16384,
    ),
}


def replay_rows(num_tokens: int) -> int:
    return num_tokens // 2


class DecoderLayer(nn.Module):
    def __init__(self, config: ReplicaConfig) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(config.hidden_size, eps=1e-6)
        self.up_proj = nn.Linear(config.hidden_size, config.ffn_size, bias=False)
        self.down_proj = nn.Linear(config.ffn_size, config.hidden_size, bias=False)
        tp_size = get_tensor_model_parallel_world_size()
        if tp_size > 1:
            # Column-parallel up projection, row-parallel down projection: each rank keeps
            # its slice of the full layer's weights, and the down projection's partial
            # sums are all-reduced.
            if config.ffn_size % tp_size:
                raise KitError(f"the FFN size {config.ffn_size} does not split over {tp_size} ranks")
            rank, shard = get_tensor_model_parallel_rank(), config.ffn_size // tp_size
            rows = slice(rank * shard, (rank + 1) * shard)
            self.up_proj.weight = nn.Parameter(self.up_proj.weight[rows].clone())
            self.down_proj.weight = nn.Parameter(self.down_proj.weight[:, rows].clone())

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        partial = self.down_proj(F.silu(self.up_proj(self.norm(hidden_states))))
        return hidden_states + tensor_model_parallel_all_reduce(partial)


class Decoder(nn.Module):
    def __init__(self, config: ReplicaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=1e-6)
        self.aux_hidden_state_layers = config.aux_hidden_state_layers
        self.replay_layers = DecoderReplayLayers(
            self.run_replay_layers, config.decoder_replay_start, config.aux_hidden_state_layers
        )

    def run_replay_layers(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Layers from the replay start: the output, then their aux hidden states."""
        start = self.config.decoder_replay_start
        hidden_states, aux = self._run_layers(hidden_states, range(start, self.config.num_layers))
        return (hidden_states, *aux)

    def _run_layers(self, hidden_states: torch.Tensor, layer_ids: range) -> tuple[torch.Tensor, list[torch.Tensor]]:
        aux = []
        for i in layer_ids:
            if i in self.aux_hidden_state_layers:
                aux.append(hidden_states)
            hidden_states = self.layers[i](hidden_states)
        return hidden_states, aux

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        hidden_states = self.embed_tokens(input_ids)
        # Early aux states stay referenced across the replay layers' break.
        hidden_states, early_aux = self._run_layers(hidden_states, range(self.config.decoder_replay_start))
        hidden_states, *replay_aux = self.replay_layers(hidden_states)
        return self.norm(hidden_states), (*early_aux, *replay_aux)


class DeepseekV41ModelState:
    """Owns the replay graphs and sets each step's replay batch."""

    def __init__(self, model: Decoder, device: torch.device) -> None:
        config = model.config
        self.model = model
        self.replay_layers = model.replay_layers
        self.replay_cudagraphs: DecoderReplayCudaGraphManager | None = None
        if device.type == "cuda":
            self.replay_cudagraphs = DecoderReplayCudaGraphManager(
                device,
                model.replay_layers,
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
        self.replay_layers.replay_batch = ReplayBatch(rows, ForwardContext(num_rows, mode), run_graph)

    def _prepare_capture(self, num_rows: int) -> None:
        # Capture reuses the runtime path on a dummy batch of twice the rows.
        self.prepare_replay_batch(2 * num_rows, use_replay_graphs=False)

    def capture_inner_cudagraphs(self) -> None:
        """Capture the replay graphs, after the model graphs (vLLM 0.33: own stream)."""
        if self.replay_cudagraphs is not None:
            self.replay_cudagraphs.capture_replay_graphs(self._prepare_capture)

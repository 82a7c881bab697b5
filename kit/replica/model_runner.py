"""`GPUModelRunner`: capture the model graphs, then the replay graphs; run them.

`capture_model()` follows vLLM's V2 runner (`vllm/v1/worker/gpu/model_runner.py`):
the model graphs through the `CudaGraphManager`, then
`model_state.capture_inner_cudagraphs()` for the replay graphs. `run()` copies
the input ids into the static buffer and replays the graphs and breaks in
order, or, with `use_cudagraph=False`, runs the same weights eagerly.
"""

from __future__ import annotations

import torch

from kit.errors import KitError
from kit.replica.breakable_cudagraph import BreakableCUDAGraphWrapper
from kit.replica.cudagraph_utils import CudaGraphManager
from kit.replica.forward_context import CUDAGraphMode, set_forward_context
from kit.replica.model import Decoder, ReplicaConfig
from kit.replica.model_state import DeepseekV41ModelState


class GPUModelRunner:
    def __init__(self, config: ReplicaConfig, device: str | torch.device = "cuda") -> None:
        self.config = config
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise KitError("the replica's graphs need CUDA; build it with device='cpu' to run it eagerly")
        torch.manual_seed(config.seed)
        self.model = Decoder(config).to(self.device, config.torch_dtype).eval()
        self.model_state = DeepseekV41ModelState(self.model, self.device)
        self.cudagraph_manager = CudaGraphManager(self.device, list(config.cudagraph_capture_sizes), "model graphs")
        self.model_runnable = BreakableCUDAGraphWrapper(self.model, self.cudagraph_manager.pool)
        self.input_ids = torch.zeros(max(config.cudagraph_capture_sizes), dtype=torch.int64, device=self.device)

    @torch.inference_mode()
    def capture_model(self) -> None:
        if self.device.type != "cuda":
            raise KitError("capture_model() needs CUDA")
        self.cudagraph_manager.capture(self._create_forward_fn)
        self.model_state.capture_inner_cudagraphs()

    def _create_forward_fn(self, num_tokens: int, warmup: bool):
        self.model_state.prepare_replay_batch(num_tokens, use_replay_graphs=False)
        input_ids = self.input_ids[:num_tokens]

        def forward_fn(cg_mode: CUDAGraphMode) -> None:
            with set_forward_context(num_tokens, cg_mode):
                self.model_runnable(input_ids)

        return forward_fn

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, use_cudagraph: bool = True) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The final hidden states and the aux hidden states, copied out of the graphs' memory."""
        num_tokens = input_ids.shape[0]
        if num_tokens not in self.config.cudagraph_capture_sizes:
            raise KitError(f"{num_tokens} tokens: run a capture size, one of {self.config.cudagraph_capture_sizes}")
        if use_cudagraph and not self.cudagraph_manager.graphs_captured:
            raise KitError("no graphs captured yet: call capture_model() first, or run with use_cudagraph=False")
        self.input_ids[:num_tokens].copy_(input_ids)
        self.model_state.prepare_replay_batch(num_tokens, use_replay_graphs=use_cudagraph)
        mode = CUDAGraphMode.PIECEWISE if use_cudagraph else CUDAGraphMode.NONE
        with set_forward_context(num_tokens, mode):
            hidden_states, aux = self.model_runnable(self.input_ids[:num_tokens])
        return hidden_states.clone(), tuple(a.clone() for a in aux)

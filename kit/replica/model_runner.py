"""`GPUModelRunner`: capture the model graphs, then the replay graphs, then the speculator's; run them.

`capture_model()` follows vLLM's V2 runner (`vllm/v1/worker/gpu/model_runner.py`):
the model graphs through the `CudaGraphManager`, then
`model_state.capture_inner_cudagraphs()` for the replay graphs, then, with
`ReplicaConfig.speculator`, `speculator.capture()` for the drafter's graphs
(`speculator.py`), last. `run()` copies the input ids into the static buffer
and replays the graphs and breaks in order, or, with `use_cudagraph=False`,
runs the same weights eagerly; `execute_model()` is the same forward with its
outputs left where the graphs wrote them, and `propose()` runs the speculator
on them, as vLLM's runner does after the target forward.

`profile_cudagraph_memory()` is vLLM's estimate of the memory the captures
take, made before the KV cache is sized (`vllm/v1/worker/gpu/cudagraph_utils.py`):
every graph captured once into a throwaway pool by
`capture_model(profile_only=True)`, which returns the drop in the device's
free memory (`torch.cuda.mem_get_info`, vLLM's
`torch.accelerator.get_memory_info`), and the graphs discarded. vLLM takes
that estimate off the KV cache's budget.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from kit.errors import KitError
from kit.replica import cudagraph_utils
from kit.replica.breakable_cudagraph import BreakableCUDAGraphWrapper
from kit.replica.cudagraph_utils import CudaGraphManager
from kit.replica.forward_context import CUDAGraphMode, set_forward_context
from kit.replica.model import Decoder, ReplicaConfig, split_output
from kit.replica.model_state import DeepseekV41ModelState
from kit.replica.speculator import DSparkSpeculator


@dataclass
class StepOutput:
    """One step: the target's outputs as the sampler read them, the draft, and what the drafter did to the former."""

    hidden_states: torch.Tensor
    aux_hidden_states: tuple[torch.Tensor, ...]
    draft_hidden_states: torch.Tensor
    draft_graph_size: int | None  # the drafter graph replayed, None when it ran eagerly
    target_outputs_overwritten: bool  # the target's outputs, read again after the drafter, had changed


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
        self.speculator = DSparkSpeculator(self.model, self.device) if config.speculator else None

    @torch.inference_mode()
    def capture_model(self, *, profile_only: bool = False) -> int:
        """Capture every graph; with `profile_only`, the drop in free device memory it caused (else 0).

        vLLM measures the drop on every capture (for its log line); the replica only when
        profiling, so that stand-ins for CUDA need no memory figures.
        """
        if self.device.type != "cuda":
            raise KitError("capture_model() needs CUDA")
        start_free_gpu_memory = free_device_memory(self.device) if profile_only else 0
        self.cudagraph_manager.capture(self._create_forward_fn)
        self.model_state.capture_inner_cudagraphs()
        if self.speculator is not None:
            self.speculator.capture()
        # The capture streams may still be running the last warm-ups, which write persistent buffers (the
        # replay rows) that the first forward, on this stream, writes and reads too. Unordered, the H200 ran
        # a gather on a later capture's rows at the large preset (a device-side assert).
        torch.cuda.synchronize(self.device)
        return start_free_gpu_memory - free_device_memory(self.device, empty_cache=False) if profile_only else 0

    def profile_cudagraph_memory(self) -> int:
        return profile_cudagraph_memory(self)

    def _create_forward_fn(self, num_tokens: int, warmup: bool):
        self.model_state.prepare_replay_batch(num_tokens, use_replay_graphs=False, piecewise=True)
        input_ids = self.input_ids[:num_tokens]

        def forward_fn(cg_mode: CUDAGraphMode) -> None:
            with set_forward_context(num_tokens, cg_mode):
                self.model_runnable(input_ids)

        return forward_fn

    @torch.inference_mode()
    def execute_model(
        self, input_ids: torch.Tensor, use_cudagraph: bool = True, num_replay_rows: int | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The final and aux hidden states where the forward left them.

        After a graph run they view graph-pool blocks (the capture's weak references): valid
        until a later graph writes there.
        """
        num_tokens = input_ids.shape[0]
        if num_tokens not in self.config.cudagraph_capture_sizes:
            raise KitError(f"{num_tokens} tokens: run a capture size, one of {self.config.cudagraph_capture_sizes}")
        if use_cudagraph and not self.cudagraph_manager.graphs_captured:
            raise KitError("no graphs captured yet: call capture_model() first, or run with use_cudagraph=False")
        self.input_ids[:num_tokens].copy_(input_ids)
        # The replay batch a PIECEWISE graph of this size takes, also eagerly: the eager forward is the graphs'
        # reference, so a graph below the trim threshold keeps its whole batch in both.
        self.model_state.prepare_replay_batch(
            num_tokens, use_replay_graphs=use_cudagraph, piecewise=True, num_rows=num_replay_rows
        )
        mode = CUDAGraphMode.PIECEWISE if use_cudagraph else CUDAGraphMode.NONE
        with set_forward_context(num_tokens, mode):
            output = self.model_runnable(self.input_ids[:num_tokens])
        return split_output(output, self.config.aux_return)

    @torch.inference_mode()
    def run(
        self, input_ids: torch.Tensor, use_cudagraph: bool = True, num_replay_rows: int | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The final hidden states and the aux hidden states, copied out of the graphs' memory.

        `num_replay_rows` sets how many of the step's last rows form its replay batch (default
        `replay_rows`); vLLM's steps make any count in `kit.experiments.dispatch.row_range`. More
        than the step's tokens stands for a PCP step's global count: every row of the step, padded
        to the replay graph that count dispatches to (`model_state.prepare_replay_batch`), so
        replay graph dispatch(r) runs for r up to pcp_size x N.
        """
        hidden_states, aux = self.execute_model(input_ids, use_cudagraph, num_replay_rows)
        return hidden_states.clone(), tuple(a.clone() for a in aux)

    @torch.inference_mode()
    def propose(
        self, hidden_states: torch.Tensor, aux_hidden_states: tuple[torch.Tensor, ...], use_cudagraph: bool = True
    ) -> torch.Tensor:
        """The speculator's draft for the last forward, read from its outputs as `execute_model` left them; a copy."""
        if self.speculator is None:
            raise KitError("this runner has no speculator: build it with ReplicaConfig(speculator=True)")
        num_tokens = hidden_states.shape[0]
        ids = self.input_ids[:num_tokens]
        return self.speculator.propose(ids, hidden_states, aux_hidden_states, use_cudagraph).clone()

    @torch.inference_mode()
    def step(self, input_ids: torch.Tensor, use_cudagraph: bool = True) -> StepOutput:
        """A decode step as vLLM orders it: the forward, the sampler's read of its outputs, then the drafter."""
        hidden_states, aux = self.execute_model(input_ids, use_cudagraph)
        sampled = hidden_states.clone(), tuple(a.clone() for a in aux)
        graph_size = self.speculator.dispatch(input_ids.shape[0], use_cudagraph) if self.speculator else None
        draft = self.propose(hidden_states, aux, use_cudagraph)
        after = (hidden_states, *aux)
        overwritten = not all(torch.equal(a, b) for a, b in zip(after, (sampled[0], *sampled[1]), strict=True))
        return StepOutput(sampled[0], sampled[1], draft, graph_size, overwritten)

    def graph_managers(self) -> list[CudaGraphManager]:
        """The runner's graph managers in capture order: model graphs, replay graphs, the speculator's."""
        replay = self.model_state.replay_cudagraphs
        drafter = self.speculator.query_cudagraph_manager if self.speculator is not None else None
        return [m for m in (self.cudagraph_manager, replay, drafter) if m is not None]

    def graph_wrappers(self) -> list[BreakableCUDAGraphWrapper]:
        """The breakable wrappers that hold the PIECEWISE graphs: the model's and the replay layers'."""
        replay = self.model_state.replay_cudagraphs
        return [self.model_runnable] + ([replay.breakable_cg_runner] if replay is not None else [])


def free_device_memory(device: torch.device, empty_cache: bool = True) -> int:
    """The device's free memory in bytes (cudaMemGetInfo), after returning the allocator's cached blocks if asked."""
    if empty_cache:
        torch.cuda.empty_cache()
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.mem_get_info(index)[0]


@torch.inference_mode()
def profile_cudagraph_memory(runner: GPUModelRunner) -> int:
    """vLLM's estimate of the memory the graph captures take: one capture into a throwaway pool, then discarded.

    Every manager and breakable wrapper is pointed at a throwaway graph pool (vLLM points the
    global pool singleton at it and swaps the wrappers' pools), `capture_model(profile_only=True)`
    measures the drop in free device memory, and the graphs are dropped again so that the real
    capture starts clean, into the real global pool. The drop counts every segment the
    allocator reserved and kept: graph-pool segments, used or free, and default-pool blocks left
    cached on the capture streams. Buffers a first forward allocates for good (the replay
    layers' break outputs) stay allocated, so a later real capture does not allocate them again.
    """
    if runner.device.type != "cuda":
        raise KitError("profile_cudagraph_memory() needs CUDA")
    gc.collect()
    torch.cuda.empty_cache()
    saved_global_pool = cudagraph_utils._global_graph_pool
    throwaway_pool = torch.cuda.graph_pool_handle()
    cudagraph_utils._global_graph_pool = throwaway_pool
    managers, wrappers = runner.graph_managers(), runner.graph_wrappers()
    saved_pools = [m.pool for m in managers], [w.graph_pool for w in wrappers]
    try:
        for manager in managers:
            manager.pool = throwaway_pool
        for wrapper in wrappers:
            wrapper.graph_pool = throwaway_pool
        return int(runner.capture_model(profile_only=True))
    finally:
        discard_graphs(runner)
        for manager, pool in zip(managers, saved_pools[0], strict=True):
            manager.pool = pool
        for wrapper, pool in zip(wrappers, saved_pools[1], strict=True):
            wrapper.graph_pool = pool
        cudagraph_utils._global_graph_pool = saved_global_pool
        gc.collect()
        torch.cuda.empty_cache()


def discard_graphs(runner: GPUModelRunner) -> None:
    """Drop every graph the runner captured (and their weak-referenced outputs), so capture_model() can run again."""
    for wrapper in runner.graph_wrappers():
        wrapper.captures.clear()
        wrapper.outputs.clear()
    for manager in runner.graph_managers():
        clear = getattr(manager, "clear", None)
        if clear is not None:
            clear()
        manager.graphs_captured = False

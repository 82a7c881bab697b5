"""The speculator: a DSpark drafter on the target's aux hidden states, its FULL graphs captured last.

vLLM 0.33 gives DeepSeek-V4.1 a DSpark speculator (`vllm/v1/worker/gpu/spec_decode/dspark/speculator.py`,
a `DFlashSpeculator`), in miniature here with vLLM's names:

- `DSparkDraftModel`: `combine_hidden_states` (DSpark's `main_proj` over the target's aux hidden
  states, concatenated), the target's embedding of the query ids, `NUM_DRAFT_LAYERS` decoder
  layers and a norm;
- `DFlashCudaGraphManager(CudaGraphManager)`: FULL graphs (vLLM's `FULL_DECODE_ONLY`, no PIECEWISE
  for DFlash), one per size of `speculator_capture_sizes` (the runner's capture sizes rounded up to
  whole requests of `num_query_per_req` tokens, as vLLM's `_init_candidates` does for a uniform
  decode routine), each over the speculator's static buffers, captured with
  `torch.cuda.graph(graph, pool, stream=current_stream())` into the global graph pool. Its
  `capture()` ends in the base `CudaGraphManager.capture`, which enters `graph_capture()`: a
  stream of its own, in vLLM 0.33 and under PR 63155 alike (the PR leaves it there);
- `DSparkSpeculator`: the static buffers (allocated at init, outside any graph pool), `capture()`
  (the runner calls it last, after the model and replay graphs), and `propose()` after the
  target forward.

What the drafter reads from the target, as vLLM's: `propose` gets the forward's final and aux
hidden states as the forward left them. After a PIECEWISE model graph those are the capture's
weak references, blocks of the graph pool. `stage_target_outputs` copies them eagerly into the
speculator's own buffers (the first rows of the aux hidden states into `_aux_staging` for a FULL
replay, vLLM's `_prepare_graph_replay`; otherwise combined into `hidden_states`, vLLM's
`_store_hidden_states`; the final hidden states only where there are no aux layers); only then
does the drafter's graph replay, and the graph reads nothing but those buffers. The ids are
copied from the runner's persistent input buffer.

The phases, for an analysis of what is read and written where:

- target forward: `GPUModelRunner.execute_model` (its outputs stay in the graph pool);
- the reads of the target's outputs: `DSparkSpeculator.stage_target_outputs`, eager, before any
  drafter graph runs;
- the drafter's graph: `DFlashCudaGraphManager.run_fullgraph` (its writes land in the graph pool);
- the speculator capture: `DSparkSpeculator.capture`, called last by `GPUModelRunner.capture_model`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from kit.errors import KitError
from kit.replica.cudagraph_utils import CudaGraphManager
from kit.replica.forward_context import CUDAGraphMode
from kit.replica.model import Decoder, DecoderLayer, ReplicaConfig

NUM_SPECULATIVE_STEPS = 4  # num_speculative_tokens; DSpark drafts from the anchor: 4 query tokens a request
MAX_NUM_REQS = 128  # vLLM's default max_num_seqs (SchedulerConfig.DEFAULT_MAX_NUM_SEQS)
NUM_DRAFT_LAYERS = 2


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def speculator_capture_sizes(
    capture_sizes: tuple[int, ...] | list[int], decode_query_len: int, max_num_reqs: int = MAX_NUM_REQS
) -> list[int]:
    """The drafter's graph sizes, largest first, as vLLM's `_init_candidates` derives a uniform decode routine's.

    Each runner capture size is rounded up to whole requests of `decode_query_len` tokens and
    left out above `max_num_reqs` requests or the largest capture size.
    """
    if decode_query_len < 1:
        raise KitError(f"decode_query_len must be at least 1, not {decode_query_len}")
    max_cg_capture_size = max(capture_sizes)
    max_decode_tokens = max_num_reqs * decode_query_len
    sizes: list[int] = []
    for num_tokens in sorted(capture_sizes, reverse=True):
        rounded = round_up(num_tokens, decode_query_len)
        if rounded > max_decode_tokens or rounded > max_cg_capture_size or rounded // decode_query_len > max_num_reqs:
            continue
        if rounded not in sizes:
            sizes.append(rounded)
    return sizes


class DSparkDraftModel(nn.Module):
    """The drafter: aux hidden states combined to the hidden size, plus the query ids' embedding, through its layers."""

    def __init__(self, config: ReplicaConfig, embed_tokens: nn.Embedding, num_aux: int) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens  # the target's (shared, as DSpark's and MTP's)
        self.main_proj = nn.Linear(max(num_aux, 1) * config.hidden_size, config.hidden_size, bias=False)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(NUM_DRAFT_LAYERS))
        self.norm = nn.RMSNorm(config.hidden_size, eps=1e-6)

    def combine_hidden_states(self, aux_hidden_states: torch.Tensor) -> torch.Tensor:
        """The concatenated aux hidden states, `(tokens, num_aux * hidden)`, to the hidden size."""
        return self.main_proj(aux_hidden_states)

    def forward(self, input_ids: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states + self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class DFlashCudaGraphManager(CudaGraphManager):
    """FULL graphs of the drafter's step, one per size, over the speculator's static buffers."""

    def __init__(self, device: torch.device, capture_sizes: list[int], decode_query_len: int) -> None:
        super().__init__(device, capture_sizes, "DFlash speculator graphs")
        self.decode_query_len = decode_query_len
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def capture(
        self,
        forward_fn: Callable[[int], None],
        prepare_forward: Callable[[int], None],
        progress_bar_desc: str = "Capturing CUDA graphs",
    ) -> None:
        """Capture every size; `prepare_forward(num_tokens)` is captured ahead of `forward_fn(num_tokens)`, as vLLM's.

        The replica's base manager warms each size up in mode NONE, then calls the forward once
        more to capture it; for these FULL graphs that call captures the whole step here, with
        `torch.cuda.graph` on the current (the `graph_capture()`) stream, as vLLM's base manager
        does for a FULL descriptor.
        """

        def create_forward_fn(num_tokens: int, warmup: bool) -> Callable[[CUDAGraphMode], None]:
            def step() -> None:
                prepare_forward(num_tokens)
                forward_fn(num_tokens)

            def forward(cg_mode: CUDAGraphMode) -> None:
                if cg_mode == CUDAGraphMode.NONE:
                    step()
                else:
                    self._capture_full(num_tokens, step)

            return forward

        super().capture(create_forward_fn, progress_bar_desc)

    def _capture_full(self, num_tokens: int, step: Callable[[], None]) -> None:
        if num_tokens in self.graphs:
            raise KitError(f"a drafter graph of {num_tokens} tokens was captured already")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, self.pool, stream=torch.cuda.current_stream()):
            step()
        self.graphs[num_tokens] = graph

    def dispatch(self, num_tokens: int) -> int | None:
        """The graph a step of `num_tokens` query tokens replays: the smallest that fits; None (eager) above all."""
        if not self.graphs_captured:
            return None
        return min((size for size in self.graphs if size >= num_tokens), default=None)

    def run_fullgraph(self, num_tokens: int) -> None:
        """Replay the FULL graph of `num_tokens` tokens (its inputs staged already)."""
        self.graphs[num_tokens].replay()

    def clear(self) -> None:
        """Drop every graph (after a profiling capture), so they are captured again."""
        self.graphs.clear()
        self.graphs_captured = False


class DSparkSpeculator:
    """Drafts from the target's aux hidden states after its forward; FULL graphs of the draft step on CUDA."""

    def __init__(self, target: Decoder, device: torch.device) -> None:
        config = target.config
        self.config = config
        self.device = device
        self.num_speculative_steps = NUM_SPECULATIVE_STEPS
        self.num_query_per_req = self.num_speculative_steps  # DSpark: the anchor is the first query
        self.aux_layers = tuple(sorted(set(config.aux_hidden_state_layers)))
        self.model = DSparkDraftModel(config, target.embed_tokens, len(self.aux_layers))
        self.model.to(device, config.torch_dtype).eval()
        # Static buffers, allocated before any capture: the graphs read and write only these.
        n, hidden, dtype = max(config.cudagraph_capture_sizes), config.hidden_size, config.torch_dtype
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.hidden_states = torch.zeros(n, hidden, dtype=dtype, device=device)
        self.draft_hidden_states = torch.zeros(n, hidden, dtype=dtype, device=device)
        self._aux_staging = (
            torch.zeros(n, len(self.aux_layers) * hidden, dtype=dtype, device=device) if self.aux_layers else None
        )
        self.capture_sizes = speculator_capture_sizes(config.cudagraph_capture_sizes, self.num_query_per_req)
        self.query_cudagraph_manager: DFlashCudaGraphManager | None = None
        if device.type == "cuda" and self.capture_sizes:
            self.query_cudagraph_manager = DFlashCudaGraphManager(device, self.capture_sizes, self.num_query_per_req)

    def capture(self) -> None:
        """Capture the drafter's FULL graphs (last, after the model and replay graphs, as vLLM's runner does)."""
        manager = self.query_cudagraph_manager
        if manager is None:
            raise KitError("the speculator's graphs need CUDA and at least one drafter capture size")
        manager.capture(self._generate_draft, self._prepare_graph_forward, "Capturing dspark CUDA graphs")

    def _prepare_graph_forward(self, num_tokens: int) -> None:
        """The FULL graph's context step: combine the staged aux hidden states (static buffers only)."""
        if self._aux_staging is not None:
            combined = self.model.combine_hidden_states(self._aux_staging[:num_tokens])
            self.hidden_states[:num_tokens].copy_(combined)

    def _generate_draft(self, num_tokens: int) -> None:
        """The draft step: the drafter over the query tokens, into `draft_hidden_states`."""
        out = self.model(self.input_ids[:num_tokens], self.hidden_states[:num_tokens])
        self.draft_hidden_states[:num_tokens].copy_(out)

    def stage_target_outputs(
        self,
        input_ids: torch.Tensor,
        last_hidden_states: torch.Tensor,
        aux_hidden_states: tuple[torch.Tensor, ...],
        num_graph_tokens: int = 0,
    ) -> None:
        """Copy what the drafter reads of the target's outputs into its own buffers: eager, before any drafter graph.

        A FULL replay of `num_graph_tokens` combines its first rows itself, from `_aux_staging`;
        the rows past them (all rows, eagerly) are combined here into `hidden_states`.
        """
        num_tokens = input_ids.shape[0]
        self.input_ids[:num_tokens].copy_(input_ids)
        start = 0
        if num_graph_tokens and self._aux_staging is not None:
            start = min(num_tokens, num_graph_tokens)
            torch.cat([h[:start] for h in aux_hidden_states], dim=-1, out=self._aux_staging[:start])
        if start == num_tokens:
            return
        if self.aux_layers:
            rows = torch.cat([h[start:num_tokens] for h in aux_hidden_states], dim=-1)
            hidden_states = self.model.combine_hidden_states(rows)
        else:
            hidden_states = last_hidden_states[start:num_tokens]
        self.hidden_states[start:num_tokens].copy_(hidden_states)

    def dispatch(self, num_tokens: int, use_cudagraph: bool = True) -> int | None:
        """The drafter graph a step of `num_tokens` replays, or None to run eagerly."""
        manager = self.query_cudagraph_manager
        return manager.dispatch(num_tokens) if use_cudagraph and manager is not None else None

    def propose(
        self,
        input_ids: torch.Tensor,
        last_hidden_states: torch.Tensor,
        aux_hidden_states: tuple[torch.Tensor, ...],
        use_cudagraph: bool = True,
    ) -> torch.Tensor:
        """The draft for the target's last forward: its outputs staged, then the drafter's graph (or eager).

        Returns a view of `draft_hidden_states`, rewritten by the next `propose`.
        """
        num_tokens = input_ids.shape[0]
        if len(aux_hidden_states) != len(self.aux_layers):
            raise KitError(f"{len(aux_hidden_states)} aux hidden states for {len(self.aux_layers)} aux layers")
        size = self.dispatch(num_tokens, use_cudagraph)
        if size is not None:
            # Rows past num_tokens keep stale inputs; nothing reads their outputs.
            self.stage_target_outputs(input_ids, last_hidden_states, aux_hidden_states, num_graph_tokens=size)
            self.query_cudagraph_manager.run_fullgraph(size)
        else:
            self.stage_target_outputs(input_ids, last_hidden_states, aux_hidden_states)
            self._generate_draft(num_tokens)
        return self.draft_hidden_states[:num_tokens]

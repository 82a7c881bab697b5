"""The decoder: real layers, aux hidden states, replay layers; its config and presets.

`Decoder` is N pre-norm MLP layers (RMSNorm, up projection, SiLU, down projection, residual) over an
embedding. Layers from `decoder_replay_start` on are its `decoder_replay_layers`: in a PIECEWISE graph of at
least `decoder_replay_trim_threshold` tokens they run in an eager break on the replay rows, which the model
state (`model_state.py`) picks for each step (by default the last half of the batch, `replay_rows`, standing
in for each request's last `window` rows) and pads to a replay graph of vLLM's default sizes
(`default_replay_capture_sizes`). With `attention_breaks` each layer's attention is an eager break of its
own (`Attention`), as in V4.1. Aux hidden states (the input of each layer in `aux_hidden_state_layers`) are
returned with the output, as for an EAGLE-style speculator: aux id `i` is recorded while layer `i` runs, so
ids below `decoder_replay_start` are made before the break and held across it (as vLLM's V4.1 records aux id
`idx` while running layer `idx`). The forward returns them as V4.1 does, `(hidden_states, aux_list)`, so the
breakable wrapper's top-level weak references leave every aux block allocated; with `aux_return="flat"`
(hypothetical) each aux is a top-level output instead, weak, its block free for later captures once the
capture ends. Like V4.1's forward, the decoder hands the break several tensors, the hidden states and its
hyper-connection state (`residual`, `post_mix`, `res_mix`), and keeps the latter bound across the break
without reading them after it (with `hyper_connections`, which the safety experiments set). The decoder
carries `decoder_replay_layers`, `decoder_replay_start` and `aux_hidden_state_layers` as vLLM's
DeepSeek-V4.1 backbone does, which is where `kit.patch.policy.has_early_aux` reads them. Under tensor
parallelism (`parallel_state.init_distributed_environment`) each layer's FFN is split over the ranks and its
output all-reduced, inside the graphs.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kit.errors import KitError
from kit.replica.breakable_cudagraph import eager_break_during_capture
from kit.replica.decoder_replay_layers import DecoderReplayLayers
from kit.replica.forward_context import in_piecewise_cudagraph
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
    # vLLM's replay sizing and dispatch (decoder_replay_cudagraph.py, model_state.py): the replay window (V4.1's
    # sliding window), max_num_seqs, the trim threshold from which a PIECEWISE graph breaks out; "half": N/2 rows per N.
    window: int = 96
    max_num_seqs: int = 128
    decoder_replay_trim_threshold: int = 128
    replay_sizing: str = "vllm"
    vocab_size: int = 4096
    dtype: str = "bfloat16"
    seed: int = 0
    intermediate_size: int = field(default=0)  # 0: four times the hidden size
    # V4.1's hyper-connection state handed to the break beside the hidden states (the safety experiments set it).
    hyper_connections: bool = False
    speculator: bool = False  # a DSpark drafter reading the aux hidden states, its graphs captured last (speculator.py)
    # V4.1 breaks its PIECEWISE graphs at every attention: each layer ends in an eager break (model and replay graphs).
    attention_breaks: bool = False
    planted_cross_break_read: bool = False  # PLANTED, a bug on purpose: see `planted_kept_block`
    aux_return: str = "nested"  # AUX_RETURNS: V4.1's (hidden_states, aux_list), or the hypothetical "flat" one

    def __post_init__(self) -> None:
        if not 0 < self.decoder_replay_start < self.num_layers:
            raise KitError(f"decoder_replay_start must be in 1..{self.num_layers - 1}, not {self.decoder_replay_start}")
        if any(not 0 <= i < self.num_layers for i in self.aux_hidden_state_layers):
            raise KitError(f"aux_hidden_state_layers must be layer ids below {self.num_layers}")
        sizes, half = self.cudagraph_capture_sizes, self.replay_sizing == "half"  # "half": N/2 rows, N even
        if not sizes or any(s < 1 or half and (s < 2 or s % 2) for s in sizes):
            raise KitError("cudagraph_capture_sizes must be sizes of at least 1 (even, 2 or more, under sizing 'half')")
        if self.dtype not in ("bfloat16", "float16", "float32"):
            raise KitError(f"dtype must be bfloat16, float16 or float32, not {self.dtype!r}")
        if self.aux_return not in ("nested", "flat"):  # AUX_RETURNS, at the end of this module
            raise KitError(f"aux_return must be one of nested, flat, not {self.aux_return!r}")
        if self.replay_sizing not in ("vllm", "half"):
            raise KitError(f"replay_sizing must be 'vllm' or 'half', not {self.replay_sizing!r}")
        if self.decoder_replay_trim_threshold <= self.window:
            # vLLM's DeepseekV41ModelState refuses the same: smaller graphs have nothing to trim.
            raise KitError(f"decoder_replay_trim_threshold must exceed the replay window of {self.window} tokens")

    @property
    def ffn_size(self) -> int:
        return self.intermediate_size or 4 * self.hidden_size

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def decoder_replay_cudagraph_capture_sizes(self) -> list[int]:
        """vLLM's default replay sizes (`default_replay_capture_sizes`), or with `replay_sizing="half"` N/2 per N."""
        if self.replay_sizing == "half":
            return sorted({replay_rows(n) for n in self.cudagraph_capture_sizes})
        return default_replay_capture_sizes(max(self.cudagraph_capture_sizes), self.max_num_seqs, self.window)


def default_replay_capture_sizes(max_capture_size: int, max_num_seqs: int, window: int) -> list[int]:
    """vLLM 0.33's replay sizes when `decoder_replay_cudagraph_capture_sizes` is empty.

    As `DecoderReplayCudaGraphManager.__init__` (vllm/models/deepseek_v41/nvidia/decoder_replay_cudagraph.py)
    makes them: multiples of `window` up to min(max_cudagraph_capture_size, max_num_seqs * window), stepping
    by 1/8 of the power-of-two interval once that is wider than the window.
    """
    bound = min(max_capture_size, max_num_seqs * window)
    sizes, s = [bound], window
    while s < bound:
        sizes.append(s)
        s += max(window, 1 << max(s.bit_length() - 4, 0))
    return sorted(set(sizes))


_LARGE = ReplicaConfig(
    hidden_size=7168,
    num_layers=8,
    decoder_replay_start=4,
    aux_hidden_state_layers=(6,),
    cudagraph_capture_sizes=(512, 1024, 2048, 4096, 8192),
    window=128,  # V4.1's sliding window
    decoder_replay_trim_threshold=768,  # vLLM's default: model graph 512 keeps the replay layers inside it
    vocab_size=16384,
)
PRESETS = {
    # Replay sizes 96, 192, ..., 480, 512: model graphs 128 and 256 can dispatch a replay graph larger than
    # themselves (R > N), 512 one of its own size (R = N).
    "small": ReplicaConfig(),
    # DeepSeek-V3's hidden size, standing in for V4.1's; capture sizes up to 8192 tokens.
    "large": _LARGE,
    # The kit's earlier sizing: one replay graph of N/2 rows per model graph N.
    "small_half": ReplicaConfig(replay_sizing="half"),
    "large_half": dataclasses.replace(_LARGE, replay_sizing="half"),
}


def replay_rows(num_tokens: int) -> int:
    """The replay rows of the replica's default step of `num_tokens` tokens: the last half (requests' windows)."""
    return max(1, num_tokens // 2)


class Attention(nn.Module):
    """Where V4.1's attention sits for the graphs: an eager break, its output in a fixed buffer.

    In a PIECEWISE graph the attention kernels run in an eager break and write a
    buffer that lives outside the graph pool, which the next segment reads. The
    stand-in's arithmetic is row-wise (each row scaled by its mean's sigmoid);
    what matters is the break: it reads the segment's output and writes a fixed
    buffer, in model graphs and replay graphs alike.
    """

    def __init__(self, max_tokens: int) -> None:
        super().__init__()
        self.max_tokens = max_tokens
        self._break_output: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if in_piecewise_cudagraph():
            return self._run_in_graph_break(hidden_states)
        return self._run(hidden_states)

    @eager_break_during_capture
    def _run_in_graph_break(self, hidden_states: torch.Tensor) -> torch.Tensor:
        out = self._run(hidden_states)
        if self._break_output is None:
            # Allocated at the first break, outside any capture: outside the graph pool, for every size.
            self._break_output = out.new_empty((self.max_tokens, *out.shape[1:]))
        return self._break_output[: out.shape[0]].copy_(out)

    @staticmethod
    def _run(hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states * torch.sigmoid(hidden_states.float().mean(-1, keepdim=True)).to(hidden_states.dtype)


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
        max_tokens = max(config.cudagraph_capture_sizes + tuple(config.decoder_replay_cudagraph_capture_sizes))
        self.attention = Attention(max_tokens) if config.attention_breaks else None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.attention is not None:
            hidden_states = hidden_states + self.attention(self.norm(hidden_states))
        partial = self.down_proj(F.silu(self.up_proj(self.norm(hidden_states))))
        return hidden_states + tensor_model_parallel_all_reduce(partial)


class Decoder(nn.Module):
    def __init__(self, config: ReplicaConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=1e-6)
        if config.hyper_connections:
            # The hyper-connection state handed to the replay layers (after the weights above, so theirs are unchanged).
            self.residual_norm = nn.RMSNorm(config.hidden_size, eps=1e-6)
            self.post_mix_proj = nn.Linear(config.hidden_size, 1, bias=False)
            self.res_mix_proj = nn.Linear(config.hidden_size, 1, bias=False)
        self.aux_hidden_state_layers = config.aux_hidden_state_layers
        self.decoder_replay_start = config.decoder_replay_start
        self.decoder_replay_layers = DecoderReplayLayers(self._run_replay_layers, self._merge_replay_inputs)

    def _run_replay_layers(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Layers from the replay start: the output, then their aux hidden states."""
        layer_ids = range(self.decoder_replay_start, self.config.num_layers)
        hidden_states, aux = self._run_layers(hidden_states, layer_ids)
        return (hidden_states, *aux)

    def _run_layers(self, hidden_states: torch.Tensor, layer_ids: range) -> tuple[torch.Tensor, list[torch.Tensor]]:
        aux = []
        for i in layer_ids:
            if i in self.aux_hidden_state_layers:
                aux.append(hidden_states)
            hidden_states = self.layers[i](hidden_states)
        return hidden_states, aux

    def _hyper_connection_state(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`residual, post_mix, res_mix`: what V4.1 hands its replay layers beside the hidden states.

        V4.1 carries `hc_mult` copies of the stream and per-token mixing weights;
        the replica carries one normalized copy and two per-token mixes, each a
        tensor of its own, so each is a graph-pool block of its own in a capture.
        """
        residual = self.residual_norm(hidden_states)
        post_mix = torch.sigmoid(self.post_mix_proj(hidden_states))
        res_mix = torch.sigmoid(self.res_mix_proj(hidden_states))
        return residual, post_mix, res_mix

    @staticmethod
    def _merge_replay_inputs(hidden_states: torch.Tensor, *state: torch.Tensor) -> torch.Tensor:
        """The replay layers' input from the break's (V4.1 merges them in the first replay layer's pre)."""
        if not state:
            return hidden_states
        residual, post_mix, res_mix = state
        return hidden_states * post_mix + residual * res_mix

    def _planted_keep(self, num_tokens: int, like: torch.Tensor) -> torch.Tensor | None:
        """PLANTED (`ReplicaConfig.planted_cross_break_read`): the block kept across the replay break, else None.

        `planted_kept_block`, allocated first in the forward: in every capture into the pool it is the first
        graph-pool block.
        """
        if not self.config.planted_cross_break_read:
            return None
        return planted_kept_block(num_tokens, self.config.hidden_size, like.device)

    def forward(self, input_ids: torch.Tensor) -> tuple:
        """`(hidden_states, aux_list)` as V4.1 returns them, or with `aux_return="flat"` `(hidden_states, *aux)`."""
        kept = self._planted_keep(input_ids.shape[0], input_ids)
        hidden_states = self.embed_tokens(input_ids)
        # Early aux states stay referenced across the replay layers' break, and are read after it.
        hidden_states, early_aux = self._run_layers(hidden_states, range(self.decoder_replay_start))
        # As in V4.1, `residual`, `post_mix` and `res_mix` go into the break with the hidden states
        # and stay bound until the forward returns, but nothing reads them after the break.
        state = self._hyper_connection_state(hidden_states) if self.config.hyper_connections else ()
        planted_keep(kept, hidden_states)  # PLANTED: written before the break, read after it
        hidden_states, *replay_aux = self.decoder_replay_layers(hidden_states, *state)
        hidden_states = planted_read(hidden_states, kept)
        aux = [*early_aux, *replay_aux]
        if self.config.aux_return == "flat":
            return (self.norm(hidden_states), *aux)
        return self.norm(hidden_states), aux


def split_output(output: tuple, aux_return: str) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The final hidden states and the aux hidden states of a forward's output, in either of `AUX_RETURNS`."""
    if aux_return == "flat":
        return output[0], tuple(output[1:])
    hidden_states, aux = output
    return hidden_states, tuple(aux)


# The shapes a forward may return its aux hidden states in (ReplicaConfig.aux_return): V4.1's, and a hypothetical one.
AUX_RETURNS = {
    "nested": "as V4.1 returns them, (hidden_states, aux_list): vLLM's wrapper keeps every aux block allocated",
    "flat": "hypothetical: (hidden_states, *aux), each aux a top-level output that vLLM's wrapper weak-references",
}


PLANTED_BYTES = 12 << 20  # the planted block: a large-pool segment of its own (see `planted_kept_block`)


def planted_kept_block(num_tokens: int, hidden_size: int, device) -> torch.Tensor:
    """PLANTED: a float32 (rows, 4, hidden) view of one buffer of exactly `PLANTED_BYTES`, rows = the tokens, at
    most as many as fit (768 at hidden 1024, every token of the small preset; 109 at the large preset's 7168).

    Why a replay graph captured after the model graphs, on their stream, takes
    it (PyTorch's caching allocator, c10/cuda/CUDACachingAllocator.cpp): a
    request of 10 MiB or more gets a segment of exactly its size rounded to
    2 MiB, so 12 MiB is a segment of its own, smaller than the 20 MiB segments
    that requests between 1 and 10 MiB come from and than the exact segments of
    larger requests. Every capture into the pool starts with all of it free
    (the earlier captures' outputs are weak references), and a request takes
    the smallest free block that fits (`get_free_block`, best fit by stream and
    size). So every model graph's block lands at the start of that one
    segment, and a replay graph captured on the same stream puts its first
    request between 1 and 12 MiB there too (at hidden 1024 from 129 rows: its
    norm's float32 temporaries or its up projection), which its replay in the
    break writes. On a stream of its own (vLLM 0.33) it cannot take the block;
    replay graph 96 (no request above 1 MiB at hidden 1024) does not either.
    The kit's allocator simulator shows this on the small preset's requests in
    outline (tests/test_invariant.py, `test_on_the_simulator_...`).
    """
    rows = min(num_tokens, PLANTED_BYTES // (4 * hidden_size * 4))
    buffer = torch.empty(PLANTED_BYTES // 4, dtype=torch.float32, device=device)
    return buffer[: rows * 4 * hidden_size].view(rows, 4, hidden_size)


def planted_read(hidden_states: torch.Tensor, kept: torch.Tensor | None) -> torch.Tensor:
    """PLANTED: after the break, the kept copy of the pre-break hidden states added back to its rows (read in
    full); `hidden_states` itself when nothing was kept."""
    if kept is None:
        return hidden_states
    rows = kept.shape[0]
    added = hidden_states[:rows] + kept.mean(1).to(hidden_states.dtype)
    return torch.cat((added, hidden_states[rows:])) if rows < hidden_states.shape[0] else added


def planted_keep(kept: torch.Tensor | None, hidden_states: torch.Tensor) -> None:
    """PLANTED: write the pre-break hidden states into the kept block (four copies per row)."""
    if kept is not None:
        rows = kept.shape[0]
        kept.copy_(hidden_states[:rows].unsqueeze(1).expand_as(kept))


# vLLM 0.33's defaults on one GPU of each kind, as its own config code computes them (scripts/vllm_presets.py).
VLLM_PRESETS_JSON = Path(__file__).with_name("vllm_presets.json")


def vllm_default_presets() -> dict[str, dict]:
    """The numbers of `VLLM_PRESETS_JSON` by preset name: capture sizes, threshold, window, replay sizes, device."""
    return json.loads(VLLM_PRESETS_JSON.read_text())["presets"]


def vllm_default_config(numbers: dict) -> ReplicaConfig:
    """The replica at vLLM's default sizes `numbers` (one entry of `vllm_default_presets`), small enough to be quick.

    Its model graphs are vLLM's default capture sizes, its replay graphs those vLLM's
    `DecoderReplayCudaGraphManager` makes of them (`default_replay_capture_sizes` of the same
    bound; tests/test_vllm_presets.py checks they agree), its threshold vLLM's default 768.
    """
    return ReplicaConfig(
        hidden_size=256,  # gb200-default captures 83 model graphs: kept small so every pairing runs fast
        cudagraph_capture_sizes=tuple(numbers["cudagraph_capture_sizes"]),
        window=numbers["window"],
        max_num_seqs=numbers["max_num_seqs"],
        decoder_replay_trim_threshold=numbers["decoder_replay_trim_threshold"],
    )


# vLLM's defaults: on an H200 the largest model graph is 512, below the trim threshold of 768, so no model graph
# breaks out and the replay graphs (128..512) run only in eager steps; on a GB200 model graphs 768..1024 (step 16)
# break out, most of them to a replay graph larger than themselves. (Defined last, with the planted read above, so
# the replica's earlier lines keep the numbers the shipped recordings' frames name.)
PRESETS.update({name: vllm_default_config(numbers) for name, numbers in vllm_default_presets().items()})

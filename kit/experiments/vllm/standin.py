"""The stand-in DeepSeek-V4.1 and the vLLM objects built around it, for `kit.experiments.vllm.capture`.

`StandInDeepseekV41` is shaped like DeepSeek-V4.1 where vLLM 0.33's capture
path looks (its backbone, the replay start, the aux ids, vLLM's own
`DecoderReplayLayers` inside); `build_runner` puts it in vLLM's V2
`GPUModelRunner` with vLLM's own graph managers, model state and wrappers.
What is stood in, bypassed, constructed and not modelled is listed here
(`STOOD_IN`, `BYPASSED`, `CONSTRUCTED`, `NOT_MODELLED`) and written into
every recording's provenance. Needs vLLM imported (`kit.experiments.vllm.importing`).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from kit.errors import KitError, check_one_of
from kit.record.provenance import require_cuda

EARLY_AUX_LAYER = 1
AUX_RETURNS = ("nested", "flat")  # V4.1's (hidden_states, aux_list), and the hypothetical flattened return
CAPTURE_NEEDS_CUDA = "capturing vLLM's graphs needs CUDA, and this process has none; read kit/recordings/vllm instead"

# What this experiment stands in for, beside the stub modules (provenance of every recording).
STOOD_IN = {
    "model": "StandInDeepseekV41: V4.1's backbone attributes, break inputs and outputs; MLP layers, no attention",
    "model_config": "hf_config.hidden_size, hc_mult and the dtype, as a namespace (no checkpoint)",
    "DeepseekV41ModelState.prepare_attn": "no attention metadata; sets the replay batch (the last half of the rows)",
    "DeepseekV41ModelState._prepare_replay_batch": "the replay batch at capture: rows 0..n-1 of a replay graph",
    "DeepseekV41ModelState.replay_batch": (
        "a step's replay batch: its last r rows (half by default), padded by vLLM's own "
        "DecoderReplayCudaGraphManager.dispatch to the replay graph that fits; vLLM gathers them with Triton kernels"
    ),
    "DeepseekV41ModelState.prepare_dummy_inputs": "no engram inputs",
    "DecoderReplayLayers.write_batch_kv": "no KV cache to write",
    "block_tables": "dummy block tables and slot mappings (no KV cache)",
    "process groups": "tp, pp, dp, ep, world: vLLM's GroupCoordinator of one rank with no device communicator",
    "kv_connector": "a namespace whose reset_capture_state does nothing",
    "vllm._C.weak_ref_tensor": "the same op registered from Python where vllm._C is missing",
}
# Objects made with object.__new__ (or set past validation): their constructors need a checkpoint, a KV cache
# or process groups. Every other vLLM object on the path is made by its own constructor (CONSTRUCTED).
BYPASSED = {
    "GPUModelRunner.__init__": (
        "object.__new__(GPUModelRunner), given only what capture_model reads (vllm_config, model, model_state, "
        "cudagraph_manager, input_buffers, block_tables, attn_groups, kv_cache_config, speculator=None, ...); "
        "the constructor would build the input batch, sampler, attention backends, KV cache and speculator"
    ),
    "DeepseekV41ModelState.__init__": (
        "object.__new__(DeepseekV41ModelState), given the model, its DecoderReplayLayers, _replay_start and the "
        "replay graph manager; the constructor would build the replay kernels' buffers (_kept_rows, "
        "_kept_slot_mappings, the staging buffers), attention groups and the Triton gather of the replay batch"
    ),
    "GroupCoordinator.__init__": (
        "object.__new__(GroupCoordinator) for _TP, _PP, _DP, _EP and _WORLD: one rank, no torch.distributed "
        "process group, no device communicator"
    ),
    "VllmConfig.model_config": (
        "a namespace set with object.__setattr__, past pydantic's validation (no checkpoint to build a ModelConfig "
        "from); cudagraph_mode and the capture sizes are set after VllmConfig's __post_init__ turned graphs off"
    ),
}
CONSTRUCTED = (
    "VllmConfig", "CompilationConfig", "DeviceConfig", "ModelCudaGraphManager", "DecoderReplayCudaGraphManager",
    "DecoderReplayLayers", "BreakableCUDAGraphWrapper", "InputBuffers", "KVCacheConfig", "the workspace manager",
)  # fmt: skip
# What a real DeepSeek-V4.1 step has that this experiment does not model.
NOT_MODELLED = {
    "speculator": (
        "the DSpark drafter and its SpeculatorCudaGraphManager capture (runner.speculator is None): its graphs, "
        "captured after the target's on a stream of their own, are not made (the replica models them)"
    ),
    "FULL graphs": (
        "only PIECEWISE model graphs: no FULL decode graphs, which keep the replay layers inside the graph on the "
        "whole batch (no break, no replay graph)"
    ),
    "microbatch (ubatch) graphs": "no UBatchRunner (DBO): no microbatched FULL graphs and no capture stream of theirs",
    "attention": (
        "the stand-in's layers are MLPs: none of V4.1's attention, sparse MLA or compressor kernels, so none of its "
        "per-layer attention breaks (a model graph here is two segments around the replay break) and no attention "
        "metadata"
    ),
    "KV cache": "no KV cache: write_batch_kv, the slot mappings and the first replay layer's KV writes do nothing",
    "parallelism": (
        "one rank: no tensor, pipeline, data, expert or context parallelism (no all-gathers, no sequence "
        "parallelism, no _agree_across_dp)"
    ),
    "the replay batch's rows": (
        "vLLM's _prepare_replay_batch (kept_lens per request, Triton gathers) is stood in: a step's replay rows are "
        "its last r rows, for any r in 1..N"
    ),
    "MoE, engram, quantized kernels": "the stand-in runs dense bf16 MLPs only",
}


@dataclasses.dataclass(frozen=True)
class StandInConfig:
    """The stand-in's sizes: the replica's small preset, with V4.1's hyper-connection width.

    The replay capture sizes are left empty, so vLLM's own
    `DecoderReplayCudaGraphManager.__init__` makes them (its default: multiples
    of the window up to min(largest capture size, max_num_seqs * window), and
    that bound): with window 96 and model sizes 128, 256, 512 that is 96, 192,
    288, 384, 480, 512, the replica's small preset. Every model size is at the
    trim threshold or above, so each model graph breaks out to its replay batch.
    """

    hidden_size: int = 1024
    hc_mult: int = 4
    num_layers: int = 6
    decoder_replay_start: int = 3
    aux_hidden_state_layers: tuple[int, ...] = (4,)
    cudagraph_capture_sizes: tuple[int, ...] = (128, 256, 512)
    decoder_replay_cudagraph_capture_sizes: tuple[int, ...] = ()  # empty: vLLM's default sizing
    window: int = 96  # V4.1's sliding window: the replay layers' unit
    trim_threshold: int = 128  # PIECEWISE model graphs this large break out to the replay batch
    max_num_seqs: int | None = None  # the scheduler's (None: VllmConfig's default); bounds vLLM's replay sizes
    vocab_size: int = 4096
    dtype: str = "bfloat16"
    seed: int = 0
    # How the early aux states leave the forward under capture (see _define_model): "nested" as V4.1 returns them,
    # (hidden_states, aux_list), which vLLM's wrapper keeps allocated; "flat" (hypothetical) as weak references, what
    # vLLM's wrapper does to top-level outputs, so a model returning its aux flattened.
    aux_return: str = "nested"
    # PLANTED, a bug on purpose (scenario `planted_cross_break_read`): the backbone keeps a float32 copy of the
    # pre-break hidden states in a graph-pool block of its own and adds it back after the replay break, as the
    # replica's `ReplicaConfig.planted_cross_break_read` does (`kit.replica.model.planted_kept_block` says why a
    # replay graph captured on the same stream takes that block). It shows the invariant and graphs-vs-eager failing.
    planted_cross_break_read: bool = False

    def with_early_aux(self, aux_return: str = "nested") -> StandInConfig:
        if aux_return not in AUX_RETURNS:
            raise KitError(f"aux_return must be one of {', '.join(AUX_RETURNS)}, not {aux_return!r}")
        return dataclasses.replace(
            self, aux_hidden_state_layers=(EARLY_AUX_LAYER, *self.aux_hidden_state_layers), aux_return=aux_return
        )


def preset_config(name: str) -> StandInConfig:
    """The stand-in at one of vLLM's default presets (`kit.replica.model.vllm_default_presets`: `h200-default`,
    `gb200-default`): vLLM's default model capture sizes, window, threshold and `max_num_seqs`, the replay sizes
    left to vLLM's own manager; hidden size 256, as the replica's presets, so that every pairing runs quickly."""
    from kit.replica.model import vllm_default_presets

    presets = vllm_default_presets()
    check_one_of(name, presets, "preset")
    numbers = presets[name]
    return StandInConfig(
        hidden_size=256,
        cudagraph_capture_sizes=tuple(numbers["cudagraph_capture_sizes"]),
        window=numbers["window"],
        trim_threshold=numbers["decoder_replay_trim_threshold"],
        max_num_seqs=numbers["max_num_seqs"],
    )


def vllm_config(cfg: StandInConfig, device: str = "cuda"):
    """The smallest real `VllmConfig` the capture path reads, and its stood-in `model_config`."""
    import torch
    from vllm.config import CompilationConfig, CUDAGraphMode, DeviceConfig, VllmConfig

    config = VllmConfig(
        device_config=DeviceConfig(device=device),
        compilation_config=CompilationConfig(
            cudagraph_capture_sizes=list(cfg.cudagraph_capture_sizes),
            max_cudagraph_capture_size=max(cfg.cudagraph_capture_sizes),
            decoder_replay_cudagraph_capture_sizes=list(cfg.decoder_replay_cudagraph_capture_sizes),
            decoder_replay_trim_threshold=cfg.trim_threshold,
        ),
    )
    # Without a model, VllmConfig turns CUDA graphs off (under the CUDA platform it also empties the
    # capture sizes); the runner would not.
    config.compilation_config.cudagraph_mode = CUDAGraphMode.PIECEWISE
    if cfg.max_num_seqs is not None:
        config.scheduler_config.max_num_seqs = cfg.max_num_seqs
    config.compilation_config.cudagraph_capture_sizes = sorted(cfg.cudagraph_capture_sizes)
    config.compilation_config.max_cudagraph_capture_size = max(cfg.cudagraph_capture_sizes)
    hf_config = SimpleNamespace(hidden_size=cfg.hidden_size, hc_mult=cfg.hc_mult, num_hidden_layers=cfg.num_layers)
    model_config = SimpleNamespace(
        hf_config=hf_config, dtype=getattr(torch, cfg.dtype),
        enable_sleep_mode=False, sleep_mode_offload_cudagraph=False, sleep_mode_backend="cumem",
    )  # fmt: skip
    object.__setattr__(config, "model_config", model_config)
    return config


def build_model(cfg: StandInConfig, device: str = "cuda"):
    """The stand-in DeepSeek-V4.1 on `device`, in eval mode (vLLM's `DecoderReplayLayers` inside)."""
    import torch

    torch.manual_seed(cfg.seed)
    model = _model_class()(cfg)
    return model.to(device, getattr(torch, cfg.dtype)).eval()


def _model_class():
    """`StandInDeepseekV41`, defined once torch is imported (this module imports without torch)."""
    global _MODEL
    if _MODEL is None:
        _MODEL = _define_model()
    return _MODEL


_MODEL = None


def _define_model():
    """`StandInDeepseekV41`, with vLLM's own `DecoderReplayLayers` inside.

    How its early aux states leave the forward under capture, and why
    (`StandInConfig.aux_return`). vLLM's `BreakableCUDAGraphWrapper._capture`
    hands the caller `weak_ref_tensors(output)`, so that "the cudagraph pool
    [can] reclaim/reuse that memory immediately for the next batch descriptor's
    capture" (its comment): the caller reads the graph's outputs at their pool
    addresses, and later captures may allocate over them. But
    `weak_ref_tensors` (`vllm/utils/torch_utils.py`) weak-refs only a tensor, or
    the tensors of a flat list or tuple; V4.1 returns `(hidden_states, [aux, ...])`,
    so the aux list passes through as it is and the wrapper's `entry.output`
    keeps every aux tensor, and with it its graph-pool block, allocated for the
    life of the graph. An early aux state is then never a free block that a
    replay capture could take, whatever the stream. By default (`"nested"`) the
    stand-in returns them so, as V4.1 does (scenarios `early_aux_pr`,
    `early_aux_shared`). `"flat"` is hypothetical (`early_aux_pr_flat`,
    `early_aux_shared_flat`): a model that returned its aux flattened, each a
    top-level output, or a `weak_ref_tensors` that recursed. The stand-in keeps
    V4.1's shape, which vLLM's runner unpacks, and hands its early aux states
    out under capture as vLLM's own `weak_ref_tensor`, what the wrapper would
    do to them as top-level outputs: their blocks go back to the pool when the
    capture ends, as the final hidden state's do, and a replay graph captured
    on the same stream may take them, the case PR 63155's early-aux exception
    is for. Late aux states are views of the replay layers' break buffers,
    outside the graph pool, either way; eager forwards (no capture) always
    return the tensors themselves.
    """
    import torch
    import torch.nn.functional as F
    from torch import nn
    from vllm.models.deepseek_v41.decoder_replay_layers import DecoderReplayLayers

    from kit.replica.model import planted_keep, planted_kept_block, planted_read

    class Layer(nn.Module):
        """An MLP layer that also updates V4.1's hyper-connection state (pre_mix, residual)."""

        def __init__(self, cfg: StandInConfig) -> None:
            super().__init__()
            self.norm = nn.RMSNorm(cfg.hidden_size, eps=1e-6)
            self.up_proj = nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False)
            self.down_proj = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)
            self.mix_proj = nn.Linear(cfg.hidden_size, cfg.hc_mult, bias=False)

        def forward(self, hidden_states, residual):
            hidden_states = hidden_states + self.down_proj(F.silu(self.up_proj(self.norm(hidden_states))))
            pre_mix = torch.sigmoid(self.mix_proj(hidden_states).float())
            residual = residual + hidden_states.unsqueeze(1) * pre_mix.unsqueeze(-1).to(hidden_states.dtype)
            return hidden_states, residual, pre_mix

    class Backbone(nn.Module):
        """V4.1's `DeepseekV4Model` where the capture path looks: layers, the replay start, the aux ids."""

        def __init__(self, cfg: StandInConfig) -> None:
            super().__init__()
            self.cfg = cfg
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))
            self.norm = nn.RMSNorm(cfg.hidden_size, eps=1e-6)
            self.start_layer, self.end_layer = 0, cfg.num_layers
            self.decoder_replay_start = cfg.decoder_replay_start
            self.aux_hidden_state_layers = tuple(sorted(set(cfg.aux_hidden_state_layers)))
            self.decoder_replay_layers = DecoderReplayLayers(
                cfg.window, self._run_replay_layers, self._write_batch_kv, set(), "swa"
            )

        @staticmethod
        def _write_batch_kv(*inputs) -> None:
            """Stood in: there is no KV cache (V4.1 writes the first replay layer's KV for every row here)."""

        def _run_layers(self, layer_ids, hidden_states, residual, pre_mix, aux: dict):
            for i in layer_ids:
                if i in self.aux_hidden_state_layers and i > 0:
                    aux[i] = hidden_states  # aux id i: layer i's input, made while layer i runs
                hidden_states, residual, pre_mix = self.layers[i](hidden_states, residual)
            return hidden_states, residual, pre_mix

        def _run_replay_layers(self, hidden_states, positions, input_ids, pre_mix, post_mix, res_mix, residual):
            """V4.1's replay layers: the seven break inputs in, `hidden_states, pre_mix, *late_aux` out."""
            mixed = (residual * post_mix.to(residual.dtype)).sum(1) + (res_mix.sum(-1) * pre_mix).sum(
                -1, keepdim=True
            ).to(hidden_states.dtype)
            hidden_states = hidden_states + mixed * 1e-3
            aux: dict[int, Any] = {}
            layer_ids = range(self.decoder_replay_start, self.end_layer)
            hidden_states, residual, pre_mix = self._run_layers(layer_ids, hidden_states, residual, pre_mix, aux)
            return (hidden_states, pre_mix, *(aux[i] for i in sorted(aux)))

        def forward(self, input_ids, positions):
            kept = None
            if self.cfg.planted_cross_break_read:  # PLANTED: allocated first, written before the break, read after
                kept = planted_kept_block(input_ids.shape[0], self.cfg.hidden_size, input_ids.device)
            hidden_states = self.embed_tokens(input_ids)
            n, hc = hidden_states.shape[0], self.cfg.hc_mult
            residual = hidden_states.unsqueeze(1).expand(n, hc, -1).contiguous()
            pre_mix = torch.zeros(n, hc, dtype=torch.float32, device=hidden_states.device)
            early: dict[int, Any] = {}
            hidden_states, residual, pre_mix = self._run_layers(
                range(self.start_layer, self.decoder_replay_start), hidden_states, residual, pre_mix, early
            )
            planted_keep(kept, hidden_states)
            post_mix = pre_mix.unsqueeze(-1) * 0.5
            res_mix = torch.softmax(pre_mix.unsqueeze(-1) * pre_mix.unsqueeze(1), dim=-1)
            # V4.1's break: these seven in (residual, post_mix, res_mix stay bound, unread, until the forward returns).
            hidden_states, pre_mix, *late_aux = self.decoder_replay_layers(
                hidden_states, positions, input_ids, pre_mix, post_mix, res_mix, residual
            )
            hidden_states = planted_read(hidden_states, kept)
            hidden_states = self.norm(hidden_states) * (1 + pre_mix.mean(-1, keepdim=True)).to(hidden_states.dtype)
            early_aux = [early[i] for i in self.aux_hidden_state_layers if i in early]
            return hidden_states, handed_out(early_aux, self.cfg.aux_return) + late_aux

    class StandInDeepseekV41(nn.Module):
        """`DeepseekV41ForCausalLM` as the runner sees it: `.model` is the backbone; returns hidden and aux states."""

        def __init__(self, cfg: StandInConfig) -> None:
            super().__init__()
            self.model = Backbone(cfg)

        @property
        def decoder_replay_layers(self):
            return self.model.decoder_replay_layers

        def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
            return self.model(input_ids, positions)

    return StandInDeepseekV41


def handed_out(early_aux: list, aux_return: str) -> list:
    """The stand-in's early aux states as its forward returns them (`_define_model` says why).

    Under vLLM's breakable capture (`BreakableCUDAGraphCapture.current()`),
    with `aux_return="flat"`: each as vLLM's own `weak_ref_tensor`, what
    `BreakableCUDAGraphWrapper._capture` does to a top-level output, so its
    block goes back to the graph pool when the capture ends. Otherwise (eager,
    warm-up, V4.1's nested return) the tensors themselves. CPU tensors (the kit's tests,
    where CUDA is stood in and nothing is captured) are never weak: their
    memory would go back to the system.
    """
    from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphCapture
    from vllm.utils.torch_utils import weak_ref_tensor

    if aux_return != "flat" or BreakableCUDAGraphCapture.current() is None:
        return list(early_aux)
    return [a if a.device.type == "cpu" else weak_ref_tensor(a) for a in early_aux]


class StandInBlockTables:
    """Block tables with no KV cache: the dummy tables and slot mappings the capture asks for."""

    cp_size = 1

    def __init__(self, device) -> None:
        import torch

        self.device = device
        self._slots = torch.full((1 << 14,), -1, dtype=torch.int64, device=device)

    def get_dummy_block_tables(self, num_reqs: int) -> tuple:
        return ()

    def get_dummy_slot_mappings(self, num_tokens: int):
        return self._slots[:num_tokens].unsqueeze(0)


def install_groups() -> None:
    """tp, pp and dp as vLLM's `GroupCoordinator`s of one rank with no device communicator."""
    from vllm.distributed import parallel_state

    for name in ("_TP", "_PP", "_DP", "_EP", "_WORLD"):
        group = object.__new__(parallel_state.GroupCoordinator)
        group.__dict__.update(
            unique_name=name.strip("_").lower(), device_communicator=None, ranks=[0], rank=0, rank_in_group=0,
            world_size=1, local_rank=0, use_device_communicator=False,
        )  # fmt: skip
        setattr(parallel_state, name, group)


def build_runner(cfg: StandInConfig, device=None):
    """vLLM's V2 `GPUModelRunner` around the stand-in: real graph managers, model state and wrappers; needs CUDA.

    `device` is for tests that stand CUDA in (tests/test_vllm_recording.py); the default is this GPU.
    """
    import torch
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor, create_forward_context
    from vllm.models.deepseek_v41.decoder_replay_layers import ReplayBatch
    from vllm.models.deepseek_v41.nvidia.decoder_replay_cudagraph import DecoderReplayCudaGraphManager
    from vllm.models.deepseek_v41.nvidia.model_state import DeepseekV41ModelState
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.worker import workspace
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager
    from vllm.v1.worker.gpu.input_batch import InputBuffers
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    if device is None:
        require_cuda(CAPTURE_NEEDS_CUDA)
        device = torch.device("cuda", torch.cuda.current_device())
    config = vllm_config(cfg, device.type)
    install_groups()
    if workspace._manager is None:
        workspace.init_workspace_manager(device, num_lanes=2)
    model = build_model(cfg, device)
    layers = model.decoder_replay_layers
    layers.trim_threshold = cfg.trim_threshold
    max_tokens = max(cfg.cudagraph_capture_sizes)
    kept_rows = torch.arange(max_tokens, dtype=torch.int64, device=device)  # persistent, as vLLM's _kept_rows

    state = object.__new__(DeepseekV41ModelState)
    state.__dict__.update(
        vllm_config=config, model=model, device=device, decoder_replay_layers=layers, supports_mm_inputs=False,
        max_num_reqs=config.scheduler_config.max_num_seqs, pcp_size=1, _replay_attn_groups=None,
        _replay_start=torch.zeros(config.scheduler_config.max_num_seqs, dtype=torch.int32, device=device),
        replay_cudagraphs=DecoderReplayCudaGraphManager(config, device, layers),
    )  # fmt: skip

    def replay_batch(num_tokens: int, run_graph: bool, rows: int | None = None, pad: bool = False) -> ReplayBatch:
        """A step's replay batch: its last `rows` rows (half of them by default), in the replay graph vLLM's own
        `dispatch` pads them to (with `run_graph`), else eagerly: on the rows alone, or with `pad` on the rows
        padded with zeros to that graph's size (vLLM's `num_padded` path), so eager runs the same shapes.

        `rows` above `num_tokens` is a prefill-context-parallel step's global row count (`_prepare_replay_batch`'s
        `num_padded = pcp.global_num_tokens - num_dropped_tokens`): the step's every row, dispatched by that count
        and, eagerly, padded to it (`kit.experiments.dispatch`)."""
        count = max(1, num_tokens // 2) if rows is None else int(rows)
        if count < 1:
            raise KitError(f"a step of {num_tokens} tokens cannot hold a replay batch of {count} rows")
        local = min(count, num_tokens)  # under PCP the rank's own rows; the global count decides the graph
        kept = kept_rows[num_tokens - local : num_tokens]
        cudagraphs = state.replay_cudagraphs
        desc = cudagraphs.dispatch(count, count, None, 0)  # NONE (eager) before the replay graphs are captured
        fits = desc.cg_mode == CUDAGraphMode.PIECEWISE
        graph = run_graph and fits
        padded = desc.num_tokens if fits and (graph or pad) else count
        context = create_forward_context(
            None, config, cudagraph_runtime_mode=CUDAGraphMode.PIECEWISE if graph else CUDAGraphMode.NONE,
            batch_descriptor=BatchDescriptor(num_tokens=padded),
        )  # fmt: skip
        num_padded = padded if pad and not graph and padded != local else None
        return ReplayBatch(kept, context, cudagraphs.run if graph else None, num_padded)

    def prepare_attn(input_batch, cg_mode, *args, **kwargs):
        layers.replay_batch = replay_batch(input_batch.num_tokens, run_graph=False)
        return None

    def prepare_replay_batch(input_batch, cg_mode, block_tables, slot_mappings, *args, capture_desc=None, **kwargs):
        rows = kept_rows[: capture_desc.num_tokens]
        context = create_forward_context(
            None, config, cudagraph_runtime_mode=capture_desc.cg_mode,
            batch_descriptor=BatchDescriptor(num_tokens=capture_desc.num_tokens),
        )  # fmt: skip
        layers.replay_batch = ReplayBatch(rows, context, state.replay_cudagraphs.run)

    state.prepare_attn = prepare_attn
    state._prepare_replay_batch = prepare_replay_batch
    state.prepare_dummy_inputs = lambda num_reqs, num_tokens: {}
    state.replay_batch = replay_batch

    runner = object.__new__(GPUModelRunner)
    runner.__dict__.update(
        vllm_config=config, device=device, model=model, model_state=state,
        cudagraph_manager=ModelCudaGraphManager(config, device, CUDAGraphMode.PIECEWISE, 1),
        input_buffers=InputBuffers(config.scheduler_config.max_num_seqs, max_tokens, device),
        block_tables=StandInBlockTables(device), attn_groups=[], kv_cache_config=KVCacheConfig(0, [], []),
        intermediate_tensors=None, pcp_manager=None, lora_config=None, use_aux_hidden_state_outputs=True,
        speculator=None, adaptive_verification=None, _draft_workspace_lane=1,
        kv_connector=SimpleNamespace(reset_capture_state=lambda: None), stand_in=cfg,
    )  # fmt: skip
    return runner

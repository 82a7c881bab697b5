"""Stand-ins for what vLLM's capture path needs and a CPU lacks: CUDA streams, process groups, a model.

Everything else is the installed vLLM 0.33.0's own code. Its graph managers,
model states and runner are built with `object.__new__` and given the
attributes their capture path reads (their constructors want a full
`VllmConfig` and a loaded model), so `GPUModelRunner.capture_model()`,
`CudaGraphManager.capture()`, `graph_capture()` and
`GroupCoordinator.graph_capture()` run as installed, or as patched.
"""

from __future__ import annotations

import contextlib
import itertools
from types import SimpleNamespace

import torch


class StandInStream:
    """A CUDA stream: it has an identity and an id, and can be waited on."""

    _ids = itertools.count(1)

    def __init__(self, device=None, priority: int = 0) -> None:
        self.device = device
        self.cuda_stream = next(self._ids)

    def wait_stream(self, other: StandInStream) -> None:
        pass

    def __repr__(self) -> str:
        return f"<stream {self.cuda_stream}>"


class StandInCuda:
    """`torch.cuda.Stream`, `current_stream`, `stream(...)` and the memory calls of `capture_model()`."""

    def __init__(self, monkeypatch) -> None:
        self.default = StandInStream()
        self.current = self.default
        self.made: list[StandInStream] = []
        cuda = self

        class Stream(StandInStream):
            def __init__(self, device=None, priority: int = 0) -> None:
                super().__init__(device, priority)
                cuda.made.append(self)

        @contextlib.contextmanager
        def stream(s):
            previous, cuda.current = cuda.current, s
            try:
                yield
            finally:
                cuda.current = previous

        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: cuda.current)
        monkeypatch.setattr(torch.cuda, "stream", stream)
        monkeypatch.setattr(torch.accelerator, "empty_cache", lambda: None)
        monkeypatch.setattr(torch.accelerator, "get_memory_info", lambda device=None: (0, 0))


def install_groups(monkeypatch) -> list:
    """Real `GroupCoordinator`s for tp, pp and dp, with no device communicator (no process groups)."""
    from vllm.distributed import parallel_state

    groups = []
    for name in ("_TP", "_PP", "_DP"):
        group = object.__new__(parallel_state.GroupCoordinator)
        group.device_communicator = None
        group.unique_name = name.strip("_").lower()
        monkeypatch.setattr(parallel_state, name, group)
        groups.append(group)
    return groups


def install_workspace(monkeypatch) -> None:
    """vLLM's workspace manager, on the CPU, as `GPUModelRunner.__init__` sets it up (two lanes: target, draft)."""
    from vllm.v1.worker import workspace

    monkeypatch.setattr(workspace, "_manager", None)
    workspace.init_workspace_manager(torch.device("cpu"), num_lanes=2)


def spy_group_capture(monkeypatch) -> list:
    """Record the stream each `GroupCoordinator.graph_capture()` is entered with; the real one still runs."""
    from vllm.distributed.parallel_state import GroupCoordinator

    seen: list = []
    original = GroupCoordinator.graph_capture

    @contextlib.contextmanager
    def graph_capture(self, graph_capture_context=None):
        with original(self, graph_capture_context) as context:
            seen.append((self.unique_name, context.stream))
            yield context

    monkeypatch.setattr(GroupCoordinator, "graph_capture", graph_capture)
    return seen


def manager(cls, sizes: tuple[int, ...] = (), **attrs):
    """A vLLM graph manager of class `cls` with PIECEWISE sizes to capture (no breakable graphs, so no CUDA graph)."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

    m = object.__new__(cls)
    descs = [BatchExecutionDescriptor(CUDAGraphMode.PIECEWISE, n, None) for n in sorted(sizes, reverse=True)]
    m.__dict__.update(
        device=torch.device("cpu"),
        ubatch_runner=None,
        cudagraph_mode=CUDAGraphMode.PIECEWISE if sizes else CUDAGraphMode.FULL,
        _capture_descs={CUDAGraphMode.PIECEWISE: descs} if sizes else {CUDAGraphMode.FULL: []},
        _max_full_descs_to_capture=None,
        _capture_mem_samples=None,
        use_breakable_cg=False,
        graphs={},
        pool=None,
        vllm_config=None,
        max_num_reqs=8,
        _graphs_captured=False,
    )
    m.__dict__.update(attrs)
    return m


class StandInGraph:
    """`torch.cuda.CUDAGraph` on the CPU: remembers the stream and pool of its capture, replays nothing."""

    made: list = []
    cuda: StandInCuda | None = None

    def __init__(self, *args, **kwargs) -> None:
        StandInGraph.made.append(self)
        self.stream = None

    def capture_begin(self, pool=None, **kwargs) -> None:
        self.stream, self._pool = StandInGraph.cuda.current, pool

    def capture_end(self) -> None:
        pass

    def replay(self) -> None:
        pass

    def pool(self):
        return self._pool


class StandInBackbone:
    """The model's backbone: where DeepSeek-V4.1 keeps its aux layer ids and the replay start."""

    def __init__(self, layers, aux_hidden_state_layers: tuple[int, ...], decoder_replay_start: int) -> None:
        self.decoder_replay_layers = layers
        self.aux_hidden_state_layers = aux_hidden_state_layers
        self.decoder_replay_start = decoder_replay_start


class StandInModel(torch.nn.Module):
    def __init__(self, backbone: StandInBackbone) -> None:
        super().__init__()
        self.model = backbone

    @property
    def decoder_replay_layers(self):
        return self.model.decoder_replay_layers


class StandInSpeculator:
    """A speculator: its `capture()` runs its own (real) `SpeculatorCudaGraphManager.capture()`."""

    def __init__(self) -> None:
        from vllm.v1.worker.gpu.spec_decode.target_dependent_ar.cudagraph_utils import SpeculatorCudaGraphManager

        self.cudagraph_manager = manager(SpeculatorCudaGraphManager)

    def capture(self) -> None:
        self.cudagraph_manager.capture(lambda *a, **k: None, None, None, None, [], None)


def deepseek_runner(*, aux: tuple[int, ...] = (37, 38, 39), replay_start: int = 20, specialized: bool = False):
    """A V2 `GPUModelRunner` holding a DeepSeek-V4.1 model state, its replay graph manager and a speculator."""
    from vllm.models.deepseek_v41.decoder_replay_layers import DecoderReplayLayers
    from vllm.models.deepseek_v41.nvidia.decoder_replay_cudagraph import DecoderReplayCudaGraphManager
    from vllm.models.deepseek_v41.nvidia.model_state import DeepseekV41ModelState
    from vllm.models.deepseek_v41.nvidia.specialized_decode.runtime.metadata_graphs import AttnMetadataCudaGraphs
    from vllm.models.deepseek_v41.nvidia.specialized_decode.runtime.model_state import (
        DeepseekV41SpecializedDecodeModelState,
    )
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    layers = DecoderReplayLayers(128, lambda *inputs: inputs, lambda *inputs: None, set(), "swa")
    state_cls = DeepseekV41SpecializedDecodeModelState if specialized else DeepseekV41ModelState
    state = object.__new__(state_cls)
    state.__dict__.update(
        model=StandInModel(StandInBackbone(layers, aux, replay_start)),
        decoder_replay_layers=layers,
        replay_cudagraphs=manager(DecoderReplayCudaGraphManager, layers=layers),
        supports_mm_inputs=False,
        max_num_reqs=8,
    )
    attn_groups: list = []
    if specialized:
        state.graphs = AttnMetadataCudaGraphs(None, 1)
        # A builder it cannot record, so it records no metadata graphs (they would need CUDA).
        attn_groups = [[SimpleNamespace(get_metadata_builder=object)]]
    runner = object.__new__(GPUModelRunner)
    runner.__dict__.update(
        model=state.model,
        model_state=state,
        cudagraph_manager=manager(
            ModelCudaGraphManager,
            hidden_states=None,
            aux_hidden_states=[],
            use_aux_hidden_state_outputs=False,
            intermediate_tensors=None,
            is_last_pp_rank=True,
        ),
        speculator=StandInSpeculator(),
        input_buffers=None,
        pcp_manager=None,
        intermediate_tensors=None,
        block_tables=None,
        attn_groups=attn_groups,
        kv_cache_config=None,
        lora_config=None,
        use_aux_hidden_state_outputs=False,
        _draft_workspace_lane=1,
        adaptive_verification=None,
        kv_connector=SimpleNamespace(reset_capture_state=lambda: None),
    )
    return runner

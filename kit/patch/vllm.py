"""PR 63155 applied to an installed vLLM 0.33, in-process.

The PR changes a few lines in each of these functions, and `kit.patch.pr`
makes the same edits to the installed functions, leaving every other line as
the installed vLLM has it:

- `vllm.distributed.parallel_state.graph_capture(device, stream=None)` reuses
  a given stream; it is installed in `parallel_state` and in every loaded
  module that imported it by name (`vllm.v1.worker.gpu.cudagraph_utils`, the
  V1 runner, the forward benchmarks);
- `CudaGraphManager.capture(..., stream=None)` captures on it and records the
  stream it used in `capture_stream`;
- `GPUModelRunner.capture_model()` (the V2 runner) hands the model graphs'
  `capture_stream` to `model_state.capture_inner_cudagraphs(..., stream=None)`;
- `DeepseekV41ModelState` and `DeepseekV41SpecializedDecodeModelState` pass it
  on to `DecoderReplayCudaGraphManager.capture_replay_graphs(prepare,
  stream=None)`, unless aux hidden states are made before the replay layers
  (an aux layer id below the model's `decoder_replay_start`): then the replay
  graphs keep a stream of their own, as the PR does.

Every other capture (the encoder, the speculators) still enters
`graph_capture()` without a stream, and so gets a new one.

vLLM 0.33 has no `has_early_aux()` (the PR adds it); the patch decides by
`kit.patch.policy`, which reads the aux layer ids and the replay start from
the model. `policy` picks that last decision: `pr` (the PR's rule), or, for
experiments, `share` or `separate`. Every decision is kept in
`PrPatch.decisions`.

    with kit.patch.vllm.apply() as patch:
        llm = LLM(model, ...)     # captures with the PR's change
    print(patch.diff())           # what it changed, as a unified diff

An installed vLLM whose functions differ from 0.33.0 (a function missing, a
signature changed, a line the PR edits not there, or the PR already merged)
is refused with a one-line `KitError`, and nothing is patched; so is a loaded
model state that overrides `capture_inner_cudagraphs` without taking a stream.
The replica's functions have the same shape, and `kit.patch.replica` reuses
the hunks named here where its lines are vLLM's.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from kit.errors import KitError
from kit.patch.pr import Codebase, Target
from kit.patch.source import Hunk

SUPPORTED_VERSION = "0.33.0"

_MODEL_STATE = "vllm.v1.worker.gpu.model_states.interface"
_STREAM_ARG = "stream: torch.cuda.Stream | None = None,"
_INNER_PARAMS = ("self", "input_buffers", "block_tables", "attn_groups", "kv_cache_config")
_INNER_STREAM = Hunk("kv_cache_config: KVCacheConfig,", f"kv_cache_config: KVCacheConfig,\n{_STREAM_ARG}")

# The edits to lines the replica has too (kit.patch.replica).
CAPTURE_TAKES_A_STREAM = Hunk(
    'progress_bar_desc: str = "Capturing CUDA graphs",',
    f'progress_bar_desc: str = "Capturing CUDA graphs",\n{_STREAM_ARG}',
)
REPLAY_GRAPHS_GET_THE_STREAM = Hunk(
    "self.replay_cudagraphs.capture_replay_graphs(prepare)",
    """
    # Not with aux hidden states made before the replay layers: the
    # forward holds them across the break, in the pool.
    self.replay_cudagraphs.capture_replay_graphs(prepare, stream=replay_stream(self, stream))
    """,
)
REPLAY_CAPTURE_ON_THE_STREAM = Hunk(
    'self.capture(create_forward_fn, "Capturing decoder replay CUDA graphs")',
    'self.capture(create_forward_fn, "Capturing decoder replay CUDA graphs", stream=stream)',
)

GRAPH_CAPTURE = Target(
    "vllm.distributed.parallel_state",
    "graph_capture",
    ("device",),
    (
        Hunk(
            "def graph_capture(device: torch.device):",
            "def graph_capture(device: torch.device, stream: torch.cuda.Stream | None = None):",
        ),
        Hunk(
            "context = GraphCaptureContext(torch.cuda.Stream(device=device))",
            """
            # Reuse the caller's stream: a capture on it can reuse the pool blocks it freed.
            context = GraphCaptureContext(stream if stream is not None else torch.cuda.Stream(device=device))
            """,
        ),
    ),
    "reuses `stream` when one is given, else makes a new one as before",
)
CAPTURE = Target(
    "vllm.v1.worker.gpu.cudagraph_utils",
    "CudaGraphManager.capture",
    ("self", "create_forward_fn", "progress_bar_desc"),
    (
        CAPTURE_TAKES_A_STREAM,
        Hunk(
            "progress_bar_desc: Description shown on the capture progress bar.",
            """
            progress_bar_desc: Description shown on the capture progress bar.
            stream: Capture on this stream instead of a new one.
            """,
        ),
        Hunk(
            "with graph_capture(device=self.device), ExitStack() as stack:",
            """
            with graph_capture(device=self.device, stream=stream) as context, ExitStack() as stack:
                self.capture_stream = context.stream
            """,
        ),
    ),
    "captures on `stream` when one is given and records the stream it used in `capture_stream`",
    adds=("capture_stream",),
)
CAPTURE_INNER = Target(
    "vllm.models.deepseek_v41.nvidia.model_state",
    "DeepseekV41ModelState.capture_inner_cudagraphs",
    _INNER_PARAMS,
    (_INNER_STREAM, REPLAY_GRAPHS_GET_THE_STREAM),
    "passes `stream` to the replay graphs, unless aux hidden states are made before the replay layers",
)
CAPTURE_REPLAY_GRAPHS = Target(
    "vllm.models.deepseek_v41.nvidia.decoder_replay_cudagraph",
    "DecoderReplayCudaGraphManager.capture_replay_graphs",
    ("self", "prepare"),
    (
        Hunk(
            "self, prepare: Callable[[BatchExecutionDescriptor], None]",
            f"self,\nprepare: Callable[[BatchExecutionDescriptor], None],\n{_STREAM_ARG}",
        ),
        REPLAY_CAPTURE_ON_THE_STREAM,
    ),
    "captures the replay graphs on `stream` when one is given",
)

TARGETS = (
    GRAPH_CAPTURE,
    CAPTURE,
    Target(
        "vllm.v1.worker.gpu.model_runner",
        "GPUModelRunner.capture_model",
        ("self", "profile_only"),
        (
            Hunk(
                """
                self.model_state.capture_inner_cudagraphs(
                    input_buffers,
                    self.block_tables,
                    self.attn_groups,
                    self.kv_cache_config,
                )
                """,
                """
                self.model_state.capture_inner_cudagraphs(
                    input_buffers,
                    self.block_tables,
                    self.attn_groups,
                    self.kv_cache_config,
                    stream=self.cudagraph_manager.capture_stream,
                )
                """,
            ),
        ),
        "hands the model graphs' `capture_stream` to `capture_inner_cudagraphs()`; the speculator keeps its own",
    ),
    Target(
        _MODEL_STATE,
        "ModelState.capture_inner_cudagraphs",
        _INNER_PARAMS,
        (_INNER_STREAM,),
        "takes the model graphs' `stream` (unused by the base class)",
    ),
    CAPTURE_INNER,
    Target(
        "vllm.models.deepseek_v41.nvidia.specialized_decode.runtime.model_state",
        "DeepseekV41SpecializedDecodeModelState.capture_inner_cudagraphs",
        _INNER_PARAMS,
        (
            _INNER_STREAM,
            Hunk(
                """
                super().capture_inner_cudagraphs(
                    input_buffers, block_tables, attn_groups, kv_cache_config
                )
                """,
                """
                super().capture_inner_cudagraphs(
                    input_buffers, block_tables, attn_groups, kv_cache_config, stream=stream
                )
                """,
            ),
        ),
        "forwards `stream` to DeepseekV41ModelState's",
    ),
    CAPTURE_REPLAY_GRAPHS,
)


@contextlib.contextmanager
def quiet_import() -> Iterator[None]:
    """Silence what importing vLLM (and torch under it) logs and warns on a machine without a GPU.

    vLLM 0.33's import logs that `vllm._C` is missing and torch warns about
    deprecations and a missing CUDA runtime: lines before the command's
    answer that say nothing about the patch. Errors still raise.
    """
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(before)


def _version() -> str:
    return getattr(sys.modules.get("vllm"), "__version__", "?")


def _refuse_other_model_states(owners: dict[str, Any]) -> None:
    """Refuse when a loaded model state overrides `capture_inner_cudagraphs` without taking a stream."""
    patched = set(owners.values())
    pending, seen = list(owners["ModelState.capture_inner_cudagraphs"].__subclasses__()), set()
    while pending:
        cls = pending.pop()
        if cls in seen:
            continue
        seen.add(cls)
        pending.extend(cls.__subclasses__())
        method = vars(cls).get("capture_inner_cudagraphs")
        if method is None or cls in patched:
            continue
        params = inspect.signature(method).parameters
        if "stream" not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            raise KitError(
                f"unsupported model state: {cls.__module__}.{cls.__qualname__}.capture_inner_cudagraphs "
                "takes no stream, and the patched runner would pass one; nothing was patched"
            )


VLLM = Codebase("vllm", lambda: f"vLLM {_version()}", TARGETS, check=_refuse_other_model_states)
apply = VLLM.apply
revert = VLLM.revert
is_applied = VLLM.is_applied
patched = VLLM.patched
diff = VLLM.diff

"""PR 63155 applied to the kit's replica, in-process, by the same edits as to vLLM.

The replica's functions are vLLM 0.33's in shape, so `kit.patch.pr` applies
the PR to them as it does to vLLM, with vLLM's hunks (`kit.patch.vllm`) where
the replica's lines are vLLM's:

- `graph_capture(device, stream=None)` reuses a given stream (in
  `parallel_state` and in `cudagraph_utils`, which imported it by name);
- `CudaGraphManager.capture(..., stream=None)` captures on it and records the
  stream it used in `capture_stream`;
- `GPUModelRunner.capture_model()` hands the model graphs' `capture_stream` to
  `model_state.capture_inner_cudagraphs(stream=None)`;
- `DeepseekV41ModelState.capture_inner_cudagraphs` passes it on to
  `capture_replay_graphs(prepare, stream=None)`, unless aux hidden states are
  made before the replay layers.

That decision is `replay_stream(policy, has_early_aux(model_state), stream)`
(`kit.patch.policy`, exported here for the experiments): `pr` (the PR's
rule), or, for experiments, `share` (always the model graphs' stream, early
aux or not) or `separate` (always a stream of their own).

    with kit.patch.replica.patched(policy="pr"):
        runner.capture_model()
"""

from __future__ import annotations

from dataclasses import replace

from kit.patch import vllm
from kit.patch.policy import has_early_aux, replay_stream
from kit.patch.pr import Codebase, Target
from kit.patch.source import Hunk

_STREAM_PARAM = "stream: torch.cuda.Stream | None = None"

TARGETS = (
    replace(vllm.GRAPH_CAPTURE, module="kit.replica.parallel_state"),
    replace(
        vllm.CAPTURE,
        module="kit.replica.cudagraph_utils",
        hunks=(
            vllm.CAPTURE_TAKES_A_STREAM,
            Hunk(
                "with graph_capture(device=self.device):",
                """
                with graph_capture(device=self.device, stream=stream) as context:
                    self.capture_stream = context.stream
                """,
            ),
        ),
    ),
    Target(
        "kit.replica.model_runner",
        "GPUModelRunner.capture_model",
        ("self", "profile_only"),
        (
            Hunk(
                "self.model_state.capture_inner_cudagraphs()",
                "self.model_state.capture_inner_cudagraphs(stream=self.cudagraph_manager.capture_stream)",
            ),
        ),
        "hands the model graphs' `capture_stream` to `capture_inner_cudagraphs()`",
    ),
    replace(
        vllm.CAPTURE_INNER,
        module="kit.replica.model_state",
        params=("self",),
        hunks=(
            Hunk(
                "def capture_inner_cudagraphs(self) -> None:",
                f"def capture_inner_cudagraphs(self, {_STREAM_PARAM}) -> None:",
            ),
            vllm.REPLAY_GRAPHS_GET_THE_STREAM,
        ),
    ),
    replace(
        vllm.CAPTURE_REPLAY_GRAPHS,
        module="kit.replica.decoder_replay_cudagraph",
        hunks=(
            Hunk(
                "def capture_replay_graphs(self, prepare: Callable[[int], None]) -> None:",
                f"def capture_replay_graphs(self, prepare: Callable[[int], None], {_STREAM_PARAM}) -> None:",
            ),
            vllm.REPLAY_CAPTURE_ON_THE_STREAM,
        ),
    ),
)

REPLICA = Codebase("kit.replica", lambda: "replica", TARGETS)
apply = REPLICA.apply
revert = REPLICA.revert
is_applied = REPLICA.is_applied
patched = REPLICA.patched
diff = REPLICA.diff

__all__ = ["TARGETS", "apply", "diff", "has_early_aux", "is_applied", "patched", "replay_stream", "revert"]

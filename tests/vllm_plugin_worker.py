"""A vLLM worker process on the CPU, as tests/test_vllm_plugin.py starts one per rank.

    python -m tests.vllm_plugin_worker RANK        # KIT_CAPTURE_DIR / KIT_VLLM_PATCH set by the caller

As vLLM's `WorkerWrapperBase.init_worker` does, it calls vLLM's own
`load_general_plugins()` (twice: vLLM says a plugin may be loaded more than
once) before any runner code is imported; then, with CUDA stood in
(tests/helpers.py's `FakeCuda`: streams, graphs, memory history) and vLLM's
world group set to RANK, it runs the estimate and the capture through vLLM's
own `GPUModelRunner.profile_cudagraph_memory` and `capture_model` around the
stand-in DeepSeek-V4.1 runner of tests/vllm_standins.py. No kit function is
called: whatever is recorded and patched, the plugin did. The estimate's
body (`_profile_cudagraph_memory`, which needs a KV cache) is stood in by one
that captures with `profile_only=True` as vLLM's does and returns ESTIMATE.
Prints one JSON line: what the worker saw (how many streams the real
capture's `graph_capture()` calls made, whether vLLM's capture_model is wrapped).
"""

from __future__ import annotations

import contextlib
import json
import sys
from types import SimpleNamespace

ESTIMATE = 3 << 20


def main(rank: int) -> None:
    import logging

    from vllm.plugins import load_general_plugins

    logging.basicConfig(level=logging.INFO)  # vLLM's worker process configures its logging at INFO

    load_general_plugins()
    load_general_plugins()

    import pytest
    import torch
    from vllm.distributed import parallel_state

    from tests import vllm_standins as standin
    from tests.helpers import FakeCuda

    mp = pytest.MonkeyPatch()
    FakeCuda(mp)
    mp.setattr(torch.accelerator, "empty_cache", lambda: None)
    mp.setattr(torch.accelerator, "get_memory_info", lambda device=None: (0, 0))
    standin.install_groups(mp)
    standin.install_workspace(mp)
    world = object.__new__(parallel_state.GroupCoordinator)
    world.__dict__.update(unique_name="world", rank_in_group=rank, device_communicator=None)
    mp.setattr(parallel_state, "_WORLD", world)

    runner = standin.deepseek_runner()  # imports vLLM's V2 runner: the plugin's hook runs here
    runner.eplb = SimpleNamespace(suppress=contextlib.nullcontext)  # no expert load balancing
    from vllm.v1.worker.gpu import model_runner

    def estimate(runner) -> int:
        runner.capture_model(profile_only=True)
        return ESTIMATE

    mp.setattr(model_runner, "_profile_cudagraph_memory", estimate)
    runner.profile_cudagraph_memory()
    entered = standin.spy_group_capture(mp)  # (group, stream) per graph_capture() of the real capture
    runner.capture_model()
    print(
        json.dumps(
            {
                "rank": rank,
                "streams": len({id(stream) for _, stream in entered}),  # model, replay, speculator: 3 unpatched
                "wrapped_by": model_runner.GPUModelRunner.capture_model.__code__.co_filename,
            }
        )
    )


if __name__ == "__main__":
    main(int(sys.argv[1]))

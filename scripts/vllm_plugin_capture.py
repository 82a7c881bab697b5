"""vLLM 0.33's estimate and capture on the GPU with the kit's plugin turned on by environment variables alone.

    KIT_CAPTURE_DIR=DIR [KIT_VLLM_PATCH=pr] python scripts/vllm_plugin_capture.py

Run by `KIT_VLLM_RUN=plugin bash scripts/vllm_on_device.sh OUT` (which installs
the kit, so that its entry point is found, and puts vLLM's sources on the
path). As a vLLM worker does, it loads vLLM's general plugins
(`vllm.plugins.load_general_plugins`: the installed kit's `kit.vllm_plugin`)
before vLLM's runner is imported, builds vLLM's V2 runner around the stand-in
DeepSeek-V4.1 (`kit.experiments.vllm.capture.build_runner`: the model, as in
every recording of kit/recordings/vllm), and runs vLLM's own
`GPUModelRunner.profile_cudagraph_memory` (the estimate
`Worker.determine_available_memory` takes off the KV cache) and then
`capture_model()`. Nothing here records or patches: whatever lands in
KIT_CAPTURE_DIR, the plugin wrote.

Stood in for the estimate, because the stand-in has no KV cache: vLLM's
`_init_minimal_kv_cache_for_profiling` does nothing, and after the estimate
this script does what the real `initialize_kv_cache` would for the stand-in
(a new `ModelCudaGraphManager`, the empty KV-cache config back); vLLM's
teardown (`_teardown_profiling_state`) runs as installed. The runner has no
expert load balancing (`eplb`). Each is listed, with
the step that failed, if one did (the capture is tried after a failed
estimate all the same), in `DIR.run.json` beside the folder (a `.json` in it
would be read as a rank's snapshot).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
STAND_INS = {
    "_init_minimal_kv_cache_for_profiling": "does nothing: the stand-in has no KV cache",
    "initialize_kv_cache (after the estimate)": "a new ModelCudaGraphManager(config, device, PIECEWISE) and the "
    "stand-in's empty KVCacheConfig, as the real one makes them",
    "GPUModelRunner.eplb": "no expert load balancing: suppress() is a null context",
}


def main() -> int:
    folder = Path(os.environ["KIT_CAPTURE_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    from kit.experiments.vllm import importing as vllm_import
    from kit.fileio import atomic_write

    vllm_import.set_vllm_env()
    vllm_import.stub_missing_extensions()
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # before any runner module: the plugin's hook runs at its import
    vllm_import.import_vllm()
    import torch
    from vllm.config import CUDAGraphMode
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.worker.gpu import cudagraph_utils
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager

    from kit.experiments.vllm.capture import StandInConfig, build_runner

    cudagraph_utils._init_minimal_kv_cache_for_profiling = lambda runner: None
    runner = build_runner(StandInConfig())
    config = runner.vllm_config
    runner.__dict__.update(
        eplb=SimpleNamespace(suppress=contextlib.nullcontext),
        compilation_config=config.compilation_config,
        cache_config=config.cache_config,
    )
    done: dict = {"stand_ins": STAND_INS, "failed": None}
    try:
        done["estimate"] = int(runner.profile_cudagraph_memory())
    except Exception:
        done["failed"] = {"step": "profile_cudagraph_memory", "error": traceback.format_exc()[-3000:]}
    runner.cudagraph_manager = ModelCudaGraphManager(config, runner.device, CUDAGraphMode.PIECEWISE, 1)
    runner.kv_cache_config = KVCacheConfig(0, [], [])
    torch.cuda.synchronize()
    try:
        done["capture_model"] = int(runner.capture_model())
    except Exception:
        done["failed"] = done["failed"] or {"step": "capture_model", "error": traceback.format_exc()[-3000:]}
    with atomic_write(folder.with_name(f"{folder.name}.run.json")) as f:
        f.write(json.dumps(done, indent=1) + "\n")
    print(json.dumps(done)[:2000])
    return 1 if done["failed"] else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())

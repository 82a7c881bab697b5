"""The replica presets of vLLM's own defaults, computed by vLLM 0.33's config code, into kit/replica/vllm_presets.json.

What a user gets from `vllm serve` of DeepSeek-V4.1 without sizing flags, on
one GPU of each kind, as vLLM 0.33 computes it (nothing restated):

1. the scheduler's `max_num_seqs` and `max_num_batched_tokens`:
   `EngineArgs._set_default_max_num_seqs_and_batched_tokens_args`
   (vllm/engine/arg_utils.py), whose `get_batch_defaults` picks them by the
   device's total memory (>= 160 GiB: B200/GB200; >= 70 GiB: H100/H200);
2. the model graphs' capture sizes and `max_cudagraph_capture_size`:
   `VllmConfig._set_cudagraph_sizes` (vllm/config/vllm.py), whose default
   ceiling is 1024 on the data-center Blackwell family
   (`current_platform.is_device_capability_family(100)`: B200, GB200) and 512
   elsewhere (an H200 is 9.0), capped by `max_num_seqs * 2` and
   `max_num_batched_tokens`;
3. the trim threshold: `CompilationConfig().decoder_replay_trim_threshold`
   (vllm/config/compilation.py);
4. the replay graphs' sizes: `DecoderReplayCudaGraphManager.__init__`
   (vllm/models/deepseek_v41/nvidia/decoder_replay_cudagraph.py), run on
   those configs up to its call of `CudaGraphManager.__init__`, whose replay
   config is read, with V4.1's `sliding_window` of 128 as the window.

The device is stood in for `vllm.platforms.current_platform` (capability,
total memory, name), so this runs on a CPU. The replica (kit/replica/model.py)
must import without vLLM on the H200, hence the checked-in JSON;
tests/test_vllm_presets.py recomputes it with vLLM and compares.

    python scripts/vllm_presets.py            # rewrite kit/replica/vllm_presets.json
    python scripts/vllm_presets.py --check    # exit 1 if the JSON differs from what vLLM computes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from copy import copy
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kit.fileio import atomic_write  # noqa: E402

PRESETS_JSON = ROOT / "kit" / "replica" / "vllm_presets.json"
WINDOW = 128  # DeepSeek-V4.1's config.sliding_window, the DecoderReplayLayers window (nvidia/model.py)
CALLS = [
    "vllm.engine.arg_utils.EngineArgs._set_default_max_num_seqs_and_batched_tokens_args (usage context: vllm serve)",
    "vllm.config.vllm.VllmConfig._set_cudagraph_sizes",
    "vllm.config.compilation.CompilationConfig().decoder_replay_trim_threshold",
    "vllm.models.deepseek_v41.nvidia.decoder_replay_cudagraph.DecoderReplayCudaGraphManager.__init__",
]


@dataclass(frozen=True)
class Device:
    name: str
    capability: tuple[int, int]
    memory_gib: float


DEVICES = {
    "h200-default": Device("NVIDIA H200", (9, 0), 139.8),
    "gb200-default": Device("NVIDIA GB200", (10, 0), 184.0),
}


class _ReplayConfigSeen(Exception):
    """Raised in place of `CudaGraphManager.__init__`, carrying the replay config it was handed."""

    def __init__(self, config) -> None:
        super().__init__("replay config")
        self.config = config


@contextlib.contextmanager
def _on_device(device: Device):
    """vLLM's `current_platform` answering for `device` (a CUDA GPU, not a CPU or TPU)."""
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability
    from vllm.utils.mem_constants import GiB_bytes

    # vLLM's own is_device_capability(_family) read the capability from get_device_capability.
    answers = {
        "get_device_total_memory": lambda *a, **k: int(device.memory_gib * GiB_bytes),
        "get_device_name": lambda *a, **k: device.name,
        "get_device_capability": lambda *a, **k: DeviceCapability(*device.capability),
        "is_tpu": lambda *a, **k: False,
        "is_cpu": lambda *a, **k: False,
    }
    with contextlib.ExitStack() as stack:
        for name, answer in answers.items():
            stack.enter_context(mock.patch.object(type(current_platform), name, staticmethod(answer)))
        yield


def scheduler_defaults(device: Device) -> SimpleNamespace:
    """`max_num_seqs` and `max_num_batched_tokens` as `vllm serve` sets them on `device` (no flags)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    args = SimpleNamespace(
        pipeline_parallel_size=1,
        tensor_parallel_size=1,
        max_num_batched_tokens=None,
        max_num_seqs=None,
        performance_mode=EngineArgs.performance_mode,
        enable_chunked_prefill=True,
        get_batch_defaults=EngineArgs.get_batch_defaults,
    )
    model = SimpleNamespace(max_model_len=1 << 20, is_multimodal_model=False, is_mm_prefix_lm=False)
    with _on_device(device):
        EngineArgs._set_default_max_num_seqs_and_batched_tokens_args(
            args, UsageContext.OPENAI_API_SERVER, model, SimpleNamespace(use_batched_dp_moe=False)
        )
    return SimpleNamespace(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens)


def model_graph_config(device: Device, scheduler) -> SimpleNamespace:
    """A config whose `compilation_config` vLLM's `_set_cudagraph_sizes` has sized for `device`."""
    from vllm.config import CompilationConfig, VllmConfig

    config = SimpleNamespace(
        model_config=SimpleNamespace(enforce_eager=False),
        compilation_config=CompilationConfig(),
        scheduler_config=scheduler,
        performance_mode=VllmConfig.performance_mode,
        speculative_config=None,
        uniform_decode_query_len=1,  # no speculative decoding: one query per decode request
    )
    with _on_device(device):
        VllmConfig._set_cudagraph_sizes(config)
    return config


def replay_sizes(config, window: int = WINDOW) -> list[int]:
    """The replay graphs' sizes `DecoderReplayCudaGraphManager.__init__` picks for `config`."""
    from vllm.models.deepseek_v41.nvidia import decoder_replay_cudagraph as replay
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    def seen(self, replay_config, *args, **kwargs):
        raise _ReplayConfigSeen(replay_config)

    manager = object.__new__(replay.DecoderReplayCudaGraphManager)
    layers = SimpleNamespace(window=window)
    with mock.patch.object(CudaGraphManager, "__init__", seen):
        try:
            replay.DecoderReplayCudaGraphManager.__init__(manager, config, "cpu", layers)
        except _ReplayConfigSeen as e:
            return list(e.config.compilation_config.cudagraph_capture_sizes)
    raise RuntimeError("DecoderReplayCudaGraphManager.__init__ never reached CudaGraphManager.__init__")


def compute_preset(device: Device) -> dict:
    """One preset's numbers from vLLM's code, with the device it stands for."""
    scheduler = scheduler_defaults(device)
    config = model_graph_config(device, scheduler)
    compilation = config.compilation_config
    return {
        "device": {"name": device.name, "capability": list(device.capability), "memory_gib": device.memory_gib},
        "max_num_seqs": scheduler.max_num_seqs,
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "max_cudagraph_capture_size": compilation.max_cudagraph_capture_size,
        "cudagraph_capture_sizes": list(compilation.cudagraph_capture_sizes),
        "decoder_replay_trim_threshold": compilation.decoder_replay_trim_threshold,
        "window": WINDOW,
        "decoder_replay_cudagraph_capture_sizes": replay_sizes(copy(config)),
    }


def compute_presets() -> dict:
    """Every preset of `DEVICES`, with the provenance: vLLM's version and the functions called."""
    import vllm

    return {
        "provenance": {
            "vllm_version": vllm.__version__,
            "calls": CALLS,
            "command": "python scripts/vllm_presets.py",
            "window": "DeepSeek-V4.1's config.sliding_window (128), the DecoderReplayLayers window",
        },
        "presets": {name: compute_preset(device) for name, device in DEVICES.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the checked-in JSON instead of writing it")
    args = parser.parse_args(argv)
    text = json.dumps(compute_presets(), indent=1) + "\n"
    if args.check:
        same = PRESETS_JSON.exists() and PRESETS_JSON.read_text() == text
        print(f"{PRESETS_JSON}: {'as vLLM computes it' if same else 'DIFFERS from what vLLM computes'}")
        return 0 if same else 1
    with atomic_write(PRESETS_JSON) as out:
        out.write(text)
    print(f"wrote {PRESETS_JSON}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

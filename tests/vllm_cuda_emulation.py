"""The GPU machine's view of vLLM 0.33, on a CPU: vLLM's CUDA platform, and no compiled extension.

A pytest plugin (`-p tests.vllm_cuda_emulation`, in a fresh process: vLLM
resolves its platform once per process). NVML answers one sm90 GPU named
like the kit's H200, so vLLM resolves `NvmlCudaPlatform` and takes its
CUDA-only import paths, as it does there; the installed wheel's compiled
extensions are shadowed by the bundle's empty stand-ins
(`_vllm_stub.stub_extensions`), as on the GPU machine, which has none.
`tests/test_vllm_bundle.py` runs its import and capture tests under it.
Nothing else of CUDA is stood in here beyond what those tests stand in.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EMULATED = "KIT_VLLM_CUDA_EMULATED"


def emulate_gpu_machine() -> None:
    """NVML with one H200 (sm90), and every compiled extension of the installed wheel stood in."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import vllm_bundle

    from kit.experiments.vllm import capture as vllm_capture

    _site, info = vllm_bundle.installed_vllm()
    vllm_capture.stub_support().stub_extensions(vllm_bundle.extension_modules(info), shadow=True)
    import vllm.third_party.pynvml as nvml

    handle = object()
    nvml.nvmlInit = nvml.nvmlShutdown = lambda *args, **kwargs: None
    nvml.nvmlDeviceGetCount = lambda: 1
    nvml.nvmlDeviceGetHandleByIndex = lambda index: handle
    nvml.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    nvml.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    os.environ[EMULATED] = "1"


emulate_gpu_machine()

"""Stub of cutlass (NVIDIA CUTLASS DSL).

The kernels of DeepSeek-V4.1's specialized decode (routed-expert GEMMs), imported by its model
state, which kit.patch.vllm patches; the stand-in model runs none of them.
"""

from _vllm_stub import install

install(__name__, __doc__)

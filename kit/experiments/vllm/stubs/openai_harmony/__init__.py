"""Stub of openai_harmony.

VLLM's gpt-oss chat format and MCP tool server (vllm.entrypoints, vllm.reasoning), imported by
vllm.config; the capture path serves no chat.
"""

from _vllm_stub import install

install(__name__, __doc__)

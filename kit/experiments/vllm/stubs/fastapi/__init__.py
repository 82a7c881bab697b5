"""Stub of fastapi.

The OpenAI-compatible server (vllm.entrypoints.serve), imported by the protocol types the parsers
use; the capture path serves nothing.
"""

from _vllm_stub import install

install(__name__, __doc__)

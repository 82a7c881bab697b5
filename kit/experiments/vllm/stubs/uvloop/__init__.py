"""Stub of uvloop.

Vllm.v1.utils runs the API server's event loop on it; the capture path runs no event loop.
"""

from _vllm_stub import install

install(__name__, __doc__)

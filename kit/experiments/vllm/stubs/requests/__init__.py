"""Stub of requests.

Vllm.connections imports it for HTTP downloads of media and weights; the capture path makes none.
"""

from _vllm_stub import install

install(__name__, __doc__)

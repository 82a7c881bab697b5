"""Stub of llguidance.

A structured-output grammar backend (vllm.v1.structured_output), imported by the scheduler's request
types; the capture path decodes nothing.
"""

from _vllm_stub import install

install(__name__, __doc__)

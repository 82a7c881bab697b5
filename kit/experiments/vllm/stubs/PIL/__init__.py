"""Stub of PIL (Pillow).

Vllm.multimodal's image hashing and loading, imported by the scheduler's output types; the stand-in
model takes no images.
"""

from _vllm_stub import install

install(__name__, __doc__)

"""Stub of partial_json_parser.

Vllm.tool_parsers reads streamed tool-call JSON with it; the capture path parses no output.
"""

from _vllm_stub import install

install(__name__, __doc__)

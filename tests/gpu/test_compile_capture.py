"""The capture recorder on torch.compile(mode="reduce-overhead"): one capture per recorded graph.

torch.compile's cudagraph trees record a graph per input shape (and may record
a shape again: on the H200, torch 2.11, two shapes gave three graphs) into a
pool of their own. The recorder labels each graph "torch.compile graphs", a capture
of its own with no eager break, and names neither its pool "global graph pool"
(vLLM's) nor its stream "unlabelled graphs stream". The same logic on the CPU:
tests/test_recorder_names.py. Runs in a fresh process, as
tests/gpu/test_capture_recorder.py does.
"""

from __future__ import annotations

import pytest
import torch

from kit import CaptureRecorder
from kit.analysis.names import pool_labels, stream_labels
from tests.gpu.test_capture_recorder import in_fresh_process

pytestmark = pytest.mark.gpu


def compiled_model_records_one_capture_per_graph():
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)).cuda()
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
    inputs = [torch.randn(8, 256, device="cuda"), torch.randn(32, 256, device="cuda")]
    with torch.no_grad(), CaptureRecorder() as rec:
        for x in inputs:
            for _ in range(3):  # the trees warm up first, then record a graph, then replay it
                compiled(x)
            torch.cuda.synchronize()
    snap = rec.snapshot
    captures = snap.kit["captures"]
    assert len(captures) >= len(inputs), captures
    assert [(c["capture"], c["manager"], c["size"], c["index"]) for c in captures] == [
        (f"torch.compile graph {i}", "torch.compile graphs", None, 0) for i in range(1, len(captures) + 1)
    ], captures
    assert all(a["trace_end"] <= b["trace_begin"] for a, b in zip(captures, captures[1:], strict=False))
    table = rec.captures()
    assert len(table) == len(captures) and (table["eager_breaks"] == 0).all()
    assert "global graph pool" not in snap.kit["pools"]
    assert "global graph pool" not in pool_labels(snap).values()
    assert "unlabelled graphs stream" not in stream_labels(snap).values()
    assert rec.errors == []


def test_compiled_model_records_one_capture_per_graph():
    in_fresh_process(compiled_model_records_one_capture_per_graph)

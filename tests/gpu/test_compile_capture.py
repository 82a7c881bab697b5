"""The capture recorder on torch.compile(mode="reduce-overhead"): one capture per recorded graph.

torch.compile's cudagraph trees record one graph per input shape into a pool
of their own. The recorder labels each graph "torch.compile graphs", a capture
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


def compiled_model_records_two_separate_captures():
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
    assert [(c["capture"], c["manager"], c["size"], c["index"]) for c in captures] == [
        ("torch.compile graph 1", "torch.compile graphs", None, 0),
        ("torch.compile graph 2", "torch.compile graphs", None, 0),
    ], captures
    table = rec.captures()
    assert len(table) == 2 and (table["eager_breaks"] == 0).all()
    assert "global graph pool" not in snap.kit["pools"]
    assert "global graph pool" not in pool_labels(snap).values()
    assert "unlabelled graphs stream" not in stream_labels(snap).values()
    assert rec.errors == []


def test_compiled_model_records_two_separate_captures():
    in_fresh_process(compiled_model_records_two_separate_captures)

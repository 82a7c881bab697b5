"""The capture recorder on plain torch code: `torch.cuda.graph` and raw `CUDAGraph` captures.

Each test runs in a fresh process: a graph pool's segments outlive its graphs
here, and later live tests need an allocator that starts empty.
"""

from __future__ import annotations

import multiprocessing

import pandas as pd
import pytest
import torch

from kit import CaptureRecorder, KitError

pytestmark = pytest.mark.gpu


def in_fresh_process(fn) -> None:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pool.apply(fn)  # re-raises the child's assertion error here


def recorder_sees_torch_cuda_graph_and_raw_captures_and_restores_torch():
    begin, end = torch.cuda.CUDAGraph.capture_begin, torch.cuda.CUDAGraph.capture_end
    x = torch.randn(256, 256, device="cuda")
    stream = torch.cuda.Stream()
    pool = torch.cuda.graph_pool_handle()
    with CaptureRecorder() as rec:
        g1 = torch.cuda.CUDAGraph()
        with rec.label("my graphs", 256), torch.cuda.graph(g1, pool=pool, stream=stream):
            y = (x * 2).relu()  # elementwise: no cuBLAS handle to create inside the capture
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            g2.capture_begin(pool=pool)
            z = torch.empty(4 << 20, device="cuda")
            g2.capture_end()
    assert torch.cuda.CUDAGraph.capture_begin is begin and torch.cuda.CUDAGraph.capture_end is end
    table = rec.captures()
    assert list(table["manager"]) == ["my graphs", "unlabelled graphs"]
    assert table["size"].iloc[0] == 256 and pd.isna(table["size"].iloc[1])
    assert set(table["stream"]) == {stream.cuda_stream}
    assert all(tuple(p) == tuple(pool) for p in table["pool"])
    assert table["new_segment_bytes"].iloc[1] >= 4 << 20
    assert "my graphs stream" in set(rec.table()["stream_label"])
    del g1, g2, y, z


def recorder_stops_cleanly_after_an_exception():
    begin = torch.cuda.CUDAGraph.capture_begin
    with pytest.raises(RuntimeError, match="inside"), CaptureRecorder():
        raise RuntimeError("inside")
    assert torch.cuda.CUDAGraph.capture_begin is begin
    with pytest.raises(KitError, match="not recording"):
        CaptureRecorder().stop()


def test_recorder_sees_torch_cuda_graph_and_raw_captures_and_restores_torch():
    in_fresh_process(recorder_sees_torch_cuda_graph_and_raw_captures_and_restores_torch)


def test_recorder_stops_cleanly_after_an_exception():
    in_fresh_process(recorder_stops_cleanly_after_an_exception)

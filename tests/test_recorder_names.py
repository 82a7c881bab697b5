"""What the capture recorder names, and what it leaves unnamed, on the CPU.

The recorder runs for real on tests/test_faults.py's `FakeCuda`. A pool is
"global graph pool" only when it is vLLM's (or the replica's) global pool; a
stream only unlabelled graphs captured on keeps no recorder name; every graph
the recorder cannot attribute to a manager (unlabelled, or torch.compile's
cudagraph trees) is a capture of its own, so it has no eager break.
The same for a real torch.compile program: tests/gpu/test_compile_capture.py.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from kit import CaptureRecorder
from kit.analysis.attribution import captures_by_name
from kit.analysis.names import pool_labels
from kit.load.snapshot import Snapshot
from kit.record.recorder import label_from_stack
from kit.replica import cudagraph_utils
from tests.helpers import MIB, FakeCuda, FakeStream, capture_replica_like, segment

TREES = "/site-packages/torch/_inductor/cudagraph_trees.py"


@pytest.fixture
def cuda(monkeypatch):
    """The fake CUDA, in a process where no global graph pool was made yet (an earlier test's would name ours)."""
    monkeypatch.setattr(cudagraph_utils, "_global_graph_pool", None)
    platforms = sys.modules.get("vllm.platforms")
    platform = vars(platforms).get("_current_platform") if platforms is not None else None
    if platform is not None:
        monkeypatch.setattr(type(platform), "_global_graph_pool", None, raising=False)
    return FakeCuda(monkeypatch)


def trees_module() -> dict:
    """A stand-in for torch/_inductor/cudagraph_trees.py: `CUDAGraphNode._record` captures one graph per shape."""
    source = (
        "def _record(graph, pool, stream):\n"
        "    with stream_context(stream):\n"
        "        graph.capture_begin(pool=pool)\n"
        "        graph.capture_end()\n"
        "def in_trees(fn):\n"
        "    return fn()\n"
    )
    namespace = {"stream_context": torch.cuda.stream}
    exec(compile(source, TREES, "exec"), namespace)  # noqa: S102 - the frames must come from that file name
    return namespace


def with_segments(snap: Snapshot) -> Snapshot:
    """The recording with one segment per pool its graphs used (FakeCuda keeps none), for the pool labels."""
    pools = dict.fromkeys(tuple(c["pool"]) for c in snap.kit["captures"])
    segments = [segment(0x1000_0000 * (i + 1), [(2 * MIB, "inactive")], pool=p) for i, p in enumerate(pools)]
    return Snapshot({**snap.raw, "segments": segments})


def raw_capture(pool=None) -> None:
    graph = torch.cuda.CUDAGraph()
    graph.capture_begin(pool=pool)
    graph.capture_end()


def test_unlabelled_graphs_are_captures_of_their_own_on_an_unnamed_stream(cuda):
    stream = FakeStream()
    with CaptureRecorder() as rec, torch.cuda.stream(stream):
        pool = torch.cuda.graph_pool_handle()
        raw_capture(pool)
        raw_capture(pool)  # the same stream, pool and (no) manager: still not an eager break
    kit = rec.snapshot.kit
    assert [(c["graph"], c["capture"], c["index"]) for c in kit["captures"]] == [
        ("unlabelled graphs graph 0", "unlabelled graphs graph 0", 0),
        ("unlabelled graphs graph 1", "unlabelled graphs graph 1", 0),
    ]
    assert [len(graphs) for graphs in captures_by_name(rec.snapshot).values()] == [1, 1]
    assert kit["streams"] == {} and kit["pools"] == {}


def test_torch_compile_trees_graphs_are_each_a_capture_with_no_size_and_no_pool_name(cuda):
    trees = trees_module()
    stream = FakeStream()
    with CaptureRecorder() as rec:
        pool = torch.cuda.graph_pool_handle()  # the trees' own pool
        trees["_record"](torch.cuda.CUDAGraph(), pool, stream)  # shape 1
        trees["_record"](torch.cuda.CUDAGraph(), pool, stream)  # shape 2
    kit = rec.snapshot.kit
    rows = [(c["graph"], c["capture"], c["manager"], c["size"], c["index"]) for c in kit["captures"]]
    assert rows == [
        ("torch.compile graph 1", "torch.compile graph 1", "torch.compile graphs", None, 0),
        ("torch.compile graph 2", "torch.compile graph 2", "torch.compile graphs", None, 0),
    ]
    assert kit["pools"] == {}
    assert kit["streams"] == {"torch.compile graphs stream": stream.cuda_stream}
    assert list(pool_labels(with_segments(rec.snapshot)).values()) == ["default pool", "graph pool 1"]


def test_torch_compile_on_the_stack_wins_over_a_manager_further_out():
    trees = trees_module()

    class ModelCudaGraphManager:
        def capture(self):
            num_tokens = 8  # noqa: F841 - read off the frame by the recorder
            return trees["in_trees"](label_from_stack)

    assert ModelCudaGraphManager().capture() == ("torch.compile graphs", None)
    assert trees["in_trees"](lambda: label_from_stack(sys._getframe(1))) == ("torch.compile graphs", None)


def test_the_replicas_global_pool_is_the_global_graph_pool(cuda):
    with CaptureRecorder() as rec:
        capture_replica_like(None)
    kit = rec.snapshot.kit
    assert kit["pools"] == {"global graph pool": list(cudagraph_utils._global_graph_pool)}
    assert list(kit["streams"]) == ["model graphs stream"]
    assert [c["index"] for c in kit["captures"]] == [0, 1, 0, 1]  # each size: two graphs, one eager break
    assert pool_labels(with_segments(rec.snapshot))[tuple(cudagraph_utils._global_graph_pool)] == "global graph pool"


def test_a_managers_own_pool_is_named_after_it_not_global(cuda):
    class EagleCudaGraphManager:
        def capture(self, pool):
            num_tokens = 64  # noqa: F841 - read off the frame by the recorder
            raw_capture(pool)

    with CaptureRecorder() as rec:
        EagleCudaGraphManager().capture(torch.cuda.graph_pool_handle())
    assert rec.snapshot.kit["pools"] == {"eagle graphs pool": list(rec.records[0].pool)}
    assert rec.snapshot.kit["streams"] == {"eagle graphs stream": rec.records[0].stream}


def test_a_pool_unlabelled_graphs_share_with_a_manager_is_left_unnamed(cuda):
    class EagleCudaGraphManager:
        def capture(self, pool):
            num_tokens = 64  # noqa: F841 - read off the frame by the recorder
            raw_capture(pool)

    with CaptureRecorder() as rec:
        pool = torch.cuda.graph_pool_handle()
        EagleCudaGraphManager().capture(pool)
        raw_capture(pool)
    assert rec.snapshot.kit["pools"] == {}
    assert [c["index"] for c in rec.snapshot.kit["captures"]] == [0, 0]


def test_vllms_platform_pool_is_the_global_graph_pool_even_for_unlabelled_graphs(cuda, monkeypatch):
    class CudaPlatform:
        _global_graph_pool = None  # vLLM's lazy class attribute

    platforms = types.ModuleType("vllm.platforms")
    platforms._current_platform = CudaPlatform()
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    with CaptureRecorder() as rec:
        raw_capture(torch.cuda.graph_pool_handle())  # made before vLLM minted its pool: not it
        CudaPlatform._global_graph_pool = torch.cuda.graph_pool_handle()
        raw_capture(CudaPlatform._global_graph_pool)  # vLLM's piecewise wrapper: no manager on the stack
    assert rec.snapshot.kit["pools"] == {"global graph pool": list(CudaPlatform._global_graph_pool)}
    labels = pool_labels(with_segments(rec.snapshot))
    assert sorted(labels.values()) == ["default pool", "global graph pool", "graph pool 1"]


def test_a_label_given_by_the_caller_still_joins_its_graphs(cuda):
    with CaptureRecorder() as rec, rec.label("my graphs", 4):
        raw_capture()
        raw_capture()
    assert [(c["capture"], c["index"]) for c in rec.snapshot.kit["captures"]] == [
        ("my graphs 4", 0),
        ("my graphs 4", 1),
    ]

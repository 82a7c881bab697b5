"""The read/write recorder's blind spot on a GPU: a Triton kernel, launched outside the dispatcher, fills an `empty`.

As vLLM's `hc_collapse_triton` (vllm/model_executor/kernels/mhc/triton.py) fills the `torch.empty` it returns
right after DeepSeek-V4.1's replay break, the kernel here is no aten op: the recorder sees the `empty_like` (its
bytes marked fresh) and the recorded op that reads them, not the kernel. The analysis must report those bytes as
written outside the dispatcher, never as carried across R. The CPU counterpart (a memmove) is in
tests/test_readwrite.py.
"""

from __future__ import annotations

import pytest
import torch

from kit.analysis.readwrite import (
    FRESH,
    Ranges,
    after_replay_reads,
    carried_reads,
    model_after_replay,
    model_outputs,
    model_runs_replay,
    model_segment,
    obligation_verdicts,
    readwrite_table,
    replay_graph,
    unseen_writer_lines,
)
from kit.record.readwrite import ReadWriteRecorder
from kit.units import format_bytes

try:
    import triton
    import triton.language as tl
except ImportError:  # no triton where the GPU tests are deselected; torch ships it on the GPU machine
    triton = None

pytestmark = pytest.mark.gpu

if triton is not None:

    @triton.jit
    def _double_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask) * 2, mask=mask)


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def test_a_triton_kernel_filling_an_empty_is_reported_written_outside_the_dispatcher():
    assert triton is not None, "triton ships with torch on the GPU machine"
    n = 4096
    x = torch.randn(n, device="cuda")
    with ReadWriteRecorder() as rw:
        with rw.phase(model_segment(n, 0)):
            h = x * 2  # carried across R: read again in segment 1
        with rw.phase(model_runs_replay(n, 0)):
            h.sum()
        with rw.phase(model_after_replay(n, 0)):
            out = torch.empty_like(h)  # as hc_collapse_triton's output
            _double_kernel[(triton.cdiv(n, 1024),)](h, out, n, BLOCK=1024)
        with rw.phase(model_segment(n, 1)):
            final = out + h
        with rw.phase(model_outputs(n)):
            rw.note_reads(final, "read after the forward")
        with rw.phase(replay_graph(n // 2)):
            h.zero_()  # R writes the carried value: the obligation sees that one
    torch.cuda.synchronize()
    assert torch.equal(out, x * 4) and torch.equal(final, x * 6)  # the kernel wrote out, read before R zeroed h
    assert all(a.op.startswith("aten.") or a.op == "read after the forward" for a in rw.accesses)  # no kernel seen
    recording, out_bytes = rw.recording(), Ranges([_span(out)])
    assert any(a.kind == FRESH and Ranges([(a.start, a.end)]) == out_bytes for a in recording.accesses)

    carried, unseen = after_replay_reads(recording, n)
    assert not Ranges((p.start, p.end) for p in carried) & out_bytes  # never carried
    assert Ranges((p.start, p.end) for p in carried_reads(recording, n)) & Ranges([_span(h)]) == Ranges([_span(h)])
    assert Ranges((p.start, p.end) for p in unseen) == out_bytes and {p.op for p in unseen} == {"aten.add.Tensor"}
    made = f"aten.empty_like.default in model graph {n} break 0 after the replay layers"
    assert {p.made_by for p in unseen} == {made}
    (line,) = unseen_writer_lines(recording)
    assert line.startswith(f"model graph {n} segment 1: {format_bytes(n * 4)} written outside the dispatcher")

    table = readwrite_table(recording)
    (row,) = table.to_dict("records")
    assert not row["holds"] and row["overlap_bytes"] == n * 4  # h, carried and written by R
    assert row["unseen_writer_bytes"] == n * 4 and row["unseen_writer_ops"] == ["aten.add.Tensor"]
    assert "were written outside the dispatcher" in obligation_verdicts(table)[0]

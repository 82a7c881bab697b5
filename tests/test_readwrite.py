"""The read/write analysis on the CPU: eager tensors, the replica with CUDA stood in for, hand-built traces.

The recorder (`kit.record.readwrite`) sees eager CPU ops exactly as it sees ops during a CUDA
graph capture; their addresses are their `data_ptr`s. The live run on a GPU is
tests/gpu/test_readwrite_live.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kit.analysis.liveness import BREAK_INPUT, HELD, liveness_table
from kit.analysis.readwrite import (
    FRESH,
    MAY_WRITE,
    OBLIGATION,
    READ,
    WRITE,
    Access,
    Ranges,
    ReadWriteRecording,
    after_replay_reads,
    attach_break_reads,
    break_reads,
    carried_reads,
    model_after_replay,
    model_break,
    model_outputs,
    model_runs_replay,
    model_segment,
    obligation_summary,
    obligation_verdicts,
    readwrite_table,
    replay_graph,
    unseen_writer_lines,
    unwritten_returns,
)
from kit.experiments.readwrite_run.result import compare_analyses
from kit.experiments.readwrite_run.run import replica_phases
from kit.patch.policy import has_early_aux
from kit.record.readwrite import ReadWriteRecorder, byte_span, element_spans
from kit.replica.model import ReplicaConfig
from kit.replica.model_runner import GPUModelRunner

from . import helpers
from .helpers import KIB
from .test_liveness import A, B, D, Trace, _kept_bound_capture, _replay_capture

TINY = dataclasses.replace(helpers.TINY, dtype="float32", hyper_connections=True)


def span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def accesses(rw: ReadWriteRecorder, kind: str | None = None, op: str | None = None) -> list[Access]:
    return [a for a in rw.accesses if (kind is None or a.kind == kind) and (op is None or op in a.op)]


# --- byte ranges ----------------------------------------------------------------------------------


def test_ranges_merge_intersect_and_subtract():
    r = Ranges([(10, 20), (15, 30), (40, 50), (5, 5)])
    assert r.spans == [(10, 30), (40, 50)] and r.total == 30
    assert (r & Ranges([(25, 45)])).spans == [(25, 30), (40, 45)]
    assert (r - Ranges([(12, 14), (28, 42)])).spans == [(10, 12), (14, 28), (42, 50)]
    assert (r | Ranges([(30, 40)])).spans == [(10, 50)]
    assert r.intersects(29, 31) and r.intersects(0, 11) and r.intersects(45, 46)
    assert not r.intersects(30, 40) and not r.intersects(0, 10) and not r.intersects(50, 60)  # half-open


# --- the recorder on eager tensors ------------------------------------------------------------------


def _forward_with_a_replay(overwrite_aux: bool) -> ReadWriteRecorder:
    """A model graph whose outputs include `aux`, made before the break, and a replay graph that may write it."""
    x = torch.randn(16, 8)
    with ReadWriteRecorder() as rw:
        with rw.phase(model_segment(16, 0)):
            aux = x * 2  # held across the break, read after it as an output
            hidden = aux + 1
        with rw.phase(model_break(16, 0)):
            out = hidden.sum(0)  # the break reads its input
        with rw.phase(model_segment(16, 1)):
            final = out * 3
        with rw.phase(model_outputs(16)):
            rw.note_reads((final, aux), "read after the forward")
        with rw.phase(replay_graph(8)):
            scratch = torch.zeros(4, 8)
            if overwrite_aux:
                aux[4:6].mul_(0)  # writes two rows of aux's bytes
            scratch.add_(1)
            hidden.mul_(0)  # over the break's input: nothing after the break reads it
    rw.aux, rw.hidden = aux, hidden  # the test reads their addresses; the recorder itself keeps no tensor
    return rw


def test_a_replay_writing_bytes_read_after_the_break_violates_the_obligation():
    rw = _forward_with_a_replay(overwrite_aux=True)
    table = readwrite_table(rw.recording())
    (row,) = table.to_dict("records")
    aux_rows = (rw.aux.data_ptr() + 4 * 32, rw.aux.data_ptr() + 6 * 32)
    assert not row["holds"] and row["overlap_bytes"] == 64 and row["first_overlap"] == aux_rows[0]
    assert row["reading_ops"] == ["read after the forward"] and row["writing_ops"] == ["aten.mul_.Tensor"]
    (verdict,) = obligation_verdicts(table)
    assert verdict.startswith("model graph 16 break 0, replay graph 8: VIOLATED: 64 B carried across the break")
    assert f"{aux_rows[0]:#x}" in verdict and "aten.mul_.Tensor in replay graph 8" in verdict
    assert obligation_summary(table).startswith(OBLIGATION) and "Violated in 1 of 1 pairings" in obligation_summary(
        table
    )


def test_a_replay_writing_elsewhere_or_over_the_breaks_input_holds():
    rw = _forward_with_a_replay(overwrite_aux=False)
    table = readwrite_table(rw.recording())
    assert table["holds"].all() and table["overlap_bytes"].sum() == 0
    assert obligation_verdicts(table)[0].startswith("model graph 16 break 0, replay graph 8: holds:")
    assert "Holds for all 1 pairings" in obligation_summary(table)
    # the break's input is what the break read, and it is not carried across
    carried = Ranges((p.start, p.end) for p in carried_reads(rw.recording(), 16))
    assert carried & Ranges([span(rw.aux)]) == Ranges([span(rw.aux)])
    (reads,) = break_reads(rw.recording()).values()
    assert reads == Ranges([span(rw.hidden)]) and not carried & reads  # what the break read, not what it wrote


def _break_reading_after_the_replay(read_input_after: bool) -> ReadWriteRecorder:
    """A model graph with an attention break, then the replay break: gather, replay layers, then (maybe) a read
    of the break's input after them; a replay graph writes over that input."""
    x = torch.randn(16, 8)
    with ReadWriteRecorder() as rw:
        with rw.phase(model_segment(16, 0)):
            h = x * 2
        with rw.phase(model_break(16, 0)):  # attention: no replay layers run here
            attn = h * 1
        with rw.phase(model_segment(16, 1)):
            hidden = attn + h
        with rw.phase(model_break(16, 1)):
            gathered = hidden[8:].clone()  # the gather, before the replay layers start
        with rw.phase(model_runs_replay(16, 1)):
            rows_out = gathered * 3
        with rw.phase(model_after_replay(16, 1)):
            out = torch.zeros(16, 8)
            out[8:] = rows_out
            if read_input_after:
                out.add_(hidden)  # a read of the break's input after R started
        with rw.phase(model_segment(16, 2)):
            final = out * 2
        with rw.phase(model_outputs(16)):
            rw.note_reads(final, "read after the forward")
        with rw.phase(replay_graph(8)):
            hidden.mul_(0)  # R allocates over, and writes, the break's input
    rw.hidden = hidden
    return rw


def test_a_read_of_a_break_input_after_the_replay_layers_start_violates_the_obligation():
    rw = _break_reading_after_the_replay(read_input_after=True)
    recording = rw.recording()
    assert recording.breaks(16) == [0, 1] and recording.replay_breaks(16) == [1]
    (row,) = readwrite_table(recording).to_dict("records")  # only the replay break is paired
    assert (row["break"], row["holds"], row["overlap_bytes"]) == (1, False, rw.hidden.numel() * 4)
    assert row["reading_ops"] == ["aten.add_.Tensor"]
    carried = Ranges((p.start, p.end) for p in carried_reads(recording, 16, 1))
    assert carried & Ranges([span(rw.hidden)]) == Ranges([span(rw.hidden)])


def test_the_gather_before_the_replay_layers_is_not_carried_and_the_pairing_holds():
    rw = _break_reading_after_the_replay(read_input_after=False)
    (row,) = readwrite_table(rw.recording()).to_dict("records")
    assert row["holds"] and row["break"] == 1
    parts = [model_segment(8, 0), model_break(8, 0), model_runs_replay(8, 0), model_after_replay(8, 0)]
    orders = [p.order for p in [*parts, model_segment(8, 1), model_outputs(8)]]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)


def test_bytes_rewritten_after_the_break_are_not_carried_across_it():
    x, break_output = torch.randn(8, 8), torch.empty(8, 8)
    with ReadWriteRecorder() as rw:
        with rw.phase(model_segment(8, 0)):
            kept = x + 1
        with rw.phase(model_break(8, 0)):
            break_output.copy_(x)  # the break's output buffer, read by the next segment
        with rw.phase(model_segment(8, 1)):
            kept.fill_(2)  # the value read next is made after the break
            kept.sum()
            break_output.sum()
        with rw.phase(replay_graph(4)):
            kept.zero_()
            break_output.zero_()
    assert readwrite_table(rw.recording())["holds"].all()
    carried = Ranges((p.start, p.end) for p in carried_reads(rw.recording(), 8))
    assert not carried & Ranges([span(kept), span(break_output)])


def test_in_place_ops_write_and_read_their_self_out_arguments_are_only_written():
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    out = torch.empty(4, 4)
    with ReadWriteRecorder() as rw, rw.phase(model_segment(4)):
        x.add_(y)
        torch.mul(x, y, out=out)
        out.copy_(y)  # copy_ overwrites without reading
    add, mul, copy = (accesses(rw, op=name) for name in ("add_", "mul.out", "copy_"))
    assert {(a.kind, (a.start, a.end)) for a in add} == {(READ, span(x)), (READ, span(y)), (WRITE, span(x))}
    assert {(a.kind, (a.start, a.end)) for a in mul} == {(READ, span(x)), (READ, span(y)), (WRITE, span(out))}
    assert {(a.kind, (a.start, a.end)) for a in copy} == {(READ, span(y)), (WRITE, span(out))}


def test_views_resolve_to_the_bytes_of_their_elements_in_their_storage():
    base = torch.arange(48, dtype=torch.float32).reshape(6, 8)  # rows of 32 bytes
    with ReadWriteRecorder() as rw, rw.phase(model_segment(6)):
        base[2:4].sum()  # two rows in the middle: one run
        base[:, 1:3].sum()  # a strided column block: 8 bytes in each row
        base.t()[0].sum()  # column 0 seen through a transpose: 4 bytes in each row
        base[1].expand(3, 8).sum()  # stride 0: one row's bytes
    reads = [(a.start - base.data_ptr(), a.end - base.data_ptr()) for a in accesses(rw, READ)]
    columns = [(32 * i + 4, 32 * i + 12) for i in range(6)]
    assert reads == [(64, 128), *columns, *[(32 * i, 32 * i + 4) for i in range(6)], (32, 64)]
    assert byte_span(base[:0]) is None and element_spans(base[:0]) == []
    assert byte_span(base[:, 1:3]) == (base.data_ptr() + 4, base.data_ptr() + 5 * 32 + 12)  # the hull


def test_element_spans_coalesce_contiguous_dimensions_and_stop_at_the_cap(monkeypatch):
    import kit.record.readwrite as recorder

    x = torch.zeros(4, 6, 8)
    p = x.data_ptr()
    assert element_spans(x[1:3]) == [(p + 192, p + 576)]  # two whole blocks of 6 x 8: one run
    assert element_spans(x, limit=1) == [(p, p + 768)]  # contiguous: one run, within a cap of one
    assert element_spans(x[:, 2:4]) == [(p + 192 * i + 64, p + 192 * i + 128) for i in range(4)]  # 2 x 8 per block
    assert element_spans(x.as_strided((3, 4), (2, 1))) == [(p, p + 32)]  # overlapping rows merge
    assert element_spans(x[:, :, 0], limit=24) is not None and element_spans(x[:, :, 0], limit=23) is None
    column = x[:, :, 0]  # 24 runs of one element: over a cap of 8, a read is its hull, a write its hull's may_write
    monkeypatch.setattr(recorder, "MAX_SPANS", 8)
    with ReadWriteRecorder() as rw, rw.phase(model_segment(4)):
        column.add_(1)
    hull = byte_span(column)
    assert {(a.kind, (a.start, a.end)) for a in rw.accesses} == {(READ, hull), (MAY_WRITE, hull)}


def test_ops_that_touch_no_data_and_ops_outside_a_phase_record_nothing_but_an_unwritten_return():
    x = torch.randn(4, 4)
    x.add_(1)  # no recorder
    with ReadWriteRecorder() as rw:
        x.add_(1)  # no phase: not recorded
        with rw.phase(model_segment(4)):
            v = x.view(16)
            x.t_()
            e = torch.empty(8)  # uninitialised: no write, its bytes marked fresh
            w = torch.empty(0).set_(x.untyped_storage(), 0, (4, 4), (4, 1))
        x.mul_(2)  # after the phase: not recorded
    assert w.data_ptr() == x.data_ptr() and v.numel() == 16
    assert [(a.kind, a.op, (a.start, a.end)) for a in rw.accesses] == [(FRESH, "aten.empty.memory_format", span(e))]


def test_phases_are_ordered_segment_break_next_segment_and_the_outputs_last():
    forward = [model_segment(64, 0), model_break(64, 0), model_segment(64, 1), model_break(64, 1), model_segment(64, 2)]
    orders = [phase.order for phase in [*forward, model_outputs(64)]]
    assert orders == sorted(orders) and len(set(orders)) == len(orders), orders


def test_the_shipped_recording_carries_what_is_read_after_the_replay_layers_start():
    """On kit/recordings/readwrite/small.json under the PR, per model graph N: the replay rows' index (8 bytes a
    row, N/2 rows) read by the break's scatter after the replay layers, and the final norm's 2,048 bytes read by
    the last segment (the aux outputs are carried only when early aux shares the stream)."""
    from kit.experiments.readwrite_run.result import load_recording

    recording = ReadWriteRecording.from_records(load_recording("small")["scenarios"]["pr"]["accesses"])
    table = readwrite_table(recording)
    for size in (128, 256, 512):
        # one break per layer before the replay layers (their attention), then the replay break, the only one paired
        assert recording.breaks(size) == [0, 1, 2, 3] and recording.replay_breaks(size) == [3]
        rows = table[table["model_size"] == size]
        assert (rows["break"] == 3).all() and (rows["carried_bytes"] == 2048 + 8 * (size // 2)).all()
        assert {(p.phase, p.op, p.end - p.start) for p in carried_reads(recording, size, 3)} == {
            (f"model graph {size} break 3 after the replay layers", "aten.index_copy_.default", 8 * (size // 2)),
            (f"model graph {size} segment 4", "aten._fused_rms_norm.default", 2048),
        }


def test_a_recording_round_trips_through_json_records():
    recording = _forward_with_a_replay(overwrite_aux=True).recording()
    again = ReadWriteRecording.from_records(recording.to_records())
    assert again.accesses == recording.accesses
    assert readwrite_table(again).equals(readwrite_table(recording.to_records()))


def test_can_run_limits_the_verdicts_to_the_pairings_that_can_run():
    recording = _forward_with_a_replay(overwrite_aux=True).recording()
    table = readwrite_table(recording, can_run=lambda model_size, replay_size: replay_size > model_size)
    assert len(table) == 1 and not table["can_run"].any() and not table["holds"].any()
    assert obligation_verdicts(table) == [] and "no pairing can run" in obligation_summary(table)


# --- the replica, CUDA stood in for --------------------------------------------------------------


def _captured(monkeypatch, config: ReplicaConfig, spy=None):
    """Capture the replica on the CPU (tests/helpers.py's FakeCuda) under the read/write recorder."""
    from kit.replica.decoder_replay_cudagraph import DecoderReplayCudaGraphManager
    from tests.helpers import FakeCuda

    FakeCuda(monkeypatch)
    runner = GPUModelRunner(config, "cpu")
    state = runner.model_state
    state.replay_cudagraphs = DecoderReplayCudaGraphManager(
        runner.device, state.decoder_replay_layers, config.decoder_replay_cudagraph_capture_sizes, 64, torch.float32
    )
    if spy is not None:
        spy(runner)
    monkeypatch.setattr(runner, "device", torch.device("cuda"))  # capture_model's check; the rest stays on the CPU
    with ReadWriteRecorder() as rw, replica_phases(runner, rw):
        runner.capture_model()
    return runner, rw.recording()


def test_replica_phases_tag_segments_breaks_outputs_and_replay_graphs(monkeypatch):
    from kit.replica.breakable_cudagraph import BreakableCUDAGraphCapture, BreakableCUDAGraphWrapper

    before = (BreakableCUDAGraphWrapper._capture, BreakableCUDAGraphCapture.add_eager)
    _, recording = _captured(monkeypatch, TINY)
    labels = {a.phase.label for a in recording.accesses}
    for size in (8, 16):
        assert {
            f"model graph {size} segment 0",
            f"model graph {size} break 0",
            f"model graph {size} segment 1",
        } <= labels
        assert f"model graph {size} outputs read after the forward" in labels
    assert {label for label in labels if label.startswith("replay")} == {
        "replay graph 4 segment 0",
        "replay graph 8 segment 0",
    }
    assert (BreakableCUDAGraphWrapper._capture, BreakableCUDAGraphCapture.add_eager) == before  # put back
    assert len(readwrite_table(recording)) == 4  # two model graphs, one break each, two replay graphs


def _spy_on_break_inputs(runner, seen: dict) -> None:
    """Keep the addresses of the hyper-connection state each capture hands the break (not the tensors)."""
    decoder = runner.model
    state = decoder._hyper_connection_state

    def spied(hidden_states):
        result = state(hidden_states)
        seen.setdefault(hidden_states.shape[0], []).append([span(t) for t in (hidden_states, *result)])
        return result

    decoder._hyper_connection_state = spied


def test_the_replicas_break_reads_four_inputs_and_nothing_after_it_reads_three_of_them(monkeypatch):
    seen: dict = {}
    _, recording = _captured(monkeypatch, TINY, spy=lambda runner: _spy_on_break_inputs(runner, seen))
    reads = break_reads(recording)
    for size in (8, 16):
        hidden, residual, post_mix, res_mix = seen[size][-1]  # the capture's, after the warm-up
        for block in (hidden, residual, post_mix, res_mix):
            assert Ranges([block]) & reads[(size, 0)] == Ranges([block])  # the break reads every input
        carried = Ranges((p.start, p.end) for p in carried_reads(recording, size))
        assert not carried & Ranges([residual, post_mix, res_mix])  # kept bound, never read after the break


# --- the aux-id boundary: aux id `idx` is made while layer `idx` runs ----------------------------------


@pytest.mark.parametrize(
    "aux_id,early",
    [
        (TINY.decoder_replay_start - 1, True),  # made by the last layer before the break, held across it
        (TINY.decoder_replay_start, False),  # made by the first replay layer, in the break
        (TINY.num_layers - 1, False),  # the last layer's
    ],
)
def test_has_early_aux_at_the_replay_start_boundary(aux_id, early):
    config = dataclasses.replace(TINY, aux_hidden_state_layers=(aux_id,))
    assert has_early_aux(GPUModelRunner(config, "cpu").model_state) is early


@pytest.mark.parametrize("aux_id,carried", [(1, True), (2, False), (3, False)])
def test_only_an_early_aux_state_is_carried_across_the_break(monkeypatch, aux_id, carried):
    """`has_early_aux` in the data: an early aux state is written before the break and read after it."""
    config = dataclasses.replace(TINY, aux_hidden_state_layers=(aux_id,))
    runner, recording = _captured(monkeypatch, config)
    for size in (8, 16):
        outputs = [a for a in recording.of("model", size) if a.phase.part == "output"]
        hidden_out, aux_out = (Ranges([(a.start, a.end)]) for a in outputs)  # the final hidden states, then the aux
        kept = Ranges((p.start, p.end) for p in carried_reads(recording, size))
        assert bool(kept & aux_out) is carried
        assert not kept & hidden_out  # made after the break
    assert has_early_aux(runner.model_state) is carried


# --- the two analyses side by side on a hand-built trace ------------------------------------------


def _recording_over(reads_after: list[int], break_inputs: list[int], replay_writes: list[int]) -> ReadWriteRecording:
    """Accesses at the hand-built trace's addresses: 64 KiB blocks written in segment 0."""
    rows, seq = [], 0
    for addr in (A, B, D):
        rows.append(Access(seq, model_segment(64), "aten.mm.default", WRITE, addr, addr + 64 * KIB))
        seq += 1
    for addr in break_inputs:
        rows.append(Access(seq, model_break(64), "aten.index_select.default", READ, addr, addr + 64 * KIB))
    for addr in reads_after:
        rows.append(Access(seq + 1, model_outputs(64), "read after the forward", READ, addr, addr + 64 * KIB))
    for addr in replay_writes:
        rows.append(Access(seq + 2, replay_graph(32), "aten.mm.default", WRITE, addr, addr + 64 * KIB))
    return ReadWriteRecording(rows)


def test_the_analyses_agree_when_the_breaks_reads_are_known_and_explain_the_trace_alone():
    t = Trace()
    _kept_bound_capture(t)
    _replay_capture(t, 32, [(B, 64 * KIB), (D, 64 * KIB)])
    recording = _recording_over([A], break_inputs=[B, D], replay_writes=[B, D])
    (pair,) = compare_analyses(attach_break_reads(t.snapshot(), recording), recording)
    assert pair["readwrite_holds"] and not pair["lifetime_conflict"] and pair["agree"] and pair["explanation"] is None
    assert {b["class"] for b in pair["lifetime_blocks"]} == {BREAK_INPUT}
    assert pair["trace_only_conflict"] and not pair["agree_trace_only"]
    assert "nothing after the break reads them" in pair["explanation_trace_only"]
    assert "residual, post_mix and res_mix" in pair["explanation_trace_only"]


def test_the_analyses_agree_on_a_conflict_over_the_early_aux_state():
    t = Trace()
    _kept_bound_capture(t)
    _replay_capture(t, 32, [(A, 64 * KIB)])
    recording = _recording_over([A], break_inputs=[B, D], replay_writes=[A])
    (pair,) = compare_analyses(attach_break_reads(t.snapshot(), recording), recording)
    assert not pair["readwrite_holds"] and pair["first_overlap"] == A and pair["overlap_bytes"] == 64 * KIB
    assert pair["lifetime_conflict"] and pair["lifetime_conflict_bytes"] == 64 * KIB and pair["agree"]
    assert pair["trace_only_conflict"] and pair["agree_trace_only"]


def test_a_break_input_read_after_the_break_too_is_the_disagreement_explained():
    """The lifetime rule assumes a break input is not read after the break; the read/write analysis checks it."""
    t = Trace()
    _kept_bound_capture(t)
    _replay_capture(t, 32, [(B, 64 * KIB)])
    recording = _recording_over([A, B], break_inputs=[B, D], replay_writes=[B])
    snap = attach_break_reads(t.snapshot(), recording)
    assert {r["addr"]: r["class"] for _, r in liveness_table(snap).rows.iterrows()}[B] == BREAK_INPUT
    (pair,) = compare_analyses(snap, recording)
    assert not pair["readwrite_holds"] and not pair["lifetime_conflict"] and not pair["agree"]
    assert f"{B:#x}" in pair["explanation"] and "also read later" in pair["explanation"]
    assert pair["trace_only_conflict"] and pair["agree_trace_only"]  # from the trace alone B is held: conflict
    assert {b["class"] for b in pair["lifetime_blocks"]} == {BREAK_INPUT} and HELD not in pair["explanation"]


def test_composite_ops_are_recorded_by_the_ops_they_run():
    """Under inference_mode `linear` and `rms_norm` reach the recorder whole; their insides are recorded instead."""
    linear, norm = torch.nn.Linear(8, 4), torch.nn.RMSNorm(8)
    x = torch.randn(3, 8)
    with torch.inference_mode(), ReadWriteRecorder() as rw, rw.phase(model_segment(3)):
        y = linear(x)
        norm(x)
    ops = {a.op for a in rw.accesses}
    assert "aten.addmm.default" in ops and "aten.linear.default" not in ops and "aten.rms_norm.default" not in ops
    assert any(a.kind == WRITE and (a.start, a.end) == span(y) for a in accesses(rw, op="addmm"))
    assert len({a.seq for a in accesses(rw, WRITE)}) >= 4  # the norm's temporaries are writes too


def test_an_op_with_a_kernel_for_the_tensors_backend_runs_that_kernel(monkeypatch):
    from kit.record.readwrite import runs_its_decomposition

    aten = torch.ops.aten
    x, w = torch.randn(2, 8), torch.ones(8)
    assert runs_its_decomposition(aten.linear.default, (x, torch.randn(4, 8)), {})
    assert not runs_its_decomposition(aten.addmm.default, (x, x, x), {})
    assert runs_its_decomposition(aten._fused_rms_norm.default, (x, [8], w, 1e-6), {})  # no CPU kernel
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert not runs_its_decomposition(aten._fused_rms_norm.default, (x, [8], w, 1e-6), {})  # its CUDA kernel


def test_the_experiment_refuses_an_unknown_policy_and_a_machine_without_cuda(tmp_path, capsys):
    from kit.experiments.readwrite_run.__main__ import main

    assert main(["--policy", "sometimes", "--out", str(tmp_path / "x.json")]) == 2
    assert "unknown read/write scenario 'sometimes'" in capsys.readouterr().err
    if torch.cuda.is_available():
        return
    assert main(["--preset", "small", "--out", str(tmp_path / "out")]) == 2
    assert "needs CUDA" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_with_attention_breaks_the_replay_layers_run_in_one_break_of_several(monkeypatch):
    config = dataclasses.replace(TINY, attention_breaks=True)
    runner, recording = _captured(monkeypatch, config)
    start = config.decoder_replay_start
    for size in (8, 16):
        # a break per layer before the replay layers, the replay break, one per layer after it (in the graph)
        assert recording.breaks(size) == list(range(start + 1)) and recording.replay_breaks(size) == [start]
        labels = {a.phase.label for a in recording.of("model", size)}
        assert {f"model graph {size} break {start} while the replay layers run",
                f"model graph {size} break {start} after the replay layers"} <= labels  # fmt: skip
    # the replay graphs break at their own attentions: their breaks' writes are theirs
    assert {a.phase.part for a in recording.of("replay", 4)} == {"segment", "break"}
    assert runner.model_state.decoder_replay_layers.run_layers.__name__ != "run_layers_by_phase"  # put back


# --- what the recorder cannot see, made visible ------------------------------------------------------


def _column_rewritten_after_the_replay() -> ReadWriteRecorder:
    """A model graph whose `kept` (8 x 4) is carried across R; after R one column of it is rewritten in place, then
    the whole of it is read; R overwrites all of it."""
    x = torch.randn(8, 4)
    with ReadWriteRecorder() as rw:
        with rw.phase(model_segment(8, 0)):
            kept = x * 2
        with rw.phase(model_runs_replay(8, 0)):
            column = x[:, :1] + 1
        with rw.phase(model_after_replay(8, 0)):
            kept[:, 1:2].copy_(column)  # a strided write of column 1 only
        with rw.phase(model_segment(8, 1)):
            kept.sum()  # reads columns 0, 2 and 3 as carried across R
        with rw.phase(replay_graph(4)):
            kept.zero_()
    rw.kept = kept
    return rw


def test_a_strided_copy_into_one_column_rewrites_that_column_and_not_the_gaps_between_its_elements():
    rw = _column_rewritten_after_the_replay()
    kept, base = rw.kept, rw.kept.data_ptr()
    assert [(a.start - base, a.end - base) for a in accesses(rw, WRITE, op="copy_")] == [
        (16 * i + 4, 16 * i + 8) for i in range(8)
    ]
    carried = Ranges((p.start, p.end) for p in carried_reads(rw.recording(), 8))
    others = Ranges([span(kept)]) - Ranges((base + 16 * i + 4, base + 16 * i + 8) for i in range(8))
    assert carried & Ranges([span(kept)]) == others and others.total == 96  # 3 of 4 columns: 8 rows x 12 bytes
    (row,) = readwrite_table(rw.recording()).to_dict("records")
    assert not row["holds"] and row["overlap_bytes"] == 96 and row["first_overlap"] == base


def _written_outside_the_dispatcher(after_replay: bool, replay_writes_it: bool) -> ReadWriteRecorder:
    """An `empty` filled by a memmove the dispatcher never sees (as a Triton kernel fills `hc_collapse_triton`'s
    output), made before R starts or after it, then read by a recorded op in the next segment."""
    import ctypes

    x = torch.randn(8, 4)
    with ReadWriteRecorder() as rw:
        with rw.phase(model_segment(8, 0)):
            h = x * 2
            out = None if after_replay else torch.empty(8, 4)
        with rw.phase(model_runs_replay(8, 0)):
            h.sum()
        with rw.phase(model_after_replay(8, 0)):
            out = torch.empty(8, 4) if after_replay else out
        ctypes.memmove(out.data_ptr(), h.data_ptr(), h.numel() * h.element_size())  # outside the dispatcher
        with rw.phase(model_segment(8, 1)):
            final = out * 3
        with rw.phase(model_outputs(8)):
            rw.note_reads(final, "read after the forward")
        with rw.phase(replay_graph(4)):
            (out if replay_writes_it else torch.zeros(2)).fill_(0)
    assert torch.equal(out, torch.zeros(8, 4) if replay_writes_it else h)  # the memmove did write it
    rw.out = out
    return rw


@pytest.mark.parametrize("after_replay", [False, True], ids=["empty_before_R", "empty_after_R"])
def test_a_read_of_an_empty_that_no_recorded_op_wrote_is_reported_written_outside_the_dispatcher(after_replay):
    rw = _written_outside_the_dispatcher(after_replay, replay_writes_it=False)
    recording, out = rw.recording(), Ranges([span(rw.out)])
    assert [(a.kind, a.op) for a in recording.accesses if Ranges([(a.start, a.end)]) == out][0] == (
        FRESH,
        "aten.empty.memory_format",
    )
    carried, unseen = after_replay_reads(recording, 8)
    assert not Ranges((p.start, p.end) for p in carried) & out  # never counted as carried
    assert carried_reads(recording, 8) == carried
    assert Ranges((p.start, p.end) for p in unseen) == out and {p.op for p in unseen} == {"aten.mul.Tensor"}
    made = "model graph 8 break 0 after the replay layers" if after_replay else "model graph 8 segment 0"
    assert {p.made_by for p in unseen} == {f"aten.empty.memory_format in {made}"}
    (line,) = unseen_writer_lines(recording)
    assert line.startswith("model graph 8 segment 1: 128 B written outside the dispatcher (returned unwritten by ")
    (row,) = readwrite_table(recording).to_dict("records")
    assert row["holds"] and row["unseen_writer_bytes"] == 128 and row["unseen_writer_ops"] == ["aten.mul.Tensor"]
    assert row["unseen_overlap_bytes"] == 0
    (verdict,) = obligation_verdicts(readwrite_table(recording))
    assert "not seen: 128 B read after it by aten.mul.Tensor were written outside the dispatcher" in verdict


def test_an_unseen_write_that_a_replay_graph_writes_over_cannot_be_decided():
    rw = _written_outside_the_dispatcher(after_replay=False, replay_writes_it=True)
    table = readwrite_table(rw.recording())
    (row,) = table.to_dict("records")
    assert row["holds"] and row["unseen_writer_bytes"] == 128 and row["unseen_overlap_bytes"] == 128
    assert "128 B read after it meet replay graph 4 where a writer is unseen" in obligation_verdicts(table)[0]
    assert "1 pairing(s) meet R there and cannot be decided" in obligation_summary(table)


def test_a_replay_graphs_unwritten_return_over_carried_bytes_cannot_be_decided():
    """R returns bytes unwritten that N carries: a kernel outside the dispatcher may fill them when R replays."""
    recording = _recording_over([A], break_inputs=[B], replay_writes=[])
    recording.accesses.append(Access(9, replay_graph(32), "aten.empty.memory_format", FRESH, A, A + 64 * KIB))
    (row,) = readwrite_table(recording).to_dict("records")
    assert row["holds"] and row["unseen_writer_bytes"] == 0 and row["unseen_overlap_bytes"] == 64 * KIB
    assert unwritten_returns(recording, "replay", 32) == Ranges([(A, A + 64 * KIB)])


def test_a_recording_without_fresh_marks_reports_no_unseen_writer():
    """Recordings made before fresh bytes were marked (the shipped ones) load and report none."""
    from kit.experiments.readwrite_run.result import load_recording

    recording = ReadWriteRecording.from_records(load_recording("small")["scenarios"]["pr"]["accesses"])
    table = readwrite_table(recording)
    assert (table["unseen_writer_bytes"] == 0).all() and (table["unseen_overlap_bytes"] == 0).all()
    assert unseen_writer_lines(recording) == [] and "outside the dispatcher" not in obligation_summary(table)


def test_a_write_too_large_to_list_rewrites_nothing_and_counts_as_the_replay_graphs():
    """`may_write` (the hull of a write over MAX_SPANS runs): never a rewrite of a carried value, always R's write."""
    rows = [
        Access(0, model_segment(64), "aten.mm.default", WRITE, A, A + 64 * KIB),
        Access(1, model_runs_replay(64), "aten.mm.default", READ, B, B + 64 * KIB),
        Access(2, model_after_replay(64), "aten.copy_.default", MAY_WRITE, A, A + 64 * KIB),
        Access(3, model_segment(64, 1), "aten.add.Tensor", READ, A, A + 64 * KIB),
        Access(4, replay_graph(32), "aten.copy_.default", MAY_WRITE, A, A + KIB),
    ]
    recording = ReadWriteRecording(rows)
    assert Ranges((p.start, p.end) for p in carried_reads(recording, 64)) == Ranges([(A, A + 64 * KIB)])
    (row,) = readwrite_table(recording).to_dict("records")
    assert not row["holds"] and row["overlap_bytes"] == KIB and row["writing_ops"] == ["aten.copy_.default"]


def test_the_side_by_side_comparison_carries_the_unseen_writer_of_each_pairing():
    t = Trace()
    _kept_bound_capture(t)
    _replay_capture(t, 32, [(A, 64 * KIB)])
    recording = _recording_over([A], break_inputs=[B, D], replay_writes=[A])
    fresh = Access(3, model_segment(64), "aten.empty.memory_format", FRESH, A, A + 64 * KIB)  # after the writes
    recording = ReadWriteRecording([*recording.accesses[:3], fresh, *recording.accesses[3:]])
    (pair,) = compare_analyses(attach_break_reads(t.snapshot(), recording), recording)
    assert pair["readwrite_holds"] and pair["carried_bytes"] == 0  # A's value came from outside the dispatcher
    assert pair["unseen_writer_bytes"] == 64 * KIB and pair["unseen_writer_ops"] == ["read after the forward"]
    assert pair["unseen_overlap_bytes"] == 64 * KIB  # and R writes it: the recording cannot decide


def test_a_scenario_run_past_its_time_limit_fails_in_one_line(monkeypatch, tmp_path):
    """Every experiment's fresh process (`recorded.run_fresh`) has a time limit; one that hangs is killed."""

    from kit.errors import KitError
    from kit.experiments import recorded

    (tmp_path / "kit_sleeper.py").write_text("import time\ntime.sleep(30)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(recorded.run_fresh, "__defaults__", (1.0,))
    with pytest.raises(KitError, match=r"^the safety run failed: killed after 1 s \(its time limit\)$"):
        recorded.run_in_subprocess("kit_sleeper", "pr", "small", tmp_path / "x.json", "the safety run")

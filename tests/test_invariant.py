"""The structural invariant (kit.analysis.invariant) on synthetic recordings, the shipped vLLM recordings, and
`kit safety`: graph-pool bytes read after the replay break whose value came before it, early aux told apart.

The synthetic capture: model graph 64 writes, before its replay break, a graph-pool intermediate (`KEPT`),
an early aux output (`AUX`) and a default-pool buffer (`OUTSIDE`); after the break its next segment reads
`KEPT` and `OUTSIDE`, and the caller reads the hidden states (written after the break) and `AUX`. Replay graph
32 writes elsewhere in the pool. Pool (0, 1) covers `POOL`, pool (0, 0) `DEFAULT`.
"""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest
import torch

from kit.analysis.invariant import (
    INVARIANT,
    NOT_RECORDED,
    early_aux_count,
    early_aux_ranges,
    graph_pool_ranges,
    invariant_result,
    invariant_summary,
    invariant_table,
    invariant_verdicts,
    pool_carried_reads,
)
from kit.analysis.readwrite import (
    READ,
    WRITE,
    Access,
    Ranges,
    ReadWriteRecording,
    model_break,
    model_outputs,
    model_runs_replay,
    model_segment,
    replay_graph,
)
from kit.experiments.readwrite_run import result as readwrite_result
from kit.experiments.safety_run import result as safety_result
from kit.recordings import RECORDINGS

PLANTED = "planted_cross_break_read"
MIB = 1 << 20

POOL = (0x10000, 0x20000)  # a graph-pool segment
DEFAULT = (0x40000, 0x50000)  # a default-pool segment
KEPT = (0x10000, 0x11000)  # 4 KiB in the graph pool, written before the break, read after it
AUX = (0x12000, 0x12800)  # 2 KiB early aux in the graph pool, read by the caller
HIDDEN = (0x13000, 0x13400)  # the final hidden states: written after the break
OUTSIDE = (0x40000, 0x40400)  # 1 KiB in the default pool, written before the break, read after it
REPLAY_WRITES = (0x18000, 0x19000)
N, R = 64, 32


def segment(span: tuple[int, int], pool: tuple[int, int]) -> dict:
    return {"address": span[0], "total_size": span[1] - span[0], "segment_pool_id": pool, "blocks": []}


RAW = {"segments": [segment(POOL, (0, 1)), segment(DEFAULT, (0, 0))]}


def synthetic(*, read_kept: bool = True) -> ReadWriteRecording:
    rows = []

    def add(phase, op, kind, span):
        rows.append(Access(len(rows), phase, op, kind, *span))

    add(model_segment(N, 0), "aten.embedding", WRITE, KEPT)
    add(model_segment(N, 0), "aten.mul", WRITE, AUX)
    add(model_segment(N, 0), "aten.copy_", WRITE, OUTSIDE)
    add(model_break(N, 0), "aten.index_select", READ, KEPT)  # the gather: before R starts, not carried
    add(model_runs_replay(N, 0), "aten.mm", READ, REPLAY_WRITES)
    add(model_segment(N, 1), "aten.add", WRITE, HIDDEN)
    if read_kept:
        add(model_segment(N, 1), "aten.add", READ, KEPT)
    add(model_segment(N, 1), "aten.add", READ, OUTSIDE)
    add(model_outputs(N), "the forward's caller", READ, HIDDEN)
    add(model_outputs(N), "the forward's caller", READ, AUX)
    add(replay_graph(R), "aten.mm", WRITE, REPLAY_WRITES)
    return ReadWriteRecording(rows)


def test_graph_pool_ranges_are_the_segments_of_pools_other_than_0_0():
    assert graph_pool_ranges(RAW) == Ranges([POOL])
    assert graph_pool_ranges({"segments": [segment(DEFAULT, (0, 0))]}) == Ranges()
    assert early_aux_count((1, 4), 3) == 1 and early_aux_count((4,), 3) == 0 and early_aux_count((0, 1, 1), 3) == 2


def test_a_graph_pool_value_read_after_the_break_violates_it_and_default_pool_bytes_are_not_counted():
    (row,) = invariant_table(synthetic(), graph_pool_ranges(RAW), early_aux=1).to_dict("records")
    # KEPT (4 KiB) is the violation; OUTSIDE is carried too but in pool (0, 0); AUX is the exception.
    assert row["graph_pool_carried_bytes"] == KEPT[1] - KEPT[0] == 4096
    assert row["early_aux_carried_bytes"] == AUX[1] - AUX[0] == 2048
    assert row["invariant_holds"] is False
    reads = {(r["start"], r["end"], r["early_aux"]) for r in row["invariant_reads"]}
    assert reads == {(*KEPT, False), (*AUX, True)}
    (kept,) = [r for r in row["invariant_reads"] if not r["early_aux"]]
    assert kept["op"] == "aten.add" and kept["phase"] == "model graph 64 segment 1" and kept["bytes"] == 4096


def test_without_the_planted_read_it_holds_by_the_exception():
    table = invariant_table(synthetic(read_kept=False), graph_pool_ranges(RAW), early_aux=1)
    (row,) = table.to_dict("records")
    assert row["invariant_holds"] is True and row["graph_pool_carried_bytes"] == 0
    assert row["early_aux_carried_bytes"] == 2048
    assert invariant_verdicts(table)[0].startswith("model graph 64 break 0: holds by the exception: ")
    said = "Holds on all 1 pairings that can run (2.00 KiB of early aux, the exception)."
    assert invariant_summary(table) == f"{INVARIANT} {said}"


def test_early_aux_not_told_apart_is_a_violation():
    """With no early aux output (a model whose aux states all come after the break), the same bytes violate it."""
    (row,) = invariant_table(synthetic(read_kept=False), graph_pool_ranges(RAW), early_aux=0).to_dict("records")
    assert row["invariant_holds"] is False and row["graph_pool_carried_bytes"] == 2048
    assert row["early_aux_carried_bytes"] == 0
    assert early_aux_ranges(synthetic(), N, 1) == Ranges([AUX])  # the output after the hidden states
    assert early_aux_ranges(synthetic(), N, 0) == Ranges()


def test_a_read_straddling_the_pools_edge_counts_only_its_graph_pool_bytes():
    rows = [
        Access(0, model_segment(N, 0), "aten.fill_", WRITE, POOL[1] - 256, POOL[1] + 256),
        Access(1, model_runs_replay(N, 0), "aten.mm", READ, 0, 1),
        Access(2, model_segment(N, 1), "aten.add", READ, POOL[1] - 256, POOL[1] + 256),
        Access(3, replay_graph(R), "aten.mm", WRITE, *REPLAY_WRITES),
    ]
    reads = pool_carried_reads(rows, N, 0, graph_pool_ranges(RAW), Ranges())
    assert [(r.start, r.end, r.early_aux) for r in reads] == [(POOL[1] - 256, POOL[1], False)]


def test_the_verdicts_list_each_read_and_the_summary_says_violated():
    table = invariant_table(synthetic(), graph_pool_ranges(RAW), early_aux=1, can_run=lambda n, r: True)
    lines = invariant_verdicts(table)
    assert lines[0].startswith("model graph 64 break 0: VIOLATED: 4.00 KiB of graph-pool values")
    assert any("aten.add (model graph 64 segment 1): VIOLATION" in line for line in lines[1:])
    assert any("early aux, allowed" in line for line in lines[1:])
    assert " VIOLATED on 1 of 1 pairings that can run: model graph(s) 64 " in invariant_summary(table)
    nothing = invariant_table(synthetic(), graph_pool_ranges(RAW), early_aux=1, can_run=lambda n, r: False)
    assert invariant_summary(nothing).endswith("Nothing to check: no pairing can run.")


def test_without_graph_pool_segments_nothing_is_claimed():
    result = invariant_result(synthetic(), {"segments": [segment(DEFAULT, (0, 0))]}, 1)
    assert result["holds"] is None and result["rows"] == [] and "Not checked" in result["summary"]


# --- vLLM's path: the shipped recordings, computed from what they hold -----------------------------------------


def _vllm(name: str) -> dict:
    return pickle.loads((RECORDINGS / "vllm" / f"{name}.pickle").read_bytes())


def test_on_vllms_recordings_the_invariant_holds_and_only_early_aux_is_in_the_pool():
    from kit.experiments.vllm.safety import invariant_of_snapshot

    for name in ("unpatched", "patched"):
        found = invariant_of_snapshot(_vllm(name))
        assert found["holds"] is True, name
        assert all(r["graph_pool_carried_bytes"] == r["early_aux_carried_bytes"] == 0 for r in found["rows"]), name
    for name in ("early_aux_pr", "early_aux_pr_flat", "early_aux_shared", "early_aux_shared_flat"):
        found = invariant_of_snapshot(_vllm(name))
        assert found["holds"] is True, name
        # the early aux (N x hidden, bf16) is the one graph-pool value read after the break: allowed
        assert {(r["model_size"], r["early_aux_carried_bytes"]) for r in found["rows"]} == {
            (n, n * 1024 * 2) for n in (128, 256, 512)
        }, name
    # The early aux told apart is what the invariant rests on: without it, early aux forced to share violates it.
    raw = _vllm("early_aux_shared")
    del raw["kit"]["readwrite"]["invariant"]  # computed again from the accesses, with every aux after the break
    raw["kit"]["variant"]["config"]["aux_hidden_state_layers"] = (4,)
    assert invariant_of_snapshot(raw)["holds"] is False


def test_on_vllms_path_the_planted_cross_break_read_violates_the_invariant_by_its_kept_block():
    """The recorded planted run (PR 63155 on a stand-in that keeps a float32 (N, 4, hidden) copy in the graph pool
    across the replay break): the invariant fails on every model graph by exactly that block, not early aux."""
    from kit.experiments.vllm.safety import invariant_of_snapshot

    found = invariant_of_snapshot(_vllm("planted_cross_break_read"))
    assert found["holds"] is False
    assert {(r["model_size"], r["graph_pool_carried_bytes"], r["early_aux_carried_bytes"]) for r in found["rows"]} == {
        (n, n * 4 * 1024 * 4, 0) for n in (128, 256, 512)
    }


@pytest.mark.parametrize("name", ["patched", "early_aux_shared", "planted_cross_break_read"])
def test_the_invariant_recorded_on_the_gpu_is_what_the_recordings_accesses_give_again(name):
    """What the run recorded (`kit["readwrite"]["invariant"]`) is computed again, here, from the same recording's
    reads, writes and segments: the two agree on every pairing."""
    from kit.experiments.vllm.safety import invariant_of_snapshot

    raw = _vllm(name)
    recorded = invariant_of_snapshot(raw)
    del raw["kit"]["readwrite"]["invariant"]
    computed = invariant_of_snapshot(raw)
    assert not recorded["computed"] and computed["computed"] and recorded["holds"] == computed["holds"]

    def key(found):
        return sorted(
            (r["model_size"], r["replay_size"], r["graph_pool_carried_bytes"], r["early_aux_carried_bytes"])
            for r in found["rows"] if r["can_run"]
        )  # fmt: skip

    assert key(recorded) == key(computed) and key(recorded)


def test_a_vllm_recording_without_accesses_is_not_recorded_never_a_pass():
    from kit.experiments.vllm.safety import invariant_of_snapshot, vllm_invariant_lines

    raw = _vllm("patched")
    del raw["kit"]["readwrite"]
    assert invariant_of_snapshot(raw) is None
    lines = vllm_invariant_lines({"patched": {"holds": None, "summary": f"{INVARIANT} {NOT_RECORDED}", "verdicts": []}})
    assert lines[1].startswith("patched: invariant not checked: not recorded")


# --- kit safety: the invariant beside the obligation ---------------------------------------------------


def _readwrite_with_invariant(holds: bool) -> dict:
    """The shipped small read/write recording with an invariant recorded for every scenario."""
    data = readwrite_result.load_recording("small")
    data["source"] = "a test"
    for scenario, run in data["scenarios"].items():
        rows = []
        for p in data["pairs"]:
            if p["scenario"] == scenario:
                bad = 0 if holds else 4096
                p.update(graph_pool_carried_bytes=bad, early_aux_carried_bytes=0, invariant_holds=holds)
                rows.append({**p, "can_run": p["dispatchable"], "invariant_reads": []})
        run["invariant"] = {"invariant": INVARIANT, "holds": holds, "summary": f"{INVARIANT} Summary of {scenario}.",
                            "verdicts": [f"model graph 128 break 3: {scenario}"], "rows": rows}  # fmt: skip
    return data


def test_kit_safety_json_carries_the_invariant_per_pairing_and_says_not_recorded_without_it(capsys):
    from kit.cli import main

    assert main(["safety", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["invariant"] == INVARIANT
    # The shipped small recordings (2026-12-05): the invariant holds but for the planted scenario, on every pairing.
    holds = {(p["scenario"], p["invariant_holds"]) for p in out["pairs"]}
    assert holds == {("pr", True), ("unpatched", True), ("early_aux_shared", True), (PLANTED, False)}
    planted = [p for p in out["pairs"] if p["scenario"] == PLANTED]
    assert {(p["model_size"], p["graph_pool_carried_bytes"]) for p in planted} == {
        (128, 2 * MIB),
        (256, 4 * MIB),
        (512, 8 * MIB),
    }
    assert all(s["invariant_recorded"] for s in out["scenarios"].values())
    assert [s["invariant_holds"] for s in out["scenarios"].values()] == [True, True, True, False]
    assert all(s["obligation"] for s in out["scenarios"].values())  # the obligation beside it
    assert out["vllm_invariant"]["patched"]["holds"] is True
    with_it = safety_result.safety_json(safety_result.load_recording("small"), _readwrite_with_invariant(False))
    assert all(p["invariant_holds"] is False and p["graph_pool_carried_bytes"] == 4096 for p in with_it["pairs"])
    assert with_it["scenarios"]["pr"]["invariant_holds"] is False


def test_kit_safety_text_prints_the_invariant_per_scenario_beside_the_obligation(capsys):
    from kit.cli import main

    assert main(["safety"]) == 0
    out = capsys.readouterr().out
    assert "the structural invariant (" in out and INVARIANT in out
    for scenario in safety_result.UNPLANTED:
        assert f"\n{scenario}: invariant holds: " in out
    assert f"\n{PLANTED}: invariant VIOLATED on 11 of 11 pairings" in out or f"\n{PLANTED}: invariant VIOLATED: " in out
    assert out.count("  beside it, the byte-overlap obligation: ") == len(safety_result.SAFETY_SCENARIOS)
    assert "patched: invariant holds: " in out and "planted_cross_break_read: invariant VIOLATED: " in out
    lines = safety_result.safety_lines(safety_result.load_recording("small"), _readwrite_with_invariant(True))
    assert "pr: invariant holds: Summary of pr." in lines and "  model graph 128 break 3: pr" in lines


# --- the planted variant ---------------------------------------------------------------------------------


def test_the_planted_scenarios_run_the_prs_capture_with_the_planted_model():
    from kit.experiments.vllm.recordings import VLLM_SCENARIOS

    config = safety_result.scenario_safety_config("planted_cross_break_read", "small")
    assert config.planted_cross_break_read
    assert not safety_result.scenario_safety_config("pr", "small").planted_cross_break_read
    assert safety_result.SCENARIO_OF["planted_cross_break_read"] == "patched"  # PR 63155's capture: a shared stream
    assert "PLANTED" in safety_result.scenario_description("planted_cross_break_read")
    assert early_aux_count(config.aux_hidden_state_layers, config.decoder_replay_start) == 0  # the PR shares
    planted = VLLM_SCENARIOS["planted_cross_break_read"]
    assert planted.planted and planted.policy == "pr" and not planted.early_aux


def test_the_planted_decoder_reads_its_kept_block_after_the_break_and_it_changes_the_outputs():
    from kit.replica.model import PLANTED_BYTES, PRESETS, Decoder, planted_kept_block

    kept = planted_kept_block(128, 1024, "cpu")
    assert kept.shape == (128, 4, 1024) and kept.dtype == torch.float32
    assert kept.untyped_storage().nbytes() == PLANTED_BYTES == 12 << 20  # a segment of its own (10 MiB or more)
    wide = planted_kept_block(1024, 7168, "cpu")  # the large preset: as many rows as fit
    assert wide.shape == (109, 4, 7168) and wide.untyped_storage().nbytes() == 12 << 20
    config = dataclasses.replace(PRESETS["small"], hyper_connections=True, dtype="float32")
    ids = torch.randint(0, config.vocab_size, (128,))
    torch.manual_seed(0)
    plain = Decoder(config)
    torch.manual_seed(0)
    planted = Decoder(dataclasses.replace(config, planted_cross_break_read=True))
    with torch.no_grad():
        assert not torch.equal(plain(ids)[0], planted(ids)[0])


def test_a_readwrite_recording_made_before_the_invariant_says_not_recorded():
    data = readwrite_result.load_recording("small")
    for run in data["scenarios"].values():
        del run["invariant"]
    lines = readwrite_result.invariant_lines(data)
    assert lines[0] == INVARIANT and len(lines) == 1 + len(data["scenarios"])
    assert all(NOT_RECORDED in line for line in lines[1:])


def test_the_large_recording_holds_the_invariant_but_for_the_planted_read():
    """Recorded on 2026-12-05: each model graph reads its planted block (the planted scenario's 11.92 MiB) after the
    break, on all 80 dispatchable pairings; the other scenarios hold on all 80, early aux the only bytes carried."""
    data = readwrite_result.load_recording("large")
    runs = {scenario: run["invariant"] for scenario, run in data["scenarios"].items()}
    assert {s: inv["holds"] for s, inv in runs.items()} == {
        "pr": True, "unpatched": True, "early_aux_shared": True, PLANTED: False,
    }  # fmt: skip
    planted = [p for p in data["pairs"] if p["scenario"] == PLANTED and p["dispatchable"]]
    assert len(planted) == 80 and not any(p["invariant_holds"] for p in planted)
    assert {p["graph_pool_carried_bytes"] for p in planted} == {109 * 4 * 7168 * 4}  # planted_kept_block's float32 rows
    early = [p for p in data["pairs"] if p["scenario"] == "early_aux_shared" and p["dispatchable"]]
    assert all(p["graph_pool_carried_bytes"] == 0 < p["early_aux_carried_bytes"] for p in early)


def test_each_pairing_gets_the_invariant_of_its_own_model_graph_and_break():
    rows = invariant_table(synthetic(), graph_pool_ranges(RAW), early_aux=1)
    late = invariant_table(synthetic(read_kept=False), graph_pool_ranges(RAW), early_aux=1)
    result = {"rows": [*rows.assign(model_size=64).to_dict("records"), *late.assign(model_size=128).to_dict("records")]}
    pairs = [{"model_size": n, "break": 0, "replay_size": R} for n in (128, 64, 256)]
    merged = readwrite_result.with_invariant(pairs, result)
    assert [p["invariant_holds"] for p in merged] == [True, False, None]  # 256: no row, not recorded
    assert [p["graph_pool_carried_bytes"] for p in merged] == [0, 4096, None]


def _planted_workload(stream_of_replays: str) -> tuple[list[dict], dict[str, int], dict[int, list[str]]]:
    """The small preset's graph-pool requests in outline: each model graph N (largest first) takes the planted
    block first, then per layer the norm's float32 and bf16 outputs, the up projection and SiLU (4 x hidden),
    the down projection, and frees all of it when its capture ends; then each replay graph R takes its norm's
    outputs and up projection. Returns the ops, the planted block's id per N, and each R's ids."""
    from kit.replica.model import PLANTED_BYTES

    hidden, ops, kept, replays = 1024, [], {}, {}

    def alloc(size: int, live: list[str]) -> str:
        name = f"t{len(ops)}"
        ops.append({"op": "alloc", "id": name, "bytes": size})
        live.append(name)
        return name

    def capture(graph: str, stream: str, body) -> None:
        ops.append({"op": "capture_begin", "graph": graph, "pool": "graph pool", "stream": stream})
        live: list[str] = []
        body(live)
        ops.extend({"op": "free", "id": name} for name in live)  # the capture's outputs are weak references
        ops.append({"op": "capture_end", "graph": graph})

    def model(n: int):
        def body(live):
            kept[n] = alloc(PLANTED_BYTES, live)
            for _ in range(3):
                for size in (n * hidden * 4, n * hidden * 2, n * 4 * hidden * 2, n * 4 * hidden * 2, n * hidden * 2):
                    alloc(size, live)
                done = live[1:]
                ops.extend({"op": "free", "id": name} for name in done)
                del live[1:]

        return body

    def replay(r: int):
        def body(live):
            replays[r] = [alloc(size, live) for size in (r * hidden * 2, r * hidden * 4, r * 4 * hidden * 2)]

        return body

    for n in (512, 256, 128):
        capture(f"model graph {n}", "model graphs", model(n))
    for r in (512, 480, 384, 288, 192, 96):
        capture(f"replay graph {r}", stream_of_replays, replay(r))
    return ops, kept, replays


@pytest.mark.parametrize("shared", [True, False])
def test_on_the_simulator_a_replay_graph_on_the_model_stream_takes_the_planted_block(shared):
    """Why the planted scenario must differ from eager on the H200 (`kit.replica.model.planted_kept_block`):
    the allocator simulator puts every model graph's planted block at one address, and the first large block of
    every replay graph from 129 rows there too when it shares the stream; never on a stream of its own."""
    from kit.allocator.simulator import simulate
    from kit.allocator.workload import parse_workload

    ops, kept, replays = _planted_workload("model graphs" if shared else "replay graphs")
    trace = simulate(parse_workload({"version": 1, "ops": ops})).snapshot()["device_traces"][0]
    sizes = {o["id"]: o["bytes"] for o in ops if o["op"] == "alloc"}
    served = iter(e for e in trace if e["action"] == "alloc" and e["size"] != 8)  # 8 B: the simulator's own
    where = {name: next(e["addr"] for e in served if e["size"] >= sizes[name]) for name in sizes}
    assert len({where[k] for k in kept.values()}) == 1  # every model graph's block at the same address
    block = (where[kept[512]], where[kept[512]] + 128 * 4 * 1024 * 4)  # what model graph 128 reads of it
    hit = {r for r, names in replays.items() if any(block[0] <= where[n] < block[1] for n in names)}
    assert hit == ({512, 480, 384, 288, 192} if shared else set())


# --- the planted replica captured on the CPU (CUDA stood in for), read by the invariant ----------------------


@pytest.mark.parametrize("planted", [True, False])
def test_the_planted_replicas_capture_reads_its_kept_block_after_the_replay_break(monkeypatch, planted):
    """The phases the GPU run records: with the planted flag, the kept block (here taken for the graph pool) is
    read after the replay break with its value from before it, every model graph; without it nothing there is."""
    from tests.helpers import TINY
    from tests.test_readwrite import _captured

    config = dataclasses.replace(TINY, dtype="float32", hyper_connections=True, planted_cross_break_read=planted)
    kept_spans: dict[int, tuple[int, int]] = {}

    def spy(runner):
        keep = runner.model._planted_keep

        def spied(num_tokens, like):
            kept = keep(num_tokens, like)
            if kept is not None:
                kept_spans[num_tokens] = (kept.data_ptr(), kept.data_ptr() + kept.numel() * 4)
            return kept

        runner.model._planted_keep = spied

    runner, recording = _captured(monkeypatch, config, spy=spy)
    blocks = kept_spans or {n: (0x1000 * n, 0x1000 * n + 64) for n in (8, 16)}  # unplanted: any pool at all
    raw = {"segments": [segment(span, (0, 1)) for span in blocks.values()]}
    result = readwrite_result.replica_invariant(recording, raw, config)
    sizes = {r["model_size"] for r in result["rows"]}
    assert sizes == {8, 16}
    for row in result["rows"]:
        n = row["model_size"]
        if planted:  # each model graph reads its own capture's block; an earlier capture's, in the pool too, not
            assert row["graph_pool_carried_bytes"] == n * 4 * config.hidden_size * 4
            assert row["invariant_holds"] is False
            assert {r["op"] for r in row["invariant_reads"]} == {"aten.mean.dim"}
        else:
            assert row["graph_pool_carried_bytes"] == 0 and row["invariant_holds"] is True
    assert result["holds"] is (not planted)

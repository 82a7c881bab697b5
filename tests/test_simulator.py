"""The allocator simulator: its rules, its snapshots, and its fidelity to the H200 recordings.

Fidelity is checked on every recorded workload of the corpus twice over: the
final state block for block (`canonical`), and the trace event by event
(`trace_events`: action, address, size, stream), so that a rule which only
changes the order of what the allocator does (which segment `empty_cache`
releases first) shows up too.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from kit import load_snapshot, segment_table
from kit.allocator.rules import get_allocation_size, round_size
from kit.allocator.simulator import CachingAllocatorSim, recorded_segment_addresses, simulate
from kit.allocator.workload import load_workload, parse_workload, pr_scenario
from kit.recordings import RECORDINGS

from .helpers import MIB
from .test_tables import run_kit

CORPUS = RECORDINGS / "corpus"
WORKLOADS = sorted(p for p in CORPUS.glob("*.json") if p.name != "PROVENANCE.json")
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def canonical(raw: dict) -> list[tuple]:
    """Segments and blocks by what the allocator decided, streams by workload name."""
    names = {sid: name for name, sid in raw["kit"]["streams"].items()}
    out = []
    for s in sorted(raw["segments"], key=lambda s: s["address"]):
        blocks = tuple(
            (
                b["address"] - s["address"],
                b["size"],
                b["state"],
                b["requested_size"] if b["state"] == "active_allocated" else None,
            )
            for b in s["blocks"]
        )
        out.append(
            (s["address"], s["total_size"], s["segment_type"], tuple(s["segment_pool_id"]), names[s["stream"]], blocks)
        )
    return out


def trace_events(raw: dict) -> list[tuple]:
    """Every trace entry as (action, address, size, stream by workload name), in order."""
    names = {sid: name for name, sid in raw["kit"]["streams"].items()}
    return [(e["action"], e["addr"], e["size"], names[e["stream"]]) for e in raw["device_traces"][0]]


def test_corpus_is_large_enough_and_has_provenance():
    assert len(WORKLOADS) >= 60
    prov = json.loads((CORPUS / "PROVENANCE.json").read_text())
    sessions = [prov, *prov.get("added", [])]  # workloads recorded later on their own carry their own
    for session in sessions:
        assert session["gpu"].startswith("NVIDIA") and session["command"].startswith("python scripts/record_corpus.py")
    recorded = {name for session in sessions for name in session["files"]}
    assert {f"{w.stem}{suffix}" for w in WORKLOADS for suffix in (".json", ".pickle")} <= recorded


def assert_reproduces(sim: dict, recorded: dict) -> None:
    """The simulated snapshot is the recorded one: segments and blocks, pools and graphs, the trace's events."""
    assert canonical(sim) == canonical(recorded)
    assert sim["kit"]["pools"] == recorded["kit"]["pools"]
    assert sim["kit"]["graphs"] == recorded["kit"]["graphs"]
    want, got = trace_events(recorded), trace_events(sim)
    first = next((i for i, (w, g) in enumerate(zip(want, got, strict=False)) if w != g), min(len(want), len(got)))
    assert got == want, f"trace differs from entry {first} of {len(want)}: recorded {want[first : first + 3]}"


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda p: p.stem)
def test_simulator_matches_the_real_allocator(workload):
    recorded = load_snapshot(workload.with_suffix(".pickle")).raw
    sim = simulate(load_workload(workload), addresses=recorded_segment_addresses(recorded)).snapshot()
    assert_reproduces(sim, recorded)


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda p: p.stem)
def test_sim_command_replays_every_recording(workload, tmp_path, capsys):
    from kit.cli import main

    out = tmp_path / "sim.pickle"
    recorded = workload.with_suffix(".pickle")
    assert main(["sim", str(workload), "--addresses-from", str(recorded), "-o", str(out)]) == 0
    assert canonical(load_snapshot(out).raw) == canonical(load_snapshot(recorded).raw)
    assert trace_events(load_snapshot(out).raw) == trace_events(load_snapshot(recorded).raw)


def test_cli_sim_addresses_from_writes_a_matching_snapshot(tmp_path):
    workload = CORPUS / "pr_two_streams.json"
    recorded = workload.with_suffix(".pickle")
    out = tmp_path / "sim.pickle"
    done = run_kit("sim", str(workload), "--addresses-from", str(recorded), "-o", str(out))
    assert done.returncode == 0, done.stderr
    sim = load_snapshot(out)
    assert sim.data_source == "simulator"
    assert canonical(sim.raw) == canonical(load_snapshot(recorded).raw)
    as_json = tmp_path / "sim.json"
    assert run_kit("sim", str(workload), "-o", str(as_json), "--json").returncode == 0
    written = json.loads(as_json.read_text())  # no recorded addresses: the simulator's own, one layout all the same
    own = simulate(load_workload(workload)).snapshot()
    assert canonical(written) == canonical(json.loads(json.dumps(own))) and len(written["segments"]) == 4
    assert trace_events(written) == trace_events(own)


def test_rounding_and_segment_sizes():
    assert [round_size(n) for n in (1, 511, 512, 513, 4096)] == [512, 512, 512, 1024, 4096]
    assert get_allocation_size(MIB) == 2 * MIB
    assert get_allocation_size(MIB + 512) == 20 * MIB
    assert get_allocation_size(10 * MIB - 512) == 20 * MIB
    assert get_allocation_size(10 * MIB) == 10 * MIB
    assert get_allocation_size(10 * MIB + 512) == 12 * MIB


def _ops(*ops):
    return parse_workload({"version": 1, "ops": list(ops)})


def test_no_reuse_across_streams_and_decisions_say_why():
    ops = _ops(
        {"op": "alloc", "id": "a", "bytes": 4 * MIB, "stream": "s1"},
        {"op": "free", "id": "a"},
        {"op": "alloc", "id": "b", "bytes": 4 * MIB, "stream": "s2"},
        {"op": "alloc", "id": "c", "bytes": 4 * MIB, "stream": "s1"},
    )
    sim = simulate(ops, explain=True)
    first, on_s2, on_s1 = sim.decisions
    assert on_s2.outcome == "new_segment" and on_s2.segment_size == 20 * MIB
    assert [r[4] for r in on_s2.refused] == ["other stream"]
    assert on_s1.outcome == "reused" and on_s1.block == first.block
    assert len(sim.segments) == 2


def test_split_merge_and_empty_cache():
    ops = _ops(
        {"op": "alloc", "id": "a", "bytes": 3 * MIB},
        {"op": "alloc", "id": "b", "bytes": 3 * MIB},
        {"op": "free", "id": "a"},
        {"op": "empty_cache"},
        {"op": "free", "id": "b"},
    )
    sim = CachingAllocatorSim().run(ops[:4])
    assert len(sim.segments) == 1  # one 20 MiB segment, split: not released while b lives
    sim.run(ops[4:])
    (seg,) = sim.snapshot()["segments"]
    assert [(b["size"], b["state"]) for b in seg["blocks"]] == [(20 * MIB, "inactive")]  # merged back
    sim.run(_ops({"op": "empty_cache"}))
    assert sim.snapshot()["segments"] == []


def test_graph_pools_survive_empty_cache_and_ids_follow_torch():
    ops = _ops(
        {"op": "capture_begin", "graph": "g0", "pool": "p", "stream": "s1"},
        {"op": "alloc", "id": "a", "bytes": 4 * MIB},
        {"op": "free", "id": "a"},
        {"op": "capture_end", "graph": "g0"},
        {"op": "capture_begin", "graph": "g1", "pool": None, "stream": "s1"},
        {"op": "capture_end", "graph": "g1"},
        {"op": "empty_cache"},
    )
    snap = simulate(ops).snapshot()
    assert snap["kit"]["graphs"] == {"g0": [0, 1], "g1": [1, 0]}
    pools = {tuple(s["segment_pool_id"]) for s in snap["segments"]}
    assert (0, 1) in pools  # the graph pool's free segment stays
    rng = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert [b["requested_size"] for b in rng] == [8, 8]  # the first capture's RNG state, default pool


def test_pr_scenario_in_the_simulator():
    two = segment_table(simulate(parse_workload(pr_scenario(False))).snapshot())
    shared = segment_table(simulate(parse_workload(pr_scenario(True))).snapshot())
    assert len(two[two["pool"] == (0, 1)]) == 2
    assert len(shared[shared["pool"] == (0, 1)]) == 1
    assert two["reserved"].sum() - shared["reserved"].sum() == 20 * MIB


def test_pytorch_memory_viz_reads_simulated_snapshots():
    from torch.cuda import _memory_viz

    snap = simulate(parse_workload(pr_scenario(False))).snapshot()
    summary = _memory_viz.segsum(snap)
    table = segment_table(snap)
    assert f"segments: {len(snap['segments'])}\n" in summary
    assert f"total_reserved: {table['reserved'].sum() / MIB:.1f}MiB" in summary  # 62.0MiB: torch's own sum
    assert f"total_allocated: {table['allocated'].sum() / MIB:.1f}MiB" in summary
    lines = _memory_viz.trace(snap).splitlines()  # walks device_traces action by action
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert sum("cudaMalloc(" in line for line in lines) == actions.count("segment_alloc") == 4
    assert sum(line.startswith("del ") for line in lines) == actions.count("free_requested") > 0
    assert pickle.loads(pickle.dumps(snap)) == snap


def test_corpus_workloads_are_what_the_recorder_generates():
    import sys

    sys.path.insert(0, str(SCRIPTS))
    from record_corpus import boundary_workloads, workloads

    expected = workloads(len([w for w in WORKLOADS if w.stem.startswith("random_")]))
    boundary = boundary_workloads()  # recorded on their own (tests/test_boundary_recordings.py)
    assert {w.stem for w in WORKLOADS} - set(boundary) == set(expected)
    for w in WORKLOADS:
        assert json.loads(w.read_text()) == {**expected, **boundary}[w.stem], w.name


def test_during_a_capture_only_the_capturing_streams_allocations_go_to_its_pool():
    """Another stream's eager allocation while s1 captures (a workload cannot say it; a trace replay can) stays in
    the default pool."""
    sim = CachingAllocatorSim()
    sim.capture_begin("g0", "p", "s1")
    captured, eager = sim.malloc("captured", 4 * MIB, "s1"), sim.malloc("eager", 6 * MIB, "s2")
    sim.capture_end("g0")
    assert (captured.pool, eager.pool) == (sim.pool_ids["p"], (0, 0))

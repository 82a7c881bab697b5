"""What-if against the real allocator: pairs recorded on the H200 as written and with one stream merged.

`kit/recordings/merged/` holds 13 workloads (`scripts/record_merged.py`) run
twice on the GPU: as generated and with stream s2's work moved onto s1. The
traces free segments (`empty_cache`) and capture into shared and private
pools. `what_if(original, {s2: s1})` must give every pool the merged run
reserved, or a correction that names the cause and whose range holds the
measured figure. `plain/replay_graphs_{separate,shared}.pickle` is vLLM's
capture order with matmuls: the replay stream's cuBLAS workspaces land in the
graph pool, and a shared run never makes them.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys

import pytest

from kit.allocator.simulator import simulate
from kit.allocator.workload import load_workload
from kit.analysis import whatif
from kit.analysis.names import stream_labels
from kit.analysis.tables import segment_table
from kit.analysis.trace.walk import walk_trace
from kit.analysis.whatif import SPREAD_SEEN_OUTSIDE, what_if, within_seen_spread
from kit.analysis.workspaces import find_workspaces
from kit.errors import KitError
from kit.load.snapshot import Snapshot, load_snapshot
from kit.recordings import RECORDINGS, recording

from .helpers import MIB

MERGED = RECORDINGS / "merged"
PAIRS = sorted(p.stem for p in MERGED.glob("merged_*.pickle") if not p.stem.endswith("_merged"))
SPREAD = RECORDINGS / "merged_spread"
SPREAD_PAIRS = sorted(
    p.name.removesuffix(".pickle.gz") for p in SPREAD.glob("spread_*.pickle.gz") if "_merged" not in p.name
)


def reserved_by_pool(table) -> dict[tuple[int, int], int]:
    return {tuple(p): int(v) for p, v in table.groupby("pool")["reserved"].sum().items()}


def assert_predicts(result, measured: dict[tuple[int, int], int]) -> list[tuple[int, int]]:
    """Every graph pool exactly as `measured` (none vanishes); the default pool, where it differs, inside the range
    the prediction states (where cudaMalloc lays segments decides ties). Returns the pools that differed."""
    predicted = reserved_by_pool(result.predicted)
    assert result.spread is not None
    missed = []
    for pool in measured.keys() | predicted.keys():
        got, want = predicted.get(pool, 0), measured.get(pool, 0)
        if pool != (0, 0):
            assert got == want, (pool, got, want)
        elif got != want:
            low, high = result.spread[pool]
            assert low <= want <= high, (pool, got, want, low, high)
            missed.append(pool)
    return missed


def merged_what_if(name: str):
    snap = load_snapshot(str(MERGED / f"{name}.pickle"))
    streams = snap.kit["streams"]
    return snap, what_if(snap, {streams["s2"]: streams["s1"]})


def test_at_least_ten_recorded_pairs_free_segments_and_capture():
    assert len(PAIRS) >= 10
    for name in PAIRS:
        for stem in (name, f"{name}_merged"):
            trace = load_snapshot(str(MERGED / f"{stem}.pickle")).trace
            assert any(e.action == "segment_free" for e in trace), stem
            assert any(p != (0, 0) for p in reserved_by_pool(segment_table(str(MERGED / f"{stem}.pickle"))))


@pytest.mark.parametrize("name", PAIRS)
def test_what_if_predicts_every_pool_the_merged_run_reserved_on_the_gpu(name):
    snap, result = merged_what_if(name)
    measured = reserved_by_pool(segment_table(str(MERGED / f"{name}_merged.pickle")))
    for pool in assert_predicts(result, measured):
        assert any(str(pool) in line and "cudaMalloc" in line for line in result.corrections)


@pytest.mark.parametrize("name", PAIRS)
def test_what_if_agrees_with_the_simulator_running_the_merged_workload_on_graph_pools(name):
    _, result = merged_what_if(name)
    sim = Snapshot(simulate(load_workload(str(MERGED / f"{name}_merged.json"))).snapshot(), origin="simulator")
    simulated, predicted = reserved_by_pool(segment_table(sim)), reserved_by_pool(result.predicted)
    graph = {p for p in simulated.keys() | predicted.keys() if p != (0, 0)}
    assert {p: predicted.get(p, 0) for p in graph} == {p: simulated.get(p, 0) for p in graph}


def test_the_two_default_pool_misses_are_within_the_stated_range_and_graph_pools_all_exact():
    exact = total = 0
    for name in PAIRS:
        _, result = merged_what_if(name)
        measured = reserved_by_pool(segment_table(str(MERGED / f"{name}_merged.pickle")))
        predicted = reserved_by_pool(result.predicted)
        for pool in measured.keys() | predicted.keys():
            total += 1
            exact += predicted.get(pool, 0) == measured.get(pool, 0)
    assert (exact, total) == (160, 162)  # docs/whatif.md's figures


# --- the spread set: long, mostly eager work moved, the default pool decided by cudaMalloc's addresses ---


@functools.cache
def spread_pair(name: str) -> tuple:
    """(what-if of `name` with s2 mapped onto s1, reserved by pool of the merged run on the GPU)."""
    snap = load_snapshot(str(SPREAD / f"{name}.pickle.gz"))
    streams = snap.kit["streams"]
    result = what_if(snap, {streams["s2"]: streams["s1"]})
    return result, reserved_by_pool(segment_table(str(SPREAD / f"{name}_merged.pickle.gz")))


def test_the_spread_set_has_twelve_pairs_whose_default_pool_moves():
    assert len(SPREAD_PAIRS) == 12
    for name in SPREAD_PAIRS:
        recorded = reserved_by_pool(segment_table(str(SPREAD / f"{name}.pickle.gz")))
        assert recorded[(0, 0)] != spread_pair(name)[1][(0, 0)]


@pytest.mark.parametrize("name", SPREAD_PAIRS)
def test_on_the_spread_set_every_graph_pool_is_exact_and_the_default_pool_near_its_stated_range(name):
    result, measured = spread_pair(name)
    predicted = reserved_by_pool(result.predicted)
    graph = {p for p in measured if p != (0, 0)}
    assert {p: predicted.get(p, 0) for p in graph} == {p: measured[p] for p in graph}
    assert set(predicted) <= set(measured)
    if predicted[(0, 0)] != measured[(0, 0)]:
        low, high = result.spread[(0, 0)]
        assert within_seen_spread(measured[(0, 0)], low, high), (low, measured[(0, 0)], high)
        assert any("(0, 0)" in line and "cannot bound" in line for line in result.corrections)


def test_the_share_the_correction_line_states_is_what_the_spread_set_measured():
    """SPREAD_SEEN_OUTSIDE is the smallest whole percent that holds every miss: neither looser nor tighter."""
    outside = []
    for name in SPREAD_PAIRS:
        result, measured = spread_pair(name)
        low, high = result.spread[(0, 0)]
        want = measured[(0, 0)]
        outside.append(max(low - want, want - high, 0) / want)
    assert sum(share > 0 for share in outside) == 6
    assert math.ceil(max(outside) * 100) / 100 == SPREAD_SEEN_OUTSIDE


def test_each_placement_lays_new_segments_where_its_docstring_says():
    """RECORDED takes the recording's addresses in order, SHUFFLED the same addresses in another order,
    ASCENDING and DESCENDING none of them (above everything recorded)."""
    recorded = [(10 + i) << 30 for i in range(8)]
    laid = {}
    for placement in (whatif.RECORDED, whatif.SHUFFLED, whatif.ASCENDING, whatif.DESCENDING):
        sim = whatif._TraceSim(recorded, above=20 << 30, placement=placement)
        laid[placement] = [sim._cuda_malloc(MIB) for _ in recorded]
    assert laid[whatif.RECORDED] == recorded
    assert sorted(laid[whatif.SHUFFLED]) == recorded and laid[whatif.SHUFFLED] != recorded
    for placement in (whatif.ASCENDING, whatif.DESCENDING):
        assert min(laid[placement]) >= 20 << 30 and len(set(laid[placement])) == len(recorded)
    assert laid[whatif.ASCENDING] == sorted(laid[whatif.ASCENDING])
    assert laid[whatif.DESCENDING] == sorted(laid[whatif.DESCENDING], reverse=True)


# --- the cuBLAS workspace of a moved stream --------------------------------------------------------


def _replay_graphs(variant: str) -> Snapshot:
    return load_snapshot(recording(f"plain/replay_graphs_{variant}.pickle"))


def _capture_streams(snap: Snapshot) -> list[int]:
    allocs = walk_trace(snap).allocs
    in_pool = allocs[allocs["pool"].map(lambda p: tuple(p) != (0, 0))]
    return list(dict.fromkeys(in_pool["stream"].tolist()))


def _graph_pool(table) -> int:
    return int(table[table["pool"] != (0, 0)]["reserved"].sum())


def test_workspaces_are_found_by_their_cpp_frames():
    snap = _replay_graphs("separate")
    found = find_workspaces(snap, snap.trace)
    assert found.found_by == "frames"
    kinds = sorted((kind, snap.trace[i].size) for i, kind in found.allocs.items())
    # one cuBLAS (32 MiB) and one cuBLASLt (1 MiB) workspace per stream: default, model, replay
    assert kinds == [("cuBLAS", 32 * MIB)] * 3 + [("cuBLASLt", MIB)] * 3


def test_what_if_on_the_vllm_shaped_separate_run_predicts_the_shared_runs_graph_pool_exactly():
    separate, shared = _replay_graphs("separate"), _replay_graphs("shared")
    model, replay = _capture_streams(separate)
    labels = stream_labels(separate)
    assert labels[model].startswith("stream of capture_model_graphs")
    result = what_if(separate, {labels[replay]: labels[model]})
    assert _graph_pool(segment_table(separate)) == 114 * MIB
    assert _graph_pool(result.predicted) == _graph_pool(segment_table(shared)) == 60 * MIB
    assert reserved_by_pool(result.predicted) == {p: v for p, v in reserved_by_pool(segment_table(shared)).items()}
    assert len(result.modelled) == 2 and all("graph pool 1" in line for line in result.modelled)
    assert result.corrections == []


def test_what_if_json_on_the_vllm_shaped_run_predicts_the_shared_graph_pool():
    separate = _replay_graphs("separate")
    model, replay = _capture_streams(separate)
    path = str(recording("plain/replay_graphs_separate.pickle"))
    done = subprocess.run(
        [sys.executable, "-m", "kit", "what-if", path, "--map", f"{replay:#x}={model:#x}", "--json"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    graph = sum(r["reserved"] for r in out["predicted"] if tuple(r["pool"]) != (0, 0))
    assert graph == _graph_pool(segment_table(_replay_graphs("shared")))
    assert len(out["modelled"]) == 2 and out["spread"] == []


def test_a_workspace_made_before_the_trace_counts_for_the_stream_moved_onto_it():
    """Cut after the model graphs' stream made its workspaces: they are live blocks from before the trace, and the
    replay stream's, moved onto that stream, are still left out."""
    raw = dict(_replay_graphs("separate").raw)
    raw["device_traces"] = [raw["device_traces"][0][100:]]
    raw.pop("kit", None)
    snap = Snapshot(raw, origin="replay_graphs_separate cut after the model stream's workspaces")
    assert sorted(kind for kind, _ in find_workspaces(snap, snap.trace).seeded.values()).count("cuBLAS") == 2
    model, replay = _capture_streams(snap)
    result = what_if(snap, {replay: model})
    assert _graph_pool(result.predicted) == _graph_pool(segment_table(_replay_graphs("shared"))) == 60 * MIB
    assert len(result.modelled) == 2 and all("left out" in line for line in result.modelled)


def test_the_baseline_line_says_which_way_the_replay_is_off():
    import pandas as pd

    def table(graph_pool: int) -> pd.DataFrame:
        return pd.DataFrame(
            {"device": [0, 0], "pool": [(0, 0), (0, 1)], "pool_label": ["default pool", "graph pool 1"],
             "reserved": [2 * MIB, graph_pool]}
        )  # fmt: skip

    (more,) = whatif._baseline_differences(table(4 * MIB), table(6 * MIB), 0)
    (less,) = whatif._baseline_differences(table(6 * MIB), table(4 * MIB), 0)
    assert "reserves 2.00 MiB more than the recording" in more and "2.00 MiB less than the recording" in less
    assert more.startswith("graph pool 1 (0, 1)")


def test_told_apart_by_size_a_workspace_is_the_allocation_still_live_at_its_address():
    """32 MiB at one address on one stream, freed, then 32 MiB there again: the second is the workspace."""
    from .helpers import segment

    base, stream = 0x7F00_0000_0000, 7
    events = [("segment_alloc", base, 64 * MIB), ("alloc", base, 32 * MIB), ("free_requested", base, 32 * MIB)]
    events += [("free_completed", base, 32 * MIB), ("alloc", base, 32 * MIB)]
    trace = [{"action": a, "addr": addr, "size": n, "stream": stream, "frames": []} for a, addr, n in events]
    raw = {
        "segments": [segment(base, [(32 * MIB, "active_allocated"), (32 * MIB, "inactive")], stream=stream)],
        "device_traces": [trace],
    }
    snap = Snapshot(raw, origin="a workspace-sized block freed and made again")
    found = find_workspaces(snap, snap.trace)
    assert found.found_by == "size" and found.allocs == {4: "cuBLAS-sized"}


def test_without_cpp_frames_workspaces_are_told_apart_by_size_and_the_correction_says_so():
    raw = dict(_replay_graphs("separate").raw)
    cpp = (".cpp", ".h", "??", "")

    def python_only(frames):
        return [f for f in frames if not str(f.get("filename", "")).endswith(cpp) and f.get("filename") not in cpp]

    raw["device_traces"] = [[dict(e, frames=python_only(e["frames"])) for e in t] for t in raw["device_traces"]]
    snap = Snapshot(raw, origin="replay_graphs_separate without C++ frames")
    assert find_workspaces(snap, snap.trace).found_by == "size"
    model, replay = _capture_streams(snap)
    result = what_if(snap, {replay: model})
    assert _graph_pool(result.predicted) == 60 * MIB
    assert any("told apart by shape" in line for line in result.corrections)


def test_a_workloads_snapshot_has_no_workspaces():
    snap = load_snapshot(str(MERGED / "merged_100.pickle"))
    assert snap.kit["workload"] is True
    assert find_workspaces(snap, snap.trace).allocs == {}


# --- maps the what-if refuses ----------------------------------------------------------------------


def test_what_if_without_a_trace_says_it_needs_one():
    raw = dict(_replay_graphs("separate").raw)
    raw["device_traces"] = [[]]
    with pytest.raises(KitError, match="no trace recorded"):
        what_if(Snapshot(raw, origin="no trace"), {"1": "0"})


def test_a_capture_stream_mapped_onto_the_default_stream_is_refused():
    snap = _replay_graphs("separate")
    _, replay = _capture_streams(snap)
    with pytest.raises(KitError, match="cannot be captured on the default stream"):
        what_if(snap, {replay: 0})


def test_chained_maps_are_refused():
    snap = _replay_graphs("separate")
    model, replay = _capture_streams(snap)
    with pytest.raises(KitError, match="which .* is mapped onto"):
        what_if(snap, {replay: model, model: 0})


def _spread_case() -> tuple:
    snap = load_snapshot(str(SPREAD / f"{SPREAD_PAIRS[0]}.pickle.gz"))
    streams = snap.kit["streams"]
    return snap, whatif.resolve_stream_map(snap, {streams["s2"]: streams["s1"]}), walk_trace(snap)


def test_the_spreads_tries_in_forked_processes_are_its_tries_run_in_order(monkeypatch):
    snap, moves, walk = _spread_case()
    real = whatif.simulated_reserved
    monkeypatch.setattr(whatif, "simulated_reserved", lambda *a: (real(*a), os.getpid()))  # where each try ran
    monkeypatch.setattr(whatif, "SPREAD_IN_PROCESSES", 0)
    monkeypatch.setattr(whatif.threading, "active_count", lambda: 1)  # pytest-xdist's worker runs a thread of its own
    with whatif.spread_tries(snap, moves, walk) as tries:
        forked = tries()
    assert whatif._FORKED is None  # let go of once the block ends
    monkeypatch.setattr(whatif, "SPREAD_IN_PROCESSES", 10**9)
    with whatif.spread_tries(snap, moves, walk) as tries:
        in_order = tries()
    assert os.getpid() not in {pid for _, pid in forked} and {pid for _, pid in in_order} == {os.getpid()}
    assert [r for r, _ in forked] == [r for r, _ in in_order] and len({str(r) for r, _ in in_order}) > 1


def test_a_process_running_another_thread_runs_the_tries_itself(monkeypatch):
    snap, _, walk = _spread_case()
    monkeypatch.setattr(whatif, "SPREAD_IN_PROCESSES", 0)
    monkeypatch.setattr(whatif.threading, "active_count", lambda: 1)
    assert whatif._forks_safely(snap, walk.device)
    monkeypatch.setattr(whatif.threading, "active_count", lambda: 2)  # a notebook's kernel, a progress ticker
    assert not whatif._forks_safely(snap, walk.device)

"""Trace analysis: rewind, block reuse per allocation, stranding, on the recorded fixtures.

The walk's segments and layout are `kit.analysis.trace.state`'s."""

from __future__ import annotations

import copy
import json

import pytest

from kit import load_snapshot
from kit.analysis.trace.reports import reuse_table, stranding_verdicts
from kit.analysis.trace.walk import walk_trace

from .helpers import RECORDED, run_kit
from .test_simulator import CORPUS


def _graph_pool_rows(snap, table):
    pool = tuple(snap.kit["pools"].get("global graph pool") or snap.kit["pools"]["global pool"])
    return table[table["pool"] == pool].set_index("stream_label")


@pytest.mark.parametrize("path", [RECORDED["two_streams"], CORPUS / "pr_two_streams.pickle"], ids=["torch", "workload"])
def test_reuse_on_separate_streams_strands_every_replay_segment(path):
    done = run_kit("reuse", str(path), "--json")
    assert done.returncode == 0, done.stderr
    snap = load_snapshot(path)
    rows = {(tuple(r["pool"]), r["stream"]): r for r in json.loads(done.stdout)}
    replay_stream = snap.kit["streams"].get("replay graphs stream") or snap.kit["streams"]["replay_stream"]
    pool = next(tuple(p) for p in snap.kit["pools"].values())
    replay = rows[(pool, replay_stream)]
    assert replay["new_segment_bytes"] > 0
    assert replay["stranded_bytes"] == replay["new_segment_bytes"]
    assert reuse_table(snap).attrs["mismatches"] == []


@pytest.mark.parametrize(
    "path", [RECORDED["shared_stream"], CORPUS / "pr_shared_stream.pickle"], ids=["torch", "workload"]
)
def test_reuse_on_shared_stream_strands_nothing_in_the_graph_pool(path):
    snap = load_snapshot(path)
    table = reuse_table(snap)
    pool = next(tuple(p) for p in snap.kit["pools"].values())
    assert table[table["pool"] == pool]["stranded_bytes"].sum() == 0
    assert table.attrs["mismatches"] == []


def test_reuse_on_a_trace_that_starts_mid_process():
    full = load_snapshot(RECORDED["two_streams"])
    raw = copy.deepcopy(full.raw)
    replay_begin = raw["kit"]["captures"][1]["trace_begin"]
    raw["device_traces"][0] = raw["device_traces"][0][replay_begin - 20 :]
    snap = load_snapshot(raw)
    walk = walk_trace(snap)
    assert walk.mismatches == []
    assert walk.rewound_segments > 0  # the state at the first entry is not empty
    table = reuse_table(snap)
    stream = raw["kit"]["streams"]["replay graphs stream"]
    row = table[(table["pool"] == (0, 1)) & (table["stream"] == stream)].iloc[0]
    assert row["stranded_bytes"] == row["new_segment_bytes"] == 42 * 2**20


def test_stranding_verdict_names_both_streams():
    (verdict,) = [v for v in stranding_verdicts(RECORDED["two_streams"]) if v.startswith("global graph pool")]
    assert verdict.startswith(
        "global graph pool, replay graphs stream: 42.00 MiB of new segments were cudaMalloc'ed over the trace "
        "(cumulative churn) while a fitting free block of this pool sat on model graphs stream; 42.00 MiB of them "
        "are still reserved at the end. Why: "
    )
    from kit.analysis.trace.reports import stranding_report

    report = stranding_report(RECORDED["two_streams"])
    row = report[report["pool"] == (0, 1)].iloc[0]
    assert row["stranded_bytes"] == 42 * 2**20 and "forward" in row["frames"]  # demo.forward made them


def test_reuse_needs_a_trace(tmp_path):
    raw = copy.deepcopy(load_snapshot(RECORDED["two_streams"]).raw)
    raw.pop("device_traces")
    path = tmp_path / "state_only.json"
    path.write_text(json.dumps(raw))
    done = run_kit("reuse", str(path))
    assert done.returncode == 2 and "no trace recorded" in done.stderr


@pytest.mark.parametrize("workload", sorted(CORPUS.glob("*.pickle")), ids=lambda p: p.stem)
def test_forward_walk_ends_at_the_snapshot(workload):
    assert walk_trace(workload).mismatches == []


def test_capture_attribution_names_each_captures_segments():
    from kit.analysis.attribution import capture_attribution

    table = capture_attribution(RECORDED["two_streams"])
    replay = table[table["graph"] == "replay graph"]
    assert list(replay["pool"]) == [(0, 1)]
    assert replay.iloc[0]["stream_label"] == "replay graphs stream"
    assert replay.iloc[0]["bytes"] == 42 * 2**20
    shared = capture_attribution(RECORDED["shared_stream"])
    replay = shared[(shared["graph"] == "replay graph") & (shared["pool"] == (0, 1))]
    assert list(replay["bytes"]) == [0]  # listed, having added nothing: the model graphs' blocks served it


def test_what_if_from_separate_streams_predicts_the_shared_recording():
    from kit.analysis.tables import segment_table
    from kit.analysis.whatif import what_if

    result = what_if(RECORDED["two_streams"], {"replay graphs stream": "model graphs stream"})
    shared = segment_table(load_snapshot(RECORDED["shared_stream"]))
    predicted_pool = result.predicted[result.predicted["pool"] == (0, 1)]
    assert predicted_pool["reserved"].sum() == shared[shared["pool"] == (0, 1)]["reserved"].sum()
    assert predicted_pool["allocated"].sum() == shared[shared["pool"] == (0, 1)]["allocated"].sum()
    assert result.saved[(0, 1)] == 42 * 2**20
    # the replay stream's 32 MiB cuBLAS workspace is left out (the shared run never made it), by its size
    (modelled,) = result.modelled
    assert "32.00 MiB" in modelled and "cuBLAS" in modelled
    (correction,) = result.corrections
    assert "told apart by shape" in correction
    predicted_default = result.predicted[result.predicted["pool"] == (0, 0)]["reserved"].sum()
    assert predicted_default == shared[shared["pool"] == (0, 0)]["reserved"].sum()


def test_what_if_cli_and_bad_mapping():
    done = run_kit(
        "what-if", str(RECORDED["two_streams"]), "--map", "replay graphs stream=model graphs stream", "--json"
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert {tuple(s["pool"]): s["bytes"] for s in out["saved"]}[(0, 1)] == 42 * 2**20
    done = run_kit("what-if", str(RECORDED["two_streams"]), "--map", "nope=model graphs stream")
    assert done.returncode == 2 and "no stream 'nope'" in done.stderr
    done = run_kit("what-if", str(RECORDED["two_streams"]), "--map", "oops")
    assert done.returncode == 2 and "expected FROM=TO" in done.stderr

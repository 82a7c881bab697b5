"""Trace analysis: rewind, block reuse per allocation, stranding, on the recorded fixtures."""

from __future__ import annotations

import copy
import json

import pytest

from kit import load_snapshot
from kit.trace import replay_trace, reuse_table, stranding_verdicts

from .conftest import RECORDED
from .test_simulator import CORPUS
from .test_tables import run_kit


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
    replay = replay_trace(snap)
    assert replay.mismatches == []
    assert replay.rewound_segments > 0  # the state at the first entry is not empty
    table = reuse_table(snap)
    stream = raw["kit"]["streams"]["replay graphs stream"]
    row = table[(table["pool"] == (0, 1)) & (table["stream"] == stream)].iloc[0]
    assert row["stranded_bytes"] == row["new_segment_bytes"] == 42 * 2**20


def test_stranding_verdict_names_both_streams():
    (verdict,) = [v for v in stranding_verdicts(RECORDED["two_streams"]) if "graph pool" in v]
    assert "replay graphs stream" in verdict and "model graphs stream" in verdict and "42.00 MiB" in verdict


def test_reuse_needs_a_trace(tmp_path):
    raw = copy.deepcopy(load_snapshot(RECORDED["two_streams"]).raw)
    raw.pop("device_traces")
    path = tmp_path / "state_only.json"
    path.write_text(json.dumps(raw))
    done = run_kit("reuse", str(path))
    assert done.returncode == 2 and "no trace recorded" in done.stderr


@pytest.mark.parametrize("workload", sorted(CORPUS.glob("*.pickle")), ids=lambda p: p.stem)
def test_forward_walk_ends_at_the_snapshot(workload):
    assert replay_trace(workload).mismatches == []

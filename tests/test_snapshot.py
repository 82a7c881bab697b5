"""The snapshot model: loading from pickle, JSON and dicts, across torch versions."""

from __future__ import annotations

import json
import pickle

import pytest

from kit import KitError, Snapshot, load_snapshot
from kit.load.rows import Block, Segment, TraceEntry
from kit.load.unpickle import safe_unpickle

from .helpers import MIB


def test_recorded_fixture_normalises_into_records(recorded_path):
    snap = load_snapshot(recorded_path)
    assert snap.segments and all(isinstance(s, Segment) for s in snap.segments)
    assert all(isinstance(b, Block) for s in snap.segments for b in s.blocks)
    assert snap.has_trace and all(isinstance(e, TraceEntry) for e in snap.trace)
    assert snap.raw["segments"][0]["address"] == snap.segments[0].address
    for s in snap.segments:
        assert sum(b.size for b in s.blocks) == s.total_size
        assert s.allocated_size == sum(b.size for b in s.blocks if b.state == "active_allocated")
    prov = snap.provenance
    assert prov["gpu"].startswith("NVIDIA") and prov["torch"].startswith("2.")
    assert snap.data_source == "recorded" and prov["gpu"] in snap.source_label


def test_json_and_pickle_load_the_same(recorded_path, tmp_path):
    snap = load_snapshot(recorded_path)
    as_json = tmp_path / "snap.json"
    as_json.write_text(json.dumps(snap.raw))
    again = load_snapshot(as_json)
    assert again.segments == snap.segments  # pool ids read back as tuples
    assert again.trace == snap.trace


def _strip(raw: dict, segment_keys=(), block_keys=(), trace_keys=(), top_keys=()) -> dict:
    raw = pickle.loads(pickle.dumps(raw))
    for k in top_keys:
        raw.pop(k, None)
    for s in raw["segments"]:
        for k in segment_keys:
            s.pop(k, None)
        for b in s["blocks"]:
            for k in block_keys:
                b.pop(k, None)
    for t in raw.get("device_traces", []):
        for e in t:
            for k in trace_keys:
                e.pop(k, None)
    return raw


@pytest.mark.parametrize(
    "strip",
    [
        # torch 2.1-era: no external_annotations, no compile_context/user_metadata, no trace stream
        dict(top_keys=("external_annotations",), trace_keys=("compile_context", "user_metadata", "stream")),
        # no history recorded at all
        dict(top_keys=("device_traces", "external_annotations")),
        # blocks without addresses (offsets are implied by order)
        dict(block_keys=("address",)),
    ],
    ids=["torch-2.1-keys", "no-device-traces", "blocks-without-address"],
)
def test_older_snapshot_shapes_load(recorded_path, strip):
    full = load_snapshot(recorded_path)
    snap = load_snapshot(_strip(full.raw, **strip))
    assert [s.address for s in snap.segments] == [s.address for s in full.segments]
    assert [b.address for s in snap.segments for b in s.blocks] == [b.address for s in full.segments for b in s.blocks]
    if "device_traces" in strip.get("top_keys", ()):
        assert not snap.has_trace and snap.trace == ()


def test_safe_unpickle_accepts_plain_data():
    data = {"a": [1, 2.5, None, True], "b": (1, 2), "c": {"d": "e"}, "big": 1 << 70}
    assert safe_unpickle(pickle.dumps(data)) == data


@pytest.mark.parametrize(
    "raw, message",
    [
        ([], "top level is list"),
        ({"x": 1}, "no 'segments' key"),
        ({"segments": [{"address": 1}]}, "missing 'total_size'"),
        ({"segments": [{"address": -1, "total_size": 2}]}, "negative"),
        ({"segments": [{"address": 0, "total_size": "2"}]}, "expected an integer"),
        ({"segments": [{"address": 0, "total_size": 4, "blocks": [{"size": 2, "state": "inactive"}]}]}, "cover 2"),
        ({"segments": [{"address": 0, "total_size": 4, "blocks": [{"size": 4, "state": "weird"}]}]}, "block state"),
        ({"segments": [{"address": 0, "total_size": 4, "segment_pool_id": [1]}]}, "two integers"),
        ({"segments": [], "device_traces": [[{"action": 7}]]}, "action is 7, expected a name"),
        ({"segments": [], "device_traces": [[{"action": ["alloc"]}]]}, "action is a list of 1"),
        ({"segments": [], "device_traces": "x"}, "not a list of lists"),
    ],
)
def test_malformed_snapshot_is_one_line_error(raw, message):
    with pytest.raises(KitError, match=message) as e:
        snap = load_snapshot(raw)
        snap.traces  # noqa: B018 - traces are parsed on first use
    assert "\n" not in str(e.value)


def test_kit_key_names_streams_and_pools(synthetic):
    synthetic["kit"] = {"streams": {"model graphs stream": 7}, "pools": {"global graph pool": [0, 1]}}
    snap = Snapshot(synthetic)
    assert snap.stream_names == {7: "model graphs stream"}
    assert snap.pool_names == {(0, 1): "global graph pool"}
    assert snap.segments[2].free_size == 30 * MIB
    assert snap.segments[3].active_size == 512

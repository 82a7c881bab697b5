"""A short fuzz run of the loaders and the workload parser: every input ends in a result or a one-line KitError.

Property-based (hypothesis, derandomised so CI is repeatable): arbitrary bytes,
real snapshots with a wrong value in one field, random snapshot-shaped
structures, hostile pickles, shared-reference bombs, arbitrary and valid
workloads. Plus every reproducer of a crash the long run (scripts/fuzz.py)
found and the kit no longer has (tests/fixtures/fuzz). The targets and mutators
are in tests/fuzz_targets.py; a target raising anything but KitError, or
running code while decoding, fails the test.
"""

from __future__ import annotations

import copy
import json
import pickle
import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kit import KitError, load_snapshot, segment_table
from kit.load.rows import BLOCK_STATES, TRACE_ACTIONS

from . import foreign_snapshots as foreign
from . import fuzz_targets as ft

FAST = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([-1, 0, 1 << 63, 1 << 64, 1 << 70, -(1 << 63)])
    | st.builds(pow, st.just(10), st.just(5000))  # more digits than Python will print
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["inactive", "active_allocated", "alloc", "segment_map", "large", "small"])
)
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@pytest.fixture(scope="module", autouse=True)
def warm():
    ft.warm_up()


def _paths(obj, path=()):
    """Every path to a value in a nested dict/list."""
    yield path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*path, i))


SNAPSHOT = foreign.snapshot("2.11")
SNAPSHOT["kit"] = {
    "streams": {"model graphs stream": foreign.S1, "replay graphs stream": foreign.S2},
    "pools": {"global graph pool": list(foreign.GRAPH_POOL)},
    "captures": [
        {
            "graph": "model 8 graph 0",
            "capture": "model 8",
            "stream": foreign.S1,
            "pool": [0, 1],
            "trace_begin": 2,
            "trace_end": 7,
        },
        {
            "graph": "replay 8 graph 0",
            "capture": "replay 8",
            "stream": foreign.S2,
            "pool": [0, 1],
            "trace_begin": 7,
            "trace_end": 11,
        },
    ],
}
FIELDS = [p for p in _paths(SNAPSHOT) if p]


def _with(obj, path, value):
    obj = copy.deepcopy(obj)
    target = obj
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    return obj


def test_the_fuzzed_snapshot_is_whole_before_it_is_broken():
    assert ft.snapshot_target(pickle.dumps(SNAPSHOT)) == "ok"
    assert ft.snapshot_target(json.dumps(SNAPSHOT).encode()) == "ok"


@FAST
@given(st.binary(max_size=2048))
def test_any_bytes_load_or_fail_in_one_line(data):
    ft.snapshot_target(data)
    ft.workload_target(data)


@FAST
@given(st.sampled_from(FIELDS), values, st.booleans())
def test_a_wrong_value_in_any_field_of_a_real_snapshot(path, value, as_json):
    broken = _with(SNAPSHOT, path, value)
    try:
        data = json.dumps(broken).encode() if as_json else pickle.dumps(broken)
    except (ValueError, TypeError):  # JSON cannot hold it (a 5000-digit integer)
        data = pickle.dumps(broken)
    ft.snapshot_target(data)


@FAST
@given(st.sampled_from(FIELDS))
def test_a_field_removed_from_a_real_snapshot(path):
    broken = copy.deepcopy(SNAPSHOT)
    target = broken
    for k in path[:-1]:
        target = target[k]
    del target[path[-1]]
    ft.snapshot_target(pickle.dumps(broken))


block = st.fixed_dictionaries(
    {
        "size": st.integers(-10, 1 << 30),
        "state": st.sampled_from([*BLOCK_STATES, "active_awaiting_free", "x"]) | values,
    },
    optional={"address": st.integers(-10, 1 << 48), "requested_size": values, "frames": values},
)
segment = st.fixed_dictionaries(
    {"address": st.integers(-10, 1 << 48), "total_size": st.integers(-10, 1 << 30)},
    optional={
        "blocks": st.lists(block, max_size=4) | values,
        "stream": st.integers() | values,
        "segment_pool_id": st.tuples(st.integers(0, 3), st.integers(0, 3)) | values,
        "device": st.integers(-1, 3),
        "segment_type": values,
        "is_expandable": values,
    },
)
entry = st.fixed_dictionaries(
    {"action": st.sampled_from([*TRACE_ACTIONS, "explode"]) | values},
    optional={"addr": st.integers(-10, 1 << 48) | values, "size": st.integers(-10, 1 << 30), "stream": values},
)
snapshot_shaped = st.fixed_dictionaries(
    {"segments": st.lists(segment, max_size=5)},
    optional={"device_traces": st.lists(st.lists(entry, max_size=12), max_size=2) | values, "kit": values},
)


@FAST
@given(snapshot_shaped, st.booleans())
def test_random_snapshot_shaped_structures(raw, as_json):
    try:
        data = json.dumps(raw).encode() if as_json else pickle.dumps(raw)
    except (ValueError, TypeError):
        data = pickle.dumps(raw)
    ft.snapshot_target(data)


@settings(FAST, max_examples=60)
@given(st.integers(0, 2**32), st.sampled_from(sorted(ft.seed_snapshots())))
def test_mutated_real_snapshots(seed, name):
    rng = random.Random(seed)
    seeds = ft.seed_snapshots()
    data = ft.next_input("snapshot", [seeds[name]], rng, marker="/nonexistent/fuzz-marker")
    ft.snapshot_target(data)


@settings(FAST, max_examples=40)
@given(st.integers(0, 2**32))
def test_hostile_pickles_are_refused_and_never_run(tmp_path_factory, seed):
    marker = tmp_path_factory.mktemp("hostile") / "pwned"
    data = ft.hostile_pickle(random.Random(seed), str(marker))
    with pytest.raises(KitError, match="refused to load global"):
        with ft.no_code_execution():
            from kit.load.snapshot import snapshot_from_bytes

            snapshot_from_bytes(data, "hostile.pickle")
    assert not marker.exists()


def test_a_shared_reference_bomb_is_refused_quickly():
    for seed in range(3):
        data = ft.shared_reference_bomb(random.Random(seed))
        started = time.monotonic()
        with pytest.raises(KitError, match="shared references"):
            load_snapshot(_write(data))
        assert time.monotonic() - started < 5


def _write(data: bytes):
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp()) / "input.pickle"
    path.write_bytes(data)
    return path


op = st.fixed_dictionaries(
    {"op": st.sampled_from(["alloc", "free", "capture_begin", "capture_end", "empty_cache"]) | values},
    optional={
        "id": st.sampled_from(["t0", "t1"]) | values,
        "bytes": st.integers(-10, 1 << 41) | values,
        "stream": st.sampled_from(["default", "s1", "s2"]) | values,
        "graph": st.sampled_from(["g0", "g1"]) | values,
        "pool": st.sampled_from(["p0", None]) | values,
    },
)


@FAST
@given(st.fixed_dictionaries({"version": st.just(1) | values, "ops": st.lists(op, max_size=12) | values}) | values)
def test_any_workload_parses_or_fails_in_one_line(workload):
    try:
        data = json.dumps(workload).encode()
    except (ValueError, TypeError):
        return
    ft.workload_target(data)


@settings(FAST, max_examples=40)
@given(st.integers(0, 2**32), st.integers(1, 200))
def test_every_valid_workload_simulates_to_a_consistent_snapshot(seed, n_ops):
    """A valid workload runs, and what the simulator writes adds up, whichever way it is read."""
    from kit.allocator.simulator import simulate
    from kit.allocator.workload import generate_workload, parse_workload
    from kit.analysis.trace.columnar import walk_columns
    from kit.analysis.trace.rows import walk_rows

    workload = generate_workload(seed, n_ops)
    assert ft.workload_target(json.dumps(workload).encode()) == "ok"
    snap = simulate(parse_workload(workload)).snapshot()
    live: dict[str, int] = {}
    for op in workload["ops"]:
        if op["op"] == "alloc":
            live[op["id"]] = op["bytes"]
        elif op["op"] == "free":
            del live[op["id"]]
    rng = [8, 8] if any(op["op"] == "capture_begin" for op in workload["ops"]) else []  # the first capture's
    blocks = [b for seg in snap["segments"] for b in seg["blocks"]]
    active = sorted(b["requested_size"] for b in blocks if b["state"] == "active_allocated")
    assert active == sorted([*live.values(), *rng])  # every live tensor, and nothing else, holds a block
    for seg in snap["segments"]:  # each segment's blocks tile it, address after address
        ends = [seg["address"]] + [b["address"] + b["size"] for b in seg["blocks"]]
        assert [b["address"] for b in seg["blocks"]] == ends[:-1] and ends[-1] == seg["address"] + seg["total_size"]
    trace = snap["device_traces"][0]
    made = sum(e["size"] for e in trace if e["action"] == "segment_alloc")
    assert made - sum(e["size"] for e in trace if e["action"] == "segment_free") == sum(
        seg["total_size"] for seg in snap["segments"]
    )
    if len(trace) < 2:
        return  # nothing to walk (a workload of one empty capture)
    loaded = load_snapshot(snap)
    for walk in (walk_rows(loaded, 0), walk_columns(loaded, 0)):
        assert walk.mismatches == []
        # every segment_alloc is followed by the allocation that needed it
        assert (walk.allocs["served"] != "reused").sum() == sum(e["action"] == "segment_alloc" for e in trace)


@pytest.mark.parametrize("target,name,data", ft.regression_inputs(), ids=[n for _, n, _ in ft.regression_inputs()])
def test_inputs_that_once_crashed_the_kit_no_longer_do(target, name, data):
    assert ft.TARGETS[target](data) in ("ok", "kit error")


def test_every_foreign_snapshot_is_a_result_not_an_error():
    for name, raw in foreign.all_variants().items():
        assert ft.snapshot_target(pickle.dumps(raw)) == "ok", name
        assert segment_table(load_snapshot(raw))["reserved"].sum() > 0, name

"""Workload validation: every malformed case is exit 2 and one line.

Sizes are written with `kit.units`; the real allocator's run is `kit.record.workload`."""

from __future__ import annotations

import json

import pytest

from .helpers import run_kit

A = {"op": "alloc", "id": "t0", "bytes": 4096, "stream": "s1"}
BEGIN = {"op": "capture_begin", "graph": "g0", "pool": "p0", "stream": "s1"}
END = {"op": "capture_end", "graph": "g0"}

BAD = {
    "not-an-object": ([], "expected a JSON object"),
    "wrong-version": ({"version": 2, "ops": []}, "unsupported version"),
    "ops-not-a-list": ({"version": 1, "ops": {}}, "'ops' must be a list"),
    "unknown-op": ({"version": 1, "ops": [{"op": "malloc"}]}, "unknown op"),
    "missing-field": ({"version": 1, "ops": [{"op": "alloc", "id": "t0"}]}, "missing bytes"),
    "unknown-field": ({"version": 1, "ops": [{**A, "colour": 1}]}, "unknown field colour"),
    "negative-bytes": ({"version": 1, "ops": [{**A, "bytes": -5}]}, "'bytes' must be an integer"),
    "huge-bytes": ({"version": 1, "ops": [{**A, "bytes": 1 << 60}]}, "'bytes' must be an integer"),
    "unknown-id": ({"version": 1, "ops": [{"op": "free", "id": "nope"}]}, "unknown id 'nope'"),
    "double-free": ({"version": 1, "ops": [A, {"op": "free", "id": "t0"}, {"op": "free", "id": "t0"}]}, "double free"),
    "foreign-free-in-capture": (
        {"version": 1, "ops": [{**A, "stream": "s2"}, BEGIN, {"op": "free", "id": "t0"}, END]},
        "during capture",
    ),
    "foreign-alloc-in-capture": ({"version": 1, "ops": [BEGIN, {**A, "stream": "s2"}, END]}, "during capture"),
    "missing-capture-end": ({"version": 1, "ops": [BEGIN, A]}, "has no capture_end"),
    "end-without-begin": ({"version": 1, "ops": [END]}, "no capture of 'g0' is underway"),
    "nested-capture": ({"version": 1, "ops": [BEGIN, {**BEGIN, "graph": "g1"}]}, "still underway"),
    "capture-on-default": ({"version": 1, "ops": [{**BEGIN, "stream": "default"}, END]}, "default stream"),
    "empty-cache-in-capture": ({"version": 1, "ops": [BEGIN, {"op": "empty_cache"}, END]}, "empty_cache during"),
    "id-reused-while-live": ({"version": 1, "ops": [A, A]}, "already allocated"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_workload_exits_2_with_one_line(tmp_path, case):
    workload, message = BAD[case]
    path = tmp_path / "w.json"
    path.write_text(json.dumps(workload))
    out = tmp_path / "out.pickle"
    done = run_kit("sim", str(path), "-o", str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kit: error: ") and message in lines[0], done.stderr
    assert not out.exists()


def test_unreadable_workload_file(tmp_path):
    path = tmp_path / "w.json"
    path.write_text("{not json")
    done = run_kit("sim", str(path))
    assert done.returncode == 2 and "not readable JSON" in done.stderr
    done = run_kit("sim", str(tmp_path / "missing.json"))
    assert done.returncode == 2 and "no such file" in done.stderr


def test_run_workload_without_cuda_is_a_clear_error(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"version": 1, "ops": [A]}))
    done = run_kit("run-workload", str(path), "-o", str(tmp_path / "out.pickle"))
    assert done.returncode == 2 and "needs CUDA" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out.pickle").exists()

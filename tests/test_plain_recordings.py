"""The plain H200 recordings (kit/recordings/plain): what they are, where they came from, what they show.

They are snapshots from programs the kit did not write (scripts/plain_programs/,
plain torch), as `torch.cuda.memory._dump_snapshot` wrote them: no `kit` key,
traces that start mid-process. These tests hold the files to their provenance
(sha256, GPU, versions, the command) and to the behaviour each program was
written to show: tensors made before history began, stranding in the graph
pool on two streams and none on one, and frees pending on `record_stream`.
"""

from __future__ import annotations

import ast
import datetime
import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from kit.allocator.rules import DEFAULT_POOL
from kit.analysis.names import stream_labels
from kit.analysis.trace.reports import reuse_table
from kit.analysis.trace.walk import walk_trace
from kit.load.snapshot import load_snapshot
from kit.recordings import RECORDINGS

from .helpers import MIB

ROOT = Path(__file__).resolve().parents[1]
PLAIN = RECORDINGS / "plain"
PROVENANCE = json.loads((PLAIN / "PROVENANCE.json").read_text())
NAMES = (
    "two_captures_separate.pickle",
    "two_captures_shared.pickle",
    "compile_reduce_overhead.pickle",
    "record_stream_separate.pickle",
    "record_stream_shared.pickle",
    "replay_graphs_separate.pickle",
    "replay_graphs_shared.pickle",
)
SEPARATE = [n for n in NAMES if n.endswith("_separate.pickle")]
ONE_STREAM = [n for n in NAMES if not n.endswith("_separate.pickle")]  # shared variants and torch.compile
FIELDS = ("description", "gpu", "torch", "cuda", "python", "date", "command", "program", "reserved_by_pool_stream")
PROGRAMS = sorted((ROOT / "scripts" / "plain_programs").glob("*.py"))


def raw(name: str) -> dict:
    return pickle.loads((PLAIN / name).read_bytes())


def test_every_recording_is_listed_and_nothing_else():
    assert sorted(PROVENANCE) == sorted(NAMES)
    assert sorted(p.name for p in PLAIN.glob("*.pickle")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_sha256_matches_provenance(name):
    assert hashlib.sha256((PLAIN / name).read_bytes()).hexdigest() == PROVENANCE[name]["sha256"]


@pytest.mark.parametrize("name", NAMES)
def test_provenance_fields(name):
    entry = PROVENANCE[name]
    assert all(entry.get(field) for field in FIELDS), [f for f in FIELDS if not entry.get(f)]
    assert entry["gpu"] == "NVIDIA H200"
    assert entry["torch"].startswith("2.") and entry["cuda"]
    date = datetime.datetime.fromisoformat(entry["date"])
    assert date.utcoffset() == datetime.timedelta(0)  # UTC
    assert entry["command"].startswith("python scripts/record_plain.py --out kit/recordings/plain")
    program = entry["program"].split()[1]
    assert (ROOT / program).is_file(), program
    assert entry["program"].endswith(f"--out {name}")


@pytest.mark.parametrize("name", NAMES)
def test_provenance_figures_are_the_files_own(name):
    """The per-(pool, stream) bytes in PROVENANCE.json are what the snapshot's segments hold."""
    groups = {}
    for seg in raw(name)["segments"]:
        key = (tuple(seg["segment_pool_id"]), seg["stream"])
        reserved, allocated = groups.get(key, (0, 0))
        groups[key] = (reserved + seg["total_size"], allocated + seg["allocated_size"])
    listed = {
        (tuple(g["pool"]), g["stream"]): (g["reserved"], g["allocated"])
        for g in PROVENANCE[name]["reserved_by_pool_stream"]
    }
    assert listed == groups


@pytest.mark.parametrize("name", NAMES)
def test_plain_snapshots_have_no_kit_key_and_have_stack_frames(name):
    data = raw(name)
    assert "kit" not in data
    trace = data["device_traces"][0]
    allocs = [e for e in trace if e["action"] == "alloc"]
    assert allocs and all(e["frames"] for e in allocs)
    assert (PLAIN / name).stat().st_size < 2 * MIB


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.name)
def test_the_programs_import_nothing_of_the_kit(program):
    tree = ast.parse(program.read_text())
    modules = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    modules += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert modules and not [m for m in modules if m.split(".")[0] == "kit"]
    assert {p.name for p in PROGRAMS} == {
        "two_captures.py",
        "compile_reduce_overhead.py",
        "record_stream.py",
        "replay_graphs.py",
    }


@pytest.mark.parametrize("name", ["two_captures_separate.pickle", "two_captures_shared.pickle"])
def test_two_captures_traces_start_mid_process(name):
    """The model, inputs and buffers were made before history began: the trace must be rewound to start."""
    assert walk_trace(load_snapshot(PLAIN / name)).rewound_segments > 0


def stranded_in_graph_pools(name: str) -> int:
    table = reuse_table(load_snapshot(PLAIN / name))
    graph = table[[tuple(p) != DEFAULT_POOL for p in table["pool"]]]
    return int(graph["stranded_bytes"].sum())


@pytest.mark.parametrize("name", SEPARATE)
def test_separate_stream_recordings_strand_graph_pool_bytes(name):
    assert stranded_in_graph_pools(name) > 0


@pytest.mark.parametrize("name", ONE_STREAM)
def test_one_stream_recordings_strand_nothing_in_graph_pools(name):
    assert stranded_in_graph_pools(name) == 0


@pytest.mark.parametrize("program", ["two_captures", "record_stream"])
def test_shared_graph_pool_is_what_graph_1s_stream_held_when_separate(program):
    """On one stream the graph pool holds what graph 1's stream held on two (same label): the rest is extra."""

    def graph_groups(name: str) -> dict[str, int]:
        snap = load_snapshot(PLAIN / name)
        labels = stream_labels(snap)
        groups = PROVENANCE[name]["reserved_by_pool_stream"]
        return {labels[g["stream"]]: g["reserved"] for g in groups if tuple(g["pool"]) != DEFAULT_POOL}

    separate, shared = graph_groups(f"{program}_separate.pickle"), graph_groups(f"{program}_shared.pickle")
    assert len(separate) == 2 and len(shared) == 1
    [(label, reserved)] = shared.items()
    assert separate[label] == reserved
    assert sum(separate.values()) > reserved


def test_compile_recording_has_a_cudagraph_trees_pool():
    pools = {tuple(g["pool"]) for g in PROVENANCE["compile_reduce_overhead.pickle"]["reserved_by_pool_stream"]}
    assert pools - {DEFAULT_POOL}


@pytest.mark.parametrize("name", ["record_stream_separate.pickle", "record_stream_shared.pickle"])
def test_record_stream_frees_are_pending_while_new_allocations_happen(name):
    """`free_requested` long before `free_completed`, with allocations of new segments in between."""
    trace = raw(name)["device_traces"][0]
    requested: dict[int, int] = {}
    pending = []
    for i, e in enumerate(trace):
        if e["action"] == "free_requested":
            requested[e["addr"]] = i
        elif e["action"] == "free_completed" and e["addr"] in requested:
            start = requested.pop(e["addr"])
            between = trace[start + 1 : i]
            waited_ms = (e["time_us"] - trace[start]["time_us"]) / 1000
            if any(b["action"] == "segment_alloc" for b in between) and waited_ms > 50:
                pending.append((e["size"], waited_ms))
    assert len(pending) >= 2, pending


def test_record_plain_without_cuda_is_one_line_error():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "record_plain.py"), "--out", "unused"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("record_plain.py: error: no CUDA GPU"), done.stderr
    assert not (ROOT / "unused").exists()

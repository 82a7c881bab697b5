"""The boundary workloads as the H200 ran them: tests/test_boundaries.py's hand-derived table, on the real allocator.

`python scripts/record_corpus.py --boundary-only --out kit/recordings/corpus`
records them on a GPU into the corpus (`boundary_*.json` beside
`boundary_*.pickle`) and adds their provenance to its `PROVENANCE.json` under
`added`. From then on the corpus tests (tests/test_simulator.py,
tests/test_trace.py) replay them with the rest; this file checks, from the
recordings alone and without the simulator, that the real allocator split
each block as `SPLITS` says and that both trace walks find the stranding
cases as `STRANDED` says.
"""

from __future__ import annotations

import json

import pytest

from kit import load_snapshot
from kit.analysis.trace.columnar import walk_columns
from kit.analysis.trace.rows import walk_rows
from kit.recordings import RECORDINGS

from .test_boundaries import SPLIT_WORKLOADS, SPLITS, STRANDED, STRANDED_WORKLOADS, WORKLOADS

CORPUS = RECORDINGS / "corpus"
RNG_STATE_BYTES = 8  # the first capture's seed and offset tensors, which no boundary workload asks for


def test_every_boundary_workload_is_recorded_with_provenance():
    prov = json.loads((CORPUS / "PROVENANCE.json").read_text())
    (session,) = [s for s in prov.get("added", []) if "boundary_small.pickle" in s["files"]]
    assert session["gpu"].startswith("NVIDIA") and session["torch"] and session["date"]
    assert session["command"] == "python scripts/record_corpus.py --boundary-only --out kit/recordings/corpus"
    assert set(session["files"]) == {f"{name}{suffix}" for name in WORKLOADS for suffix in (".json", ".pickle")}
    for name, workload in WORKLOADS.items():
        assert json.loads((CORPUS / f"{name}.json").read_text()) == workload, name


def _blocks_by_id(name: str) -> tuple[dict, dict]:
    """Each allocation id of the workload -> its block in the recorded final state (address, size, requested, state).

    The k-th allocation of a stream in the trace is the k-th `alloc` op on that
    stream in the workload; the RNG state tensors of the first capture are the
    only other allocations.
    """
    raw = load_snapshot(CORPUS / f"{name}.pickle").raw
    streams = {sid: stream for stream, sid in raw["kit"]["streams"].items()}
    by_stream: dict[str, list[int]] = {}
    for e in raw["device_traces"][0]:
        if e["action"] == "alloc" and e["size"] != RNG_STATE_BYTES:
            by_stream.setdefault(streams[e["stream"]], []).append(e["addr"])
    ops: dict[str, list[str]] = {}
    for op in WORKLOADS[name]["ops"]:
        if op["op"] == "alloc":
            ops.setdefault(op["stream"], []).append(op["id"])
    assert {s: len(a) for s, a in by_stream.items()} == {s: len(i) for s, i in ops.items()}
    blocks = {b["address"]: b for s in raw["segments"] for b in s["blocks"]}
    where = {tid: addr for s in ops for tid, addr in zip(ops[s], by_stream[s], strict=True)}
    return {tid: blocks.get(addr) for tid, addr in where.items()}, raw


@pytest.mark.parametrize("name", SPLIT_WORKLOADS)
def test_the_real_allocator_splits_as_derived_by_hand(name):
    blocks, _ = _blocks_by_id(name)
    for case, (requested, block, left_free, probe) in SPLITS.items():
        if not case.startswith(name.split("_")[1]):
            continue
        got = blocks[f"{case}:request"]
        assert (got["requested_size"], got["size"], got["state"]) == (requested, block, "active_allocated"), case
        if probe:  # what was split off sits right after the request, taken by the probe
            taken = blocks[f"{case}:probe"]
            assert (taken["address"], taken["requested_size"]) == (got["address"] + block, probe), case
        assert left_free or f"{case}:probe" not in blocks, case


@pytest.mark.parametrize("name", SPLIT_WORKLOADS + STRANDED_WORKLOADS)
def test_both_walks_end_at_the_recording(name):
    snap = load_snapshot(CORPUS / f"{name}.pickle")
    rows, columns = walk_rows(snap, 0), walk_columns(snap, 0)
    assert rows.mismatches == [] and columns.mismatches == []
    assert rows.allocs.drop(columns="frames").equals(columns.allocs.drop(columns="frames"))


@pytest.mark.parametrize("name", STRANDED_WORKLOADS)
def test_the_walks_find_the_recorded_exact_fit_stranded(name):
    blocks, raw = _blocks_by_id(name)
    snap = load_snapshot(raw)
    for walk in (walk_rows(snap, 0), walk_columns(snap, 0)):
        allocs = walk.allocs.set_index("addr", drop=False)
        for pool, (block, over, exact) in STRANDED.items():
            above = allocs.loc[blocks[f"{pool}_stranded:over:request"]["address"]]
            fits = allocs.loc[blocks[f"{pool}_stranded:exact:request"]["address"]]
            assert (above["size"], above["served"]) == (over, "new_segment"), pool
            assert (fits["size"], fits["served"], fits["other_block_size"]) == (exact, "stranded", block), pool
            assert fits["other_stream"] == raw["kit"]["streams"][f"{pool}_stranded:holder"], pool

"""Plain snapshots, as a user brings them: no `kit` key, a trace that starts mid-process.

Made here from the shipped recordings by dropping the `kit` key and the head
of the trace (what `max_entries` does to a long run); the H200 recordings of
programs the kit did not write are checked in `test_plain_recordings.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kit.analysis.attribution import capture_attribution, capture_table, capture_windows
from kit.analysis.liveness import liveness_table
from kit.analysis.names import generated_labels, pool_labels, resolve_stream, stream_labels
from kit.analysis.tables import diff_summary, diff_tables, segment_table
from kit.analysis.trace.walk import walk_trace
from kit.analysis.whatif import (
    EXPANDABLE_CAVEAT,
    layout_differences,
    simulate_trace,
    trace_to_workload,
    what_if,
)
from kit.errors import KitError
from kit.load.snapshot import Snapshot, load_snapshot
from kit.recordings import RECORDINGS, recording

from .helpers import MIB

# Every recording but the merged pairs and the expandable folder's: cut mid-trace, three of the
# merged pairs (and five of the expandable folder's runs without the setting, workloads of the
# same generator) rewind to a start the trace walk gets wrong (an unsplit remainder kept in a live
# block, a segment's pool), which the what-if's own tests on them (tests/test_whatif_merged.py,
# tests/test_expandable.py) do not need: they start at the trace's beginning.
# Recordings with expandable_segments:True are replayed only from the trace's beginning (EXPANDABLE).
LEFT_OUT = ("merged", "expandable")
ALL = sorted(str(p.relative_to(RECORDINGS)) for p in RECORDINGS.rglob("*.pickle") if p.parent.name not in LEFT_OUT)
EXPANDABLE = sorted(str(p.relative_to(RECORDINGS)) for p in RECORDINGS.glob("expandable/*_expandable.pickle"))


def plain(name: str, cut: float = 0.0) -> Snapshot:
    """A shipped recording without its kit key, its trace's first `cut` of entries dropped."""
    raw = dict(load_snapshot(recording(name)).raw)
    raw.pop("kit", None)
    trace = raw["device_traces"][0]
    raw["device_traces"] = [trace[int(len(trace) * cut) :]]
    return Snapshot(raw, origin=f"plain {name}")


def test_stream_labels_come_from_the_first_allocation_and_survive_a_second_process():
    separate, shared = plain("two_streams.pickle"), plain("shared_stream.pickle")
    a, b = stream_labels(separate), stream_labels(shared)
    assert a[0] == b[0] == "default stream"
    first = "stream of forward (demo.py:28)"
    assert sorted(a.values()) == sorted(["default stream", first, first + " #2"])
    # The same program's first capture stream has another id in the other process but the same label.
    shared_id = next(sid for sid, label in b.items() if label == first)
    separate_id = next(sid for sid, label in a.items() if label == first)
    assert shared_id != separate_id
    assert first in generated_labels(separate) and "default stream" not in generated_labels(separate)


def test_graph_pools_are_numbered_by_the_order_they_were_made():
    snap = load_snapshot(recording("corpus/random_003.pickle"))
    labels = pool_labels(snap)
    made = {}
    for i, e in enumerate(snap.trace):
        if e.action == "segment_alloc":
            seg = next((s for s in snap.segments if s.address == e.addr), None)
            if seg and seg.segment_pool_id != (0, 0):
                made.setdefault(seg.segment_pool_id, i)
    order = [pool for pool in sorted(made, key=made.get) if pool != (0, 1)]
    assert labels[(0, 1)] == "p0"  # the recording names it: it takes no number
    for n, pool in enumerate(order, start=1):
        assert labels[pool] == f"graph pool {n}"


def test_a_stream_is_found_by_id_hex_or_label():
    snap = plain("two_streams.pickle")
    labels = stream_labels(snap)
    for sid, label in labels.items():
        assert resolve_stream(snap, str(sid)) == sid
        assert resolve_stream(snap, hex(sid)) == sid
        assert resolve_stream(snap, label) == sid
    assert resolve_stream(snap, "default stream") == 0
    with pytest.raises(KitError, match="no stream 'stream B'.*stream of forward"):
        resolve_stream(snap, "stream B")


# Known misses, each strict (an xfail that passes fails the run): the plugin's recordings begin
# with vLLM's graph-memory estimate, which captures into a pool of its own and frees it again.
# Without the kit key a trace does not say which pool a segment it frees belonged to, and the
# walk takes it as the default pool's, so replayed from the very start six segments land in the
# wrong pool; cut at 50% or 80% (after the estimate) they replay exactly, and with the kit key's
# capture windows they replay exactly from the start
# (test_a_graph_pool_freed_within_the_trace_is_told_by_the_capture_windows).
KNOWN_MISSES = {(0.0, "vllm_plugin/patched/rank0.pickle"), (0.0, "vllm_plugin/unpatched/rank0.pickle")}


def _replayed(cut: float, name: str):
    miss = pytest.mark.xfail(strict=True, reason="known miss, see KNOWN_MISSES")
    return pytest.param(cut, name, marks=miss) if (cut, name) in KNOWN_MISSES else pytest.param(cut, name)


@pytest.mark.parametrize("cut, name", [_replayed(cut, name) for name in ALL for cut in (0.0, 0.5, 0.8)])
def test_the_trace_replayed_from_its_rewound_start_ends_at_the_recording(cut, name):
    snap = plain(name, cut)
    assert layout_differences(simulate_trace(snap), snap) == []
    assert what_if(snap, {}).corrections == []


def test_a_simulation_keeps_its_trace_when_asked_and_only_then():
    snap = plain(ALL[0])
    kept, left = simulate_trace(snap), simulate_trace(snap, trace=False)
    assert left.history == "none" and kept.has_trace  # the run nobody reads the trace of keeps none
    walk = walk_trace(kept)  # the trace kept walks to the simulated segments, an alloc for each recorded one
    assert walk.mismatches == [] and len(walk.allocs) == len(walk_trace(snap).allocs) > 0


@pytest.mark.parametrize("arm", ["unpatched", "patched"])
def test_a_graph_pool_freed_within_the_trace_is_told_by_the_capture_windows(arm):
    snap = load_snapshot(recording(f"vllm_plugin/{arm}/rank0.pickle"))
    freed = {e.addr for e in snap.trace if e.action == "segment_free"}
    made = walk_trace(snap).new_segments
    assert any(tuple(p) != (0, 0) for p in made.loc[made["addr"].isin(freed), "pool"])  # the estimate's pool
    assert layout_differences(simulate_trace(snap), snap) == []


@pytest.mark.parametrize("name", EXPANDABLE)
def test_an_expandable_trace_replays_from_its_beginning_and_a_cut_one_is_refused(name):
    snap = plain(name)
    assert layout_differences(simulate_trace(snap), snap) == []
    assert what_if(snap, {}).corrections == [EXPANDABLE_CAVEAT]  # what the simulation cannot know, said
    with pytest.raises(KitError, match="pages mapped before it began"):
        what_if(plain(name, 0.5), {})


def test_what_if_on_a_plain_mid_process_snapshot_predicts_the_shared_stream_run():
    snap = plain("two_streams.pickle", cut=0.5)  # starts after the first capture began
    assert snap.captures == [] and walk_trace(snap).rewound_segments > 0
    ids = {name: sid for sid, name in load_snapshot(recording("two_streams.pickle")).stream_names.items()}
    second, first = ids["replay graphs stream"], ids["model graphs stream"]
    labels = stream_labels(snap)
    measured = segment_table(recording("shared_stream.pickle"))
    want = int(measured[measured["pool"] == (0, 1)]["reserved"].sum())
    for mapping in (
        {labels[second]: labels[first]},
        {str(second): str(first)},
        {hex(second): hex(first)},
        {second: first},
    ):
        result = what_if(snap, mapping)
        got = result.predicted[result.predicted["pool"] == (0, 1)]["reserved"].sum()
        assert got == want == 66 * MIB
        assert result.saved[(0, 1)] == 42 * MIB
        assert set(result.predicted["stream"]) <= set(stream_labels(snap))  # the recording's ids, not 4096
        assert "graph pool 1" in set(result.predicted["pool_label"])


def test_a_moved_streams_workspace_told_apart_by_size_is_left_out_and_said_so():
    snap = load_snapshot(recording("two_streams.pickle"))  # Python frames only: no C++ frame names the getter
    same = what_if(snap, {"replay graphs stream": "replay graphs stream"})
    assert same.corrections == [] and same.modelled == []
    moved = what_if(snap, {"replay graphs stream": "model graphs stream"})
    assert len(moved.modelled) == 1 and "32.00 MiB" in moved.modelled[0] and "default pool" in moved.modelled[0]
    assert len(moved.corrections) == 1 and "told apart by shape" in moved.corrections[0]
    shared = segment_table(recording("shared_stream.pickle"))
    for pool in ((0, 0), (0, 1)):  # the shared run made no second workspace: both pools exact
        want = shared[shared["pool"] == pool]["reserved"].sum()
        assert (
            moved.predicted[moved.predicted["pool"] == pool]["reserved"].sum()
            == want
            == (322 if pool == (0, 0) else 66) * MIB
        )


def test_what_if_cli_takes_ids_and_labels_and_prints_mib():
    path = str(recording("two_streams.pickle"))
    snap = load_snapshot(path)
    ids = {label: sid for sid, label in stream_labels(snap).items()}
    run = [sys.executable, "-m", "kit", "what-if", path]
    by_hex = subprocess.run(
        [*run, "--map", f"{ids['replay graphs stream']:#x}={ids['model graphs stream']}", "--json"],
        capture_output=True,
        text=True,
    )
    assert by_hex.returncode == 0, by_hex.stderr
    out = json.loads(by_hex.stdout)
    assert out["map"][0]["from_label"] == "replay graphs stream"
    assert {tuple(s["pool"]): s["bytes"] for s in out["saved"]}[(0, 1)] == 42 * MIB
    text = subprocess.run([*run, "--map", "replay graphs stream=model graphs stream"], capture_output=True, text=True)
    assert text.returncode == 0, text.stderr
    assert "global graph pool (0, 1): 108.00 MiB reserved as recorded, 66.00 MiB predicted (saves 42.00 MiB)" in (
        text.stdout
    )
    assert "4096" not in text.stdout
    bad = subprocess.run([*run, "--map", "nope=default stream"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no stream 'nope'" in bad.stderr


def test_inferred_capture_windows_attribute_what_the_recorder_did():
    recorded = capture_attribution(recording("two_streams.pickle"))
    inferred = capture_attribution(plain("two_streams.pickle"))
    assert inferred.attrs["inferred"] and "inferred" in inferred.attrs["source"]
    assert not recorded.attrs["inferred"]
    in_pool = recorded[recorded["pool"] == (0, 1)]
    assert sorted(inferred["bytes"]) == sorted(in_pool["bytes"]) == [44040192, 69206016]
    windows = capture_windows(plain("two_streams.pickle"))
    assert all(w["inferred"] for w in windows) and len({w["stream"] for w in windows}) == 2


def test_inferred_windows_group_a_captures_graphs_around_its_eager_breaks():
    table = capture_table(plain("replica/small_unpatched.pickle"))
    # The model graphs' stream: 3 captures of 2 graphs, taken as one capture (no empty_cache between them); the
    # replay graphs' stream: 6 captures of one graph each (vLLM's replay sizes 96, 192, ..., 512)
    assert list(table["graphs"]) == [6, 6]
    assert table.attrs["inferred"]
    live = liveness_table(plain("replica/small_unpatched.pickle"))
    assert "inferred" in live.source and len(live.model_captures) == 2


def test_a_window_with_no_graph_pool_allocation_is_skipped_not_ended_before_it_begins():
    raw = dict(load_snapshot(recording("two_streams.pickle")).raw)
    raw["kit"] = dict(raw["kit"])
    first = raw["kit"]["captures"][0]
    raw["kit"]["captures"] = [{**first, "graph": "empty", "trace_begin": 1, "trace_end": 3}, *raw["kit"]["captures"]]
    ops = trace_to_workload(Snapshot(raw, origin="empty window"))["ops"]
    assert not any(op.get("graph") == "empty" for op in ops)


def test_diff_by_label_matches_graph_pools_by_id_and_streams_by_label_across_processes(tmp_path):
    before, after = segment_table(plain("two_streams.pickle")), segment_table(plain("shared_stream.pickle"))
    diff = diff_tables(before, after, by="label")
    pool = diff[diff["pool_label"] == "graph pool 1"]
    assert pool["reserved_before"].sum() == 108 * MIB and pool["reserved_after"].sum() == 66 * MIB
    assert "graph pool 1: 108.00 MiB reserved before, 66.00 MiB after (saved 42.00 MiB)" in diff_summary(diff)
    assert [p["paired_by"] for p in diff.attrs["pool_pairs"] if p["label"] == "graph pool 1"] == ["id"]
    assert "stream of forward (demo.py:28)" in diff.attrs["paired_generated"]
    for name, snap in (("a", plain("two_streams.pickle")), ("b", plain("shared_stream.pickle"))):
        import pickle

        (tmp_path / f"{name}.pickle").write_bytes(pickle.dumps(snap.raw))
    done = subprocess.run(
        [sys.executable, "-m", "kit", "diff", str(tmp_path / "a.pickle"), str(tmp_path / "b.pickle"), "--by-label"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "saved 42.00 MiB" in done.stdout and "warning: --by-label paired groups by labels the kit generated" in (
        done.stderr
    )


# The H200 recordings of programs the kit did not write (scripts/plain_programs/).


def _graph_pool_bytes(table) -> int:
    return int(table[table["pool"] != (0, 0)]["reserved"].sum())


def _capture_streams(snap: Snapshot) -> list[int]:
    """The streams that allocated in a graph pool, in the order they first did."""
    allocs = walk_trace(snap).allocs
    in_pool = allocs[allocs["pool"].map(lambda p: tuple(p) != (0, 0))]
    return list(dict.fromkeys(in_pool["stream"].tolist()))


@pytest.mark.parametrize("program", ["two_captures", "record_stream"])
def test_what_if_on_a_plain_separate_stream_recording_predicts_the_shared_stream_run(program):
    separate = load_snapshot(recording(f"plain/{program}_separate.pickle"))
    shared = load_snapshot(recording(f"plain/{program}_shared.pickle"))
    assert separate.kit == {} and walk_trace(separate).rewound_segments > 0
    first, second = _capture_streams(separate)
    labels = stream_labels(separate)
    measured = _graph_pool_bytes(segment_table(shared))
    assert _graph_pool_bytes(segment_table(separate)) > measured  # the separate run strands memory
    for mapping in ({labels[second]: labels[first]}, {str(second): str(first)}, {hex(second): hex(first)}):
        result = what_if(separate, mapping)
        assert _graph_pool_bytes(result.predicted) == measured, mapping


@pytest.mark.parametrize("name", sorted(p.name for p in (RECORDINGS / "plain").glob("*.pickle")))
def test_the_identity_map_reproduces_each_plain_recordings_pools(name):
    snap = load_snapshot(recording(f"plain/{name}"))
    result = what_if(snap, {})
    recorded = segment_table(snap)
    for pool in set(recorded["pool"]):
        assert result.baseline[result.baseline["pool"] == pool]["reserved"].sum() == (
            recorded[recorded["pool"] == pool]["reserved"].sum()
        )
    assert result.corrections == []
    assert layout_differences(simulate_trace(snap), snap) == []


def test_two_captures_streams_are_named_by_the_function_that_captured_them():
    labels = set(stream_labels(load_snapshot(recording("plain/two_captures_separate.pickle"))).values())
    assert {"stream of capture_first (two_captures.py:44)", "stream of capture_second (two_captures.py:61)"} <= labels
    compile_labels = stream_labels(load_snapshot(recording("plain/compile_reduce_overhead.pickle")))
    assert not any("torchinductor" in label or ".py:" in label and "/" in label for label in compile_labels.values())
    assert "stream of main (compile_reduce_overhead.py:61)" in compile_labels.values()


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("two_captures_separate", 1),
        ("record_stream_separate", 1),
        ("two_captures_shared", 0),
        ("record_stream_shared", 0),
        ("compile_reduce_overhead", 0),
    ],
)
def test_check_fails_every_separate_stream_recording_and_passes_the_rest(name, code):
    done = subprocess.run(
        [sys.executable, "-m", "kit", "check", str(recording(f"plain/{name}.pickle"))], capture_output=True, text=True
    )
    assert done.returncode == code, done.stdout + done.stderr
    if code:
        assert done.stdout.count("\n") == 1 and done.stdout.startswith("graph pool 1 (0, 1), stream of ")


def _readme_debug_commands() -> list[str]:
    """The commands of the README's "Debug your own snapshot" bash block, continuation lines joined."""
    readme = (RECORDINGS.parents[1] / "README.md").read_text()
    section = readme.split("## Debug your own snapshot", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = block.replace("\\\n", " ").splitlines()
    return [line.split("  #", 1)[0].strip() for line in lines if line.strip()]


def test_the_readmes_debug_your_own_snapshot_path_runs_as_written(tmp_path):
    import shlex

    commands = _readme_debug_commands()
    expected = ["explain", "what-if", "table", "reuse", "what-if", "report", "diff"]
    assert [shlex.split(c)[3] for c in commands] == expected
    outputs = {}
    for command in commands:
        argv = shlex.split(command)
        assert argv[:3] == ["python", "-m", "kit"]
        # Run from the repository, as the README says; the report page goes into tmp_path.
        argv = [sys.executable, *(a if a != "report.html" else str(tmp_path / a) for a in argv[1:])]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=RECORDINGS.parents[1])
        assert done.returncode == 0, f"{command}: {done.stderr}"
        outputs.setdefault(argv[3], done.stdout)  # the first what-if is --rank's
    second, first = "stream of capture_second (two_captures.py:61)", "stream of capture_first (two_captures.py:44)"
    best = f"Best map, simulated: --map '{second}={first}', saves 22.00 MiB of graph pool"
    assert (
        best in outputs["explain"]
        and f"1. --map '{second}={first}': saves 22.00 MiB of graph pool" in (outputs["what-if"])
    )
    assert (
        "graph pool 1 (0, 1): 56.00 MiB reserved as recorded, 34.00 MiB predicted (saves 22.00 MiB)"
        in (outputs["what-if"])  # the best map's full what-if, after the ranking
    )
    assert "graph pool 1: 56.00 MiB reserved before, 34.00 MiB after (saved 22.00 MiB)" in outputs["diff"]
    assert (tmp_path / "report.html").stat().st_size > 100_000


@pytest.mark.parametrize(
    "name", [*sorted(f"plain/{p.name}" for p in (RECORDINGS / "plain").glob("*.pickle")), "two_streams.pickle"]
)
def test_any_stream_mapped_onto_any_other_gives_a_prediction(name):
    # The simulated segments of a mapped run differ in size from the recording's; laying them out
    # where the recording's lay must never make two overlap (the default stream as a target did once).
    # A capture stream moved onto the default stream is refused: CUDA cannot capture there.
    import itertools

    snap = load_snapshot(recording(name))
    captured = set(_capture_streams(snap))
    for a, b in itertools.permutations(stream_labels(snap), 2):
        if b == 0 and a in captured:
            with pytest.raises(KitError, match="cannot be captured on the default stream"):
                what_if(snap, {a: b})
            continue
        result = what_if(snap, {a: b})
        assert a not in set(result.predicted["stream"]), (a, b)

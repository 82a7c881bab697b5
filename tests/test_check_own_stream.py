"""Issue 28: `kit check --own-stream`, the captures allowed a stream of their own (the PR's drafter).

PR 63155 moves only the decoder replay graphs onto the model graphs' stream; the speculator's
(drafter's) graphs keep their own and strand in the global graph pool by design. `check` allows
them by default (`DEFAULT_OWN_STREAM`) and lists them as allowed; the replay graphs on a stream of
their own still fail it. The snapshots here are simulated on the CPU (workload streams become
stream labels through the `kit` key; recorded capture windows are added the way
`kit.record.recorder` writes them); the last section runs the guard on the replica's recordings
with the drafter on, once the lead has recorded them.

- PR + drafter: model and replay graphs captured into pool `p` on stream `model`, then the
  drafter's graph into `p` on stream `drafter`, which makes a new segment while the model
  graphs' free block sits on `model` (20 MiB stranded): exit 0, the drafter's group allowed;
- unpatched + drafter: the replay graphs on stream `replay` strand too: exit 1 by default.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest

import kit
from kit.allocator.simulator import CachingAllocatorSim
from kit.allocator.workload import parse_workload
from kit.analysis.check import DEFAULT_OWN_STREAM, check_snapshot
from kit.analysis.liveness import is_drafter_capture
from kit.experiments.recorded import current_words
from kit.recordings import RECORDINGS, shipped_bytes

from .helpers import MIB, run_kit

SEGMENT = 20 * MIB  # an 8 MiB request gets a 20 MiB segment (1 to 10 MiB requests: 20 MiB segments)
MANAGERS = {"model graph": "model graphs", "replay graph": "replay graphs", "drafter graph": "DFlash speculator graphs"}


def _ops(replay_stream: str, *, drafter: str | None = "drafter", also_on_drafter: str | None = None) -> list:
    """Model graph, replay graph, then the drafter's graph (on stream `drafter`), all into pool `p`.

    `also_on_drafter` names one more graph captured on the drafter's stream into `p` after it.
    """
    ops = [{"op": "capture_begin", "graph": "model graph", "pool": "p", "stream": "model"}]
    ops += [{"op": "alloc", "id": "m0", "bytes": 16 * MIB}, {"op": "alloc", "id": "m1", "bytes": 16 * MIB}]
    ops += [{"op": "free", "id": "m0"}, {"op": "capture_end", "graph": "model graph"}]  # m0's block: free, on model
    ops += [{"op": "capture_begin", "graph": "replay graph", "pool": "p", "stream": replay_stream}]
    ops += [{"op": "alloc", "id": "r0", "bytes": 8 * MIB}, {"op": "free", "id": "r0"}]
    ops += [{"op": "capture_end", "graph": "replay graph"}]
    if drafter:
        ops += [{"op": "capture_begin", "graph": "drafter graph", "pool": "p", "stream": drafter}]
        ops += [{"op": "alloc", "id": "d0", "bytes": 8 * MIB}, {"op": "capture_end", "graph": "drafter graph"}]
    if also_on_drafter:
        ops += [{"op": "capture_begin", "graph": also_on_drafter, "pool": "p", "stream": drafter}]
        ops += [{"op": "alloc", "id": "x0", "bytes": 1024}, {"op": "capture_end", "graph": also_on_drafter}]
    return ops


def simulated(ops: list, *, managers: dict[str, str] | None = None) -> dict:
    """The workload's snapshot; with `managers` (graph -> manager), its windows in `kit["captures"]` as recorded."""
    sim = CachingAllocatorSim()
    windows, begun = [], {}
    for op in parse_workload({"version": 1, "ops": ops}):
        sim.run([op])  # one op at a time: the trace's length marks each capture's window
        if op.op == "capture_begin":
            begun[op.graph] = (len(sim.trace), op.stream)  # after the RNG state the first capture_begin makes
        elif op.op == "capture_end" and managers and op.graph in managers:
            begin, stream = begun[op.graph]
            manager = managers[op.graph]
            windows.append(
                {
                    "graph": f"{manager} graph 0",
                    "capture": manager,
                    "manager": manager,
                    "size": None,
                    "index": 0,
                    "stream": sim.stream_id(stream),
                    "pool": list(sim.graph_pools[op.graph]),
                    "trace_begin": begin,
                    "trace_end": len(sim.trace),
                }
            )
    raw = sim.snapshot()
    if windows:
        raw["kit"]["captures"] = windows
    return raw


def pr_drafter() -> dict:
    return simulated(_ops("model"))


def unpatched_drafter() -> dict:
    return simulated(_ops("replay"))


def _write(tmp_path, name: str, raw: dict) -> str:
    path = tmp_path / f"{name}.pickle"
    path.write_bytes(pickle.dumps(raw))
    return str(path)


def _stream(raw: dict, name: str) -> int:
    return raw["kit"]["streams"][name]


def _line(raw: dict, label: str) -> str:
    """The body of a group's line: pool, stream, 20 MiB stranded, all still reserved."""
    return (
        f"p (0, 1), {label} (stream {_stream(raw, label)}): 20.00 MiB stranded ({SEGMENT} bytes), "
        "20.00 MiB of it still reserved"
    )


# -- the default: what the PR argues


def test_the_default_is_the_speculators_captures():
    """The default patterns are `is_drafter_capture`'s words: a manager matches them exactly when it is a drafter's."""
    assert DEFAULT_OWN_STREAM == ("speculator", "drafter")
    for manager in ("DFlash speculator graphs", "EAGLE Drafter graphs", "model graphs", "replay graphs", "graphs"):
        matched = any(p.casefold() in manager.casefold() for p in DEFAULT_OWN_STREAM)
        assert matched == is_drafter_capture(manager), manager


def test_the_pr_with_the_drafter_passes_by_default_and_lists_the_drafter_as_allowed(tmp_path):
    raw = pr_drafter()
    path = _write(tmp_path, "pr_drafter", raw)
    done = run_kit("check", path)
    assert done.returncode == 0, done.stdout + done.stderr
    allowed, summary = done.stdout.splitlines()
    assert allowed == f"allowed by --own-stream 'drafter' (stream label 'drafter'): {_line(raw, 'drafter')}"
    assert summary.startswith("ok: no graph pool stranded more than 0 B (1 allowed group(s) on their own stream")
    assert done.stderr == ""


def test_own_stream_none_allows_nothing(tmp_path):
    raw = pr_drafter()
    path = _write(tmp_path, "pr_drafter", raw)
    for none in ("none", "NONE"):
        done = run_kit("check", path, "--own-stream", none)
        assert done.returncode == 1, done.stdout + done.stderr
        assert done.stdout.splitlines() == [_line(raw, "drafter")]  # the drafter's group offends, as before #28
        assert "failed: 1 group(s) stranded more than 0 B (simulator" in done.stderr
    result = check_snapshot(raw, own_stream=())
    assert not result.ok and result.allowed == [] and result.own_stream == ()


def test_the_unpatched_one_fails_by_default(tmp_path):
    """The replay graphs' own stream is not allowed; the drafter's still is, and is listed."""
    raw = unpatched_drafter()
    path = _write(tmp_path, "unpatched_drafter", raw)
    done = run_kit("check", path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        _line(raw, "replay"),
        f"allowed by --own-stream 'drafter' (stream label 'drafter'): {_line(raw, 'drafter')}",
    ]
    assert "failed: 1 group(s) stranded more than 0 B (1 allowed group(s)" in done.stderr


def test_own_stream_allows_by_label_and_replaces_the_default(tmp_path):
    without_drafter = simulated(_ops("replay", drafter=None))
    path = _write(tmp_path, "unpatched", without_drafter)
    assert run_kit("check", path).returncode == 1
    for pattern in ("replay", "REPLAY", " repl"):  # case-insensitive, a part of the label, stripped
        done = run_kit("check", path, "--own-stream", pattern)
        assert done.returncode == 0, done.stdout + done.stderr
        allowed, _ = done.stdout.splitlines()
        assert allowed.startswith(f"allowed by --own-stream {pattern.strip()!r} (stream label 'replay'): p (0, 1)")
    # with the drafter on: a pattern given replaces the default, so the drafter must be named again
    path = _write(tmp_path, "unpatched_drafter", unpatched_drafter())
    done = run_kit("check", path, "--own-stream", "replay")
    assert done.returncode == 1 and done.stdout.splitlines()[0].startswith("p (0, 1), drafter (stream ")
    done = run_kit("check", path, "--own-stream", "replay", "--own-stream", "drafter")
    assert done.returncode == 0, done.stdout + done.stderr
    assert len([line for line in done.stdout.splitlines() if line.startswith("allowed by --own-stream")]) == 2


def test_json_carries_allowed(tmp_path):
    raw = pr_drafter()
    path = _write(tmp_path, "pr_drafter", raw)
    done = run_kit("check", path, "--json")
    assert done.returncode == 0
    out = json.loads(done.stdout)
    assert set(out) == {"ok", "offending", "source", "allowed", "own_stream"}
    assert out["ok"] is True and out["offending"] == [] and out["own_stream"] == ["speculator", "drafter"]
    (group,) = out["allowed"]
    assert group == {
        "device": 0,
        "pool": [0, 1],
        "pool_label": "p",
        "stream": _stream(raw, "drafter"),
        "stream_label": "drafter",
        "stranded_bytes": SEGMENT,
        "still_reserved": SEGMENT,
        "frames": "",
        "patterns": ["drafter"],
        "matched": ["stream label 'drafter'"],
    }
    done = run_kit("check", path, "--json", "--own-stream", "none")
    assert done.returncode == 1
    out = json.loads(done.stdout)
    assert out["allowed"] == [] and out["own_stream"] == []
    assert [g["stream_label"] for g in out["offending"]] == ["drafter"]
    assert "patterns" not in out["offending"][0]  # an offending group keeps the keys it had


# -- by manager: the recorded capture windows


def test_a_recorded_drafter_capture_is_allowed_by_its_manager(tmp_path):
    """The drafter's stream named neutrally ("s3"): only the recorded window's manager says it is the drafter's."""
    raw = simulated(_ops("model", drafter="s3"), managers=MANAGERS)
    assert check_snapshot(raw, own_stream=()).offending[0]["stream_label"] == "s3"
    done = run_kit("check", _write(tmp_path, "by_manager", raw))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith(
        "allowed by --own-stream 'speculator' (manager 'DFlash speculator graphs'): p (0, 1), s3 (stream "
    )
    unpatched = simulated(_ops("replay", drafter="s3"), managers=MANAGERS)
    result = check_snapshot(unpatched)
    assert [g["stream_label"] for g in result.offending] == ["replay"]
    assert [(g["stream_label"], g["matched"]) for g in result.allowed] == [
        ("s3", ["manager 'DFlash speculator graphs'"])
    ]
    by_manager = check_snapshot(unpatched, own_stream=("REPLAY GRAPHS", "dflash"))  # a manager's name, any case
    assert by_manager.ok and [g["patterns"] for g in by_manager.allowed] == [["REPLAY GRAPHS"], ["dflash"]]


def test_a_group_is_allowed_only_when_all_its_captures_are():
    """Another manager's graph captured on the drafter's stream into the pool: the group is not the drafter's alone."""
    managers = {**MANAGERS, "other graph": "model graphs"}
    raw = simulated(_ops("model", drafter="s3", also_on_drafter="other graph"), managers=managers)
    result = check_snapshot(raw)
    assert not result.ok and result.allowed == []
    assert [g["stream_label"] for g in result.offending] == ["s3"]
    assert check_snapshot(raw, own_stream=("speculator", "model graphs")).ok
    # a stream label the snapshot gives allows every capture on it (a pattern matches a manager or the label)
    assert check_snapshot(raw, own_stream=("s3",)).ok


# -- what the allowlist never touches


def test_a_snapshot_without_capture_metadata_is_unaffected(tmp_path):
    """No `kit` key (a plain torch snapshot): no given labels, no recorded managers, so the default allows nothing.
    The label the kit made up names its stream only in full; a part of it ("stream") names none, an error."""
    raw = pr_drafter()
    plain = {k: v for k, v in raw.items() if k != "kit"}
    path = _write(tmp_path, "plain", plain)
    done = run_kit("check", path)
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stdout.splitlines()
    label = kit.check_snapshot(plain, own_stream=()).offending[0]["stream_label"]  # one the kit made up
    assert line.startswith(f"graph pool 1 (0, 1), {label} (stream ") and not line.startswith("allowed")
    named = run_kit("check", path, "--own-stream", label)  # the label as printed, in full
    assert named.returncode == 0 and named.stdout.startswith(f"allowed by --own-stream {label!r} (stream {label!r} (")
    part = run_kit("check", path, "--own-stream", "stream")
    assert part.returncode == 2 and "--own-stream 'stream' matches no stream of this snapshot" in part.stderr


def test_the_default_pool_is_never_allowed():
    """With --pools all, the drafter stream's eager stranding in the default pool still offends."""
    eager = [{"op": "alloc", "id": "e0", "bytes": 8 * MIB, "stream": "model"}, {"op": "free", "id": "e0"}]
    eager += [{"op": "alloc", "id": "e1", "bytes": 8 * MIB, "stream": "drafter"}]
    raw = simulated(eager + _ops("model"))
    result = check_snapshot(raw, pools="all")
    assert [(tuple(g["pool"]), g["stream_label"]) for g in result.offending] == [((0, 0), "drafter")]
    assert [(tuple(g["pool"]), g["stream_label"]) for g in result.allowed] == [((0, 1), "drafter")]
    assert check_snapshot(raw).ok  # graph pools only: the drafter's graph group, allowed


def test_groups_within_max_stranded_are_not_listed_as_allowed(tmp_path):
    path = _write(tmp_path, "pr_drafter", pr_drafter())
    done = run_kit("check", path, "--max-stranded", str(SEGMENT))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [f"ok: no graph pool stranded more than 20.00 MiB (simulator ({path}))"]


# -- the Python API and bad input


def test_assert_no_stranding_takes_own_stream():
    raw = pr_drafter()
    assert kit.assert_no_stranding(raw).allowed[0]["stream_label"] == "drafter"
    with pytest.raises(AssertionError) as raised:
        kit.assert_no_stranding(raw, own_stream=())
    assert str(raised.value).splitlines()[1] == _line(raw, "drafter")
    unpatched = unpatched_drafter()
    with pytest.raises(AssertionError) as raised:
        kit.assert_no_stranding(unpatched)
    lines = str(raised.value).splitlines()
    allowed = f"allowed by --own-stream 'drafter' (stream label 'drafter'): {_line(unpatched, 'drafter')}"
    assert lines[1:] == [_line(unpatched, "replay"), allowed]
    assert check_snapshot(raw, own_stream="drafter").ok  # one pattern as a string
    assert check_snapshot(raw, own_stream=["drafter", "drafter"]).own_stream == ("drafter",)


def test_bad_own_stream_exits_2(tmp_path):
    path = _write(tmp_path, "pr_drafter", pr_drafter())
    for args in (["--own-stream", ""], ["--own-stream", "  "], ["--own-stream", "none", "--own-stream", "drafter"]):
        done = run_kit("check", path, *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stdout == "" and done.stderr.startswith("kit: error: --own-stream ")
        assert len(done.stderr.splitlines()) == 1
    for bad in (("",), (None,), 5):
        with pytest.raises(kit.KitError, match="own.stream"):
            check_snapshot(pr_drafter(), own_stream=bad)


def test_help_names_the_option():
    done = run_kit("check", "--help")
    text = " ".join(done.stdout.split())  # argparse wraps to the terminal's width
    assert "--own-stream PATTERN" in text and "'none' allows nothing" in text


# -- the replica's scenarios with the drafter on


def test_scenarios_speculator_flag_reaches_run_scenario(tmp_path, monkeypatch):
    from kit.experiments import scenarios

    seen = []

    def fake_run(name, preset="small", speculator=False):
        seen.append((name, preset, speculator))
        return {"segments": []}

    monkeypatch.setattr(scenarios, "run_scenario", fake_run)
    monkeypatch.setattr(scenarios, "summarize", lambda raw: {})
    out = str(tmp_path / "x.pickle")
    assert scenarios.main(["patched", "--preset", "small", "-o", out, "--speculator"]) == 0
    assert scenarios.main(["unpatched", "-o", out]) == 0
    assert seen == [("patched", "small", True), ("unpatched", "small", False)]


def test_check_on_the_shipped_h200_drafter_run(tmp_path):
    """The PR's configuration with the drafter on, recorded on an H200 (`kit/recordings/drafter/small.json`, scenario
    `pr`): the drafter's graphs strand 24 MiB of the global graph pool on their own stream. Issue 28's failure (exit 1)
    with --own-stream none; exit 0 by default, the group listed as allowed by its manager. Under `share_all` (every
    capture on the model graphs' stream) nothing strands, so nothing is allowed either."""
    scenarios = current_words(json.loads(shipped_bytes(RECORDINGS / "drafter" / "small.json")))["scenarios"]
    path = _write(tmp_path, "pr", scenarios["pr"]["snapshot"])
    line = "global graph pool (0, 1), DFlash speculator graphs stream (stream "
    done = run_kit("check", path, "--own-stream", "none")
    assert done.returncode == 1 and done.stdout.startswith(line), done.stdout + done.stderr
    assert f"24.00 MiB stranded ({24 * MIB} bytes)" in done.stdout
    done = run_kit("check", path)
    assert done.returncode == 0, done.stdout + done.stderr
    allowed, summary = done.stdout.splitlines()
    assert allowed.startswith(f"allowed by --own-stream 'speculator' (manager 'DFlash speculator graphs'): {line}")
    assert "first stranded allocation: combine_hidden_states (speculator.py:" in allowed
    assert summary.startswith("ok: no graph pool stranded more than 0 B (1 allowed group(s)")
    shared = check_snapshot(scenarios["share_all"]["snapshot"])
    assert shared.ok and shared.allowed == []


DRAFTER_RECORDINGS = {
    name: RECORDINGS / "replica" / f"small_{name}_drafter.pickle" for name in ("patched", "unpatched")
}  # `python -m kit.experiments.scenarios NAME --preset small --speculator -o ...` on a GPU


def test_check_on_the_replica_with_the_drafter():
    """Acceptance of issue 28: the PR's configuration with the drafter on passes, the unpatched one fails."""
    for name, path in DRAFTER_RECORDINGS.items():
        config = kit.load_snapshot(path).kit["scenario"]["config"]
        assert config["speculator"] is True, name
    patched = DRAFTER_RECORDINGS["patched"]
    done = run_kit("check", str(patched))
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(run_kit("check", str(patched), "--json").stdout)
    assert out["ok"] is True and out["allowed"], out  # the drafter's graphs strand on their own stream, allowed
    for group in out["allowed"]:
        assert group["patterns"] == ["speculator"] and "manager 'DFlash speculator graphs'" in group["matched"]
    assert all(line.startswith("allowed by --own-stream 'speculator'") for line in done.stdout.splitlines()[:-1])
    assert run_kit("check", str(patched), "--own-stream", "none").returncode == 1
    done = run_kit("check", str(DRAFTER_RECORDINGS["unpatched"]))
    assert done.returncode == 1, done.stdout + done.stderr
    offending = [line for line in done.stdout.splitlines() if not line.startswith("allowed by")]
    assert offending and all("replay graphs stream" in line for line in offending)


@pytest.mark.gpu
def test_run_scenario_records_the_speculator(tmp_path):
    """On a GPU: the scenario with the drafter on says so in its config and command, and passes the guard."""
    out = tmp_path / "patched_drafter.pickle"
    done = subprocess.run(
        [sys.executable, "-m", "kit.experiments.scenarios", "patched", "--preset", "small", "--speculator"]
        + ["-o", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    snap = kit.load_snapshot(out)
    assert snap.kit["scenario"]["config"]["speculator"] is True
    assert snap.kit["provenance"]["command"].endswith("patched --preset small --speculator")
    assert check_snapshot(snap).ok
    assert check_snapshot(snap, own_stream=()).offending  # the drafter strands: not allowed, it offends

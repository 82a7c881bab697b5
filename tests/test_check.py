"""`python -m kit check` and `kit.assert_no_stranding`: the CI guard, on the replica and the H200 recordings.

Expected outcomes, from what each recording is:

- the replica unpatched (small and large): the replay graphs are captured on
  their own stream into the model graphs' pool and make new segments while the
  model graphs' free blocks sit there: exit 1;
- patched: one stream, nothing stranded in the graph pool: exit 0;
- early aux under the PR: the PR keeps the replay graphs on their own stream
  on purpose (an aux hidden state made before the replay layers), so they
  strand exactly as unpatched (24 MiB of graph pool): exit 1. The guard
  measures memory, not safety: a model with early aux fails it by design;
- early aux forced to share: no stranding (though graphs then differ from
  eager, `docs/replica.md`): exit 0;
- the model-and-replay experiment on two streams: exit 1; on a shared stream: exit 0;
- plain snapshots (`kit/recordings/plain`, where present): every `*_separate`
  program exit 1, the `*_shared` ones and torch.compile's exit 0.
"""

from __future__ import annotations

import copy
import inspect
import json
import pickle

import pytest

import kit
from kit.cli import main
from kit.experiments.scenarios import summarize
from kit.recordings import RECORDINGS, recording
from kit.replica.model import DecoderLayer
from kit.units import format_bytes

from .helpers import MIB, RECORDED
from .test_tables import run_kit

REPLICA = {
    name: recording(f"replica/{name}.pickle")
    for name in (
        "small_unpatched",
        "small_patched",
        "small_early_aux_pr",
        "small_early_aux_shared",
        "large_unpatched",
        "large_patched",
    )
}
EXPECTED = {
    "small_unpatched": 1,
    "small_patched": 0,
    "small_early_aux_pr": 1,
    "small_early_aux_shared": 0,
    "large_unpatched": 1,
    "large_patched": 0,
}
# The line of the replica's layer whose matmul asks first for the replay graphs' new segment.
LAYER_FRAME = f"forward (model.py:{inspect.getsourcelines(DecoderLayer.forward)[1] + 3})"


def stranded(name: str) -> int:
    """What the recording says the replay captures added on their own stream (the scenario summary, by stream)."""
    return summarize(REPLICA[name])["replay_added_by_stream"]["replay graphs stream"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_check_on_the_replica(name):
    done = run_kit("check", str(REPLICA[name]))
    assert done.returncode == EXPECTED[name], done.stdout + done.stderr
    if EXPECTED[name]:
        (line,) = done.stdout.splitlines()  # one line per offending group: here the replay graphs' stream
        assert line.startswith("global graph pool (0, 1), replay graphs stream (stream ")
        assert f"({stranded(name)} bytes)" in line and f"first stranded allocation: {LAYER_FRAME}" in line
        assert "failed: 1 group(s) stranded more than 0 B" in done.stderr
    else:
        assert done.stdout.startswith("ok: no graph pool stranded more than 0 B")


@pytest.mark.parametrize(("name", "code"), [("two_streams", 1), ("shared_stream", 0)])
def test_check_on_the_two_capture_recordings(name, code):
    done = run_kit("check", str(RECORDED[name]))
    assert done.returncode == code, done.stdout + done.stderr
    assert ("replay graphs stream" in done.stdout) == bool(code)


PLAIN = sorted((RECORDINGS / "plain").glob("*.pickle"))  # plain torch snapshots of programs the kit did not write


def test_the_plain_recordings_are_there():
    assert len(PLAIN) == 7  # replay_graphs_separate and _shared (vLLM-shaped) joined the five


@pytest.mark.parametrize("path", PLAIN, ids=lambda p: p.stem)
def test_check_on_the_plain_recordings(path):
    """Every separate-stream program fails; shared-stream ones and torch.compile's pass."""
    done = run_kit("check", str(path))
    assert done.returncode == (1 if path.stem.endswith("_separate") else 0), done.stdout + done.stderr
    if done.returncode:
        (line,) = done.stdout.splitlines()
        assert line.startswith("graph pool 1 (0, 1), stream of ")


def test_check_json():
    done = run_kit("check", str(REPLICA["small_unpatched"]), "--json")
    assert done.returncode == 1
    out = json.loads(done.stdout)
    # issue 28 added "allowed" and "own_stream" (tests/test_check_own_stream.py); the first three keep their meaning
    assert set(out) == {"ok", "offending", "source", "allowed", "own_stream"} and out["ok"] is False
    assert out["allowed"] == [] and out["own_stream"] == ["speculator", "drafter"]
    assert "small_unpatched.pickle" in out["source"]
    (group,) = out["offending"]
    snap = kit.load_snapshot(REPLICA["small_unpatched"])
    assert group["pool"] == [0, 1] and group["pool_label"] == "global graph pool"
    assert group["stream"] == snap.kit["streams"]["replay graphs stream"]
    assert group["stream_label"] == "replay graphs stream"
    assert group["stranded_bytes"] == group["still_reserved"] == 24 * MIB
    assert LAYER_FRAME in group["frames"]
    done = run_kit("check", str(REPLICA["small_patched"]), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["ok"] is True
    assert json.loads(done.stdout)["offending"] == []


def test_max_stranded_and_pools():
    path = str(REPLICA["small_unpatched"])
    assert run_kit("check", path, "--max-stranded", str(24 * MIB)).returncode == 0  # not more than 24 MiB
    assert run_kit("check", path, "--max-stranded", str(24 * MIB - 1)).returncode == 1
    # the default pool strands too (the model graphs' stream beside the default stream): only --pools all sees it
    assert run_kit("check", str(REPLICA["small_patched"]), "--pools", "all").returncode == 1
    result = kit.check_snapshot(REPLICA["small_unpatched"], pools="all")
    # graph pools first, as the verdicts are ordered: the replay graphs' 24 MiB, then the default pool's groups
    assert [tuple(g["pool"]) for g in result.offending] == [(0, 1), (0, 0), (0, 0)]
    assert result.offending[0]["stranded_bytes"] == stranded("small_unpatched") == 24 * MIB
    assert all(g["stranded_bytes"] > 0 for g in result.offending[1:])


def test_main_returns_the_exit_status_of_check(capsys):
    assert main(["check", str(REPLICA["small_unpatched"])]) == 1
    assert main(["check", str(REPLICA["small_patched"])]) == 0
    assert main(["table", str(REPLICA["small_patched"])]) == 0  # commands that return nothing still exit 0
    capsys.readouterr()


def test_assert_no_stranding_for_a_pytest_test():
    kit.assert_no_stranding(REPLICA["small_patched"])
    kit.assert_no_stranding(REPLICA["small_unpatched"], max_stranded=24 * MIB)
    with pytest.raises(AssertionError) as raised:
        kit.assert_no_stranding(REPLICA["small_unpatched"])
    lines = str(raised.value).splitlines()
    assert lines == [
        kit.check_snapshot(REPLICA["small_unpatched"]).summary(),
        *run_kit("check", str(REPLICA["small_unpatched"])).stdout.splitlines(),
    ]


def test_bad_input_exits_2(tmp_path):
    corrupt = tmp_path / "corrupt.pickle"
    corrupt.write_bytes(b"not a pickle at all")
    done = run_kit("check", str(corrupt))
    assert done.returncode == 2 and done.stderr.startswith("kit: error:") and not done.stdout
    raw = copy.deepcopy(kit.load_snapshot(REPLICA["small_unpatched"]).raw)
    raw.pop("device_traces")
    no_trace = tmp_path / "no_trace.pickle"
    no_trace.write_bytes(pickle.dumps(raw))
    done = run_kit("check", str(no_trace))
    assert done.returncode == 2 and "no trace recorded (memory history was off)" in done.stderr
    for other in ("reuse", "what-if"):  # one wording for the same refusal, whichever command meets it
        assert run_kit(other, str(no_trace), *(["--map", "a=b"] if other == "what-if" else [])).stderr == done.stderr
    raw["device_traces"] = [[]]
    with pytest.raises(kit.KitError, match="no trace recorded"):
        kit.check_snapshot(raw)
    assert run_kit("check", str(tmp_path / "missing.pickle")).returncode == 2
    assert run_kit("check", str(REPLICA["small_patched"]), "--pools", "default").returncode == 2
    assert run_kit("check", str(REPLICA["small_patched"]), "--max-stranded", "-5").returncode == 2
    with pytest.raises(kit.KitError, match="--pools"):
        kit.check_snapshot(REPLICA["small_patched"], pools="some")


# -- issue 27: the guard fails closed, and walks every device


def _raw(name: str) -> dict:
    return copy.deepcopy(kit.load_snapshot(REPLICA[name]).raw)


def _reversed_trace(raw: dict) -> dict:
    raw["device_traces"] = [list(reversed(trace)) for trace in raw["device_traces"]]
    return raw


@pytest.mark.parametrize(
    "path", [REPLICA["small_unpatched"], RECORDINGS / "plain" / "two_captures_separate.pickle"], ids=lambda p: p.stem
)
def test_a_trace_whose_walk_misses_the_snapshot_exits_2_in_one_line(tmp_path, path):
    """Reversed, the trace walks to other segments than the snapshot's: no verdict (it exited 0 after 13 warnings)."""
    raw = _reversed_trace(copy.deepcopy(kit.load_snapshot(path).raw))
    bad = tmp_path / "reversed.pickle"
    bad.write_bytes(pickle.dumps(raw))
    for extra in ([], ["--json"], ["--pools", "all", "--max-stranded", str(1 << 40)]):
        done = run_kit("check", str(bad), *extra)
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stdout == ""
        (line,) = done.stderr.splitlines()
        missed = "device 0's trace, walked from its start, does not end at the snapshot ("
        assert line.startswith(f"kit: error: {bad}: {missed}")
        assert "mismatch(es); the first: segment 0x" in line and "cannot be trusted" in line


def test_check_snapshot_and_assert_no_stranding_raise_kit_error_for_a_trace_whose_walk_misses():
    raw = _reversed_trace(_raw("small_patched"))  # a snapshot that passes, until its trace is reversed
    kit.assert_no_stranding(_raw("small_patched"))
    with pytest.raises(kit.KitError, match="walked from its start, does not end at the snapshot"):
        kit.check_snapshot(raw)
    with pytest.raises(kit.KitError, match="cannot be trusted"):  # not AssertionError: the cause is not stranding
        kit.assert_no_stranding(raw)


def _two_devices(device_0: str, device_1: str) -> dict:
    """Device 0 from one replica recording, device 1 from another (no kit key: the two name streams apart)."""
    first, second = _raw(device_0), _raw(device_1)
    segments = [dict(s, device=0) for s in first["segments"]] + [dict(s, device=1) for s in second["segments"]]
    return {"segments": segments, "device_traces": [first["device_traces"][0], second["device_traces"][0]]}


def test_every_device_with_a_trace_is_checked(tmp_path):
    """Only device 1 strands (the unpatched replica's 24 MiB); device 0 is the patched one, clean."""
    path = tmp_path / "two_devices.pickle"
    path.write_bytes(pickle.dumps(_two_devices("small_patched", "small_unpatched")))
    done = run_kit("check", str(path))
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stdout.splitlines()
    assert f"{format_bytes(24 * MIB)} stranded ({24 * MIB} bytes)" in line
    (group,) = json.loads(run_kit("check", str(path), "--json").stdout)["offending"]
    assert (group["device"], group["pool"], group["stranded_bytes"]) == (1, [0, 1], 24 * MIB)
    swapped = tmp_path / "swapped.pickle"
    swapped.write_bytes(pickle.dumps(_two_devices("small_unpatched", "small_patched")))
    (group,) = kit.check_snapshot(str(swapped)).offending
    assert group["device"] == 0
    clean = _two_devices("small_patched", "small_patched")
    assert kit.check_snapshot(clean).ok
    clean["device_traces"][1] = list(reversed(clean["device_traces"][1]))  # device 1's walk fails: so does check
    with pytest.raises(kit.KitError, match="device 1's trace, walked from its start, does not end"):
        kit.check_snapshot(clean)


# --- --own-stream by what the kit prints: labels, ids, globs; and a pattern that names nothing ------------------


def test_own_stream_takes_the_label_the_kit_prints_the_stream_id_and_a_glob():
    """A plain snapshot names no stream; the kit's own label (in full), the id, or a glob over them allows the
    stranded group, and nothing else moves. A part of a made-up label ("stream") names no stream: an error."""
    path = RECORDINGS / "plain" / "two_captures_separate.pickle"
    failed = kit.check_snapshot(str(path), own_stream=())
    (group,) = failed.offending
    label, stream = group["stream_label"], group["stream"]
    assert label.startswith("stream of capture_second (")
    for pattern in (label, label.upper(), str(stream), hex(stream), "stream of capture_second*"):
        result = kit.check_snapshot(str(path), own_stream=(pattern,))
        assert result.ok and not result.offending, pattern
        assert [a["matched"] for a in result.allowed] == [[f"stream {label!r} ({stream})"]], pattern
    for pattern in ("stream", "capture_second", "nope"):
        with pytest.raises(kit.KitError) as raised:
            kit.check_snapshot(str(path), own_stream=(pattern,))
        message = str(raised.value)
        assert f"--own-stream {pattern!r} matches no stream of this snapshot; its streams: " in message
        assert f"{label} ({stream})" in message and "\n" not in message


def test_the_default_patterns_need_not_match_and_a_named_stream_still_counts_its_manager():
    """The default (the speculator's words) matches nothing on most snapshots and is no error; on the kit's own
    recording a stream label and a manager still match by a part of them."""
    path = RECORDINGS / "plain" / "two_captures_separate.pickle"
    assert not kit.check_snapshot(str(path)).ok  # default: no error, nothing allowed
    drafter = recording("replica/small_patched_drafter.pickle")
    assert kit.check_snapshot(str(drafter), own_stream=("DFlash",)).ok
    done = run_kit("check", str(path), "--own-stream", "nope")
    assert done.returncode == 2 and "matches no stream of this snapshot" in done.stderr

"""Bad input on the command line: exit 2, one line on stderr, no traceback, nothing written."""

from __future__ import annotations

import json
import os
import pickle

import pytest

from kit import KitError, load_snapshot

from .test_tables import run_kit


class _RunsAShellCommand:
    """Pickles into a call of os.system: what a hostile snapshot would carry."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def hostile_pickle(marker) -> bytes:
    return pickle.dumps({"segments": [], "device_traces": [[_RunsAShellCommand(f"touch {marker}")]]})


def test_hostile_pickle_never_runs_its_command(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "hostile.pickle"
    path.write_bytes(hostile_pickle(marker))
    out = tmp_path / "report.html"
    for args in (["table", str(path)], ["report", str(path), "-o", str(out)], ["diff", str(path), str(path)]):
        done = run_kit(*args)
        assert done.returncode == 2
        assert "refused to load global" in done.stderr
        assert "system" in done.stderr  # names the refused global (posix.system / nt.system)
    assert not marker.exists()
    assert not out.exists()
    with pytest.raises(KitError, match="refused to load global"):
        load_snapshot(path)
    assert not marker.exists()


def _bad_inputs(tmp_path, recorded):
    good = recorded.read_bytes()
    cases = {
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "corrupt": good[:100] + bytes(range(256)) * 4 + good[1200:],
        "not-a-snapshot": pickle.dumps([1, 2, 3]),
        "unreadable-json": b'{"segments": [',
        "json-not-a-snapshot": json.dumps({"hello": 1}).encode(),
        "binary-garbage": os.urandom(4096),
    }
    paths = {}
    for name, data in cases.items():
        paths[name] = tmp_path / f"{name}.pickle"
        paths[name].write_bytes(data)
    paths["missing"] = tmp_path / "does-not-exist.pickle"
    paths["folder"] = tmp_path
    return paths


@pytest.mark.parametrize(
    "case",
    [
        "empty",
        "truncated",
        "corrupt",
        "not-a-snapshot",
        "unreadable-json",
        "json-not-a-snapshot",
        "binary-garbage",
        "missing",
        "folder",
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, case):
    from .conftest import RECORDED

    path = _bad_inputs(tmp_path, RECORDED["two_streams"])[case]
    out = tmp_path / "out.html"
    for args in (["table", str(path), "--json"], ["report", str(path), "-o", str(out)]):
        done = run_kit(*args)
        assert done.returncode == 2, (case, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kit: error: "), done.stderr
        assert "Traceback" not in done.stderr
        assert done.stdout == ""
        assert not out.exists()


def test_report_failure_leaves_previous_file_intact(tmp_path):
    out = tmp_path / "report.html"
    out.write_text("the good report")
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"\x80\x05garbage")
    assert run_kit("report", str(bad), "-o", str(out)).returncode == 2
    assert out.read_text() == "the good report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pickle", "report.html"]


def test_unknown_command_is_a_usage_error():
    done = run_kit("frobnicate")
    assert done.returncode == 2 and "Traceback" not in done.stderr

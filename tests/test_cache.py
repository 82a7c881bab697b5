"""Large snapshots: the trace streamed into columns while unpickled, and the cache of the columns.

The streamed load (`kit.load.incremental`) must give exactly what the plain load
gives, on every recording and on a generated snapshot, and fall back to the
plain load, with the same result, wherever the stream is unusual (an entry
listed twice, an entry referenced from the `kit` key, several devices, an
old protocol); it must add less memory than `pickle.load` adds. The cache
(`kit.load.cache`) must give the same snapshot again, and every cache it
cannot trust (another file's, truncated, damaged, from another kit, of the
snapshot before it changed) must be named on stderr and made again; two
processes opening one file at once must both succeed.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kit.load.cache as cache
import kit.load.columns
import kit.load.incremental as incremental
import kit.load.snapshot
from kit import KitError, Snapshot, load_snapshot, segment_table
from kit.analysis.trace.reports import reuse_table
from kit.analysis.trace.walk import walk_trace
from kit.cli import main
from kit.scale import write_scale_snapshot

from .helpers import FIXTURES, segment

ROOT = Path(__file__).resolve().parents[1]
PICKLES = sorted(FIXTURES.rglob("*.pickle"))
SMALL = 0.01  # of the benchmark's snapshot: about 500 segments and 20,000 events


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("generated") / "scale.pickle"
    write_scale_snapshot(path, seed=3, scale=SMALL)
    return path


@pytest.fixture
def snapshot_file(generated, tmp_path) -> Path:
    """A copy of the generated snapshot in a folder of its own, cached whatever its size."""
    path = tmp_path / "snap.pickle"
    path.write_bytes(generated.read_bytes())
    return path


@pytest.fixture(autouse=True)
def _caches_for_every_size(monkeypatch, tmp_path):
    monkeypatch.setattr(incremental.TraceSink, "GROUP", 1000)  # small files still see entries in several groups
    monkeypatch.setattr(cache, "MIN_BYTES", 0)
    monkeypatch.delenv("KIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))


def same(a: Snapshot, b: Snapshot) -> None:
    """Two snapshots hold the same columns, traces (frames as the analyses read them) and kit key."""
    for key, value in vars(a.columns).items():
        if key != "records":
            assert np.array_equal(value, vars(b.columns)[key]), key
    assert sorted(a.trace_columns) == sorted(b.trace_columns)
    for device, ta in a.trace_columns.items():
        tb = b.trace_columns[device]
        for key in ("action", "addr", "size", "stream", "time_us"):
            assert getattr(ta, key).tolist() == getattr(tb, key).tolist(), (device, key)
        frames = [[f if type(f) is list else [] for f in t.frames] for t in (ta, tb)]
        assert frames[0] == frames[1], device
    assert a.kit == b.kit and a.history == b.history


def plain(path: Path) -> Snapshot:
    """The snapshot as the plain load makes it: the whole dict unpickled, then checked."""
    with open(path, "rb") as f:
        return Snapshot(pickle.load(f), origin=str(path))


def from_cache_only(monkeypatch, path: Path) -> Snapshot:
    """Load `path` with the file readers disabled: only a cache can answer."""

    def refuse(*args, **kwargs):
        raise AssertionError("read the snapshot file instead of its cache")

    with monkeypatch.context() as m:
        m.setattr(kit.load.snapshot, "read_incremental", refuse)
        m.setattr(kit.load.snapshot, "load_file", refuse)
        return load_snapshot(path)


# -- the streamed load ------------------------------------------------------------------------------


def _streamed(path: Path) -> tuple | None:
    """What the streamed read gives (None: it does not apply, and the file is read plainly)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return incremental.read_incremental(path, fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("path", PICKLES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_streamed_load_equals_the_plain_load_on_every_recording(path):
    streamed = _streamed(path)
    snap = load_snapshot(path, cache=False)
    if any(len(t) for t in plain(path).trace_columns.values()):
        assert streamed is not None  # every recording with a trace streams
    same(snap, plain(path))
    assert snap.raw == pickle.loads(path.read_bytes())  # read again on demand, unchanged


def test_streamed_load_equals_the_plain_load_on_a_generated_snapshot(generated):
    snap = load_snapshot(generated, cache=False)
    assert snap._raw is None  # only the columns are kept
    same(snap, plain(generated))
    pd.testing.assert_frame_equal(segment_table(snap), segment_table(plain(generated)))
    pd.testing.assert_frame_equal(walk_trace(snap).allocs, walk_trace(plain(generated)).allocs)


def _entries(n: int) -> list[dict]:
    return [
        {"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0, "time_us": i, "frames": [{"name": f"f{i % 7}"}]}
        for i in range(n)
    ]


def _write(path: Path, raw: dict, protocol: int = 4) -> Path:
    path.write_bytes(pickle.dumps(raw, protocol=protocol))
    return path


def test_an_entry_listed_twice_is_read_as_the_plain_load_reads_it(tmp_path):
    entries = _entries(2500)
    entries[1700] = entries[5]  # the same dict, in a later batch of 1,000: the pickle references it again
    path = _write(tmp_path / "twice.pickle", {"segments": [], "device_traces": [entries]})
    snap = load_snapshot(path)
    assert snap.trace_columns[0].addr[1700] == 5 * 4096
    same(snap, plain(path))


def test_an_entry_referenced_from_the_kit_key_is_kept(tmp_path):
    entries = _entries(1500)
    path = _write(tmp_path / "shared.pickle", {"segments": [], "device_traces": [entries], "kit": {"x": entries[3]}})
    assert load_snapshot(path).kit["x"] == entries[3]  # not the dict the stream emptied


@pytest.mark.parametrize("traces", [[[], "trace"], ["trace", "trace"], [[], [], "trace", []]], ids=str)
def test_every_device_reads_as_the_plain_load_reads_it(tmp_path, traces):
    raw = {
        "segments": [],
        "device_traces": [_entries(1200 + 7 * i) if t == "trace" else t for i, t in enumerate(traces)],
    }
    path = _write(tmp_path / "devices.pickle", raw)
    assert _streamed(path)[1] == traces.index("trace")  # the first device with entries is streamed
    same(load_snapshot(path), plain(path))


def test_a_trace_list_referenced_twice_is_kept(tmp_path):
    entries = _entries(1500)
    path = _write(tmp_path / "twice.pickle", {"segments": [], "device_traces": [entries], "kit": {"again": entries}})
    assert _streamed(path) is None  # the list is in two places: read plainly
    assert load_snapshot(path).kit["again"] == entries


@pytest.mark.parametrize("protocol", [2, 3, 5])
def test_other_protocols_read_as_the_plain_load_reads_them(tmp_path, protocol):
    path = _write(tmp_path / "p.pickle", {"segments": [], "device_traces": [_entries(1100)]}, protocol)
    same(load_snapshot(path), plain(path))


def test_frames_not_shared_read_as_the_plain_load_reads_them(tmp_path, monkeypatch):
    entries = [{**e, "frames": [{"name": f"f{i}", "line": i}]} for i, e in enumerate(_entries(1500))]  # each its own
    path = _write(tmp_path / "unshared.pickle", {"segments": [], "device_traces": [entries]})
    monkeypatch.setattr(kit.load.columns.Stacks, "MAX_FRAME_OBJECTS", 100)  # a stream would keep too many alive
    same(load_snapshot(path), plain(path))


def test_device_traces_before_segments_loads_as_the_usual_order(tmp_path):
    """The top-level keys in the other order: the same snapshot, even where a segment's block is (by the pickle's
    memo) the very dict of a trace entry, which the stream empties as it reads the trace, before the segments."""
    segments = [segment(0x10_0000, [(512, "active_allocated"), (1536, "inactive")])]
    usual = _write(tmp_path / "usual.pickle", {"segments": segments, "device_traces": [_entries(2500)]})
    first = _write(tmp_path / "first.pickle", {"device_traces": [_entries(2500)], "segments": segments})
    same(load_snapshot(first), load_snapshot(usual))
    same(load_snapshot(first), plain(first))
    entries = _entries(2500)
    entries[5].update(addr=0x10_0000, address=0x10_0000, requested_size=512, state="active_allocated")
    shared = {**segments[0], "blocks": [entries[5], segments[0]["blocks"][1]]}
    path = _write(tmp_path / "shared.pickle", {"device_traces": [entries], "segments": [shared]})
    snap = load_snapshot(path)
    assert snap.trace_columns[0].addr[5] == 0x10_0000 and snap.columns.block_size.tolist() == [512, 1536]
    same(snap, plain(path))


def test_the_key_inside_a_string_is_passed_over(tmp_path):
    decoy = "\x8c\x0ddevice_traces]"  # the bytes the stream looks for, inside a string before the real key
    raw = {"kit": {"note": decoy}, "segments": [], "device_traces": [_entries(1100)]}
    path = _write(tmp_path / "decoy.pickle", raw)
    assert load_snapshot(path).kit["note"] == decoy
    same(load_snapshot(path), plain(path))


def test_a_file_cannot_name_the_trace_sink(tmp_path):
    """The sink's name is a token made for one load: a pickle that guesses at it is refused like any global."""
    module, name = "kit-sink-" + "0" * 32, incremental.SINK_NAME
    call = b"\x8c" + bytes([len(module)]) + module.encode() + b"\x8c" + bytes([len(name)]) + name.encode() + b"\x93)R"
    placeholder = "X" * (len(call) - 2)  # pickled as SHORT_BINUNICODE: as long as the call, so no frame changes
    data = pickle.dumps({"segments": [], "device_traces": [_entries(1500)], "kit": placeholder}, protocol=4)
    assert data.count(b"\x8c" + bytes([len(placeholder)]) + placeholder.encode()) == 1
    path = tmp_path / "sink.pickle"
    path.write_bytes(data.replace(b"\x8c" + bytes([len(placeholder)]) + placeholder.encode(), call))
    with pytest.raises(KitError, match=f"refused to load global '{module}.TraceSink'"):
        load_snapshot(path)


def test_a_bad_entry_gives_the_plain_loads_error(tmp_path):
    entries = _entries(2500)
    entries[2100]["size"] = -1
    path = _write(tmp_path / "bad.pickle", {"segments": [], "device_traces": [entries]})
    with pytest.raises(KitError) as streamed:
        load_snapshot(path)
    with pytest.raises(KitError) as plainly:
        plain(path)
    assert str(streamed.value) == str(plainly.value) and "trace 0 entry 2100" in str(streamed.value)


def _outcome(load) -> tuple:
    """What a load gives: ("error", its message) or ("snapshot", the snapshot)."""
    try:
        return ("snapshot", load())
    except KitError as e:
        return ("error", str(e))


_BASE = pickle.dumps(
    {"segments": [], "device_traces": [[], _entries(1300), _entries(40)], "kit": {"streams": {"a": 0}}}, protocol=4
)


@settings(max_examples=120, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_a_damaged_pickle_reads_as_the_plain_load_reads_it(data):
    """Bytes changed anywhere (mostly in the trace): the streamed load's result or error is the plain load's."""
    raw = bytearray(_BASE)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(2, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        del raw[data.draw(st.integers(len(raw) // 2, len(raw))) :]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "damaged.pickle"
        path.write_bytes(bytes(raw))
        got = _outcome(lambda: load_snapshot(path, cache=False))
        want = _outcome(lambda: Snapshot(kit.load.snapshot.load_file(path), origin=str(path)))
    assert got[0] == want[0], (got, want)
    if got[0] == "error":
        assert got[1] == want[1]
    else:
        same(got[1], want[1])


_ODD = [-1, 0, 2**63, 2**70, 1.5, None, True, "x", "annotate", "a newer torch's action", [], {}, [{"name": "f"}]]
_KEYS = ["action", "addr", "size", "stream", "time_us", "frames", "device_free", "compile_context"]


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_an_unusual_trace_reads_as_the_plain_load_reads_it(data):
    """Odd values, missing keys, non-dicts, shared entries: the streamed load's result or error is the plain load's."""
    traces = [_entries(1300), _entries(30)]
    kit_key: dict = {}
    for _ in range(data.draw(st.integers(1, 3))):
        trace = traces[data.draw(st.integers(0, 1))]
        i = data.draw(st.integers(0, len(trace) - 1))
        change = data.draw(st.sampled_from(["value", "drop", "not a dict", "shared", "in the kit key"]))
        if type(trace[i]) is not dict:
            continue
        if change == "value":
            trace[i] = {**trace[i], data.draw(st.sampled_from(_KEYS)): data.draw(st.sampled_from(_ODD))}
        elif change == "drop":
            trace[i] = {k: v for k, v in trace[i].items() if k != data.draw(st.sampled_from(_KEYS))}
        elif change == "not a dict":
            trace[i] = data.draw(st.sampled_from([None, 3, [], "entry"]))
        elif change == "shared":
            trace[data.draw(st.integers(0, len(trace) - 1))] = trace[i]
        else:
            kit_key["entry"] = trace[i]
    raw = {"segments": [], "device_traces": traces, "kit": kit_key}
    with tempfile.TemporaryDirectory() as folder:
        path = _write(Path(folder) / "unusual.pickle", raw, data.draw(st.sampled_from([4, 5])))
        got = _outcome(lambda: load_snapshot(path, cache=False))
        want = _outcome(lambda: plain(path))
        if got[0] == "snapshot":
            assert got[1].kit == raw["kit"]
    assert got[0] == want[0], (got, want)
    if got[0] == "error":
        assert got[1] == want[1]
    else:
        same(got[1], want[1])


MEASURE = """
import pickle, sys
sys.path.insert(0, {root!r})
from kit.load.snapshot import load_snapshot


def status(key):
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(key)).split()[1])


before = status("VmRSS:")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak starts again from here
if sys.argv[1] == "pickle":
    with open(sys.argv[2], "rb") as f:
        data = pickle.load(f)
else:
    snap = load_snapshot(sys.argv[2], cache=False)
print(status("VmHWM:") - before)
"""


def test_the_streamed_load_adds_less_memory_than_pickle_load(tmp_path):
    path = tmp_path / "scale.pickle"
    write_scale_snapshot(path, seed=2, scale=0.05)
    code = MEASURE.format(root=str(ROOT))
    added = {
        how: int(subprocess.run([sys.executable, "-c", code, how, str(path)], capture_output=True, text=True).stdout)
        for how in ("pickle", "kit")
    }
    assert added["kit"] < 0.8 * added["pickle"], added


# -- the cache --------------------------------------------------------------------------------------


def test_a_second_load_opens_the_cache_and_equals_the_first(snapshot_file, monkeypatch, capsys):
    first = load_snapshot(snapshot_file)
    assert cache.beside(snapshot_file).exists()
    again = from_cache_only(monkeypatch, snapshot_file)
    same(again, first)
    same(again, plain(snapshot_file))
    assert again.source_label == first.source_label
    pd.testing.assert_frame_equal(segment_table(again), segment_table(plain(snapshot_file)))
    pd.testing.assert_frame_equal(reuse_table(again), reuse_table(plain(snapshot_file)))
    assert again.raw == pickle.loads(snapshot_file.read_bytes())  # the file, read again
    assert capsys.readouterr().err == ""


def _rejected_and_made_again(monkeypatch, capsys, path: Path, reason: str) -> None:
    """The next load names the cache's fault on stderr, reads the file, and leaves a cache that works."""
    snap = load_snapshot(path)
    err = capsys.readouterr().err
    assert f"kit: note: cache {cache.beside(path)} is {reason}" in err and err.endswith("making it again\n"), err
    assert len(err.splitlines()) == 1
    same(snap, plain(path))
    same(from_cache_only(monkeypatch, path), plain(path))
    assert capsys.readouterr().err == ""


def test_a_cache_of_another_file_is_made_again(snapshot_file, tmp_path, monkeypatch, capsys):
    other = tmp_path / "other.pickle"
    write_scale_snapshot(other, seed=4, scale=SMALL)
    load_snapshot(other)
    cache.beside(other).replace(cache.beside(snapshot_file))  # another file's cache, under this file's name
    _rejected_and_made_again(monkeypatch, capsys, snapshot_file, "made from another file")


def test_a_cache_of_the_snapshot_before_it_changed_is_made_again(snapshot_file, monkeypatch, capsys):
    load_snapshot(snapshot_file)
    raw = pickle.loads(snapshot_file.read_bytes())
    raw["device_traces"][0] = raw["device_traces"][0][:-10]
    snapshot_file.write_bytes(pickle.dumps(raw))
    _rejected_and_made_again(monkeypatch, capsys, snapshot_file, "made from another file, or from this one before")


def test_a_snapshot_touched_after_caching_is_read_again(snapshot_file, monkeypatch, capsys):
    load_snapshot(snapshot_file)
    st = snapshot_file.stat()
    os.utime(snapshot_file, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # same bytes, another modification time
    _rejected_and_made_again(monkeypatch, capsys, snapshot_file, "made from another file")


def test_a_truncated_cache_is_made_again(snapshot_file, monkeypatch, capsys):
    load_snapshot(snapshot_file)
    cached = cache.beside(snapshot_file)
    data = cached.read_bytes()
    cached.write_bytes(data[: len(data) - 4096])
    _rejected_and_made_again(monkeypatch, capsys, snapshot_file, "truncated")


@pytest.mark.parametrize("cut", [0, 5, 20, 100])
def test_a_cache_cut_anywhere_in_its_header_is_made_again(snapshot_file, monkeypatch, capsys, cut):
    load_snapshot(snapshot_file)
    cached = cache.beside(snapshot_file)
    cached.write_bytes(cached.read_bytes()[:cut])
    load_snapshot(snapshot_file)
    err = capsys.readouterr().err
    assert "is truncated; making it again" in err or "is not a kit cache" in err, err
    same(from_cache_only(monkeypatch, snapshot_file), plain(snapshot_file))


def test_a_damaged_cache_is_made_again(snapshot_file, monkeypatch, capsys):
    load_snapshot(snapshot_file)
    cached = cache.beside(snapshot_file)
    data = bytearray(cached.read_bytes())
    data[-1000] ^= 0x01  # one bit of a column
    cached.write_bytes(bytes(data))
    _rejected_and_made_again(monkeypatch, capsys, snapshot_file, "damaged (its data's checksum does not match)")


def test_a_damaged_header_is_made_again(snapshot_file, monkeypatch, capsys):
    """One letter of a stream's name in the header's kit key changed, the JSON still valid: only its CRC-32 tells."""
    load_snapshot(snapshot_file)
    cached = cache.beside(snapshot_file)
    data = cached.read_bytes()
    _, length, _ = cache.PREFIX.unpack(data[: cache.PREFIX.size])
    header = data[cache.PREFIX.size : cache.PREFIX.size + length]
    assert header.count(b'"comm stream"') == 1
    changed = header.replace(b'"comm stream"', b'"comm Stream"')
    assert "comm Stream" in cache.decode(json.loads(changed)["kit_key"])["streams"]  # a header a reader would take
    cached.write_bytes(data[: cache.PREFIX.size] + changed + data[cache.PREFIX.size + length :])
    _rejected_and_made_again(monkeypatch, capsys, snapshot_file, "damaged (its header's checksum does not match)")


def test_a_snapshot_rewritten_in_its_last_mib_with_its_size_and_time_is_read_again(snapshot_file, monkeypatch, capsys):
    """Only bytes of the last MiB change, the size and the modification time stay: the hash of the tail tells."""
    raw = pickle.loads(snapshot_file.read_bytes())
    before, after = "before the rewrite", "after the rewrite!"
    raw["kit"] = {**raw.pop("kit"), "note": before}  # the kit key last, so the note lies in the file's last MiB
    data = pickle.dumps(raw, protocol=4)
    at = data.index(before.encode())
    assert data.count(before.encode()) == 1 and len(data) - cache.HASHED_BYTES <= at and at >= cache.HASHED_BYTES
    snapshot_file.write_bytes(data)
    assert load_snapshot(snapshot_file).kit["note"] == before and cache.beside(snapshot_file).exists()
    st = snapshot_file.stat()
    snapshot_file.write_bytes(data.replace(before.encode(), after.encode()))
    os.utime(snapshot_file, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (snapshot_file.stat().st_size, snapshot_file.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    _rejected_and_made_again(monkeypatch, capsys, snapshot_file, "made from another file, or from this one before")
    assert load_snapshot(snapshot_file).kit["note"] == after


def test_a_cache_from_an_older_kit_is_made_again(snapshot_file, monkeypatch, capsys):
    with monkeypatch.context() as m:
        m.setattr(cache, "FORMAT", cache.FORMAT - 1)
        load_snapshot(snapshot_file)
    _rejected_and_made_again(monkeypatch, capsys, snapshot_file, "written by another kit")


def test_a_cache_from_another_kit_version_is_made_again(snapshot_file, monkeypatch, capsys):
    with monkeypatch.context() as m:
        m.setattr(cache, "kit_version", lambda: "0.0.1")
        load_snapshot(snapshot_file)
    _rejected_and_made_again(monkeypatch, capsys, snapshot_file, "written by another kit (kit 0.0.1")


def _rewrite_header(path: Path, change) -> None:
    """Change a cache's header and give it a matching checksum (what a careful forger would do)."""
    data = path.read_bytes()
    _, length, _ = cache.PREFIX.unpack(data[: cache.PREFIX.size])
    header = json.loads(data[cache.PREFIX.size : cache.PREFIX.size + length])
    change(header)
    text = json.dumps(header, separators=(",", ":")).encode().ljust(length)
    assert len(text) == length
    path.write_bytes(
        cache.PREFIX.pack(cache.MAGIC, length, zlib.crc32(text)) + text + data[cache.PREFIX.size + length :]
    )


def test_a_cache_naming_an_object_array_is_refused_unread(snapshot_file, monkeypatch, capsys):
    load_snapshot(snapshot_file)

    def objects(header: dict) -> None:
        header["arrays"]["segments.address"]["dtype"] = "|O"

    _rewrite_header(cache.beside(snapshot_file), objects)
    _rejected_and_made_again(monkeypatch, capsys, snapshot_file, "damaged (array segments.address)")


LOAD = """
import builtins, os, sys, time
sys.path.insert(0, {root!r})
import kit.load.cache as c
c.MIN_BYTES = 0
if sys.argv[2] == "slowly":  # every write to a cache file waits: readers come while it is half written


    class Slow:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            time.sleep(0.1)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)


    fdopen, opened = os.fdopen, builtins.open
    os.fdopen = lambda *a, **k: Slow(fdopen(*a, **k))
    builtins.open = lambda f, mode="r", *a, **k: (
        Slow(opened(f, mode, *a, **k)) if "w" in mode and "kitcache" in str(f) else opened(f, mode, *a, **k)
    )
from kit import load_snapshot, segment_table
s = load_snapshot(sys.argv[1])
print(int(segment_table(s)["reserved"].sum()), len(s.trace_columns[0]))
"""


def test_processes_opening_one_file_while_its_cache_is_written_all_succeed(snapshot_file, monkeypatch):
    def start(how: str) -> subprocess.Popen:
        command = [sys.executable, "-c", LOAD.format(root=str(ROOT)), str(snapshot_file), how]
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    writer = start("slowly")
    deadline = time.monotonic() + 120
    while {p.name for p in snapshot_file.parent.iterdir()} == {snapshot_file.name}:  # until the cache is begun
        assert time.monotonic() < deadline and writer.poll() is None
        time.sleep(0.01)
    runs = [writer, *(start("now") for _ in range(2))]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], outputs
    assert len({out for out, _ in outputs}) == 1 and all(err == b"" for _, err in outputs), outputs
    same(from_cache_only(monkeypatch, snapshot_file), plain(snapshot_file))
    assert not [p for p in snapshot_file.parent.iterdir() if p.name.endswith(".tmp")]  # no temporary left


def test_no_cache_neither_reads_nor_writes_one(snapshot_file, capsys):
    load_snapshot(snapshot_file, cache=False)
    assert not cache.beside(snapshot_file).exists()
    assert main(["--no-cache", "table", str(snapshot_file)]) == 0
    assert main(["table", str(snapshot_file), "--no-cache", "--json"]) == 0
    assert not cache.beside(snapshot_file).exists() and cache.enabled()  # and the setting is put back
    assert main(["table", str(snapshot_file)]) == 0
    assert cache.beside(snapshot_file).exists()


def test_kit_cache_dir_holds_every_cache(snapshot_file, tmp_path, monkeypatch):
    folder = tmp_path / "caches"
    monkeypatch.setenv("KIT_CACHE_DIR", str(folder))
    load_snapshot(snapshot_file)
    assert not cache.beside(snapshot_file).exists()
    (made,) = folder.iterdir()
    assert made.name.startswith("snap.pickle-") and made.name.endswith(cache.SUFFIX)
    same(from_cache_only(monkeypatch, snapshot_file), plain(snapshot_file))


def test_a_read_only_folder_puts_the_cache_in_the_user_cache_folder(snapshot_file, tmp_path, monkeypatch):
    monkeypatch.setattr(cache.os, "access", lambda path, mode, **kw: Path(path) != snapshot_file.parent)
    load_snapshot(snapshot_file)
    assert not cache.beside(snapshot_file).exists()
    assert [p.name.endswith(cache.SUFFIX) for p in (tmp_path / "user-cache" / "kit").iterdir()] == [True]
    same(from_cache_only(monkeypatch, snapshot_file), plain(snapshot_file))


def test_a_folder_readable_but_not_writable_puts_the_cache_in_the_user_cache_folder(generated, tmp_path, monkeypatch):
    """A folder of mode 0o555: readable, not writable. Root writes anywhere, so there `os.access` answers from the
    mode's bits as a user's access would (the folder's own answer for any other user)."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    path = folder / "snap.pickle"
    path.write_bytes(generated.read_bytes())
    real = os.access

    def access(where, mode, **kw):
        if os.geteuid() != 0 or Path(where) != folder:
            return real(where, mode, **kw)
        bits = os.stat(where).st_mode
        wanted = ((os.R_OK, 0o400), (os.W_OK, 0o200), (os.X_OK, 0o100))
        return all(bits & bit for flag, bit in wanted if mode & flag)

    monkeypatch.setattr(cache.os, "access", access)
    folder.chmod(0o555)
    try:
        assert os.access(folder, os.R_OK | os.X_OK) and not os.access(folder, os.W_OK)
        load_snapshot(path)
        assert not cache.beside(path).exists()
        assert [p.name.endswith(cache.SUFFIX) for p in (tmp_path / "user-cache" / "kit").iterdir()] == [True]
        same(from_cache_only(monkeypatch, path), plain(path))
    finally:
        folder.chmod(0o755)


def test_small_files_and_shipped_recordings_are_never_cached(monkeypatch):
    monkeypatch.setattr(cache, "MIN_BYTES", 4 << 20)
    for path in PICKLES[:5]:
        load_snapshot(path)
    assert not list(FIXTURES.rglob("*" + cache.SUFFIX))


def test_a_kit_key_a_cache_cannot_hold_leaves_the_snapshot_uncached(tmp_path, capsys):
    path = _write(tmp_path / "set.pickle", {"segments": [], "device_traces": [_entries(1200)], "kit": {"x": {1, 2}}})
    assert load_snapshot(path).kit["x"] == {1, 2}
    assert not cache.beside(path).exists() and capsys.readouterr().err == ""
    assert load_snapshot(path).kit["x"] == {1, 2}


def test_a_cache_holds_the_kit_key_exactly():
    value = {"streams": {"a": 1}, "pools": {"p": (0, 1)}, 3: [1.5, None, True, float("inf")], "t": ((1, [2]),)}
    assert cache.decode(json.loads(json.dumps(cache.encode(value)))) == value
    assert type(cache.decode(cache.encode(value))["pools"]["p"]) is tuple
    with pytest.raises(cache.Unencodable):
        cache.encode({"s": {1, 2}})


def test_the_header_layout_is_what_the_docstring_says(snapshot_file):
    load_snapshot(snapshot_file)
    data = cache.beside(snapshot_file).read_bytes()
    magic, length, crc = struct.unpack("<8sQI4x", data[:24])
    assert magic == b"KITCACHE" and zlib.crc32(data[24 : 24 + length]) == crc
    header = json.loads(data[24 : 24 + length])
    assert header["format"] == cache.FORMAT and header["source"]["size"] == snapshot_file.stat().st_size
    assert all(spec["offset"] % cache.ALIGN == 0 for spec in header["arrays"].values())


# -- the walk kept beside the cache -----------------------------------------------------------------


def _same_walk(a, b) -> None:
    pd.testing.assert_frame_equal(a.allocs.drop(columns="frames"), b.allocs.drop(columns="frames"))
    assert [list(f) for f in a.allocs["frames"]] == [list(f) for f in b.allocs["frames"]]
    pd.testing.assert_frame_equal(a.new_segments, b.new_segments)
    assert (a.mismatches, a.rewound_segments, a.device) == (b.mismatches, b.rewound_segments, b.device)


def test_the_walk_is_kept_once_and_equals_a_fresh_walk(snapshot_file, monkeypatch, capsys):
    from kit.analysis.trace import columnar, walk

    first = walk.walk_trace(load_snapshot(snapshot_file))
    kept = walk.KIND + "0"
    assert snapshot_file.with_name(snapshot_file.name + f".kit{kept}").exists()
    assert (first.allocs["served"] == "stranded").any()  # the kept walk has every kind of row to get right
    with monkeypatch.context() as m:
        m.setattr(columnar, "walk_columns", lambda *a: pytest.fail("walked again instead of reading the kept walk"))
        m.setattr(walk, "walk_columns", lambda *a: pytest.fail("walked again instead of reading the kept walk"))
        again = walk.walk_trace(load_snapshot(snapshot_file))
    _same_walk(again, first)
    _same_walk(again, walk.walk_trace(plain(snapshot_file)))  # a dict: never cached, walked afresh
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("damage", ["truncated", "flipped", "other rows"])
def test_a_damaged_kept_walk_is_named_and_walked_again(snapshot_file, capsys, damage):
    from kit.analysis.trace import walk

    fresh = walk.walk_trace(load_snapshot(snapshot_file))
    kept = snapshot_file.with_name(snapshot_file.name + f".kit{walk.KIND}0")
    data = bytearray(kept.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped":
        data[-9] ^= 0xFF
    else:  # a well-formed file whose rows point past the trace: checked, not trusted
        stamp = load_snapshot(snapshot_file).cache_source[1]
        header, arrays = cache.open_extra(snapshot_file, stamp, walk.KIND + "0")
        arrays = {k: np.array(v) for k, v in arrays.items()}
        arrays["allocs.index"][0] = 10**12
        described = {k: header[k] for k in ("device", "rewound", "mismatches")}
        cache.save_extra(snapshot_file, stamp, walk.KIND + "0", arrays, described)
        data = bytearray(kept.read_bytes())
    kept.write_bytes(bytes(data))
    again = walk.walk_trace(load_snapshot(snapshot_file))
    _same_walk(again, fresh)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("walking again" in err or "making it again" in err), err

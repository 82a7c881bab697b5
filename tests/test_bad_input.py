"""Bad input: exit 2, one line on stderr, no traceback, nothing written; and no global of any pickle looked up.

The safe unpickler (`kit.load.unpickle`) refuses every global a pickle names.
Besides the hostile pickles that would run a command, the last test names
globals of torch, collections, copyreg, functools, pathlib, numpy and builtins
(what `torch.save`, numpy and plain pickles carry), and proves that none was
even looked up: their modules are stood in for by spies that count every
attribute read, and the `pickle.find_class` and `import` audit events, which
unpickling a global the ordinary way raises, must not occur.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import sys

import pytest

from kit import KitError, load_snapshot
from kit.load.incremental import SINK_NAME
from kit.load.unpickle import safe_unpickle, snapshot_unpickler

from .helpers import run_kit, run_kit_process


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
        done = run_kit_process(*args)  # as a user runs it: the entry point, a fresh interpreter
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
    from .helpers import RECORDED

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
    done = run_kit_process("frobnicate")
    assert done.returncode == 2 and "Traceback" not in done.stderr


# --- globals of every module a snapshot-shaped pickle might name -------------------------------------

# (module, name): what torch.save, numpy, pandas and plain pickles name, and what an attack would reach for.
NAMED_GLOBALS = [
    ("torch", "Tensor"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch.storage", "_load_from_bytes"),
    ("collections", "OrderedDict"),
    ("collections", "defaultdict"),
    ("copyreg", "_reconstructor"),
    ("functools", "partial"),
    ("functools", "reduce"),
    ("pathlib", "PosixPath"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy", "frombuffer"),
    ("builtins", "getattr"),
    ("builtins", "eval"),
    ("builtins", "list"),
    ("builtins", "__import__"),
]


class _LookupSpy(type(os)):
    """Stands in for a module in sys.modules and counts every attribute looked up on it.

    Unpickling a global the ordinary way imports its module (which finds it in
    sys.modules) and then looks the name up on it: either shows up here.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        object.__setattr__(self, "looked_up", [])

    def __getattribute__(self, attr: str):
        if not attr.startswith("__") and attr != "looked_up":
            object.__getattribute__(self, "looked_up").append(attr)
        return object.__getattribute__(self, attr) if attr.startswith("__") or attr == "looked_up" else object()


def _pickles_naming(module: str, name: str) -> dict[str, bytes]:
    """Snapshot-shaped pickles, `{"segments": [], "kit": <the global>}`, that name `module.name` every way pickle can.

    By GLOBAL (protocols 0 to 3) and by STACK_GLOBAL (protocol 4 and later), and
    called with no arguments (REDUCE), as a hostile pickle would.
    """

    def text(value: str) -> bytes:
        return pickle.SHORT_BINUNICODE + bytes([len(value.encode())]) + value.encode()

    def snapshot(value: bytes) -> bytes:
        head = pickle.PROTO + b"\x04" + pickle.EMPTY_DICT + pickle.MARK + text("segments") + pickle.EMPTY_LIST
        return head + text("kit") + value + pickle.SETITEMS + pickle.STOP

    stacked = text(module) + text(name) + pickle.STACK_GLOBAL
    return {
        "GLOBAL": b"(dS'segments'\n(lsS'kit'\nc" + f"{module}\n{name}\n".encode() + b"s.",
        "STACK_GLOBAL": snapshot(stacked),
        "STACK_GLOBAL called": snapshot(stacked + pickle.EMPTY_TUPLE + pickle.REDUCE),
    }


_AUDIT: list[tuple[str, tuple]] | None = None  # the audit events while a test listens, else None


def _listen(event: str, args: tuple) -> None:
    if _AUDIT is not None and event in ("pickle.find_class", "import"):
        _AUDIT.append((event, args))


sys.addaudithook(_listen)  # audit hooks cannot be removed; this one only records while a test listens


@pytest.mark.parametrize("module,name", NAMED_GLOBALS, ids=[f"{m}.{n}" for m, n in NAMED_GLOBALS])
def test_a_named_global_of_any_module_is_refused_without_being_looked_up(tmp_path, monkeypatch, module, name):
    global _AUDIT
    spies = {m: _LookupSpy(m) for m in {module, module.partition(".")[0]}}
    for pickled in _pickles_naming(module, name).values():
        path = tmp_path / "named.pickle"
        path.write_bytes(pickled)
        for load in (lambda d=pickled: safe_unpickle(d, "named.pickle"), lambda p=path: load_snapshot(p)):
            _AUDIT = []
            try:
                with monkeypatch.context() as m:
                    for spied, spy in spies.items():
                        m.setitem(sys.modules, spied, spy)
                    with pytest.raises(KitError) as refused:
                        load()
            finally:
                events, _AUDIT = _AUDIT, None
            assert str(refused.value).endswith(
                f"named.pickle: refused to load global '{module}.{name}': a snapshot holds plain data only"
            )
            # pickle's own find_class raises "pickle.find_class"; importing the named module would raise "import"
            top = module.partition(".")[0]
            assert [e for e, args in events if e == "pickle.find_class" or args[0].partition(".")[0] == top] == []
            assert {spied: spy.looked_up for spied, spy in spies.items()} == {spied: [] for spied in spies}


SINK_TOKEN = "kit-sink-" + "5" * 32  # the module name the stream makes up for one load


@pytest.mark.parametrize("module", ["kit.load.incremental", "kit-sink-" + "0" * 32, "builtins", "os"])
def test_the_trace_sinks_name_under_any_module_but_the_loads_token_is_refused_without_lookup(module):
    """The unpickler admits the sink by (token, name): the sink's class name under another module is any global."""
    global _AUDIT
    made = []
    sink = (SINK_TOKEN, SINK_NAME, lambda: made.append("sink") or [])
    for way, pickled in _pickles_naming(module, SINK_NAME).items():
        _AUDIT = []
        try:
            with pytest.raises(KitError, match=f"^refused to load global '{module}.{SINK_NAME}'"):
                snapshot_unpickler(io.BytesIO(pickled), sink=sink).load()
        finally:
            events, _AUDIT = _AUDIT, None
        assert made == [] and [e for e, _ in events if e == "pickle.find_class"] == [], way
    # the load's own token is admitted, and its factory called
    admitted = snapshot_unpickler(io.BytesIO(_pickles_naming(SINK_TOKEN, SINK_NAME)["STACK_GLOBAL called"]), sink=sink)
    assert admitted.load() == {"segments": [], "kit": []} and made == ["sink"]


def test_a_persistent_id_is_refused(tmp_path):
    """`torch.save` stores tensors' storages by persistent id; a snapshot has none, and none is resolved."""
    for pid in (pickle.BINPERSID, b"Pstorage\n"):
        head = pickle.PROTO + b"\x02" + pickle.EMPTY_DICT + pickle.MARK + pickle.SHORT_BINUNICODE + b"\x08segments"
        value = pickle.SHORT_BINUNICODE + b"\x07storage" + pickle.BINPERSID if pid == pickle.BINPERSID else pid
        data = head + value + pickle.SETITEMS + pickle.STOP
        path = tmp_path / "persistent.pickle"
        path.write_bytes(data)
        for load in (lambda d=data: safe_unpickle(d, "persistent.pickle"), lambda p=path: load_snapshot(p)):
            with pytest.raises(KitError) as refused:
                load()
            assert str(refused.value).endswith(
                "persistent.pickle: refused a persistent id: a snapshot holds plain data only"
            )

"""Fuzz targets and input mutators for the kit's loaders and workload parser.

Shared by the short property-based run in the suite (tests/test_fuzz.py) and
the long run (scripts/fuzz.py). A target takes the bytes of a file a user
might hand the kit and runs what the command line runs on it: loading (pickle
or JSON), normalising, the segment table, and, when there is a trace, its
walk, the reuse table, the stranding report, the capture table and a
what-if. It returns "ok" or "kit error"; anything else it raises is a crash.
While the bytes are decoded an audit hook watches for anything that would run
code (a process, `exec`, an import, a pickle global), which is a crash too.

The mutators make inputs from real ones: byte-level edits, and edits of the
decoded structure (wrong types in every field, huge and negative numbers,
blocks that overlap or overrun their segment, segments that overlap, traces
that contradict the final snapshot, shared references that expand a small
pickle into millions of records, pickles that name a global).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import pickle
import random
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kit.errors import KitError

from .helpers import FIXTURES, MIB

REGRESSIONS = Path(__file__).parent / "fixtures" / "fuzz"  # inputs that once crashed the kit, kept as regression tests


class CodeExecution(Exception):
    """Raised by the audit hook: decoding an input tried to run code."""


_watch = threading.local()
_FORBIDDEN_PREFIXES = (
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.startfile",
    "subprocess.",
    "exec",
    "compile",
    "import",
    "pickle.find_class",
    "ctypes.",
    "socket.",
    "shutil.",
    "os.remove",
    "os.rename",
)


def _audit(event: str, args: tuple) -> None:
    if getattr(_watch, "on", False) and event.startswith(_FORBIDDEN_PREFIXES):
        _watch.on = False
        raise CodeExecution(f"decoding raised audit event {event}")


_hook_installed = False


@contextlib.contextmanager
def no_code_execution() -> Iterator[None]:
    """Fail with `CodeExecution` if the block starts a process, execs, imports or resolves a pickle global."""
    global _hook_installed
    if not _hook_installed:
        # json.loads reads UTF-16 and UTF-32 bytes too, loading their codecs on first use: load them now.
        for codec in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"):
            "".encode(codec)
        sys.addaudithook(_audit)  # audit hooks cannot be removed; it only acts while watching
        _hook_installed = True
    _watch.on = True
    try:
        yield
    finally:
        _watch.on = False


def warm_up() -> None:
    """Import everything the targets use, so that no import happens while they watch for one."""
    snapshot_target(pickle.dumps({"segments": []}))
    for seed in seed_snapshots().values():
        snapshot_target(seed)
    workload_target(json.dumps({"version": 1, "ops": [{"op": "alloc", "id": "a", "bytes": 1}]}).encode())


def _check_message(e: KitError) -> None:
    message = str(e)
    if not message or "\n" in message or len(message) > 2000:
        raise AssertionError(f"a KitError that is not one short line: {message[:200]!r}")


def snapshot_target(data: bytes, *, report: bool = False) -> str:
    """Load `data` as a snapshot file and run every analysis the command line offers on it."""
    from kit.analysis.attribution import capture_table
    from kit.analysis.tables import diff_tables, segment_table, stream_labels
    from kit.analysis.trace.reports import reuse_table, stranding_report
    from kit.analysis.trace.walk import walk_trace
    from kit.analysis.whatif import what_if
    from kit.cli import _print_table
    from kit.load.snapshot import snapshot_from_bytes

    try:
        with no_code_execution():
            snap = snapshot_from_bytes(data, "fuzz input")
        table = segment_table(snap)
        diff_tables(table, table, by="label")
        with contextlib.redirect_stdout(io.StringIO()):  # what `table` and `table --json` print
            _print_table(table, False)
            _print_table(table, True)
        if snap.has_trace:
            walk = walk_trace(snap)
            reuse_table(snap, walk)
            stranding_report(snap, walk)
            if snap.kit.get("captures"):
                capture_table(snap)
                names = sorted(set(stream_labels(snap).values()) & set(snap.stream_names.values()))
                if len(names) >= 2:
                    what_if(snap, {names[0]: names[1]})
        if report:
            from kit.show.report import render_report

            render_report(snap)
    except KitError as e:
        _check_message(e)
        return "kit error"
    return "ok"


def workload_target(data: bytes) -> str:
    """Read `data` as a workload file, validate it, and run it on the simulator."""
    from kit.allocator.simulator import simulate
    from kit.allocator.workload import workload_from_bytes
    from kit.analysis.tables import segment_table
    from kit.load.snapshot import Snapshot

    try:
        ops = workload_from_bytes(data, "fuzz workload")
        if len(ops) <= 5000:
            segment_table(Snapshot(simulate(ops).snapshot(), origin="fuzz simulation"))
    except KitError as e:
        _check_message(e)
        return "kit error"
    return "ok"


TARGETS: dict[str, Callable[[bytes], str]] = {"snapshot": snapshot_target, "workload": workload_target}


def crash_signature(exc: BaseException) -> str:
    """The exception type and the innermost frame in the kit (else the innermost frame) that raised it."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if f"{os.sep}kit{os.sep}" in f.filename] or frames
    where = f"{Path(mine[-1].filename).name}:{mine[-1].lineno}" if mine else "?"
    return f"{type(exc).__name__} at {where}"


# --- seeds ------------------------------------------------------------------------


def _trim(raw: dict) -> dict:
    """A recorded snapshot with its stack frames dropped: small enough to mutate quickly."""
    for seg in raw.get("segments", []):
        seg["frames"] = []
        for b in seg.get("blocks", []):
            b["frames"] = []
    for trace in raw.get("device_traces") or []:
        for e in trace:
            e["frames"] = []
    return raw


def seed_snapshots() -> dict[str, bytes]:
    """Real snapshots (recorded on the H200, simulated, foreign torch versions), as pickle and JSON bytes."""
    from kit.load.unpickle import safe_unpickle

    from .foreign_snapshots import FOREIGN

    seeds: dict[str, bytes] = {}
    paths = [FIXTURES / "two_streams.pickle", FIXTURES / "replica" / "small_unpatched.pickle"]
    paths += sorted((FIXTURES / "corpus").glob("pr_*.pickle")) + sorted((FIXTURES / "corpus").glob("random_00*.pickle"))
    for path in paths:
        raw = _trim(safe_unpickle(path.read_bytes(), str(path)))
        seeds[f"{path.stem}.pickle"] = pickle.dumps(raw)
        as_json = json.dumps(raw).encode()
        if len(as_json) < 40_000:
            seeds[f"{path.stem}.json"] = as_json
    for version, raw in FOREIGN.items():
        seeds[f"torch-{version}.pickle"] = pickle.dumps(raw)
    return seeds


def seed_workloads() -> dict[str, bytes]:
    paths = sorted((FIXTURES / "corpus").glob("pr_*.json")) + sorted((FIXTURES / "corpus").glob("random_00*.json"))
    return {p.name: p.read_bytes() for p in paths}


def regression_inputs() -> list[tuple[str, str, bytes]]:
    """(target, name, bytes) of every stored reproducer of a crash found and fixed (`<target>-<name>.bin.gz`)."""
    return [
        (p.name.split("-", 1)[0], p.name, gzip.decompress(p.read_bytes())) for p in sorted(REGRESSIONS.glob("*.bin.gz"))
    ]


# --- mutation ---------------------------------------------------------------------

INTERESTING: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    511,
    512,
    MIB,
    2 * MIB + 1,
    1 << 31,
    1 << 53,
    (1 << 63) - 1,
    1 << 63,
    1 << 64,
    -(1 << 63),
    1 << 200,
    10**5000,
    -(10**5000),
    0.5,
    float("nan"),
    float("inf"),
    "",
    "x",
    "x" * 5000,
    "inactive",
    "active_allocated",
    "active_pending_free",
    "alloc",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "annotate",
    "small",
    "large",
    b"bytes",
    [],
    {},
    [[]],
    [1],
    [0, 0],
    [0, 1, 2],
    (0, 1),
    {"a": 1},
    [{"action": "alloc"}],
]


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """Something from the interesting values, or a random nested structure."""
    r = rng.random()
    if r < 0.6 or depth > 3:
        return rng.choice(INTERESTING)
    if r < 0.75:
        return rng.randint(-(1 << 70), 1 << 70)
    if r < 0.87:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    keys = ["address", "size", "state", "action", "addr", "stream", "blocks", "segments", rng.choice(["k", "", "0"])]
    return {rng.choice(keys): random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _nodes(obj: Any, rng: random.Random, limit: int = 2000) -> list[tuple]:
    """Paths to up to `limit` containers and leaves of `obj`, picked at random once there are many."""
    out: list[tuple] = []
    queue = [(obj, ())]
    while queue and len(out) < limit:
        node, p = queue.pop(rng.randrange(len(queue)) if len(queue) > 64 else 0)
        out.append(p)
        if isinstance(node, dict):
            queue.extend((v, (*p, k)) for k, v in node.items())
        elif isinstance(node, list):
            queue.extend((v, (*p, i)) for i, v in enumerate(node))
    return out


def _get(obj: Any, path: tuple) -> Any:
    for k in path:
        obj = obj[k]
    return obj


def _copy(obj: Any) -> Any:
    """A structural copy of plain data (lists and dicts copied; leaves shared)."""
    if isinstance(obj, dict):
        return {k: _copy(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_copy(v) for v in obj]
    return obj


def _snapshot_edit(raw: dict, rng: random.Random) -> None:
    """One edit that keeps the snapshot's shape but breaks what it means."""
    segs = raw.get("segments")
    segs = [s for s in segs if isinstance(s, dict)] if isinstance(segs, list) else []
    traces = raw.get("device_traces")
    traces = [t for t in traces if isinstance(t, list)] if isinstance(traces, list) else []
    choice = rng.randrange(10)
    if choice == 0 and segs:  # a block that overruns its segment
        seg = rng.choice(segs)
        if isinstance(seg.get("blocks"), list) and seg["blocks"]:
            b = rng.choice(seg["blocks"])
            if isinstance(b, dict) and isinstance(b.get("size"), int):
                b["size"] += rng.choice([1, 512, MIB, -512, 1 << 40])
    elif choice == 1 and len(segs) >= 2:  # two segments that overlap
        a, b = rng.sample(segs, 2)
        if isinstance(a.get("address"), int):
            b["address"] = a["address"] + rng.choice([0, 512, MIB])
    elif choice == 2 and segs:  # blocks out of order, or overlapping each other
        seg = rng.choice(segs)
        blocks = seg.get("blocks")
        if isinstance(blocks, list) and len(blocks) >= 2:
            rng.shuffle(blocks)
    elif choice == 3 and traces:  # a free of something never allocated
        t = rng.choice(traces)
        t.insert(rng.randint(0, len(t)), {"action": "free_completed", "addr": rng.randrange(1 << 40), "size": 512})
    elif choice == 4 and traces and segs:  # an alloc where a live block already is
        seg = rng.choice(segs)
        t = rng.choice(traces)
        if isinstance(seg.get("address"), int):
            entry = {"action": "alloc", "addr": seg["address"], "size": rng.choice([512, MIB, 1 << 30]), "stream": 0}
            t.insert(rng.randint(0, len(t)), entry)
    elif choice == 5 and traces:  # the trace starts mid-process, or stops early
        t = rng.choice(traces)
        k = rng.randint(0, len(t))
        if rng.random() < 0.5:
            del t[:k]
        else:
            del t[k:]
    elif choice == 6 and traces and segs:  # a live segment freed or mapped within the trace
        seg = rng.choice(segs)
        t = rng.choice(traces)
        action = rng.choice(["segment_free", "segment_alloc", "segment_map", "segment_unmap"])
        entry = {"action": action, "addr": seg.get("address"), "size": seg.get("total_size"), "stream": 0}
        t.insert(rng.randint(0, len(t)), entry)
    elif choice == 7 and traces:  # the same entry twice
        t = rng.choice(traces)
        if t:
            i = rng.randrange(len(t))
            t.insert(i, _copy(t[i]))
    elif choice == 8 and isinstance(raw.get("kit"), dict):  # capture windows that do not fit the trace
        captures = raw["kit"].get("captures")
        for c in captures if isinstance(captures, list) else []:
            if isinstance(c, dict):
                c[rng.choice(["trace_begin", "trace_end", "pool", "stream", "graph"])] = random_value(rng)
    elif segs:  # an expandable segment, mapped in pieces
        seg = rng.choice(segs)
        seg["is_expandable"] = True
        if traces and isinstance(seg.get("address"), int) and isinstance(seg.get("total_size"), int):
            half = seg["total_size"] // 2
            traces[0][:0] = [
                {"action": "segment_map", "addr": seg["address"], "size": half, "stream": seg.get("stream", 0)},
                {"action": "segment_map", "addr": seg["address"] + half, "size": seg["total_size"] - half},
            ]


def mutate_structure(obj: Any, rng: random.Random, edits: int | None = None) -> Any:
    """A copy of `obj` with a few random edits: values replaced by wrong types, keys dropped or added, lists cut."""
    obj = _copy(obj)
    for _ in range(edits or rng.randint(1, 3)):
        if isinstance(obj, dict) and "segments" in obj and rng.random() < 0.35:
            _snapshot_edit(obj, rng)
            continue
        paths = _nodes(obj, rng)
        path = rng.choice(paths)
        if not path:
            if rng.random() < 0.1:
                obj = random_value(rng)
            continue
        parent, key = _get(obj, path[:-1]), path[-1]
        r = rng.random()
        if r < 0.55:
            parent[key] = random_value(rng)
        elif r < 0.7 and isinstance(parent, dict):
            del parent[key]
        elif r < 0.8 and isinstance(parent, dict):
            parent[rng.choice(["frames", "stream", "device", "size", "extra", "kit", "pool_id"])] = random_value(rng)
        elif r < 0.9 and isinstance(parent, list):
            parent.insert(key, _copy(parent[key]))
        elif isinstance(parent, list):
            del parent[key:]
        else:
            parent[key] = random_value(rng)
    return obj


def encode(obj: Any, rng: random.Random) -> bytes:
    """Pickle (any protocol) or JSON; JSON only when it can hold the value."""
    if rng.random() < 0.3:
        try:
            return json.dumps(obj, default=lambda o: repr(o)).encode()
        except (ValueError, TypeError, RecursionError):
            pass
    try:
        return pickle.dumps(obj, protocol=rng.randint(0, pickle.HIGHEST_PROTOCOL))
    except ValueError:  # protocols 0 and 1 write huge integers as decimal text, which Python limits
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def mutate_bytes(data: bytes, rng: random.Random, other: bytes = b"") -> bytes:
    """Byte-level edits: flips, inserts, deletions, truncation, splices with another input."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if not buf or r < 0.1:
            buf += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif r < 0.4:
            i = rng.randrange(len(buf))
            buf[i] = rng.randrange(256)
        elif r < 0.55:
            i = rng.randrange(len(buf))
            buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif r < 0.7:
            i = rng.randrange(len(buf))
            del buf[i : i + rng.randint(1, 64)]
        elif r < 0.8:
            del buf[rng.randrange(len(buf)) :]
        elif r < 0.9 and other:
            i, j = rng.randrange(len(buf)), rng.randrange(len(other))
            buf[i:] = other[j : j + rng.randint(1, 4096)]
        else:
            i = rng.randrange(len(buf))
            chunk = buf[i : i + rng.randint(1, 32)]
            buf[i:i] = chunk * rng.randint(2, 50)
    return bytes(buf)


class _Hostile:
    """Pickles into a call of a dangerous function: what a hostile snapshot carries."""

    def __init__(self, fn: Any, args: tuple) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def hostile_pickle(rng: random.Random, marker: str) -> bytes:
    """A snapshot-shaped pickle that would run code (create `marker`) if loaded by plain pickle."""
    import builtins
    import subprocess

    payload = rng.choice(
        [
            _Hostile(os.system, (f"touch {marker}",)),
            _Hostile(builtins.exec, (f"open({marker!r}, 'w')",)),
            _Hostile(builtins.eval, (f"open({marker!r}, 'w')",)),
            _Hostile(subprocess.call, (["touch", marker],)),
            _Hostile(open, (marker, "w")),
        ]
    )
    raw = {"segments": [], "device_traces": [[{"action": "alloc", "addr": 0, "size": 1}]]}
    where = rng.choice(["segments", "trace", "kit", "top"])
    if where == "segments":
        raw["segments"].append(payload)
    elif where == "trace":
        raw["device_traces"][0].append(payload)
    elif where == "kit":
        raw["kit"] = {"streams": payload}
    else:
        raw = payload  # type: ignore[assignment]
    return pickle.dumps(raw, protocol=rng.randint(0, pickle.HIGHEST_PROTOCOL))


def shared_reference_bomb(rng: random.Random) -> bytes:
    """A small pickle whose shared references expand into a huge number of records."""
    block = {"address": 0, "size": 512, "state": "inactive"}
    n = rng.choice([1000, 3000, 10000])
    seg = {"address": 0, "total_size": 512, "blocks": [block] * n}
    entry = {"action": "alloc", "addr": 0, "size": 512}
    trace = [entry] * n
    raw = {"segments": [seg] * n, "device_traces": [trace] * rng.choice([1, n])}
    return pickle.dumps(raw)


def next_input(target: str, seeds: list[bytes], rng: random.Random, marker: str) -> bytes:
    """One input for `target`, made from the seeds."""
    from kit.load.unpickle import check_expansion as _check_expansion
    from kit.load.unpickle import safe_unpickle

    r = rng.random()
    if target == "snapshot" and r < 0.02:
        return hostile_pickle(rng, marker)
    if target == "snapshot" and r < 0.03:
        return shared_reference_bomb(rng)
    seed = rng.choice(seeds)
    if r < 0.35:
        return mutate_bytes(seed, rng, rng.choice(seeds))
    try:
        obj = json.loads(seed) if seed.lstrip()[:1] in (b"{", b"[") else safe_unpickle(seed)
        _check_expansion(obj, len(seed), "seed")  # a seed that is a shared-reference bomb stays bytes
        return encode(mutate_structure(obj, rng), rng)
    except (KitError, ValueError, RecursionError, MemoryError):
        return mutate_bytes(seed, rng)

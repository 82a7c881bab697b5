"""Workloads: a sequence of allocator operations, run on the simulator or on a real GPU.

Format version 1 (JSON; `docs/workloads.md`):

    {"version": 1, "ops": [
      {"op": "alloc", "id": "t0", "bytes": 4096, "stream": "s1"},
      {"op": "free", "id": "t0"},
      {"op": "capture_begin", "graph": "g0", "pool": "p0", "stream": "s1"},
      {"op": "capture_end", "graph": "g0"},
      {"op": "empty_cache"}]}

Streams are names; `default` is the device's default stream, any other name a
new stream made on first use. Pools name `graph_pool_handle()` results; a
null pool gives the capture a private pool. During a capture, allocations and
frees happen on the capture's stream. Graphs stay alive to the end.

`parse_workload` checks all of that before anything runs and raises a
one-line `KitError` naming the op at fault. `generate_workload` makes seeded
random workloads for the fidelity corpus.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any, NamedTuple

from kit.errors import KitError, describe
from kit.units import MIB

DEFAULT = "default"
MAX_BYTES = 1 << 40  # one request above 1 TiB is a typo, not a workload
KEYS = {  # op -> (required fields, all allowed fields)
    "alloc": ({"op", "id", "bytes"}, {"op", "id", "bytes", "stream"}),
    "free": ({"op", "id"}, {"op", "id"}),
    "capture_begin": ({"op", "graph", "stream"}, {"op", "graph", "stream", "pool"}),
    "capture_end": ({"op", "graph"}, {"op", "graph"}),
    "empty_cache": ({"op"}, {"op"}),
}


class Op(NamedTuple):
    """One validated operation. `stream` is the stream it runs on, resolved.

    A NamedTuple rather than a dataclass: a million-op workload is built in a
    fraction of the time.
    """

    op: str
    id: str | None = None
    bytes: int = 0
    stream: str = DEFAULT
    graph: str | None = None
    pool: str | None = None


class _Where(NamedTuple):
    """An op's place in its file, for error messages: "FILE: op INDEX (KIND)"."""

    file: str
    index: int
    kind: str

    def __str__(self) -> str:
        return f"{self.file}: op {self.index} ({self.kind})"

    def __format__(self, spec: str) -> str:
        return str(self)


def _name(op: dict, key: str, where: object, *, optional: bool = False) -> str | None:
    """The op's non-empty string `key`; None for a missing or null optional one."""
    value = op.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise KitError(f"{where}: '{key}' must be a non-empty string, not {describe(value)}")
    return value


def parse_workload(data: Any, where: str = "workload") -> list[Op]:
    """Validate a workload (a parsed JSON object) into a list of `Op`."""
    checker = _Checker()
    check = {kind: getattr(checker, kind) for kind in KEYS}  # op -> its checker's method
    ops: list[Op] = []
    for i, op in enumerate(_raw_ops(data, where)):
        at = _checked_fields(op, i, where)
        ops.append(check[op["op"]](op, at))
    if checker.capture:
        raise KitError(f"{where}: capture of '{checker.capture.graph}' has no capture_end")
    return ops


def _raw_ops(data: Any, where: str) -> list:
    """The ops of a version-1 workload object, not yet checked."""
    if not isinstance(data, dict):
        raise KitError(f"{where}: expected a JSON object with 'version' and 'ops'")
    if data.get("version") != 1:
        raise KitError(f"{where}: unsupported version {describe(data.get('version'))} (this kit reads version 1)")
    raw_ops = data.get("ops")
    if not isinstance(raw_ops, list):
        raise KitError(f"{where}: 'ops' must be a list")
    return raw_ops


def _checked_fields(op: Any, i: int, where: str) -> _Where:
    """Where op `i` is, once it is an object of a known kind with the fields that kind takes."""
    if not isinstance(op, dict):
        raise KitError(f"{where}: op {i}: expected an object, not {describe(op)}")
    kind = op.get("op")
    if not isinstance(kind, str) or kind not in KEYS:
        raise KitError(f"{where}: op {i}: unknown op {describe(kind)} (expected one of {', '.join(KEYS)})")
    at = _Where(where, i, kind)  # formatted only for an error
    required, allowed = KEYS[kind]
    if not required.issubset(op):
        raise KitError(f"{at}: missing {', '.join(sorted(required - op.keys()))}")
    if not op.keys() <= allowed:
        unknown = ", ".join(sorted(k if isinstance(k, str) else describe(k) for k in op.keys() - allowed))
        raise KitError(f"{at}: unknown field {unknown}")
    return at


class _Checker:
    """What decides whether an op may come next: the live and freed ids, the graphs, the capture underway.

    One method per op kind: it checks the op against the workload so far,
    records it, and returns it as an `Op`.
    """

    __slots__ = ("live", "freed", "graphs", "capture")

    def __init__(self) -> None:
        self.live: dict[str, str] = {}  # id -> stream it was allocated on
        self.freed: set[str] = set()
        self.graphs: set[str] = set()
        self.capture: Op | None = None

    def alloc(self, op: dict, at: _Where) -> Op:
        """A new id, on its stream (the capture's during a capture)."""
        capture = self.capture
        tid = _name(op, "id", at)
        size = op["bytes"]
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_BYTES:
            raise KitError(f"{at}: 'bytes' must be an integer from 1 to {MAX_BYTES}, not {describe(size)}")
        stream = _name(op, "stream", at, optional=True) or (capture.stream if capture else DEFAULT)
        if capture and stream != capture.stream:
            raise KitError(
                f"{at}: allocates on stream '{stream}' during capture of '{capture.graph}' on stream '{capture.stream}'"
            )
        if tid in self.live:
            raise KitError(f"{at}: id '{tid}' is already allocated")
        self.live[tid] = stream
        self.freed.discard(tid)
        return Op("alloc", id=tid, bytes=size, stream=stream)

    def free(self, op: dict, at: _Where) -> Op:
        """A live id, freed on the stream it was allocated on."""
        capture, live = self.capture, self.live
        tid = _name(op, "id", at)
        if tid in self.freed:
            raise KitError(f"{at}: double free of id '{tid}'")
        if tid not in live:
            raise KitError(f"{at}: unknown id '{tid}'")
        if capture and live[tid] != capture.stream:
            raise KitError(
                f"{at}: frees '{tid}' of stream '{live[tid]}' during capture of "
                f"'{capture.graph}' on stream '{capture.stream}'"
            )
        self.freed.add(tid)
        return Op("free", id=tid, stream=live.pop(tid))

    def capture_begin(self, op: dict, at: _Where) -> Op:
        """A new graph, captured on a stream of its own, while no other capture is underway."""
        graph = _name(op, "graph", at)
        stream = _name(op, "stream", at)
        pool = _name(op, "pool", at, optional=True)
        if self.capture:
            raise KitError(f"{at}: capture of '{self.capture.graph}' is still underway")
        if graph in self.graphs:
            raise KitError(f"{at}: graph '{graph}' was already captured")
        if stream == DEFAULT:
            raise KitError(f"{at}: cannot capture on the default stream")
        self.graphs.add(graph)
        self.capture = Op("capture_begin", graph=graph, pool=pool, stream=stream)
        return self.capture

    def capture_end(self, op: dict, at: _Where) -> Op:
        """The end of the capture underway."""
        graph = _name(op, "graph", at)
        if self.capture is None or self.capture.graph != graph:
            raise KitError(f"{at}: no capture of '{graph}' is underway")
        stream, self.capture = self.capture.stream, None
        return Op("capture_end", graph=graph, stream=stream)

    def empty_cache(self, op: dict, at: _Where) -> Op:
        """`torch.cuda.empty_cache()`, outside a capture."""
        if self.capture:
            raise KitError(f"{at}: empty_cache during capture of '{self.capture.graph}'")
        return Op("empty_cache")


def load_workload(path: str | os.PathLike) -> list[Op]:
    """Read and validate a workload file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise KitError(f"{path}: no such file") from None
    except OSError as e:
        raise KitError(f"{path}: cannot read ({e.strerror or e})") from None
    return workload_from_bytes(data, str(path))


def workload_from_bytes(data: bytes, where: str = "workload") -> list[Op]:
    """Decode and validate the bytes of a workload file."""
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError) as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise KitError(f"{where}: not readable JSON ({detail})") from None
    return parse_workload(parsed, where)


# Sizes on and around every boundary of the allocator (`kit.allocator.rules`).
BOUNDARY_SIZES = [
    1,
    511,
    512,
    513,
    4096,
    MIB - 1,
    MIB,
    MIB + 1,
    2 * MIB,
    10 * MIB - 512,
    10 * MIB,
    10 * MIB + 1,
    20 * MIB,
    20 * MIB + 1,
]


def _random_size(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.25:
        return rng.choice(BOUNDARY_SIZES)
    if r < 0.6:
        return rng.randint(1, MIB)
    if r < 0.9:
        return rng.randint(MIB, 12 * MIB)
    return rng.randint(12 * MIB, 64 * MIB)


def generate_workload(
    seed: int,
    n_ops: int = 200,
    *,
    n_streams: int = 3,
    n_pools: int = 2,
    max_live_bytes: int = 4 << 30,
    capture_rate: float = 0.06,
) -> dict:
    """A seeded random version-1 workload.

    It mixes allocations across streams, frees in and out of captures, captures
    into shared and private pools, and `empty_cache`, with sizes around every
    allocator boundary; live bytes stay under `max_live_bytes`. A share
    `capture_rate` of the ops outside a capture begins one; graph pools are
    never released, so long workloads meant for a real GPU want a low rate.
    """
    rng = random.Random(seed)
    streams = [DEFAULT] + [f"s{i}" for i in range(1, n_streams)]
    pools = [f"p{i}" for i in range(n_pools)]
    ops: list[dict] = []
    live: dict[str, tuple[str, int]] = {}
    live_bytes = 0
    capture: dict | None = None
    next_id = graph_id = 0
    while len(ops) < n_ops:
        r = rng.random()
        if capture and (r < 0.08 or len(ops) >= n_ops - 1):
            ops.append({"op": "capture_end", "graph": capture["graph"]})
            capture = None
        elif not capture and r < capture_rate and len(ops) < n_ops - 4:
            stream = rng.choice(streams[1:] or ["s1"])
            pool = rng.choice([*pools, None])
            capture = {"op": "capture_begin", "graph": f"g{graph_id}", "pool": pool, "stream": stream}
            graph_id += 1
            ops.append(capture)
        elif not capture and r < capture_rate + 0.03:
            ops.append({"op": "empty_cache"})
        elif r < 0.55 or not live:
            size = _random_size(rng)
            if live_bytes + size > max_live_bytes:
                continue
            stream = capture["stream"] if capture else rng.choice(streams)
            tid = f"t{next_id}"
            next_id += 1
            live[tid] = (stream, size)
            live_bytes += size
            ops.append({"op": "alloc", "id": tid, "bytes": size, "stream": stream})
        else:
            choices = [t for t, (s, _) in live.items() if not capture or s == capture["stream"]]
            if not choices:
                continue
            tid = rng.choice(choices)
            live_bytes -= live.pop(tid)[1]
            ops.append({"op": "free", "id": tid})
    if capture:
        ops.append({"op": "capture_end", "graph": capture["graph"]})
    return {"version": 1, "ops": ops}


def pr_scenario(
    shared_stream: bool, *, layers: int = 4, tokens: int = 1024, replay_tokens: int = 512, hidden: int = 2048
) -> dict:
    """The PR's story as a workload: model capture, then replay capture into the same pool.

    Each layer allocates a 4x-wide intermediate and a new hidden state and frees
    the intermediate and the old hidden state, like a decoder forward.
    """
    ops: list[dict] = []
    n = 0

    def forward(prefix: str, rows: int, n_layers: int, stream: str) -> None:
        nonlocal n
        h = f"{prefix}x"
        ops.append({"op": "alloc", "id": h, "bytes": rows * hidden * 2, "stream": stream})
        for layer in range(n_layers):
            a, h2 = f"{prefix}a{layer}", f"{prefix}h{layer}"
            ops.append({"op": "alloc", "id": a, "bytes": rows * 4 * hidden * 2, "stream": stream})
            ops.append({"op": "alloc", "id": h2, "bytes": rows * hidden * 2, "stream": stream})
            ops.append({"op": "free", "id": a})
            ops.append({"op": "free", "id": h})
            h = h2

    replay_stream = "model_stream" if shared_stream else "replay_stream"
    ops.append({"op": "capture_begin", "graph": "model graph", "pool": "global pool", "stream": "model_stream"})
    forward("m", tokens, layers, "model_stream")
    ops.append({"op": "capture_end", "graph": "model graph"})
    ops.append({"op": "capture_begin", "graph": "replay graph", "pool": "global pool", "stream": replay_stream})
    forward("r", replay_tokens, max(1, layers // 2), replay_stream)
    ops.append({"op": "capture_end", "graph": "replay graph"})
    return {"version": 1, "ops": ops}

"""`walk_trace`: how each allocation of a snapshot's trace was served, by the fastest walk that can tell.

The walk on the snapshot's columns (`kit.analysis.trace.columnar`) handles
every trace but one of expandable segments, which the walk entry by entry
(`kit.analysis.trace.rows`) handles; both return the same `TraceWalk`.

A snapshot cached beside its file (`kit.load.cache`) keeps its columnar walk
there too (`<snapshot>.kitwalk`: integer arrays and JSON, checked as the
columns' cache is), so `reuse`, `check`, `report` and `what-if` on one large
file walk its trace once, not once per command.
"""

from __future__ import annotations

from weakref import WeakKeyDictionary

import numpy as np
import pandas as pd

from kit.analysis.trace.columnar import alloc_frame, walk_columns
from kit.analysis.trace.rows import walk_rows
from kit.analysis.trace.state import TraceWalk
from kit.load import cache as caches
from kit.load.snapshot import Snapshot, load_snapshot

# A snapshot is read-only once loaded, so its walk is kept while the snapshot lives:
# the tables, verdicts, attribution and what-if of one snapshot walk it once.
_WALKS: WeakKeyDictionary[Snapshot, dict[int, TraceWalk]] = WeakKeyDictionary()


def walk_trace(snapshot: Snapshot | str | dict, device: int = 0) -> TraceWalk:
    """Walk the snapshot's trace from its rewound start; classify every alloc.

    `allocs` has one row per alloc; its `frames` is the trace entry's own
    list of stack frames, shared with the snapshot. The walk runs on the
    snapshot's columns, except over expandable segments.
    """
    snap = load_snapshot(snapshot)
    walks = _WALKS.setdefault(snap, {})
    if device not in walks:
        walk = _kept(snap, device)
        if walk is None:
            walk = walk_columns(snap, device)
            if walk is None:
                walk = walk_rows(snap, device)
            else:
                _keep(snap, walk)
        walks[device] = walk
    return walks[device]


KIND = "walk"
_ALLOCS = ("index", "pool_a", "pool_b", "fresh")
_STRANDED = ("row", "block", "size", "stream")
_MADE = ("index", "addr", "size", "pool_a", "pool_b", "stream")


def _keep(snap: Snapshot, walk: TraceWalk) -> None:
    """Keep a columnar walk beside the snapshot's cache (nothing where the snapshot is not cached)."""
    if snap.cache_source is None:
        return
    allocs, made = walk.allocs, walk.new_segments
    pools = _pool_pairs(allocs["pool"])
    stranded = np.flatnonzero((allocs["served"] == "stranded").to_numpy())
    made_pools = _pool_pairs(made["pool"])
    ints = {
        "allocs.index": allocs["index"],
        "allocs.pool_a": pools[:, 0],
        "allocs.pool_b": pools[:, 1],
        "allocs.fresh": allocs["segment_bytes"],
        "stranded.row": stranded,
        "stranded.block": allocs["other_block"].to_numpy()[stranded],
        "stranded.size": allocs["other_block_size"].to_numpy()[stranded],
        "stranded.stream": allocs["other_stream"].to_numpy()[stranded],
        **{f"made.{c}": made[c] for c in ("index", "addr", "size", "stream")},
        "made.pool_a": made_pools[:, 0],
        "made.pool_b": made_pools[:, 1],
    }
    arrays = {name: np.asarray(values).astype(np.int64) for name, values in ints.items()}
    described = {"device": walk.device, "rewound": walk.rewound_segments, "mismatches": list(walk.mismatches)}
    path, stamp = snap.cache_source
    caches.save_extra(path, stamp, f"{KIND}{walk.device}", arrays, described)


def _pool_pairs(pools: pd.Series) -> np.ndarray:
    """Each row's pool `(a, b)` as two int64 columns; read once per distinct pool (a million rows hold a few)."""
    codes, distinct = pd.factorize(pools)
    pairs = np.array(list(distinct), dtype=np.int64).reshape(-1, 2)
    return pairs[codes]


def _kept(snap: Snapshot, device: int) -> TraceWalk | None:
    """The walk `_keep` kept for this very file and device, rebuilt; None if there is none usable."""
    if snap.cache_source is None or device not in snap.trace_columns:
        return None
    path, stamp = snap.cache_source
    found = caches.open_extra(path, stamp, f"{KIND}{device}")
    if found is None:
        return None
    header, arrays = found
    tc = snap.trace_columns[device]
    try:
        get = {name: np.array(arrays[name]) for name in arrays}  # copies: off the memory map
        rows, fresh = get["allocs.index"], get["allocs.fresh"]
        n = len(rows)
        if not (
            len(fresh) == len(get["allocs.pool_a"]) == len(get["allocs.pool_b"]) == n
            and (n == 0 or 0 <= rows.min() <= rows.max() < len(tc))
            and all(len(get[f"stranded.{c}"]) == len(get["stranded.row"]) for c in _STRANDED)
            and (len(get["stranded.row"]) == 0 or 0 <= get["stranded.row"].min() <= get["stranded.row"].max() < n)
            and len({len(get[f"made.{c}"]) for c in _MADE}) == 1
            and header["device"] == device
        ):
            raise ValueError("its arrays do not fit the trace")
        row_pools = _pools(get["allocs.pool_a"], get["allocs.pool_b"])
        stranded = tuple(get[f"stranded.{c}"] for c in _STRANDED)
        allocs = alloc_frame(tc, rows, row_pools, fresh, stranded)
        made = list(
            zip(
                *(get[f"made.{c}"].tolist() for c in ("index", "addr", "size")),
                zip(get["made.pool_a"].tolist(), get["made.pool_b"].tolist(), strict=True),
                get["made.stream"].tolist(),
                strict=True,
            )
        )
        new_segments = pd.DataFrame(made, columns=["index", "addr", "size", "pool", "stream"])
        mismatches = [str(m) for m in header["mismatches"]]
        return TraceWalk(allocs, new_segments, mismatches, int(header["rewound"]), device)
    except (KeyError, TypeError, ValueError) as e:
        caches.note(f"the walk kept for {path} is damaged ({e}); walking again")
        return None


def _pools(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each row's pool `(a, b)` as a tuple of ints, one tuple per distinct pool (a million rows have a few pools)."""
    codes_a, values_a = pd.factorize(a)
    codes_b, values_b = pd.factorize(b)
    codes, pairs = pd.factorize(codes_a * len(values_b) + codes_b)
    firsts, seconds = values_a[pairs // len(values_b)].tolist(), values_b[pairs % len(values_b)].tolist()
    tuples = np.empty(len(pairs), dtype=object)
    tuples[:] = list(zip(firsts, seconds, strict=True))
    return tuples[codes]

"""Every split rule and the stranding rule on both sides of its boundary, with the answers worked out by hand.

The boundary workloads (`scripts/record_corpus.py`, `boundary_workloads`) put a
request in a free block of known size so that it leaves 0, 511, 512, 513 bytes,
1 MiB - 1, 1 MiB or 1 MiB + 512 bytes of it before rounding, in the small pool
and the large one, outside captures and in them. PyTorch's rules
(`CUDACachingAllocator.cpp`): a request rounds up to a multiple of 512 bytes; a
small-pool block is split when 512 bytes or more are left, a large-pool block
only when more than 1 MiB is. `SPLITS` below is each case's outcome derived by
hand from those rules alone, not from the kit; the simulator must produce it,
and both trace walks (`kit.analysis.trace.rows` and `kit.analysis.trace.columnar`)
must walk its snapshot to the same final state and classify each request as
derived here. The stranding cases put a request one 512-byte step above a free
block of another stream (not stranded) and one exactly its size (stranded).
`tests/test_boundary_recordings.py` holds the same table against the H200.

Every other limit of the kit is taken the same way, at the limit, one below
and one above (issue 39): the loaders' limits (in the row parser and the bulk
checks alike), the cache's index checks, the capture windows, the byte
formatter's units, the segment-type rules and the patch's hunk refusals. The
segment map's limits are in `tests/test_segment_map.py`, the inferred capture
windows' in `tests/test_attribution.py`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zlib
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

import kit.load.cache as cache
from kit import load_snapshot
from kit.allocator.rules import get_allocation_size, is_small_request, is_small_segment
from kit.allocator.simulator import simulate
from kit.allocator.workload import parse_workload
from kit.analysis.attribution import capture_attribution, checked_capture_windows
from kit.analysis.trace.columnar import walk_columns
from kit.analysis.trace.rows import walk_rows
from kit.errors import KitError
from kit.load.columns import Stacks, _fast_segment_columns
from kit.load.rows import (
    INT64_MAX,
    INT64_MIN,
    MAX_ADDRESS,
    MAX_BYTES,
    MAX_DEVICE,
    MAX_DEVICE_BYTES,
    check_no_overlap,
    parse_segment,
)
from kit.load.snapshot import Snapshot
from kit.patch.source import Hunk, apply_hunk
from kit.units import format_bytes

from .helpers import KIB, MIB, segment

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from record_corpus import boundary_workloads  # noqa: E402

# case -> (bytes requested, the block it gets, bytes split off and left free beside it, the probe that takes them)
SPLITS = {
    # Small pool: a 64 KiB free block (1.5 MiB for the 1 MiB cases); split when 512 B or more are left.
    "small_left_0": (65_536, 65_536, 0, 0),
    "small_left_511": (65_025, 65_536, 0, 0),  # rounds up to the whole block
    "small_left_512": (65_024, 65_024, 512, 512),  # exactly 512 B left: split
    "small_left_513": (65_023, 65_024, 512, 512),  # rounds up to 65,024: 512 B left, split
    "small_left_1048575": (524_289, 524_800, 1_048_064, 1_048_064),
    "small_left_1048576": (524_288, 524_288, 1_048_576, 1_048_576),
    "small_left_1049088": (523_776, 523_776, 1_049_088, 1_048_576),  # the probe asks for 1 MiB of it
    # Large pool, a 4 MiB free block: split only when more than 1 MiB is left.
    "large_left_0": (4_194_304, 4_194_304, 0, 0),
    "large_left_511": (4_193_793, 4_194_304, 0, 0),
    "large_left_512": (4_193_792, 4_194_304, 0, 0),  # 512 B left: kept with the allocation
    "large_left_513": (4_193_791, 4_194_304, 0, 0),
    "large_left_1048575": (3_145_729, 4_194_304, 0, 0),  # rounds to 3,146,240: 1 MiB - 512 left, kept
    "large_left_1048576": (3_145_728, 4_194_304, 0, 0),  # exactly 1 MiB left: kept
    "large_left_1049088": (3_145_216, 3_145_216, 1_049_088, 1_049_088),  # 1 MiB + 512 left: split
    # Large pool, a new segment: 10 MiB or more rounds the segment up to 2 MiB, here 12 MiB.
    "large_fresh_left_0": (12_582_912, 12_582_912, 0, 0),
    "large_fresh_left_511": (12_582_401, 12_582_912, 0, 0),
    "large_fresh_left_512": (12_582_400, 12_582_912, 0, 0),
    "large_fresh_left_513": (12_582_399, 12_582_912, 0, 0),
    "large_fresh_left_1048575": (11_534_337, 12_582_912, 0, 0),
    "large_fresh_left_1048576": (11_534_336, 12_582_912, 0, 0),
    "large_fresh_left_1049088": (11_533_824, 11_533_824, 1_049_088, 1_049_088),
}
# pool -> (the holder's free block, the request one step above it, the request exactly its size)
STRANDED = {"small": (1_048_064, 1_048_065, 1_048_064), "large": (12_582_912, 12_582_913, 12_582_912)}
WORKLOADS = boundary_workloads()
SPLIT_WORKLOADS = ["boundary_small", "boundary_small_capture", "boundary_large", "boundary_large_capture"]
STRANDED_WORKLOADS = ["boundary_stranded", "boundary_stranded_capture"]


def test_the_workloads_hold_every_case_and_only_these():
    assert sorted(WORKLOADS) == sorted(SPLIT_WORKLOADS + STRANDED_WORKLOADS)
    for name in SPLIT_WORKLOADS:
        requests = {
            op["id"].removesuffix(":request"): op["bytes"]
            for op in WORKLOADS[name]["ops"]
            if op["op"] == "alloc" and op["id"].endswith(":request")
        }
        pool = name.split("_")[1]
        assert requests == {case: spec[0] for case, spec in SPLITS.items() if case.startswith(pool)}
        captures = sum(op["op"] == "capture_begin" for op in WORKLOADS[name]["ops"])
        assert captures == (len(requests) if name.endswith("_capture") else 0)


def _simulated(name: str):
    return simulate(parse_workload(WORKLOADS[name], name), explain=True)


@pytest.mark.parametrize("name", SPLIT_WORKLOADS)
def test_the_simulator_splits_as_derived_by_hand(name):
    sim = _simulated(name)
    decisions = {d.id: d for d in sim.decisions}
    for case, (requested, block, left_free, probe) in SPLITS.items():
        if not case.startswith(name.split("_")[1]):
            continue
        request = decisions[f"{case}:request"]
        assert (request.requested, sim.tensors[f"{case}:request"].size) == (requested, block), case
        assert request.split == (left_free > 0), case
        assert request.outcome == ("new_segment" if "fresh" in case else "reused"), case
        if probe:  # the part split off is a free block right after the request, which the probe takes
            taken = decisions[f"{case}:probe"]
            assert (taken.requested, taken.outcome, taken.block) == (probe, "reused", request.block + block), case
        else:
            assert f"{case}:probe" not in decisions, case


def _walks(sim) -> tuple:
    snap = load_snapshot(sim.snapshot())
    rows, columns = walk_rows(snap, 0), walk_columns(snap, 0)
    assert rows.mismatches == [] and columns.mismatches == []
    # One row per allocation, in the order the simulator served them (its decisions, the RNG state's included).
    assert len(rows.allocs) == len(columns.allocs) == len(sim.decisions)
    return rows, columns


@pytest.mark.parametrize("name", SPLIT_WORKLOADS)
def test_both_walks_end_at_the_snapshot_and_serve_each_request_as_derived(name):
    sim = _simulated(name)
    for walk in _walks(sim):
        served = dict(zip((d.id for d in sim.decisions), walk.allocs["served"], strict=True))
        for case, (_, _, _, probe) in SPLITS.items():
            if case.startswith(name.split("_")[1]):
                assert served[f"{case}:request"] == ("new_segment" if "fresh" in case else "reused"), case
                assert not probe or served[f"{case}:probe"] == "reused", case
        assert "stranded" not in set(served.values())  # every case on a stream of its own, nothing to take


@pytest.mark.parametrize("name", STRANDED_WORKLOADS)
def test_a_request_exactly_the_size_of_another_streams_free_block_is_stranded_and_one_step_above_is_not(name):
    sim = _simulated(name)
    for walk in _walks(sim):
        rows = dict(zip((d.id for d in sim.decisions), walk.allocs.to_dict("records"), strict=True))
        for pool, (block, over, exact) in STRANDED.items():
            above, fits = rows[f"{pool}_stranded:over:request"], rows[f"{pool}_stranded:exact:request"]
            assert (above["size"], above["served"]) == (over, "new_segment"), pool
            assert (fits["size"], fits["served"], fits["other_block_size"]) == (exact, "stranded", block), pool
            assert fits["other_stream"] == sim.stream_ids[f"{pool}_stranded:holder"], pool
        assert sum(r["served"] == "stranded" for r in rows.values()) == 2


def test_recording_them_without_cuda_is_one_line_and_writes_nothing(tmp_path):
    script = Path(__file__).resolve().parents[1] / "scripts" / "record_corpus.py"
    out = tmp_path / "corpus"
    done = subprocess.run(
        [sys.executable, str(script), "--boundary-only", "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        timeout=300,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "record_corpus.py: error: recording needs CUDA, which this process has none of; nothing was written"
    ]
    assert not out.exists()


# --- every other limit of the kit at exactly the limit, one below and one above it (issue 39) ------------------
#
# Each case below is a (limit, the value one below, at and one above it) worked out from the limit's definition;
# below and at are accepted, above is refused (or treated as the other side of the rule).


def _segment_at(address: int, size: int = 2 * MIB, **fields) -> dict:
    raw = segment(address, [(size, "inactive")])
    raw.update(fields)
    return raw


def _reserving(total: int) -> list[dict]:
    """Segments that reserve `total` bytes in all, 4 TiB or less each, 8 TiB apart."""
    whole, rest = divmod(total, MAX_DEVICE_BYTES)
    sizes = [MAX_DEVICE_BYTES] * whole + ([rest] if rest else [])
    return [_segment_at((i + 1) << 43, size) for i, size in enumerate(sizes)]


LOADER_LIMITS = {  # name -> (limit, a snapshot with a value, the column it lands in, whether the bulk check takes it)
    "segment size": (MAX_DEVICE_BYTES, lambda v: {"segments": [_segment_at(1 << 44, v)]}, "total_size", True),
    "device": (MAX_DEVICE, lambda v: {"segments": [_segment_at(1 << 44, device=v)]}, "device", True),
    "stream": (INT64_MAX, lambda v: {"segments": [_segment_at(1 << 44, stream=v)]}, "stream", True),
    "segment end": (MAX_ADDRESS + 1, lambda v: {"segments": [_segment_at(v - 2 * MIB)]}, None, False),
    "all segments": (MAX_BYTES, lambda v: {"segments": _reserving(v)}, None, True),
}
TRACE_LIMITS = {  # name -> (the limit, a trace entry with a value)
    "entry size": (MAX_DEVICE_BYTES, lambda v: {"action": "alloc", "addr": 0x1000, "size": v, "stream": 0}),
    "entry address": (MAX_ADDRESS, lambda v: {"action": "alloc", "addr": v, "size": 512, "stream": 0}),
    "entry stream": (INT64_MAX, lambda v: {"action": "alloc", "addr": 0x1000, "size": 512, "stream": v}),
}


@pytest.mark.parametrize("name", LOADER_LIMITS)
def test_each_segment_limit_of_the_loaders_takes_the_limit_and_refuses_one_more(name):
    limit, make, column, bulk = LOADER_LIMITS[name]
    for value in (limit - 1, limit):
        raw = make(value)
        snap = load_snapshot(raw)
        if column is not None:
            assert int(getattr(snap.columns, column).max()) == value, name
        assert sum(snap.columns.total_size.tolist()) == sum(s["total_size"] for s in raw["segments"]), name
        assert (_fast_segment_columns(raw["segments"]) is not None) == bulk, name  # the bulk checks take it too
        _parsed_row_by_row(raw)  # and so does the row parser
    with pytest.raises(KitError):
        load_snapshot(make(limit + 1))
    assert _fast_segment_columns(make(limit + 1)["segments"]) is None, name
    with pytest.raises(KitError):
        _parsed_row_by_row(make(limit + 1))


def _parsed_row_by_row(raw: dict) -> None:
    """The row parser's checks of each segment, then of all of them together (what the bulk checks fall back to)."""
    check_no_overlap(tuple(parse_segment(s, f"segment {i}") for i, s in enumerate(raw["segments"])), "rows")


def test_a_stream_id_takes_int64s_least_value_and_refuses_one_less():
    assert load_snapshot({"segments": [_segment_at(1 << 44, stream=INT64_MIN)]}).columns.stream.min() == INT64_MIN
    with pytest.raises(KitError, match="'stream'"):
        load_snapshot({"segments": [_segment_at(1 << 44, stream=INT64_MIN - 1)]})


@pytest.mark.parametrize("name", TRACE_LIMITS)
def test_each_trace_entry_limit_takes_the_limit_and_refuses_one_more(name):
    limit, make = TRACE_LIMITS[name]
    field = {"entry size": "size", "entry address": "addr", "entry stream": "stream"}[name]
    for value in (limit - 1, limit):
        snap = load_snapshot({"segments": [], "device_traces": [[make(value)]]})
        assert int(getattr(snap.trace_columns[0], field)[0]) == value, name
    with pytest.raises(KitError, match=f"trace 0 entry 0: '?{field}"):
        load_snapshot({"segments": [], "device_traces": [[make(limit + 1)]]})


def test_device_traces_take_one_list_per_possible_device_and_refuse_one_more():
    for devices in (MAX_DEVICE - 1, MAX_DEVICE):
        assert load_snapshot({"segments": [], "device_traces": [[] for _ in range(devices)]}).has_trace is False
    with pytest.raises(KitError, match="'device_traces' is not a list of lists"):
        load_snapshot({"segments": [], "device_traces": [[] for _ in range(MAX_DEVICE + 1)]})


# The cache's index checks (`kit.load.cache`): an array, the header and the data end exactly at their file's end.


@pytest.mark.parametrize(
    ("offset", "length", "usable"),
    [(7, 3, True), (8, 3, True), (9, 3, False), (1, 1, True), (0, 1, True), (-1, 1, False)],
)
def test_a_cached_array_may_end_exactly_at_the_datas_end_and_not_a_byte_past(offset, length, usable):
    data = np.arange(32, dtype=np.uint8)  # 32 bytes: three int64s from 8 end exactly at its end
    header = {"arrays": {"a": {"dtype": "<i8", "shape": [length], "offset": offset}}}
    if usable:
        assert len(cache._arrays(header, data)["a"]) == length
    else:
        with pytest.raises(cache.Rejected, match=r"damaged \(array a\)"):
            cache._arrays(header, data)


def _trace_arrays(stack: list[int], starts: list[int], flat: list[int]) -> dict[str, np.ndarray]:
    fields = {f"trace0.{name}": np.zeros(len(stack), dtype=np.int64) for name in cache.TRACE_FIELDS}
    fields["trace0.stack"] = np.array(stack, dtype=np.int32)
    return fields | {"trace0.stack_starts": np.array(starts, dtype=np.int64), "trace0.stack_frames": np.array(flat)}


@pytest.mark.parametrize(
    ("stack", "starts", "usable"),
    [
        ([0, 1], [0, 1, 2], True),  # stack 1, the last of two
        ([0, 2], [0, 1, 2], False),  # one past the last
        ([-1, 1], [0, 1, 2], False),  # one below the first
        ([0, 1], [0, 1, 3], False),  # the stacks end one frame past the frames held
        ([0, 1], [0, 1, 1], False),  # one frame short of them
    ],
)
def test_a_cached_entrys_stack_is_one_the_cache_holds(stack, starts, usable):
    meta = {"device": 0, "time_missing": False, "frames": []}
    arrays = _trace_arrays(stack, starts, [0, 1])
    if usable:
        assert cache._trace(meta, arrays).stack.tolist() == stack
    else:
        with pytest.raises(cache.Rejected, match="damaged"):
            cache._trace(meta, arrays)


@pytest.mark.parametrize(("frame", "usable"), [(2, True), (3, False), (-1, False)])
def test_a_cached_stack_names_only_frames_the_cache_holds(frame, usable):
    frames = [{"filename": f"f{i}.py", "line": i, "name": "g"} for i in range(3)]
    stacks = Stacks.from_arrays(frames, np.array([0, 2]), np.array([0, frame]), lambda stored: stored)
    if usable:
        assert stacks.lists() == [[frames[0], frames[2]]]
    else:
        with pytest.raises(KitError, match="names a frame the cache does not hold"):
            stacks.lists()


def _cache_file(tmp_path: Path, header: bytes, extra: int) -> Path:
    """A cache file whose prefix gives `header`'s length plus `extra` bytes."""
    path = tmp_path / "x.kitcache"
    path.write_bytes(cache.PREFIX.pack(cache.MAGIC, len(header) + extra, zlib.crc32(header)) + header)
    return path


@pytest.mark.parametrize(("extra", "usable"), [(-1, False), (0, True), (1, False)])
def test_a_caches_header_may_end_exactly_at_the_files_end(tmp_path, extra, usable):
    """One byte short reads as damaged JSON; exactly the file's rest is read; one past is truncated."""
    path = _cache_file(tmp_path, b'{"format": 1}', extra)
    with open(path, "rb") as f:
        if usable:
            header, start = cache._header(f, path.stat().st_size)
            assert header == {"format": 1} and start == cache._aligned(path.stat().st_size)
        else:
            with pytest.raises(cache.Rejected, match="truncated" if extra > 0 else "damaged"):
                cache._header(f, path.stat().st_size)


@pytest.mark.parametrize(
    ("data_bytes", "reason"), [(99, "longer than its header says"), (100, None), (101, "truncated")]
)
def test_a_caches_data_ends_exactly_where_its_header_says(data_bytes, reason):
    stamp = cache.Stamp(1, 2, "x")
    header = {"format": cache.FORMAT, "kit": cache.kit_version(), "source": asdict(stamp), "data_bytes": data_bytes}
    if reason is None:
        cache._check(header, stamp, 164, 64)
    else:
        with pytest.raises(cache.Rejected, match=reason):
            cache._check(header, stamp, 164, 64)


# The attribution windows (`kit.analysis.attribution`): a window [begin, end) holds entry begin, not entry end.

POOL_AT = 0x2000_0000  # four graph-pool segments, made at trace indices 0..3, of 2, 4, 6 and 8 MiB


def _four_segments(captures: list[dict] | None = None) -> Snapshot:
    sizes = [2 * MIB, 4 * MIB, 6 * MIB, 8 * MIB]
    addresses = [POOL_AT + sum(sizes[:i]) + i * MIB for i in range(4)]
    made = list(zip(addresses, sizes, strict=True))
    trace = [{"action": "segment_alloc", "addr": a, "size": n, "stream": 7} for a, n in made]
    segments = [segment(a, [(n, "inactive")], stream=7, pool=(0, 1)) for a, n in made]
    raw = {"segments": segments, "device_traces": [trace], "kit": {"captures": captures or []}}
    return Snapshot(raw, origin="four segments")


@pytest.mark.parametrize(("begin", "end", "mib"), [(1, 3, 10), (0, 4, 20), (1, 2, 4), (2, 2, 0), (3, 4, 8)])
def test_a_capture_window_holds_the_segments_made_from_its_begin_to_just_before_its_end(begin, end, mib):
    window = {"graph": "g", "trace_begin": begin, "trace_end": end}
    added = capture_attribution(_four_segments(), [window])
    assert int(added["bytes"].sum()) == mib * MIB


@pytest.mark.parametrize(
    ("begin", "end", "refusal"),
    [
        (0, 3, None),
        (0, 4, None),  # ends exactly at the trace's end
        (0, 5, "ends at trace index 5, past the trace's 4 entries"),
        (2, 2, None),  # an empty window
        (3, 2, r"ends \(trace index 2\) before it begins \(3\)"),
        (-1, 2, "'trace_begin' is negative"),
    ],
)
def test_a_recorded_window_may_end_at_the_traces_end_and_begin_at_its_end(begin, end, refusal):
    window = {"graph": "g", "capture": "c", "trace_begin": begin, "trace_end": end, "pool": [0, 1], "stream": 7}
    snap = _four_segments([window])
    if refusal is None:
        assert [(w["trace_begin"], w["trace_end"]) for w in checked_capture_windows(snap)] == [(begin, end)]
    else:
        with pytest.raises(KitError, match=refusal):
            checked_capture_windows(snap)


# The byte formatter (`kit.units.format_bytes`): each unit from exactly 1024 of the one below.

GIB = 1 << 30


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (KIB, "1.00 KiB"),
        (KIB + 1, "1.00 KiB"),
        (MIB - 1, "1024.00 KiB"),  # one byte short of a MiB: still counted in KiB
        (MIB, "1.00 MiB"),
        (MIB + 1, "1.00 MiB"),
        (GIB - 1, "1024.00 MiB"),
        (GIB, "1.00 GiB"),
        (GIB + 1, "1.00 GiB"),
        (1 << 40, "1024.00 GiB"),  # GiB is the largest unit
        (-1023, "-1023 B"),
        (-KIB, "-1.00 KiB"),
        (-MIB, "-1.00 MiB"),
    ],
)
def test_format_bytes_changes_unit_at_exactly_1024_of_the_one_below(n, text):
    assert format_bytes(n) == text


# The segment-type rules (`kit.allocator.rules`): derived from CUDACachingAllocator.cpp as in the table above.

TWO_MIB = 2 * MIB


@pytest.mark.parametrize(("total", "small"), [(TWO_MIB - 512, True), (TWO_MIB, True), (TWO_MIB + 512, False)])
@pytest.mark.parametrize("given", [None, "medium"])  # no segment_type, or one the kit does not know
def test_a_segment_without_a_known_type_is_small_up_to_2_MiB(total, small, given):
    raw = segment(1 << 44, [(total, "inactive")])
    del raw["segment_type"]
    if given is not None:
        raw["segment_type"] = given
    assert is_small_segment(total) == small
    assert parse_segment(raw, "s").segment_type == ("small" if small else "large")  # the row parser
    assert load_snapshot({"segments": [raw]}).columns.small.tolist() == [small]  # the bulk columns


@pytest.mark.parametrize(
    ("request_bytes", "small", "segment_bytes"),
    [
        (MIB - 512, True, TWO_MIB),
        (MIB, True, TWO_MIB),  # the largest small request
        (MIB + 512, False, 20 * MIB),  # the smallest large one shares a 20 MiB segment
        (10 * MIB - 512, False, 20 * MIB),
        (10 * MIB, False, 10 * MIB),  # from 10 MiB a request has a segment of its own, rounded to 2 MiB
        (10 * MIB + 512, False, 12 * MIB),
        (12 * MIB, False, 12 * MIB),
    ],
)
def test_a_new_segment_is_sized_and_typed_by_its_request_at_each_boundary(request_bytes, small, segment_bytes):
    assert (is_small_request(request_bytes), get_allocation_size(request_bytes)) == (small, segment_bytes)
    ops = [{"op": "alloc", "id": "x", "bytes": request_bytes, "stream": "default"}]
    (made,) = simulate(parse_workload({"version": 1, "ops": ops})).snapshot()["segments"]
    assert (made["total_size"], made["segment_type"]) == (segment_bytes, "small" if small else "large")


# The patch's refusals (`kit.patch.source.apply_hunk`): a hunk's old lines must occur exactly once, anywhere.

FUNCTION = ["def f(x):", "    a = 1", "    b = 2", "    return a + b"]


@pytest.mark.parametrize(
    ("old", "refusal"),
    [
        ("def f(x):", None),  # the first line
        ("return a + b", None),  # the last line
        ("b = 2\nreturn a + b", None),  # the last two
        ("return a + b\npass", "the line `return a + b` is not there"),  # one line past the end
        ("a = 1\nb = 3", "the line `a = 1` is not there"),  # the last line differs
        ("c = 3", "the line `c = 3` is not there"),
    ],
)
def test_a_hunk_applies_where_its_old_lines_occur_once_up_to_the_last_line(old, refusal):
    hunk = Hunk(old, "pass  # new")
    if refusal is None:
        new = apply_hunk(FUNCTION, hunk, "f", "test")
        assert len(new) == len(FUNCTION) - len(old.splitlines()) + 1
        assert sum(line.strip() == "pass  # new" for line in new) == 1
    else:
        with pytest.raises(KitError, match=f"unsupported test: f: {re.escape(refusal)}; nothing was patched"):
            apply_hunk(FUNCTION, hunk, "f", "test")


@pytest.mark.parametrize(("times", "refusal"), [(0, "is not there"), (1, None), (2, "is there 2 times")])
def test_a_hunk_is_refused_unless_its_old_lines_occur_exactly_once(times, refusal):
    lines = ["def f():", *["    x = 1"] * times, "    return 0"]
    if refusal is None:
        assert apply_hunk(lines, Hunk("x = 1", "y = 2"), "f", "test") == ["def f():", "    y = 2", "    return 0"]
    else:
        with pytest.raises(KitError, match=f"the line `x = 1` {refusal}; nothing was patched"):
            apply_hunk(lines, Hunk("x = 1", "y = 2"), "f", "test")

"""The segment map's limits (`kit.show.pictures.segment_map_figure`): it always finishes, and never draws more bars.

Past `max_bars`, neighbouring blocks of one state are merged, then the smallest
segments are left out down to one, and a segment whose runs alone pass the
limit is drawn in `max_bars` groups of neighbouring runs (issue 39: that
segment used to make the loop run forever). Every case is checked under a
timeout, at the limit, one below and one above it, and as a property over
random segments and limits: whatever is drawn tiles its segments exactly and
the title says what was left out, merged or grouped.
"""

from __future__ import annotations

import re
import threading

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kit.errors import KitError
from kit.show.pictures import segment_map_figure

from .helpers import MIB, segment

BASE = 0x7F00_0000_0000
ALLOC, FREE = "active_allocated", "inactive"


def _snapshot(*segments: list[tuple[int, str]]) -> dict:
    """A snapshot of segments built from their blocks, each segment 1 GiB from the previous one."""
    return {"segments": [segment(BASE + (i << 30), blocks) for i, blocks in enumerate(segments)], "device_traces": [[]]}


def _drawn(fig) -> dict[int, list[tuple[float, float, str]]]:
    """Per drawn segment (by address): its bars (offset MiB, MiB, hover text) in address order."""
    rows: dict[int, list] = {}
    for trace in fig.data:
        for y, base, x, text in zip(trace.y, trace.base, trace.x, trace.hovertext, strict=True):
            rows.setdefault(int(y.rsplit("| ", 1)[1], 16), []).append((base, x, text))
    return {address: sorted(bars) for address, bars in rows.items()}


def _blocks_in(text: str) -> int:
    found = re.match(r"(\d+) blocks, ", text)
    return int(found.group(1)) if found else 1


def _tiles(bars: list[tuple[float, float, str]], total: int) -> bool:
    """Whether the bars cover their segment from 0 to its end, each starting where the previous one ended."""
    cursor = 0.0
    for base, x, _ in bars:
        if base != cursor:
            return False
        cursor += x
    return cursor == total / MIB


@pytest.mark.timeout(20)
def test_one_segment_with_more_runs_than_bars_is_drawn_in_groups_and_says_so():
    """Issue 39's snippet: allocated, free, allocated with max_bars=2 used to hang."""
    fig = segment_map_figure(_snapshot([(2 * MIB, ALLOC), (2 * MIB, FREE), (2 * MIB, ALLOC)]), max_bars=2)
    (bars,) = _drawn(fig).values()
    assert [(base, x) for base, x, _ in bars] == [(0.0, 2.0), (2.0, 4.0)]
    assert bars[0][2] == "2.00 MiB allocated at +0 B"
    assert bars[1][2] == "2 blocks, 4.00 MiB mostly allocated at +2.00 MiB: 2.00 MiB allocated, 2.00 MiB free"
    assert f"segment {BASE:#x}: its 3 runs drawn as 2 bars of neighbouring runs" in fig.layout.title.text
    assert "not drawn" not in fig.layout.title.text


@pytest.mark.timeout(20)
@pytest.mark.parametrize("max_bars", [0, -1, 2.5, True])
def test_fewer_than_one_bar_is_refused_in_one_line(max_bars):
    with pytest.raises(KitError, match="needs at least 1 bar"):
        segment_map_figure(_snapshot([(2 * MIB, ALLOC)]), max_bars=max_bars)


ALTERNATING = [(MIB // 2, ALLOC), (MIB // 2, FREE)] * 2  # 4 blocks, 4 runs
PAIRS = [(MIB // 4, ALLOC)] * 2 + [(MIB // 4, FREE)] * 2 + [(MIB, ALLOC)]  # 5 blocks, 3 runs


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("max_bars", "bars", "note"),
    [(6, 5, None), (5, 5, None), (4, 3, "one bar"), (3, 3, "one bar"), (2, 2, "3 runs drawn as 2 bars")],
)
def test_one_segments_blocks_runs_and_groups_at_each_limit(max_bars, bars, note):
    """Five blocks in three runs: every block down to five bars, the runs down to three, then groups."""
    fig = segment_map_figure(_snapshot(PAIRS), max_bars=max_bars)
    (drawn,) = _drawn(fig).values()
    assert len(drawn) == bars and _tiles(drawn, 2 * MIB)
    assert sum(_blocks_in(text) for _, _, text in drawn) == 5
    title = fig.layout.title.text.split("<br>")[0]
    assert title.endswith("coloured by stream") if note is None else note in title
    assert ("runs drawn as" in title) == (max_bars < 3) and "not drawn" not in title


LARGER = [(2 * size, state) for size, state in PAIRS]  # 4 MiB, 5 blocks, 3 runs


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("max_bars", "segments", "merged", "grouped"),
    [(10, 2, False, False), (9, 2, False, False), (8, 2, True, False), (7, 2, True, False)]
    + [(6, 1, True, False), (3, 1, True, False), (2, 1, True, True)],
)
def test_two_segments_at_each_limit_merge_then_leave_the_smaller_out_then_group(max_bars, segments, merged, grouped):
    """ALTERNATING (2 MiB, 4 blocks in 4 runs) and LARGER (4 MiB, 5 blocks in 3 runs): 9 blocks, 7 runs."""
    fig = segment_map_figure(_snapshot(ALTERNATING, LARGER), max_bars=max_bars)
    drawn, title = _drawn(fig), fig.layout.title.text.split("<br>")[0]
    assert len(drawn) == segments and sum(len(bars) for bars in drawn.values()) <= max_bars
    assert all(_tiles(bars, 4 * MIB if address > BASE else 2 * MIB) for address, bars in drawn.items())
    assert ("(1 smallest segments not drawn)" in title) == (segments == 1) and (BASE + (1 << 30)) in drawn
    assert ("one bar" in title, "runs drawn as" in title) == (merged, grouped)


blocks_st = st.tuples(st.integers(1, 4), st.sampled_from([ALLOC, FREE, "active_pending_free"]))  # (512 KiB, state)
segments_st = st.lists(
    st.lists(blocks_st, min_size=1, max_size=8),
    min_size=1,
    max_size=4,
)


def _within(seconds: float, call):
    """`call()`'s result, failing the example if it has none within `seconds` (the call left running, a daemon).

    pytest-timeout fails a test once; hypothesis would go on to run the example again and hang, so each
    example has its own limit, and a failing one is not shrunk (`phases`): the test ends in two limits at most.
    """
    done: list = []
    worker = threading.Thread(target=lambda: done.append(_outcome(call)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert done, f"no figure within {seconds} s"
    if isinstance(done[0], BaseException):
        raise done[0]
    return done[0]


def _outcome(call):
    try:
        return call()
    except Exception as e:  # raised again in the test's thread
        return e


@pytest.mark.timeout(120)
@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
@given(segments_st, st.integers(1, 12), st.integers(1, 5))
def test_any_segments_and_limits_finish_within_the_limits_and_tile_what_is_drawn(blocks, max_bars, max_segments):
    raw = _snapshot(*[[(units * 512 * 1024, state) for units, state in seg] for seg in blocks])
    fig = _within(10, lambda: segment_map_figure(raw, max_bars=max_bars, max_segments=max_segments))
    drawn, title = _drawn(fig), fig.layout.title.text.split("<br>")[0]
    totals = {s["address"]: s["total_size"] for s in raw["segments"]}
    assert 1 <= len(drawn) <= max_segments and sum(len(bars) for bars in drawn.values()) <= max_bars
    for address, bars in drawn.items():
        assert _tiles(bars, totals[address]), address
        assert sum(_blocks_in(text) for _, _, text in bars) == len(blocks[(address - BASE) >> 30])
    kept = sorted(totals.values(), reverse=True)[: len(drawn)]  # the largest are kept
    assert sorted((totals[a] for a in drawn), reverse=True) == kept
    dropped = len(totals) - len(drawn)
    assert (f"({dropped} smallest segments not drawn)" in title) == (dropped > 0)
    if sum(map(len, blocks)) <= max_bars and len(blocks) <= max_segments:
        assert sum(map(len, drawn.values())) == sum(map(len, blocks)) and "(" not in title
    grouped = len(drawn) == 1 and _runs(blocks[(min(drawn) - BASE) >> 30]) > max_bars
    assert ("runs drawn as" in title) == grouped
    assert not grouped or len(drawn[min(drawn)]) == max_bars


def _runs(blocks: list[tuple[int, str]]) -> int:
    """How many runs of neighbouring blocks in one state."""
    return 1 + sum(a[1] != b[1] for a, b in zip(blocks, blocks[1:], strict=False))

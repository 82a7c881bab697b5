"""Every stream of a figure has a colour of its own (issue 36: the default stream was drawn in nearly s1's teal).

`kit.show.pictures.stream_colours` gives the default stream (id 0, whatever a
recorder named it) and the kit's named streams fixed colours, and every other
stream the next colour of a palette whose colours look different (CIE76
distance at least `DISTINCT`), then hues of their own.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from kit.analysis.names import DEFAULT_STREAM_LABEL, MODEL_STREAM_LABEL, REPLAY_STREAM_LABEL
from kit.show.pictures import (
    DISTINCT,
    MARK_COLOURS,
    OTHER_STREAM_COLOURS,
    STREAM_COLOURS,
    colour_distance,
    segment_map_figure,
    stream_colours,
)

from .helpers import MIB, segment

MERGED = Path(__file__).resolve().parents[1] / "kit" / "recordings" / "merged"


def colours_by_stream(fig) -> dict[str, str]:
    """Each legend group (a stream's label) of a segment map and the colour its bars are hatched in."""
    out: dict[str, set] = {}
    for trace in fig.data:
        out.setdefault(trace.legendgroup, set()).add(trace.marker.pattern.fgcolor)
    assert all(len(c) == 1 for c in out.values()), out  # one colour per stream, whatever the block state
    return {label: c.pop() for label, c in out.items()}


def many_streams(n: int) -> dict:
    """A snapshot with one segment on each of `n` streams: the default one named "default", then s1, s2, ..."""
    ids = [0, *range(1000, 1000 + n - 1)]
    segments = [segment(0x7F00_0000_0000 + (i << 30), [(2 * MIB, "inactive")], stream=s) for i, s in enumerate(ids)]
    names = {"default": 0, **{f"s{i}": s for i, s in enumerate(ids[1:], start=1)}}
    return {"segments": segments, "device_traces": [[]], "kit": {"streams": names}}


def test_every_stream_of_a_segment_map_has_its_own_colour_and_the_first_ones_look_apart():
    n = len(OTHER_STREAM_COLOURS) + 8  # past the palette
    colours = colours_by_stream(segment_map_figure(many_streams(n)))
    assert len(colours) == n and len(set(colours.values())) == n
    assert colours["default"] == STREAM_COLOURS[DEFAULT_STREAM_LABEL]  # id 0 is the default stream, named or not
    first = [colours["default"], *(colours[f"s{i}"] for i in range(1, len(OTHER_STREAM_COLOURS) + 1))]
    assert min(colour_distance(a, b) for a, b in itertools.combinations(first, 2)) >= DISTINCT
    assert not set(colours.values()) & set(MARK_COLOURS.values())


def test_the_recorded_default_stream_is_not_drawn_like_s1():
    colours = colours_by_stream(segment_map_figure(MERGED / "merged_100.pickle"))
    assert set(colours) == {"default", "s1", "s2"}
    assert min(colour_distance(a, b) for a, b in itertools.combinations(colours.values(), 2)) >= DISTINCT
    assert colours["default"] == STREAM_COLOURS[DEFAULT_STREAM_LABEL]


def test_the_kits_named_streams_keep_their_colours_and_others_never_take_them():
    labels = {"m": MODEL_STREAM_LABEL, "r": REPLAY_STREAM_LABEL, **{f"x{i}": f"x{i}" for i in range(30)}}
    colours = stream_colours(labels)
    assert colours["m"] == STREAM_COLOURS[MODEL_STREAM_LABEL] and colours["r"] == STREAM_COLOURS[REPLAY_STREAM_LABEL]
    others = [colours[f"x{i}"] for i in range(30)]
    assert len(set(others)) == 30 and not set(others) & set(STREAM_COLOURS.values())

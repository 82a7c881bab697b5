"""A guard for CI: did a snapshot's graph pools strand memory on a second stream?

`check_snapshot` walks the snapshot's trace (every device that has one) and
takes the stranding report's groups (`kit.analysis.trace.reports`): a group
offends when it made more than `max_stranded` bytes of new segments while a
fitting free block sat in the same pool on another stream at that moment.
By default only graph pools count (every pool but the default one, (0, 0));
`pools="all"` counts the default pool too.

This is the test vLLM could add for PR 63155: record the capture with memory
history on, then

    python -m kit check capture.pickle          # exit 0 ok, 1 stranded, 2 bad input

or, in a pytest test, `kit.assert_no_stranding(snapshot)`, which raises
`AssertionError` with one line per offending group.

The guard fails closed: a snapshot it cannot judge raises `KitError` (the
command line exits 2), never passes. That is a snapshot without a trace, a
malformed capture window in its `kit` key, and a trace whose walk misses:
where walking a device's trace forward from its rewound start does not end at
the snapshot's segments (the walk's `mismatches`: a corrupted or reordered
trace, or a trace and segments of different moments), the stranded figures
come from a history that did not happen, so no verdict is given.
`assert_no_stranding` raises the same `KitError`, not `AssertionError`: a
pytest test errors with the cause instead of failing as if memory stranded.

Captures allowed a stream of their own (`own_stream`, `--own-stream`): PR
63155 moves only the decoder replay graphs onto the model graphs' stream; the
speculator's (drafter's) graphs keep their own, because "it needs its own
lifetime argument" (`kit.experiments.drafter_run` makes it). So with a drafter
on, the PR's own configuration strands in the global graph pool on the
drafter's stream, by design. `own_stream` is a tuple of patterns; a pattern
matches a capture when it is a case-insensitive substring of the capture's
manager (a recorded window's `manager` in the `kit` key, e.g. "DFlash
speculator graphs") or of the label the snapshot itself gives the capture's
stream (`kit["streams"]`: the recorder's "DFlash speculator graphs stream", a
workload's stream name). A graph-pool (pool, stream) group whose captures in
that pool are all matched (or, with no recorded window of that group, whose
stream is matched) is not offending: it is listed in `allowed`, with the
patterns that allowed it and what they matched, and printed on a line of its
own, so nothing is hidden. A stream is also matched by what the kit prints for
it: its label in full ("stream A", "stream of f (x.py:3)", case aside; a
made-up label is never matched by a part of it, so `stream` does not allow
every stream) or its id (`140234567`, or `0x...`). A pattern with `*`, `?` or
`[` is a glob over the same names. The default, `DEFAULT_OWN_STREAM`, is what
the PR argues: the speculator's captures, by
`kit.analysis.liveness.is_drafter_capture`'s words ("speculator",
"drafter"), in a manager or a given stream label. An empty tuple (`--own-stream
none`) allows nothing. A pattern given other than the default that matches no
stream of the snapshot is a one-line error naming the streams there are. The
default pool is never allowed.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from kit.allocator.rules import DEFAULT_POOL
from kit.analysis.attribution import checked_capture_windows
from kit.analysis.names import stream_labels
from kit.analysis.trace.reports import stranding_report
from kit.analysis.trace.walk import walk_trace
from kit.errors import KitError
from kit.load.snapshot import Snapshot, load_snapshot
from kit.units import format_bytes

POOLS = ("graph", "all")
# What PR 63155 argues may keep a stream of its own: the speculator's captures (`is_drafter_capture`'s words).
DEFAULT_OWN_STREAM: tuple[str, ...] = ("speculator", "drafter")


@dataclass
class CheckResult:
    """What `check_snapshot` found: `ok`, the offending groups (dicts, exact bytes), the data source, and the
    groups that would have offended on a stream `own_stream` allows (`allowed`, each with `patterns` and `matched`)."""

    ok: bool
    offending: list[dict]
    source: str
    pools: str = "graph"
    max_stranded: int = 0
    allowed: list[dict] = field(default_factory=list)  # groups that would offend, on a stream `own_stream` allows
    own_stream: tuple[str, ...] = DEFAULT_OWN_STREAM
    expandable: bool = False  # recorded with expandable_segments:True (a new segment is a mapping: a note says so)

    def lines(self) -> list[str]:
        """One line per offending group: pool, stream, stranded bytes, the first stack frames."""
        return [offending_line(group) for group in self.offending]

    def allowed_lines(self) -> list[str]:
        """One line per allowed group: the pattern that allowed it and what it matched, then as `lines()`."""
        return [allowed_line(group) for group in self.allowed]

    def summary(self) -> str:
        """One line: passed, or how many groups offended (and how many allowed groups were not counted)."""
        which = "no graph pool" if self.pools == "graph" else "no pool"
        limit = format_bytes(self.max_stranded)
        allowed = f" ({len(self.allowed)} allowed group(s) on their own stream not counted)" if self.allowed else ""
        if self.ok:
            return f"ok: {which} stranded more than {limit}{allowed} ({self.source})"
        return f"failed: {len(self.offending)} group(s) stranded more than {limit}{allowed} ({self.source})"

    def to_json(self) -> dict:
        """`{"ok", "offending", "source", "allowed", "own_stream"}`, as `python -m kit check --json` prints it."""
        return {
            "ok": self.ok,
            "offending": self.offending,
            "source": self.source,
            "allowed": self.allowed,
            "own_stream": list(self.own_stream),
        }


def offending_line(group: dict) -> str:
    """`graph pool 1 (0, 1), stream of f (x.py:3) (stream 123): 24.00 MiB stranded (25165824 bytes); ...`."""
    pool = tuple(group["pool"])
    line = (
        f"{group['pool_label']} {pool}, {group['stream_label']} (stream {group['stream']}): "
        f"{format_bytes(group['stranded_bytes'])} stranded ({group['stranded_bytes']} bytes), "
        f"{format_bytes(group['still_reserved'])} of it still reserved"
    )
    return line + (f"; first stranded allocation: {group['frames']}" if group["frames"] else "")


def allowed_line(group: dict) -> str:
    """`allowed by --own-stream 'speculator' (manager 'DFlash speculator graphs'): global graph pool (0, 1), ...`."""
    patterns = ", ".join(repr(p) for p in group["patterns"])
    return f"allowed by --own-stream {patterns} ({'; '.join(group['matched'])}): {offending_line(group)}"


def own_stream_patterns(own_stream: tuple[str, ...] | list[str] | str) -> tuple[str, ...]:
    """The patterns, checked: each a non-empty string (an empty one would match every name); a string is one."""
    if isinstance(own_stream, str):
        own_stream = (own_stream,)
    if not isinstance(own_stream, tuple | list):
        raise KitError(f"own_stream {own_stream!r}: expected a tuple of patterns (names, or parts of them)")
    for pattern in own_stream:
        if not isinstance(pattern, str) or not pattern.strip():
            raise KitError(
                f"--own-stream {pattern!r}: expected a part of a capture's manager name or of its stream's label "
                "(an empty pattern would allow every stream; `none` allows none)"
            )
    return tuple(dict.fromkeys(p.strip() for p in own_stream))


GLOB = frozenset("*?[")


def _matches(pattern: str, name: str | None, *, whole: bool = False) -> bool:
    """Whether `pattern` names `name`: a glob over it, or a case-insensitive substring (all of it if `whole`)."""
    if not name:
        return False
    folded, wanted = name.casefold(), pattern.casefold()
    if GLOB & set(pattern):
        return fnmatch.fnmatchcase(folded, wanted)
    return folded == wanted if whole else wanted in folded


def _matching(patterns: tuple[str, ...], name: str | None) -> str | None:
    """The first pattern that names `name` (a case-insensitive substring, or a glob)."""
    return next((p for p in patterns if _matches(p, name)), None)


def _naming_stream(patterns: tuple[str, ...], stream: int, printed: str | None) -> str | None:
    """The first pattern that names a stream by what the kit prints for it: its label in full, or its id."""
    ids = {str(stream), hex(stream)}
    return next((p for p in patterns if p.strip().casefold() in ids or _matches(p, printed, whole=True)), None)


def _stream_matches(patterns, stream: int, given: str | None, printed: str | None) -> tuple[str, str] | None:
    """`(pattern, what it matched)` for a stream named by its given label, its printed label or its id."""
    pattern = _matching(patterns, given)
    if pattern is not None:
        return pattern, f"stream label {given!r}"
    pattern = _naming_stream(patterns, stream, printed)
    if pattern is not None:
        return pattern, f"stream {printed!r} ({stream})"
    return None


def unmatched_patterns(snap: Snapshot, windows: list[dict], patterns: tuple[str, ...]) -> list[str]:
    """The patterns that name no stream and no capture manager of `snap`."""
    printed = stream_labels(snap)
    streams = {int(s) for s in printed} | {int(w["stream"]) for w in windows}
    managers = [w.get("manager", w["graph"]) for w in windows]
    return [
        p
        for p in patterns
        if not any(_stream_matches((p,), s, snap.stream_names.get(s), printed.get(s)) for s in streams)
        and not any(_matches(p, m) for m in managers)
    ]


def _no_such_stream(snap: Snapshot, unmatched: list[str]) -> str:
    printed = stream_labels(snap)
    streams = ", ".join(f"{label} ({stream})" for stream, label in sorted(printed.items()))
    which = ", ".join(repr(p) for p in unmatched)
    return (
        f"{snap.origin}: --own-stream {which} matches no stream of this snapshot; its streams: {streams or 'none'} "
        "(give a label as printed, a stream id, a part of a capture's manager name, or a glob)"
    )


def _allowance(snap: Snapshot, windows: list[dict], group: dict, patterns: tuple[str, ...]) -> dict | None:
    """Why `group` may keep its own stream (`{"patterns", "matched"}`), or None when it may not.

    Only a graph pool's group, and only by names the snapshot gives: each of
    the group's recorded windows (same pool and stream) by its manager or by
    the stream's label from the `kit` key; with no recorded window, by that
    label alone.
    """
    pool = tuple(group["pool"])
    if not patterns or pool == DEFAULT_POOL:
        return None
    label = snap.stream_names.get(group["stream"])  # None for a label the kit made up
    by_stream = _stream_matches(patterns, group["stream"], label, group.get("stream_label"))
    found: dict[str, str] = {}  # what matched ("manager 'X'", "stream label 'Y'") -> the pattern that matched it
    for window in windows:
        if tuple(window["pool"]) != pool or window["stream"] != group["stream"]:
            continue
        manager = window.get("manager", window["graph"])
        by_manager = _matching(patterns, manager)
        if by_manager is not None:
            found.setdefault(f"manager {manager!r}", by_manager)
        elif by_stream is not None:
            found.setdefault(by_stream[1], by_stream[0])
        else:
            return None  # one capture of the group is not allowed: neither is the group
    if not found:  # no recorded window of the group: its stream, if named
        if by_stream is None:
            return None
        found[by_stream[1]] = by_stream[0]
    return {"patterns": list(dict.fromkeys(found.values())), "matched": list(found)}


def check_snapshot(
    snapshot: Snapshot | str | dict,
    *,
    pools: str = "graph",
    max_stranded: int = 0,
    own_stream: tuple[str, ...] = DEFAULT_OWN_STREAM,
) -> CheckResult:
    """Whether no graph pool (`pools="all"`: no pool) stranded more than `max_stranded` bytes on any stream.

    Walks every device that has a trace. A group over `max_stranded` on a
    stream `own_stream` allows (case-insensitive substrings of a recorded
    capture's manager or of the stream's label the snapshot gives; default
    `DEFAULT_OWN_STREAM`, the speculator's; `()` allows nothing) goes to
    `allowed` instead of `offending` (module docstring). Raises `KitError`
    without a trace (memory history recorded with enabled="all"), with
    `pools`, `max_stranded` or `own_stream` out of range, with a malformed
    capture window, and when walking a device's trace does not end at the
    snapshot (the verdict could not be trusted).
    """
    if pools not in POOLS:
        raise KitError(f"--pools {pools!r}: expected one of {', '.join(POOLS)}")
    if isinstance(max_stranded, bool) or not isinstance(max_stranded, int) or max_stranded < 0:
        raise KitError(f"--max-stranded {max_stranded!r}: expected a number of bytes, 0 or more")
    patterns = own_stream_patterns(own_stream)
    snap = load_snapshot(snapshot)
    devices = [d for d, columns in sorted(snap.trace_columns.items()) if len(columns) >= 2]
    if not snap.has_trace or not devices:
        snap.require_trace(0)  # raises, in the words every command uses for a snapshot without a trace
    windows = checked_capture_windows(snap)
    unmatched = unmatched_patterns(snap, windows, patterns) if patterns != DEFAULT_OWN_STREAM else []
    if unmatched:
        raise KitError(_no_such_stream(snap, unmatched))
    offending, allowed = [], []
    for device in devices:
        walk = walk_trace(snap, device)
        if walk.mismatches:
            raise KitError(_walk_misses(snap, device, walk.mismatches))
        report = stranding_report(snap, walk, min_bytes=0)
        for row in report.to_dict(orient="records"):
            if pools == "graph" and tuple(row["pool"]) == DEFAULT_POOL:
                continue
            if row["stranded_bytes"] > max_stranded:
                group = _group(row, device)
                allowance = _allowance(snap, windows, group, patterns)
                if allowance is None:
                    offending.append(group)
                else:
                    allowed.append({**group, **allowance})
    for groups in (offending, allowed):
        groups.sort(key=lambda g: (tuple(g["pool"]) == DEFAULT_POOL, -g["stranded_bytes"]))  # as the verdicts
    return CheckResult(
        not offending, offending, snap.source_label, pools, max_stranded, allowed, patterns, snap.expandable
    )


def _walk_misses(snap: Snapshot, device: int, mismatches: list[str]) -> str:
    """One line: the trace's walk misses the snapshot, how many differences and the first, and that no verdict is
    given."""
    return (
        f"{snap.origin}: device {device}'s trace, walked from its start, does not end at the snapshot "
        f"({len(mismatches)} mismatch(es); "
        f"the first: {mismatches[0]}), so a stranding verdict from it cannot be trusted: `check` gives none "
        "(a corrupted or reordered trace, or segments and trace from different moments)"
    )


def _group(row: dict, device: int) -> dict:
    return {
        "device": device,
        "pool": [int(row["pool"][0]), int(row["pool"][1])],
        "pool_label": row["pool_label"],
        "stream": int(row["stream"]),
        "stream_label": row["stream_label"],
        "stranded_bytes": int(row["stranded_bytes"]),
        "still_reserved": int(row["still_reserved"]),
        "frames": row["frames"],
    }


def assert_no_stranding(
    snapshot: Snapshot | str | dict,
    *,
    pools: str = "graph",
    max_stranded: int = 0,
    own_stream: tuple[str, ...] = DEFAULT_OWN_STREAM,
) -> CheckResult:
    """Raise `AssertionError`, one line per offending group, if a graph pool stranded more than `max_stranded` bytes.

    For a pytest test of a capture path: record the capture with memory history
    on, then `kit.assert_no_stranding(snapshot)`. Returns the `CheckResult`
    when it passes. `own_stream` as `check_snapshot`'s; the allowed groups'
    lines follow the offending ones in the message. A snapshot
    `check_snapshot` cannot judge (no trace, a malformed capture window, a
    trace whose walk misses it) raises its `KitError`, not `AssertionError`:
    the test errors, naming the cause.
    """
    result = check_snapshot(snapshot, pools=pools, max_stranded=max_stranded, own_stream=own_stream)
    if not result.ok:
        raise AssertionError("\n".join([result.summary(), *result.lines(), *result.allowed_lines()]))
    return result

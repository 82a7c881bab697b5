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
malformed capture window in its `kit` key, and a trace that does not replay:
where walking a device's trace forward from its rewound start does not end at
the snapshot's segments (the walk's `mismatches`: a corrupted or reordered
trace, or a trace and segments of different moments), the stranded figures
come from a history that did not happen, so no verdict is given.
`assert_no_stranding` raises the same `KitError`, not `AssertionError`: a
pytest test errors with the cause instead of failing as if memory stranded.
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.allocator.rules import DEFAULT_POOL
from kit.analysis.attribution import checked_capture_windows
from kit.analysis.tables import format_bytes
from kit.analysis.trace.replay import replay_trace
from kit.analysis.trace.reports import stranding_report
from kit.errors import KitError
from kit.load.snapshot import Snapshot, load_snapshot

POOLS = ("graph", "all")


@dataclass
class CheckResult:
    """What `check_snapshot` found: `ok`, the offending groups (dicts, exact bytes), and the data source."""

    ok: bool
    offending: list[dict]
    source: str
    pools: str = "graph"
    max_stranded: int = 0

    def lines(self) -> list[str]:
        """One line per offending group: pool, stream, stranded bytes, the first stack frames."""
        return [offending_line(group) for group in self.offending]

    def summary(self) -> str:
        """One line: passed, or how many groups offended."""
        which = "no graph pool" if self.pools == "graph" else "no pool"
        limit = format_bytes(self.max_stranded)
        if self.ok:
            return f"ok: {which} stranded more than {limit} ({self.source})"
        return f"failed: {len(self.offending)} group(s) stranded more than {limit} ({self.source})"

    def to_json(self) -> dict:
        """`{"ok", "offending", "source"}`, as `python -m kit check --json` prints it."""
        return {"ok": self.ok, "offending": self.offending, "source": self.source}


def offending_line(group: dict) -> str:
    """`graph pool 1 (0, 1), stream of f (x.py:3) (stream 123): 24.00 MiB stranded (25165824 bytes); ...`."""
    pool = tuple(group["pool"])
    line = (
        f"{group['pool_label']} {pool}, {group['stream_label']} (stream {group['stream']}): "
        f"{format_bytes(group['stranded_bytes'])} stranded ({group['stranded_bytes']} bytes), "
        f"{format_bytes(group['still_reserved'])} of it still reserved"
    )
    return line + (f"; first stranded allocation: {group['frames']}" if group["frames"] else "")


def check_snapshot(snapshot: Snapshot | str | dict, *, pools: str = "graph", max_stranded: int = 0) -> CheckResult:
    """Whether no graph pool (`pools="all"`: no pool) stranded more than `max_stranded` bytes on any stream.

    Walks every device that has a trace. Raises `KitError` without a trace
    (memory history recorded with enabled="all"), with `pools` or
    `max_stranded` out of range, with a malformed capture window, and when a
    device's trace does not replay to the snapshot (the verdict could not be
    trusted).
    """
    if pools not in POOLS:
        raise KitError(f"--pools {pools!r}: expected one of {', '.join(POOLS)}")
    if isinstance(max_stranded, bool) or not isinstance(max_stranded, int) or max_stranded < 0:
        raise KitError(f"--max-stranded {max_stranded!r}: expected a number of bytes, 0 or more")
    snap = load_snapshot(snapshot)
    devices = [d for d, columns in sorted(snap.trace_columns.items()) if len(columns) >= 2]
    if not snap.has_trace or not devices:
        raise KitError(
            f"{snap.origin}: `check` needs a trace, and this snapshot has none: record it with "
            "torch.cuda.memory._record_memory_history() on before the graphs are captured"
        )
    checked_capture_windows(snap)
    offending = []
    for device in devices:
        replay = replay_trace(snap, device)
        if replay.mismatches:
            raise KitError(_no_replay(snap, device, replay.mismatches))
        report = stranding_report(snap, replay, min_bytes=0)
        for row in report.to_dict(orient="records"):
            if pools == "graph" and tuple(row["pool"]) == DEFAULT_POOL:
                continue
            if row["stranded_bytes"] > max_stranded:
                offending.append(_group(row, device))
    offending.sort(key=lambda g: (tuple(g["pool"]) == DEFAULT_POOL, -g["stranded_bytes"]))  # as the verdicts
    return CheckResult(not offending, offending, snap.source_label, pools, max_stranded)


def _no_replay(snap: Snapshot, device: int, mismatches: list[str]) -> str:
    """One line: the trace does not replay, how many differences and the first, and that no verdict is given."""
    return (
        f"{snap.origin}: device {device}'s trace does not replay to the snapshot ({len(mismatches)} mismatch(es); "
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


def assert_no_stranding(snapshot: Snapshot | str | dict, *, pools: str = "graph", max_stranded: int = 0) -> CheckResult:
    """Raise `AssertionError`, one line per offending group, if a graph pool stranded more than `max_stranded` bytes.

    For a pytest test of a capture path: record the capture with memory history
    on, then `kit.assert_no_stranding(snapshot)`. Returns the `CheckResult`
    when it passes. A snapshot `check_snapshot` cannot judge (no trace, a
    malformed capture window, a trace that does not replay) raises its
    `KitError`, not `AssertionError`: the test errors, naming the cause.
    """
    result = check_snapshot(snapshot, pools=pools, max_stranded=max_stranded)
    if not result.ok:
        raise AssertionError("\n".join([result.summary(), *result.lines()]))
    return result

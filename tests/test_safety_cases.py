"""The safety verdict for a replay allocation over each kind of block a model graph holds across its eager break.

One small trace, built here entry by entry: a model capture of two graphs
around an eager break holds three graph-pool blocks when the break begins:

- `INPUT`, which the break reads and the forward keeps bound to its end (a
  break input, as DeepSeek-V4.1's `residual`): nothing reads it after the break;
- `AUX`, which the break does not read and the forward keeps to its end (an
  early aux hidden state): the model graph may read it after the break;
- `RELEASED`, freed as the break returns, before the next graph's first
  allocation (the hidden states the break gathered from).

Then a replay capture allocates over one of them. Only `AUX` is a conflict: a
replay graph that runs in the break would overwrite what the model graph still
reads (`kit.analysis.liveness`). From the trace alone, without the break's
reads, `INPUT` cannot be told from `AUX` and counts as a conflict too (the safe
side), which the verdict says.
"""

from __future__ import annotations

import pytest

from kit import liveness_table
from kit.analysis.liveness import BREAK_INPUT, HELD, RELEASED, liveness_verdicts

from .helpers import KIB, MIB, segment

STREAM, POOL = 7, (0, 1)
GRAPH_POOL, EAGER = 0x1000_0000, 0x2000_0000
INPUT, AUX, FREED, NEXT = (GRAPH_POOL + i * 64 * KIB for i in range(4))
MODEL, REPLAY = "model graphs 64", "replay graphs 32"
BREAK_READS = {(MODEL, 0): [(INPUT, INPUT + 64 * KIB)]}


def _snapshot(replay_over: int) -> dict:
    """The model capture and its break, then a replay capture allocating 64 KiB at `replay_over`."""
    trace, captures = [], []

    def entry(action: str, addr: int, size: int = 64 * KIB) -> None:
        frames = [{"filename": "/x/model.py", "line": 10 + len(trace), "name": "forward"}]
        trace.append({"action": action, "addr": addr, "size": size, "stream": STREAM, "frames": frames})

    def free(addr: int) -> None:
        entry("free_requested", addr)
        entry("free_completed", addr)

    def graph(capture: str, manager: str, size: int, index: int, begin: int) -> None:
        window = {"trace_begin": begin, "trace_end": len(trace), "stream": STREAM, "pool": list(POOL)}
        captures.append(
            {"graph": f"{capture} graph {index}", "capture": capture, "manager": manager, "size": size}
            | {"index": index}
            | window
        )

    entry("segment_alloc", EAGER, 2 * MIB)
    entry("segment_alloc", GRAPH_POOL, 2 * MIB)
    for addr in (INPUT, AUX, FREED):
        entry("alloc", addr)
    graph(MODEL, "model graphs", 64, 0, 0)
    entry("alloc", EAGER)  # the break: it reads INPUT and FREED, and allocates its output outside the pool
    free(EAGER)
    free(FREED)  # the forward drops the gathered hidden states as the break returns
    begin = len(trace)
    entry("alloc", NEXT)  # the next graph's first allocation
    for addr in (NEXT, INPUT, AUX):  # INPUT and AUX stay bound to the forward's end
        free(addr)
    graph(MODEL, "model graphs", 64, 1, begin)
    begin = len(trace)
    entry("alloc", replay_over)
    free(replay_over)
    graph(REPLAY, "replay graphs", 32, 0, begin)
    segments = [
        segment(GRAPH_POOL, [(2 * MIB, "inactive")], stream=STREAM, pool=POOL),
        segment(EAGER, [(2 * MIB, "inactive")], stream=STREAM),
    ]
    return {"segments": segments, "device_traces": [trace], "kit": {"captures": captures}}


def _row(liveness, addr: int) -> dict:
    (row,) = liveness.rows[liveness.rows["addr"] == addr].to_dict("records")
    return row


SAFE_REUSE = f"{MODEL}: safe: 192.00 KiB held across 1 break (64.00 KiB {RELEASED}, 64.00 KiB {BREAK_INPUT}, "
SAFE_REUSE += f"64.00 KiB {HELD}); replay graphs reuse 64.00 KiB that nothing reads after the break"
CONFLICT = (
    f"{MODEL}: CONFLICT: 64.00 KiB in 1 block(s) held after the break (first at {AUX:#x}, allocated at forward "
    f"(model.py:13)) are written over by {REPLAY}, which may run in the break"
)

CASES = {  # block the replay graph allocates over -> (its class, conflict, the verdict)
    "break input": (INPUT, BREAK_INPUT, False, SAFE_REUSE),
    "early aux": (AUX, HELD, True, CONFLICT),
    "released by the break": (FREED, RELEASED, False, SAFE_REUSE),
}


@pytest.mark.parametrize("case", CASES)
def test_a_replay_allocation_over_each_kind_of_held_block_gets_its_verdict(case):
    over, kind, conflict, verdict = CASES[case]
    found = liveness_table(_snapshot(over), break_reads=BREAK_READS)
    assert found.break_reads_known
    assert {addr: _row(found, addr)["class"] for addr in (INPUT, AUX, FREED)} == {
        INPUT: BREAK_INPUT,
        AUX: HELD,
        FREED: RELEASED,
    }
    row = _row(found, over)
    assert (row["class"], row["overlapping_replay"], row["replay_in_break"]) == (kind, [REPLAY], [REPLAY])
    assert row["conflict"] is conflict
    assert found.rows["conflict"].sum() == int(conflict)  # only the block under the replay graph can conflict
    assert liveness_verdicts(found) == [verdict]


def test_from_the_trace_alone_a_break_input_counts_as_held_and_the_verdict_says_why():
    found = liveness_table(_snapshot(INPUT))
    assert not found.break_reads_known
    assert _row(found, INPUT)["class"] == HELD and _row(found, INPUT)["conflict"]
    assert _row(found, FREED)["class"] == RELEASED
    (verdict,) = liveness_verdicts(found)
    assert verdict == (
        f"{MODEL}: CONFLICT: 64.00 KiB in 1 block(s) held after the break (first at {INPUT:#x}, allocated at "
        f"forward (model.py:12)) are written over by {REPLAY}, which may run in the break (the breaks' reads "
        "unrecorded: held may include break inputs)"
    )
    # released by the break stays safe from the trace alone
    assert liveness_verdicts(liveness_table(_snapshot(FREED)))[0].startswith(f"{MODEL}: safe: ")


def test_a_replay_graph_that_does_not_run_in_the_break_is_no_conflict_even_over_the_early_aux():
    found = liveness_table(_snapshot(AUX), break_reads=BREAK_READS, replay_size_for=lambda size: size // 4)
    row = _row(found, AUX)
    assert (row["overlapping_replay"], row["replay_in_break"], row["conflict"]) == ([REPLAY], [], False)
    assert liveness_verdicts(found)[0].endswith(
        f"held after the break is reused only by {REPLAY}, which does not run in this break"
    )

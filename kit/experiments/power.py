"""A pairing's power: whether its check against eager could have failed, measured by a positive control on the GPU.

A pairing (model graph N, replay graph R in N's eager break) is checked by
comparing N's outputs with eager ones. A write by R can change them only
through a graph-pool value N reads after R and that was written before it:
R's own outputs, which the break reads as R's result, are not such a value.
The control plants the worst such interference a replay graph could make:
right after R replays, every byte of the graph pool except R's outputs is
overwritten with `POISON` (0xFF bytes: NaN in bfloat16, float16 and float32)
by `PoolPoison`, the forward goes on, and N's outputs are compared with the
same forward without the poison, graph against graph, bit for bit (no
numerics noise: the same graphs on the same inputs). Where they change, a
write by R to what N still reads would have shown: the pairing has power.
Where they stay bit-exact, N reads nothing from the graph pool after R but
R's outputs, so no replay graph's writes there could change them: the
comparison cannot fail, and the pairing is not counted as shown (whatever is
safe there is safe by the structure, not shown by the run).

The control also catches a masked check: had anything run after R in the
break and rewritten what R could reach (as the earlier adversary's own
replay graph did for model graph 2048 at the large preset), the poison
would be rewritten too and the pairing would come out without power.

The pool is put back as it was when poisoned once the forward is over
(`PoolPoison.restore`), so no later run sees the poison. `power_fields` makes
a pairing's `power`, `power_reason` and the control's figures; `power_clause`
says, for a set of pairings, how many are shown and which are not, and why.
A recording made before the control has no `power`: its pairings are "power
not recorded", never counted as shown.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kit.analysis.equivalence import compare_forward

POISON = 0xFF  # every byte: NaN in bfloat16, float16 and float32
POWER_KEYS = ("power", "power_reason")
SHOWN = (
    "the graph pool poisoned right after R (R's outputs kept) changed {outputs}: a write by R to what N reads after "
    "it would have shown"
)
NOTHING_READ = (
    "N reads no graph-pool byte after R but R's outputs: the whole pool poisoned right after R left N's outputs "
    "bit-exact, so no replay graph's writes could show"
)
CONTROL = (
    "power: the pairing's graph run again with every graph-pool byte but R's outputs set to 0xFF (NaN) right after R "
    "replays, against the unpoisoned run, bit for bit; a pairing whose outputs do not change could not have failed"
)
FAILED = (
    "the check failed: N's outputs differ from eager, so it could fail (the poison, R's outputs kept, changed none)"
)
NOT_RECORDED = "power not recorded (a recording made before the positive control)"
NOT_RUN = "the positive control did not run: {why}"


# --- the poison (CUDA, or any device for the tests) ----------------------------------------------


def graph_pool_segments(pool: Sequence[int], device) -> list:
    """The graph pool `pool`'s segments on `device`, each as a uint8 tensor over its bytes (torch's memory snapshot)."""
    import torch

    wanted = tuple(int(p) for p in pool)
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    views = []
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device") != index or tuple(segment.get("segment_pool_id", ())) != wanted:
            continue
        views.append(byte_view(int(segment["address"]), int(segment["total_size"]), torch.device("cuda", index)))
    return views


def byte_view(address: int, size: int, device) -> Any:
    """A uint8 tensor over `size` bytes at `address`, owning nothing (as vLLM's weak references do)."""
    import torch

    storage = torch._C._construct_storage_from_data_pointer(address, device, size)
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (size,), (1,))


def _tensors(outputs: Any) -> list:
    import torch

    if isinstance(outputs, torch.Tensor):
        return [outputs]
    if isinstance(outputs, list | tuple):
        return [t for o in outputs for t in _tensors(o)]
    return []


class PoolPoison:
    """Poisons a graph pool's bytes but the given outputs' (`__call__`), and puts the pool back (`restore`)."""

    def __init__(self, segments: list) -> None:
        self.segments = segments
        self.saved: list | None = None
        self.calls = 0

    @classmethod
    def of(cls, pool: Sequence[int], device) -> PoolPoison:
        """The poison of graph pool `pool` on `device` (CUDA)."""
        return cls(graph_pool_segments(pool, device))

    @property
    def nbytes(self) -> int:
        return sum(int(s.numel()) for s in self.segments)

    def __call__(self, keep: Any) -> None:
        """Every pool byte to `POISON`, but the bytes of the tensors in `keep` (R's outputs): they keep their values.

        The pool as it was is saved first, for `restore`. Runs under inference mode: R's outputs are inference
        tensors when the forward ran under it, as vLLM's do, and only inference mode may write them in place.
        """
        import torch

        with torch.inference_mode():
            kept = [(t, t.clone()) for t in _tensors(keep)]
            self.saved = [s.clone() for s in self.segments]
            for segment in self.segments:
                segment.fill_(POISON)
            for tensor, values in kept:
                tensor.copy_(values)
        self.calls += 1

    def restore(self) -> None:
        """The pool's bytes as they were when poisoned (nothing if it was not)."""
        import torch

        if self.saved is not None:
            with torch.inference_mode():
                for segment, saved in zip(self.segments, self.saved, strict=True):
                    segment.copy_(saved)
        self.saved = None


# --- a pairing's power -----------------------------------------------------------------------------


def power_fields(names: list[str], poisoned: tuple, graph: tuple, failed: bool = False) -> dict:
    """A pairing's `power` and `power_reason`, and the control's figures: the poisoned forward against the same
    forward without the poison (`(hidden_states, aux_hidden_states)` each), bit for bit.

    A check that `failed` (N's outputs differ from eager) could fail: it has power even where the poison changed
    nothing (R's outputs, kept, may cover all that R overwrote of what N reads after it).
    """
    control = compare_forward(names, poisoned, graph)
    changed = not control["bit_exact"]
    power = changed or failed
    if changed:
        reason = SHOWN.format(outputs=", ".join(control["differing_outputs"]))
    else:
        reason = FAILED if failed else NOTHING_READ
    return {
        "power": power,
        "power_reason": reason,
        "power_differing_outputs": control["differing_outputs"],
        "power_max_abs_diff": control["max_abs_diff"],
    }


def not_run(why: str) -> dict:
    """The fields of a pairing whose control did not run: no power claimed."""
    return {"power": None, "power_reason": NOT_RUN.format(why=why)}


def has_power(row: Any) -> bool:
    """Whether a pairing counts as shown: its control ran and changed N's outputs (never for an old recording)."""
    import numpy as np

    value = row.get("power")
    return isinstance(value, bool | np.bool_) and bool(value)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)  # None, or NaN as pandas fills a gap


def reason_of(row: Any) -> str:
    """Why a pairing has no power: its recorded reason, or `NOT_RECORDED`."""
    if _missing(row.get("power")):
        reason = row.get("power_reason")
        return reason if isinstance(reason, str) and reason.startswith(NOT_RUN.split("{")[0]) else NOT_RECORDED
    return str(row.get("power_reason") or NOTHING_READ)


def power_clause(rows: Iterable[Any]) -> str:
    """`k of n pairings shown (with power); m without power: (N, R), ... because ...`, one group per reason."""
    rows = list(rows)
    if rows and all(reason_of(r) == NOT_RECORDED for r in rows):
        return f"{NOT_RECORDED}: none of these {len(rows)} pairings is counted as shown"
    shown = [r for r in rows if has_power(r)]
    clause = f"{len(shown)} of {len(rows)} pairings shown (with power)"
    without = [r for r in rows if not has_power(r)]
    if not without:
        return clause
    groups: dict[str, list[str]] = {}
    for r in without:
        groups.setdefault(_short(reason_of(r)), []).append(f"({int(r['model_size'])}, {int(r['replay_size'])})")
    said = "; ".join(f"{', '.join(pairs)} because {reason}" for reason, pairs in groups.items())
    return f"{clause}; {len(without)} without power: {said}"


def _short(reason: str) -> str:
    """A reason in a verdict: up to its first colon (the rest is in each pairing's `power_reason`)."""
    return reason if reason == NOT_RECORDED else reason.split(":")[0]

"""The read/write recorder: the device bytes every aten op reads and writes, by phase.

While a `ReadWriteRecorder` is active (a `TorchDispatchMode`, so it sees
every aten op, eager or during CUDA graph capture), each op run inside a
phase (`recorder.phase(...)`, `kit.analysis.readwrite.Phase`) adds:

- a read for every tensor argument, except the arguments an op only writes:
  `out=` arguments and the `self` of `copy_`, `fill_`, `zero_` and the
  random fills;
- a write for every argument the op's schema marks written (`Tensor(a!)`:
  in-place ops and `out=`), and for every fresh output (a return with no
  alias), except the uninitialised outputs of `empty` and its kin;
- a `fresh` mark for those uninitialised outputs: bytes the op returned
  without writing them (see "What the recorder cannot see" below);
- nothing for ops that touch no data: views, in-place view ops (`set_`,
  `t_`, `as_strided_`, tagged `inplace_view`) and `record_stream`.

A tensor's bytes are its elements' bytes (`element_spans`): a strided view
(a column slice, a transpose) is the set of its elements' byte ranges, its
contiguous inner dimensions coalesced into runs, not the hull from its first
to its last element, so a `copy_` into one column writes that column and not
the columns between its elements. A view of more than `MAX_SPANS` runs is
recorded conservatively: a read as its hull (`byte_span`: reading more can
only find more carried bytes), a write as `may_write` over its hull (never as
a write: a write that covered bytes it did not write would hide later reads
of values carried across R; `kit.analysis.readwrite` counts `may_write` bytes
as written by a replay graph, and as rewritten by nobody).

An op the dispatcher runs as its CompositeImplicitAutograd decomposition
(`linear`, `rms_norm`, which reach a dispatch mode whole under
`inference_mode`) is run as that decomposition with the recorder active, so
the ops inside it and the temporaries they write are recorded one by one
(`runs_its_decomposition`). Ops with a kernel of their own (an explicit
composite, a CUDA kernel) are recorded by their arguments and outputs: what
such a kernel allocates and writes inside it is not seen; the lifetime
analysis, which sees every allocation, is the check on that.

What the recorder cannot see: a kernel launched outside the dispatcher (a
Triton kernel called directly, as vLLM's `hc_collapse_triton` is in
DeepSeek-V4.1's forward; DeepGEMM; NCCL through ctypes) is no aten op, so
neither its reads nor its writes are recorded. Such a kernel typically
writes an output made by `torch.empty`: the recorder marks those bytes
`fresh`, and `kit.analysis.readwrite` reports a later read of fresh bytes that
no recorded op wrote as "written outside the dispatcher"
(`unseen_writer_reads`, the `unseen_writer_bytes` column): never as a value
carried across R. The reads of such a kernel stay unseen; a kernel outside
the dispatcher that writes memory an aten op made (not an `empty`) is not
detected at all.

Ops outside any phase (warm-ups, the recorder's own work) are not recorded.
The recorder keeps integers only, never a tensor, so it changes no lifetime
the capture recorder sees. `note_reads` records reads that happen outside
the ops (a graph's outputs, which its caller reads after the forward).
`kit.analysis.readwrite` reads the result; on the CPU it works on eager
tensors alike, their addresses being their `data_ptr`s.

    with ReadWriteRecorder() as rw, rw.phase(model_segment(512, 0)):
        ...
    readwrite_table(rw.recording())
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator
from typing import Any

from kit.analysis.readwrite import FRESH, MAY_WRITE, READ, WRITE, Access, Phase, ReadWriteRecording

# In-place ops that overwrite `self` without reading it.
WRITE_ONLY = {"copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "exponential_", "geometric_"}
WRITE_ONLY |= {"cauchy_", "log_normal_"}
# Factories whose output holds no written values.
UNWRITTEN = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided"}
# Ops that touch no data: `record_stream`, and vLLM's `weak_ref_tensor` (a view whose schema declares no alias,
# so it would otherwise count as writing its output).
NO_DATA = {"record_stream", "weak_ref_tensor"}
# The most byte ranges one tensor's elements are recorded as; a view of more runs falls back to its hull.
MAX_SPANS = 16384


def tensors_in(value: Any) -> list:
    """The tensors in an argument or a return: a tensor, or a list or tuple of them (nested)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in tensors_in(v)]
    return []


def byte_span(t) -> tuple[int, int] | None:
    """The bytes `[start, end)` a strided tensor's view can reach in its storage (its hull); None for no elements."""
    import torch

    if t.layout != torch.strided or t.device.type == "meta" or t.numel() == 0:
        return None
    last = sum((n - 1) * abs(stride) for n, stride in zip(t.shape, t.stride(), strict=True))
    start = t.data_ptr()
    return start, start + (last + 1) * t.element_size()


def element_spans(t, limit: int | None = None) -> list[tuple[int, int]] | None:
    """The bytes of a strided tensor's elements, as sorted, disjoint `[start, end)` ranges; None over `limit` ranges
    (`MAX_SPANS` unless given).

    Dimensions of one element or of stride 0 (a broadcast repeats its
    elements) are dropped; the innermost dimensions whose strides make one
    contiguous run are coalesced; the rest give one run per index. No
    elements (or no strided layout) give [].
    """
    import numpy as np

    if byte_span(t) is None:
        return []
    dims = sorted(((s, n) for n, s in zip(t.shape, t.stride(), strict=True) if n > 1 and s != 0), reverse=True)
    run = 1  # elements in one contiguous run
    while dims and dims[-1][0] == run:
        run *= dims.pop()[1]
    count = 1
    for _, n in dims:
        count *= n
    if count > (MAX_SPANS if limit is None else limit):
        return None
    offsets = np.zeros(1, dtype=np.int64)
    for stride, n in dims:
        offsets = (offsets[:, None] + np.arange(n, dtype=np.int64) * stride).ravel()
    size, length = t.element_size(), run * t.element_size()
    starts = np.unique(offsets) * size + t.data_ptr()  # sorted; runs of one length merge where they touch or overlap
    first = np.flatnonzero(np.r_[True, starts[1:] > starts[:-1] + length])
    last = np.r_[first[1:] - 1, len(starts) - 1]
    return list(zip(starts[first].tolist(), (starts[last] + length).tolist(), strict=True))


def read_ranges(t) -> list[tuple[int, int]]:
    """What reading `t` reads: its elements' bytes, or over `MAX_SPANS` runs its hull (reading more is conservative)."""
    spans = element_spans(t)
    if spans is None:
        return [byte_span(t)]
    return spans


def tensor_reads(values: Iterable) -> list[tuple[int, int]]:
    """The byte ranges the tensors in `values` (arguments, returns) are read at."""
    return [s for t in tensors_in(list(values)) for s in read_ranges(t)]


def read_spans(func, args: tuple, kwargs: dict) -> list[tuple[int, int]] | None:
    """The spans an op reads (taken before it runs); None for an op that touches no data."""
    import torch

    name = func.overloadpacket.__name__
    if func.is_view or torch.Tag.inplace_view in func.tags or name in NO_DATA:
        return None
    reads = []
    for i, arg in enumerate(func._schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(arg.name)
        info = arg.alias_info
        written = info is not None and info.is_write
        if written and (getattr(arg, "is_out", arg.kwarg_only) or name in WRITE_ONLY):  # out=
            continue
        reads += tensor_reads([value])
    return reads


def write_spans(func, args: tuple, kwargs: dict, out: Any) -> dict[str, list[tuple[int, int]]]:
    """What an op wrote (taken after it ran), by kind: `WRITE` its arguments marked written and its fresh outputs,
    element by element; `MAY_WRITE` the hulls of those over `MAX_SPANS` runs; `FRESH` the outputs of `empty` and
    its kin, which hold no written value."""
    written: list = []
    schema = func._schema
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            written += tensors_in(args[i] if i < len(args) else kwargs.get(arg.name))
    outs = (out,) if len(schema.returns) == 1 else tuple(out or ())
    fresh_returns = [v for ret, v in zip(schema.returns, outs, strict=False) if ret.alias_info is None]
    returned = tensors_in(fresh_returns)
    spans: dict[str, list[tuple[int, int]]] = {WRITE: [], MAY_WRITE: [], FRESH: []}
    if func.overloadpacket.__name__ in UNWRITTEN:
        spans[FRESH] = tensor_reads(returned)  # the bytes it returned, unwritten (a hull over MAX_SPANS: all of them)
    else:
        written += returned
    for t in written:
        exact = element_spans(t)
        if exact is None:
            spans[MAY_WRITE].append(byte_span(t))
        else:
            spans[WRITE] += exact
    return spans


def runs_its_decomposition(func, args: tuple, kwargs: dict) -> bool:
    """Whether the dispatcher runs `func` as its CompositeImplicitAutograd decomposition on these tensors.

    So it does when the op has such a kernel and none that comes first for the
    tensors' backend (a CUDA or CPU kernel, or an explicit composite). Under
    `inference_mode` these ops reach a dispatch mode whole; the recorder runs
    their decomposition with itself active, so it sees the ops inside and the
    temporaries they write, as the plain dispatcher would have run them.
    """
    import torch

    def has(key: str) -> bool:
        return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), key)

    if not has("CompositeImplicitAutograd"):
        return False
    backend = "CUDA" if any(t.is_cuda for t in tensors_in([args, list(kwargs.values())])) else "CPU"
    return not any(has(k) for k in (backend, "CompositeExplicitAutogradNonFunctional", "CompositeExplicitAutograd"))


@functools.cache
def _mode_class():
    from torch.utils._python_dispatch import TorchDispatchMode

    class ReadWriteMode(TorchDispatchMode):
        """Runs every aten op as usual, then tells the recorder what it read and wrote."""

        def __init__(self, recorder: ReadWriteRecorder) -> None:
            super().__init__()
            self.recorder = recorder

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if runs_its_decomposition(func, args, kwargs):
                with self:
                    return func.decompose(*args, **kwargs)
            phase = self.recorder.current_phase
            reads = read_spans(func, args, kwargs) if phase is not None else None
            out = func(*args, **kwargs)
            if reads is not None:
                written = write_spans(func, args, kwargs, out)
                self.recorder.add(phase, str(func), reads, written[WRITE], written[MAY_WRITE], written[FRESH])
            return out

    return ReadWriteMode


class ReadWriteRecorder:
    """Records the bytes each aten op reads and writes while a phase is set; see the module docstring."""

    def __init__(self) -> None:
        self.accesses: list[Access] = []
        self.current_phase: Phase | None = None
        self._seq = 0
        self._mode = None

    def __enter__(self) -> ReadWriteRecorder:
        self._mode = _mode_class()(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        mode, self._mode = self._mode, None
        mode.__exit__(*exc)

    @contextlib.contextmanager
    def phase(self, phase: Phase | None) -> Iterator[Phase | None]:
        """Record the enclosed ops under `phase`; the phase before comes back at the end."""
        previous = self.current_phase
        self.current_phase = phase
        try:
            yield phase
        finally:
            self.current_phase = previous

    def set_phase(self, phase: Phase | None) -> None:
        """Move on to `phase` within an enclosing `phase(...)` block (which restores the one before it)."""
        self.current_phase = phase

    def add(
        self,
        phase: Phase,
        op: str,
        reads: Iterable[tuple[int, int]],
        writes: Iterable[tuple[int, int]],
        may_write: Iterable[tuple[int, int]] = (),
        fresh: Iterable[tuple[int, int]] = (),
    ) -> None:
        """One op's accesses under one sequence number: its reads first, then its writes (exact, then the hulls of
        writes too large to list), then the bytes it returned unwritten."""
        seq, self._seq = self._seq, self._seq + 1
        for kind, spans in ((READ, reads), (WRITE, writes), (MAY_WRITE, may_write), (FRESH, fresh)):
            self.accesses += [Access(seq, phase, op, kind, s, e) for s, e in spans]

    def note_reads(self, value: Any, op: str) -> None:
        """Reads of the tensors in `value` outside any op (a graph's outputs, read by its caller), in this phase."""
        if self.current_phase is not None:
            self.add(self.current_phase, op, tensor_reads([value]), [])

    def recording(self) -> ReadWriteRecording:
        return ReadWriteRecording(list(self.accesses))

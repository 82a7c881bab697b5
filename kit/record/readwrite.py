"""The read/write recorder: the device bytes every aten op reads and writes, by phase.

While a `ReadWriteRecorder` is active (a `TorchDispatchMode`, so it sees
every aten op, eager or during CUDA graph capture), each op run inside a
phase (`recorder.phase(...)`, `kit.analysis.readwrite.Phase`) adds:

- a read for every tensor argument, as the byte range its view spans in its
  storage (`data_ptr` to the last element it can reach), except the
  arguments an op only writes: `out=` arguments and the `self` of `copy_`,
  `fill_`, `zero_` and the random fills;
- a write for every argument the op's schema marks written (`Tensor(a!)`:
  in-place ops and `out=`), and for every fresh output (a return with no
  alias), except the uninitialised outputs of `empty` and its kin;
- nothing for ops that touch no data: views, in-place view ops (`set_`,
  `t_`, `as_strided_`, tagged `inplace_view`) and `record_stream`.

An op the dispatcher runs as its CompositeImplicitAutograd decomposition
(`linear`, `rms_norm`, which reach a dispatch mode whole under
`inference_mode`) is run as that decomposition with the recorder active, so
the ops inside it and the temporaries they write are recorded one by one
(`runs_its_decomposition`). Ops with a kernel of their own (an explicit
composite, a CUDA kernel) are recorded by their arguments and outputs: what
such a kernel allocates and writes inside it is not seen; the lifetime
analysis, which sees every allocation, is the check on that.

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

from kit.analysis.readwrite import READ, WRITE, Access, Phase, ReadWriteRecording

# In-place ops that overwrite `self` without reading it.
WRITE_ONLY = {"copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "exponential_", "geometric_"}
WRITE_ONLY |= {"cauchy_", "log_normal_"}
# Factories whose output holds no written values.
UNWRITTEN = {"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided"}
# Ops that touch no data: `record_stream`, and vLLM's `weak_ref_tensor` (a view whose schema declares no alias,
# so it would otherwise count as writing its output).
NO_DATA = {"record_stream", "weak_ref_tensor"}


def tensors_in(value: Any) -> list:
    """The tensors in an argument or a return: a tensor, or a list or tuple of them (nested)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in tensors_in(v)]
    return []


def byte_span(t) -> tuple[int, int] | None:
    """The bytes `[start, end)` a strided tensor's view can reach in its storage; None for no elements."""
    import torch

    if t.layout != torch.strided or t.device.type == "meta" or t.numel() == 0:
        return None
    last = sum((n - 1) * abs(stride) for n, stride in zip(t.shape, t.stride(), strict=True))
    start = t.data_ptr()
    return start, start + (last + 1) * t.element_size()


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
        reads += [s for s in map(byte_span, tensors_in(value)) if s]
    return reads


def write_spans(func, args: tuple, kwargs: dict, out: Any) -> list[tuple[int, int]]:
    """The spans an op wrote: its arguments marked written, and its fresh outputs (taken after it ran)."""
    writes = []
    schema = func._schema
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            writes += [s for s in map(byte_span, tensors_in(value)) if s]
    if func.overloadpacket.__name__ not in UNWRITTEN:
        outs = (out,) if len(schema.returns) == 1 else tuple(out or ())
        for ret, value in zip(schema.returns, outs, strict=False):
            if ret.alias_info is None:
                writes += [s for s in map(byte_span, tensors_in(value)) if s]
    return writes


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
                self.recorder.add(phase, str(func), reads, write_spans(func, args, kwargs, out))
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

    def add(self, phase: Phase, op: str, reads: Iterable[tuple[int, int]], writes: Iterable[tuple[int, int]]) -> None:
        """One op's accesses: its reads first, then its writes, under one sequence number."""
        seq, self._seq = self._seq, self._seq + 1
        self.accesses += [Access(seq, phase, op, READ, s, e) for s, e in reads]
        self.accesses += [Access(seq, phase, op, WRITE, s, e) for s, e in writes]

    def note_reads(self, value: Any, op: str) -> None:
        """Reads of the tensors in `value` outside any op (a graph's outputs, read by its caller), in this phase."""
        if self.current_phase is not None:
            self.add(self.current_phase, op, [s for s in map(byte_span, tensors_in(value)) if s], [])

    def recording(self) -> ReadWriteRecording:
        return ReadWriteRecording(list(self.accesses))

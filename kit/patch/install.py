"""Installing replacement functions in running code, all or nothing, and taking them back.

A `Patch` is a set of attribute replacements (module functions, methods)
applied together and reverted together: if one replacement fails, those
already made are undone before the error propagates, and `revert()` puts
back every original object (an attribute a class inherited, or one the
patch added, is deleted again rather than left behind as a copy). The PR's
functions that `kit.patch.source` compiles are installed this way
(`kit.patch.pr`), and so are the capture recorder's hooks.

Applying and reverting are atomic against Ctrl-C: a KeyboardInterrupt that
arrives meanwhile is held back until the patch is wholly on or wholly off
(`interrupts_deferred`), so an interrupted run never leaves half a patch.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kit.errors import KitError

Replacement = tuple[Any, str, Callable[..., Any]]


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold back a Ctrl-C (SIGINT) that arrives in the block and raise it once the block is done.

    Only the main thread receives KeyboardInterrupt, so elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield  # not the main thread, or a handler installed outside Python, which cannot be put back
        return
    pending: list[Any] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(frame))
    except (ValueError, TypeError, OSError):  # no signals here (an embedded interpreter)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending and callable(previous):
            previous(signal.SIGINT, pending[0])


_ABSENT = object()  # an attribute the owner did not hold itself (inherited, or added by the patch)


class Patch:
    """Attribute replacements applied and reverted as one; a context manager too."""

    def __init__(self, name: str, replacements: list[Replacement], *, additions: Sequence[Replacement] = ()) -> None:
        self.name = name
        self.replacements = replacements
        self.additions = list(additions)  # attributes the patch adds: they must not exist yet
        self.originals: list[tuple[Any, str, Any]] = []
        self._lock = threading.Lock()

    @property
    def applied(self) -> bool:
        return bool(self.originals)

    def apply(self) -> Patch:
        with self._lock, interrupts_deferred():
            if self.applied:
                return self
            for owner, attr, _ in self.replacements:
                if not hasattr(owner, attr):
                    raise KitError(
                        f"{self.name}: {qualified_name(owner)} has no attribute {attr!r}; nothing was patched"
                    )
            for owner, attr, _ in self.additions:
                if hasattr(owner, attr):
                    raise KitError(f"{self.name}: {qualified_name(owner)} already has {attr!r}; nothing was patched")
            try:
                for owner, attr, new in [*self.replacements, *self.additions]:
                    original = vars(owner).get(attr, _ABSENT)
                    setattr(owner, attr, new)
                    self.originals.append((owner, attr, original))
            except BaseException:
                self._restore()
                raise
        return self

    def revert(self) -> None:
        with self._lock, interrupts_deferred():
            self._restore()

    def _restore(self) -> None:
        while self.originals:
            owner, attr, original = self.originals.pop()
            if original is _ABSENT:
                delattr(owner, attr)
            else:
                setattr(owner, attr, original)

    def targets(self) -> list[str]:
        """Where each replacement and addition goes, as `module.qualname.attr`."""
        return [f"{qualified_name(owner)}.{attr}" for owner, attr, _ in [*self.replacements, *self.additions]]

    def __enter__(self) -> Patch:
        return self.apply()

    def __exit__(self, *exc: object) -> None:
        self.revert()

    def __repr__(self) -> str:
        return f"<Patch {self.name}: {'applied' if self.applied else 'not applied'}>"


def qualified_name(owner: Any) -> str:
    """`module.Class` of a class, the name of a module."""
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}"
    return getattr(owner, "__name__", repr(owner))

"""Progress bars for the kit's long work: loads, walks, simulations, the scale generator, live runs.

One place decides whether a bar shows: work that ends within `DELAY`
seconds shows nothing; past that, a tqdm bar on stderr in a terminal, or a
widget in a notebook (`tqdm.notebook`). Nothing shows when stderr is not a
terminal (a pipe, a log file, CI) outside a notebook, after
`set_quiet(True)` (`python -m kit --quiet`, or `KIT_QUIET=1`), or where
tqdm is not installed (the bare GPU machine): the work runs the same either
way.

    with progress.bar("loading scale.pickle", total=size, unit="B") as bar:
        ...
        bar.update(n)

    for item in progress.track(items, "simulating"):
        ...
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

DELAY = 2.0  # seconds of work before a bar appears
T = TypeVar("T")
_quiet = os.environ.get("KIT_QUIET", "") not in ("", "0")


def set_quiet(quiet: bool) -> None:
    """Show no progress in this process (or show it again)."""
    global _quiet
    _quiet = quiet


def is_quiet() -> bool:
    return _quiet


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (where a bar is a widget)."""
    shell = sys.modules.get("IPython")
    ip = shell.get_ipython() if shell is not None and hasattr(shell, "get_ipython") else None
    return ip is not None and "IPKernelApp" in getattr(ip, "config", {})


def shown() -> bool:
    """Whether a bar would show at all: not quiet, and stderr a terminal or a notebook's."""
    if _quiet:
        return False
    try:
        terminal = sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stderr
        terminal = False
    return terminal or in_notebook()


class _Silent:
    """A bar that shows nothing."""

    def update(self, n: float = 1) -> None:
        pass

    def set_description(self, desc: str) -> None:
        pass


def _tqdm(desc: str, total: float | None, unit: str) -> Any | None:
    """A tqdm bar (a widget in a notebook), or None where tqdm is not installed."""
    options = {
        "desc": desc,
        "total": total,
        "unit": unit,
        "unit_scale": unit == "B",
        "unit_divisor": 1024 if unit == "B" else 1000,
        "delay": DELAY,
        "leave": False,
    }
    if in_notebook():
        try:
            from tqdm.notebook import tqdm as widget

            return widget(**options)
        except ImportError:  # no ipywidgets: text on stderr, as in a terminal
            pass
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(**options, file=sys.stderr)


@contextlib.contextmanager
def bar(desc: str, total: float | None = None, unit: str = "it") -> Iterator[Any]:
    """A progress bar (an object with `update(n)`) for work of `total` units; silent where nobody watches."""
    shown_bar = _tqdm(desc, total, unit) if shown() else None
    if shown_bar is None:
        yield _Silent()
        return
    try:
        yield shown_bar
    finally:
        shown_bar.close()


def track(items: Iterable[T], desc: str, total: int | None = None, *, every: int = 1) -> Iterator[T]:
    """`items`, one by one, with a bar while they take time; the bar moves every `every` items.

    Where no bar would show, `items` come back untouched (a hot loop pays nothing).
    """
    if not shown():
        return iter(items)
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    return _tracked(items, desc, total, every)


def _tracked(items: Iterable[T], desc: str, total: int | None, every: int) -> Iterator[T]:
    with bar(desc, total) as shown_bar:
        n = 0
        for item in items:
            yield item
            n += 1
            if n == every:
                shown_bar.update(n)
                n = 0
        shown_bar.update(n)

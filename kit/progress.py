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

Work whose length nobody knows (an import, a patch applied, a whole
experiment) shows the seconds it has taken instead: `working(desc)` around
it, or `watch_cells()` once in a notebook, which does that for every cell
(labelled by the cell's first comment line) so that no cell sits at `[*]`
for more than `DELAY` seconds without saying it is still working.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

DELAY = 2.0  # seconds of work before a bar appears
TICK = 0.5  # seconds between redraws of a `working` bar
WORKING_FORMAT = "{desc}: still working ({elapsed})"
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


def _tqdm(desc: str, total: float | None, unit: str, **extra: Any) -> Any | None:
    """A tqdm bar (a widget in a notebook), or None where tqdm is not installed."""
    options = {
        "desc": desc,
        "total": total,
        "unit": unit,
        "unit_scale": unit == "B",
        "unit_divisor": 1024 if unit == "B" else 1000,
        "delay": DELAY,
        "leave": False,
        **extra,
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


@contextlib.contextmanager
def working(desc: str, delay: float | None = None) -> Iterator[None]:
    """Work of unknown length: after `delay` (`DELAY`) seconds, a bar of `desc` and the time so far, until it ends."""
    if not shown():
        yield
        return
    done = threading.Event()
    # The thread runs in this context: in a kernel, that is what sends its bar to the running cell's output.
    ticker = threading.Thread(target=contextvars.copy_context().run, args=(_tick, desc, done, delay), daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()


def _tick(desc: str, done: threading.Event, delay: float | None) -> None:
    """Wait `delay` seconds for `done`; then show a bar of the elapsed time and redraw it until `done`."""
    delay = DELAY if delay is None else delay
    if done.wait(delay):
        return
    shown_bar = _tqdm(desc, None, "it", bar_format=WORKING_FORMAT, delay=0)
    if shown_bar is None:
        return
    try:
        while True:
            shown_bar.refresh()
            if done.wait(TICK):
                break
    finally:
        shown_bar.close()


_watching: dict[str, Any] = {}


def watch_cells() -> None:
    """In a notebook, wrap this cell's rest and every later cell in `working`; elsewhere do nothing.

    A later cell's bar is named by the cell's first comment line. This cell's shows at once: the import
    that brought this function already took its time.
    """
    if not in_notebook() or "shell" in _watching:
        return
    _watching["shell"] = ip = sys.modules["IPython"].get_ipython()
    ip.events.register("pre_run_cell", _cell_started)
    ip.events.register("post_run_cell", _cell_ended)
    _start_cell("importing the kit", 0.0)


def _cell_started(info: Any) -> None:
    _start_cell(cell_label(getattr(info, "raw_cell", "") or ""), None)


def _start_cell(desc: str, delay: float | None) -> None:
    _cell_ended()
    cell = working(desc, delay)
    cell.__enter__()
    _watching["cell"] = cell


def _cell_ended(*_: Any) -> None:
    cell = _watching.pop("cell", None)
    if cell is not None:
        cell.__exit__(None, None, None)


def cell_label(source: str) -> str:
    """What a cell's bar says: its first comment line (`# loading vLLM` -> "loading vLLM"), or "this cell"."""
    for line in source.splitlines():
        line = line.strip()
        if line.startswith("#") and not line.startswith("#!") and line.strip("# %"):
            return line.lstrip("#").strip()
        if line:
            break
    return "this cell"

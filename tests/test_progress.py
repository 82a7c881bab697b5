"""Progress bars (`kit.progress`): on a terminal once work takes time, silent in a pipe, when quiet, when quick.

A pseudo-terminal stands in for the user's: what the kit writes to stderr is
read back from it. `DELAY` is set to 0 where a test needs a bar to show at
once, and left at its two seconds where it must not.
"""

from __future__ import annotations

import ast
import fcntl
import os
import select
import struct
import sys
import termios
import time
from pathlib import Path

import pytest

import kit.load.cache
from kit import progress
from kit.cli import main
from kit.scale import main as generate
from kit.scale import write_scale_snapshot

from .helpers import RECORDED

ROOT = Path(__file__).resolve().parents[1]


class Terminal:
    """stderr replaced by a pseudo-terminal of 100 columns while in a `with`; `written()` reads what reached it.

    Installed inside the test's body: pytest puts its own stderr back between a fixture's setup and the test.
    """

    def __init__(self) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        self.tty = os.fdopen(slave, "w", buffering=1)
        self.out = b""

    def __enter__(self) -> Terminal:
        self.was, sys.stderr = sys.stderr, self.tty
        return self

    def __exit__(self, *exc) -> None:
        sys.stderr = self.was
        self.written()

    def written(self) -> str:
        self.tty.flush()
        while select.select([self.master], [], [], 0.1)[0]:
            self.out += os.read(self.master, 1 << 16)
        return self.out.decode(errors="replace")


@pytest.fixture
def terminal(monkeypatch):
    monkeypatch.setattr(progress, "_quiet", False)
    shown = Terminal()
    yield shown
    shown.tty.close()
    os.close(shown.master)


@pytest.fixture
def at_once(monkeypatch):
    monkeypatch.setattr(progress, "DELAY", 0)


def test_a_bar_shows_on_a_terminal(terminal, at_once):
    with terminal, progress.bar("loading x.pickle", total=1000, unit="B") as bar:
        bar.update(500)
    assert "loading x.pickle" in terminal.written()


def test_quick_work_shows_nothing(terminal):
    assert progress.DELAY == 2.0
    with terminal:
        with progress.bar("loading x.pickle", total=1000, unit="B") as bar:
            bar.update(1000)
        assert list(progress.track(range(100), "counting")) == list(range(100))
    assert terminal.written() == ""


def test_work_of_unknown_length_shows_its_time_so_far(terminal, monkeypatch):
    monkeypatch.setattr(progress, "DELAY", 0.2)
    with terminal:
        with progress.working("importing vLLM"):
            time.sleep(1.5)
        shown = terminal.written()
        with progress.working("a quick cell"):
            pass
    assert "importing vLLM: still working (00:01)" in shown, shown
    assert "a quick cell" not in terminal.written()


def test_a_cell_bar_is_named_by_the_cells_first_comment():
    assert progress.cell_label("# applying the PR to vLLM\npatch.apply()") == "applying the PR to vLLM"
    assert progress.cell_label("\n## the table\nx = 1") == "the table"
    assert progress.cell_label("x = 1\n# later") == "this cell"
    assert progress.cell_label("") == "this cell"


def test_nothing_shows_in_a_pipe(at_once, capsys, monkeypatch):
    monkeypatch.setattr(progress, "_quiet", False)
    with progress.bar("loading x.pickle", total=1000) as bar:
        bar.update(10)
    assert capsys.readouterr().err == ""


def test_quiet_shows_nothing(terminal, at_once, monkeypatch):
    progress.set_quiet(True)
    try:
        with terminal:
            assert list(progress.track([1, 2, 3], "counting")) == [1, 2, 3]
    finally:
        progress.set_quiet(False)
    assert terminal.written() == ""


def test_a_command_shows_its_load_and_quiet_hides_it(terminal, at_once, capsys):
    with terminal:
        assert main(["table", str(RECORDED["two_streams"])]) == 0
    assert "loading two_streams.pickle" in terminal.written()
    loud = len(terminal.out)
    with terminal:
        assert main(["--quiet", "table", str(RECORDED["two_streams"])]) == 0
        assert main(["table", str(RECORDED["two_streams"]), "--quiet"]) == 0
    assert len(terminal.out) == loud and not progress.is_quiet()  # nothing more, and the setting is put back
    assert "source:" in capsys.readouterr().out  # stdout is the same either way


def test_the_generator_shows_its_phases(terminal, at_once, tmp_path, capsys):
    with terminal:
        assert generate(["--out", str(tmp_path), "--scale", "0.002"]) == 0
    shown = terminal.written()
    for phase in ("simulating the workload", "dressing the trace like torch's", "writing scale.pickle"):
        assert phase in shown


@pytest.fixture
def bars(monkeypatch) -> list:
    """The bars `kit.progress` opens, as recorders of their description, total, unit and count."""
    opened = []

    class Recorder:
        def __init__(self, desc, total, unit):
            self.desc, self.total, self.unit, self.n = desc, total, unit, 0
            opened.append(self)

        def update(self, n=1):
            self.n += n

        def close(self):
            pass

    monkeypatch.setattr(progress, "shown", lambda: True)
    monkeypatch.setattr(progress, "_tqdm", Recorder)
    return opened


def test_the_load_bar_counts_every_byte_of_the_file(at_once, tmp_path, bars):
    path = tmp_path / "scale.pickle"
    write_scale_snapshot(path, seed=1, scale=0.002)
    bars.clear()  # the generator's own bar
    kit.load.snapshot.load_snapshot(path, cache=False)
    (bar,) = bars
    assert bar.desc == "loading scale.pickle" and bar.unit == "B" and bar.total == path.stat().st_size
    assert bar.total <= bar.n < bar.total + 200  # the file, and the few bytes the stream splices in


@pytest.mark.parametrize("every", [1, 3, 4, 10, 11])
def test_a_tracked_bar_ends_at_its_total(at_once, bars, every):
    """The last items, fewer than `every`, are counted too: the bar ends at 10 of 10, whatever `every` is."""
    assert list(progress.track(range(10), "counting", every=every)) == list(range(10))
    (bar,) = bars
    assert (bar.n, bar.total) == (10, 10)


def test_a_notebook_gets_a_widget(monkeypatch):
    from tqdm.notebook import tqdm_notebook

    monkeypatch.setattr(progress, "in_notebook", lambda: True)
    bar = progress._tqdm("loading x.pickle", 100, "B")
    try:
        assert isinstance(bar, tqdm_notebook)
    finally:
        bar.close()


def test_no_tqdm_means_no_bar(terminal, at_once, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # `import tqdm` fails, as on the bare GPU machine
    with terminal, progress.bar("loading x.pickle", total=10) as bar:
        bar.update(5)
    assert terminal.written() == ""


def test_the_walk_and_the_what_if_show_their_bars(terminal, at_once, capsys):
    with terminal:
        assert main(["reuse", str(RECORDED["two_streams"]), "--no-cache"]) == 0
        assert main(["what-if", str(RECORDED["two_streams"]), "--map", "replay graphs stream=model graphs stream"]) == 0
    shown = terminal.written()
    for work in ("walking the trace", "simulating the what-if"):
        assert work in shown


def test_live_runs_show_one_step_per_process(terminal, at_once, monkeypatch):
    from kit.experiments import recorded

    with terminal:
        runs = recorded.run_each(["pr", "unpatched"], lambda name, preset, out: {"name": name}, "small", "kit-x-")
    assert runs == {"pr": {"name": "pr"}, "unpatched": {"name": "unpatched"}}
    assert "kit-x (small), one process each" in terminal.written()


def tqdm_importers() -> list[str]:
    """The kit's files that import tqdm themselves, anywhere in them."""
    found = []
    for path in sorted((ROOT / "kit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(name.split(".")[0] == "tqdm" for name in names):
                found.append(str(path.relative_to(ROOT)))
                break
    return found


def test_only_kit_progress_imports_tqdm():
    """Every bar goes through `kit.progress`, so quiet mode, the delay and a missing tqdm hold everywhere."""
    assert tqdm_importers() == ["kit/progress.py"]

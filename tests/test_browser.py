"""Every walkthrough notebook runs in JupyterLab in a real browser, renders its widgets and plots, and reacts.

One JupyterLab server (headless, a token, a free port, notebooks/ as its root) serves all notebooks;
for each notebooks/NN_*.ipynb, tests/browser/run_notebook.mjs opens it in Debian's Chromium through
playwright-core (no browser download), runs Run > Run All Cells, waits for an idle kernel, and
reports what the page shows. The test requires no error output, at least one widget view, a
rendered plotly plot where the notebook uses plotly, the key lines and figures each notebook
must show (tests/test_notebooks.py's `KEY_LINES` and `SHOWN`) and the line naming its data source, a
progress widget shown while any cell runs longer than `SLOW_IN_BROWSER` seconds, every plotly plot at least 90% as wide
as its output area with no legend entry behind a scroll bar and no title cut off (1400 px window), and,
in every notebook with a control a person can operate, one control marked with the CSS class
`kit-main-control`: moving it must change what its cell shows as `CONTROL` says (before and after, a
figure where there is one). Screenshots of the whole notebook before and after moving the control go
to build/screenshots/, with each plot's measured width, its output area's, and the legend and title
checks in `<notebook>_plots.json`.

A snapshot whose names are markup (tests/hostile.py) is opened in the same Chromium through
tests/browser/open_page.mjs: its report page, and the explorer's HTML widgets set with innerHTML as
ipywidgets does. Nothing in them may run, and the labels read as written ("stream of <module> (...)").

Lab runs with its own settings: autosave off (so running a notebook never writes its outputs into
notebooks/), checkpoints in a temporary folder, every cell attached to the page (windowing off, so
that off-screen outputs render), no news fetching. Chromium and playwright-core come from
`make browser-deps`, which this test runs itself when either is missing.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import secrets
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from kit.show.explorer import SnapshotExplorer
from kit.show.report import write_report

from .hostile import EXPLORER_HTML, MODULE_LABEL, POOL_NAME, SCRIPT_LABEL, hostile_snapshot
from .servers import free_port, stop_process_group, wait_until_up
from .test_notebooks import KEY_LINES, SHOWN, SLOW_CELL

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
DRIVER = ROOT / "tests" / "browser" / "run_notebook.mjs"
PAGE_DRIVER = ROOT / "tests" / "browser" / "open_page.mjs"
PLAYWRIGHT = ROOT / "tests" / "browser" / "node_modules" / "playwright-core" / "package.json"
CHROMIUM = Path(os.environ.get("KIT_CHROMIUM", "/usr/bin/chromium"))
SCREENSHOTS = ROOT / "build" / "screenshots"
NOTEBOOK_SECONDS = 240  # one notebook: open, run all, render, move the control
PLOT_SHARE = 0.9  # of its output area's width, the least a plotly plot may fill
# A cell slower than this shows progress while it runs: SLOW_CELL, plus a second for the browser's clock (the
# driver looks every 200 ms, and a cell's time there includes drawing its outputs).
SLOW_IN_BROWSER = SLOW_CELL + 1.0

# Per notebook, its main control: (kind, what its cell shows before moving it, and after, and whether a figure
# changes). The move is one step: the next toggle button, one arrow key on a slider, the next dropdown option.
CONTROL = {
    "01_start_here": (
        "ToggleButtons",
        ("global graph pool: 108.00 MiB reserved before, 66.00 MiB after (saved 42.00 MiB)",),
        ("default pool: 354.00 MiB reserved before, 322.00 MiB after (saved 32.00 MiB)",),
        True,
    ),
    "02_root_cause": (
        "IntSlider",
        ("Step 29 of 42 (replay graph capture)", "Nothing it may take fits: a new 20.00 MiB segment"),
        ("Step 30 of 42 (replay graph capture)", "taken: 1 block (12.00 MiB)"),
        True,
    ),
    "03_the_fix": (
        "ToggleButtons",
        ("graph pool: 48.00 MiB before, 24.00 MiB after: 24.00 MiB saved (25,165,824 bytes)",),
        ("graph pool: 2.96 GiB before, 1.53 GiB after: 1.42 GiB saved (1,528,823,808 bytes)",),
        True,
    ),
    "04_safety": (
        "ToggleButtons",
        (
            "policy pr, early aux on: the replay graphs keep a stream of their own; capture early_aux_pr;",
            "graphs equal eager bit for bit (9 outputs over 3 sizes)",
        ),
        (
            "policy share, early aux on: the replay graphs share the model graphs' stream; capture early_aux_shared;",
            "graphs equal eager bit for bit (9 outputs over 3 sizes)",  # V4.1's nested aux return: the block is kept
            "replay graphs reuse 512.00 KiB that nothing reads after the break",
        ),
        True,
    ),
    "05_alternatives": (
        "ToggleButtons",
        ("unpatched: vLLM 0.33: every capture on a stream of its own",),
        ("pr: PR 63155: the replay graphs on the model graphs' stream", "saves 24.00 MiB against unpatched"),
        True,
    ),
    "07_your_snapshot": (
        "ToggleButtons",
        ("two_captures_separate.pickle)", "check (python -m kit check exits 1)", "22.00 MiB stranded (23068672 bytes)"),
        (
            "two_captures_shared.pickle)",
            "check (python -m kit check exits 0): ok: no graph pool stranded more than 0 B",
        ),
        True,
    ),
    "06_vllm_in_process": (
        "Dropdown",
        ("+++ vllm.distributed.parallel_state.graph_capture (PR 63155)",),
        ("+++ vllm.v1.worker.gpu.cudagraph_utils.CudaGraphManager.capture (PR 63155)",),
        False,
    ),
}
# What the main control's cell must not show before it moves, and after.
NOT_SHOWN = {"04_safety": (("CONFLICT", "early_aux_shared;"), ("early_aux_pr;", "CONFLICT"))}

LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none", "scrollPastEnd": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}


def _api(base: str, token: str, path: str, method: str = "GET") -> dict | list | None:
    req = urllib.request.Request(f"{base}{path}", headers={"Authorization": f"token {token}"}, method=method)
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = resp.read()
    return json.loads(body) if body else None


def uses_plotly(notebook: Path) -> bool:
    """Whether the notebook's code makes plotly figures, so that its page must show one."""
    nb = nbformat.read(notebook, as_version=4)
    return any(re.search(r"plotly|FigureWidget", c.source) for c in nb.cells if c.cell_type == "code")


@pytest.fixture(scope="module")
def browser() -> Path:
    """Chromium and playwright-core, installed by `make browser-deps` if either is missing."""
    if not (CHROMIUM.exists() and PLAYWRIGHT.exists()):
        done = subprocess.run(
            ["make", "--no-print-directory", "browser-deps", f"CHROMIUM={CHROMIUM}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, f"make browser-deps failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert CHROMIUM.exists(), f"{CHROMIUM} missing after make browser-deps"
    assert PLAYWRIGHT.exists(), f"{PLAYWRIGHT} missing after make browser-deps"
    assert shutil.which("node"), "node is not on PATH"
    return CHROMIUM


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """A JupyterLab server on notebooks/, as `make lab` starts it, with the test's settings; yields (url, token)."""
    tmp = tmp_path_factory.mktemp("lab")
    for plugin, values in LAB_SETTINGS.items():
        target = tmp / "settings" / f"{plugin}.jupyterlab-settings"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))
    port, token = free_port(), secrets.token_hex(16)
    command = [
        str(Path(sys.executable).parent / "jupyter"),
        "lab",
        "--no-browser",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        f"--IdentityProvider.token={token}",
        "--notebook-dir=notebooks",
        f"--FileCheckpoints.checkpoint_dir={tmp / 'checkpoints'}",
    ]
    if os.geteuid() == 0:
        command.append("--allow-root")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),  # this kit
        "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
    }
    log = (tmp / "lab.log").open("wb")
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(
            proc,
            lambda: _api(base, token, "/api/status"),
            timeout=120,
            why_it_died=lambda: (tmp / "lab.log").read_text()[-3000:],
        )
        yield base, token
    finally:
        stop_process_group(proc)
        log.close()


def shut_down_kernels(base: str, token: str, notebook: str) -> None:
    """End the notebook's session so that its kernel does not compete with the next notebook's."""
    for session in _api(base, token, "/api/sessions"):
        if session.get("path") == notebook:
            _api(base, token, f"/api/sessions/{session['id']}", method="DELETE")


def words(text: str) -> str:
    """`text` with every run of whitespace one space: a page's text and printed lines compare alike."""
    return " ".join(text.split())


def test_notebooks_exist():
    assert NOTEBOOKS, "no notebooks/NN_*.ipynb found"
    assert {n.stem for n in NOTEBOOKS} == set(CONTROL) == set(KEY_LINES)


def test_playwright_core_is_pinned_exactly():
    package = json.loads((DRIVER.parent / "package.json").read_text())
    lock = json.loads((DRIVER.parent / "package-lock.json").read_text())
    pinned = package["dependencies"]["playwright-core"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", pinned), pinned
    assert lock["packages"]["node_modules/playwright-core"]["version"] == pinned
    assert set(package["dependencies"]) == {"playwright-core"}, "the driver needs nothing else from npm"


@pytest.mark.slow
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_renders_and_reacts_in_jupyterlab(notebook: Path, lab: tuple[str, str], browser: Path):
    base, token = lab
    saved = notebook.read_bytes()
    for stale in SCREENSHOTS.glob(f"{notebook.stem}*.png"):
        stale.unlink()
    expects_plot = uses_plotly(notebook)
    command = ["node", str(DRIVER), "--base", base, "--token", token, "--notebook", notebook.name]
    command += ["--screenshots", str(SCREENSHOTS), "--chromium", str(browser), "--timeout", str(NOTEBOOK_SECONDS)]
    if expects_plot:
        command.append("--expect-plot")
    try:
        done = subprocess.run(command, cwd=DRIVER.parent, capture_output=True, text=True, timeout=NOTEBOOK_SECONDS + 60)
    finally:
        shut_down_kernels(base, token, notebook.name)
    lines = done.stdout.strip().splitlines()
    assert lines, f"the driver reported nothing (exit {done.returncode}):\n{done.stderr[-3000:]}"
    report = json.loads(lines[-1])
    brief = {k: v for k, v in report.items() if k not in ("text", "control_text", "control_text_after")}
    context = f"{notebook.name}: {json.dumps(brief, indent=1)[:4000]}\n{done.stderr[-2000:]}"

    assert "driver_error" not in report, context
    execution = report["execution"]
    assert execution["running"] == 0 and execution["executed"] == execution["code_cells"] > 0, context
    assert not report["errors"], context
    assert not report["console_errors"], context
    assert report["widget_views"] > 0, f"no widget view rendered: {context}"
    if expects_plot:
        assert report["plotly_svgs"] > 0, f"the notebook uses plotly but no plot rendered: {context}"
    assert (SCREENSHOTS / f"{notebook.stem}.png").stat().st_size > 10_000, context
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    (SCREENSHOTS / f"{notebook.stem}_plots.json").write_text(json.dumps(report["plots"], indent=1) + "\n")
    for plot in report["plots"]:  # every figure as wide as its cell, its legend and title whole
        what = f"{notebook.name}: the plot {plot['title']!r}"
        assert plot["width"] >= PLOT_SHARE * plot["area_width"], f"{what} is {plot['width']} px in {plot['area_width']}"
        assert not plot["legend_scrolls"], f"{what} hides legend entries behind a scroll bar"
        assert not plot["title_cut"], f"{what} has its title cut off"
    page = words(report["text"])
    assert words("data source: recorded") in page, f"{notebook.name} names no data source"
    for line in (*KEY_LINES[notebook.stem], *SHOWN[notebook.stem]):
        assert words(line) in page, f"{notebook.name} does not show {line!r} in the browser"
    assert len(report["cells"]) == execution["code_cells"], context
    for number, cell in enumerate(report["cells"]):  # a slow cell shows that it is still working, while it is
        if (cell["seconds"] or 0) > SLOW_IN_BROWSER:
            first, took = cell["first_line"], cell["seconds"]
            assert cell["progress"], f"{notebook.name} code cell {number} ({first!r}) ran {took:.1f} s with no progress"
    # Every notebook a person can operate has its main control, and moving it changes what its cell shows.
    assert report["control_widgets"], f"{notebook.name} has no control: {context}"
    assert len(report["controls"]) == 1, f"not one kit-main-control among {report['control_widgets']}: {context}"
    kind, before, after, figure = CONTROL[notebook.stem]
    assert report["controls"][0]["kind"] == kind, context
    shown, moved = words(report["control_text"]), words(report["control_text_after"])
    assert moved != shown, f"moving the kit-main-control ({report['moved']}) changed nothing its cell shows"
    for text in before:
        assert text in shown, f"{notebook.name}: before moving its control, {text!r} is not shown"
    for text in after:
        assert text in moved, f"{notebook.name}: after {report['moved']}, {text!r} is not shown"
    not_before, not_after = NOT_SHOWN.get(notebook.stem, ((), ()))
    assert not [t for t in not_before if t in shown] and not [t for t in not_after if t in moved], context
    assert report["figure_changed"] is figure, f"a plotly figure changed: {report['figure_changed']}: {context}"
    assert not report["errors_after"], context
    for name in ("control", "after", "control_after"):
        assert (SCREENSHOTS / f"{notebook.stem}_{name}.png").stat().st_size > 10_000, context
    assert notebook.read_bytes() == saved, f"JupyterLab wrote to {notebook.name}"


# --- a snapshot whose names are markup: nothing runs, every label reads as written ------------------------

# A page that shows HTML strings as ipywidgets' HTML widget does (innerHTML); the strings ride in as JSON.
INNER_HTML_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"></head><body><script>
for (const value of {values}) {{ const div = document.createElement("div"); div.innerHTML = value;
document.body.appendChild(div); }}
</script></body></html>"""


def inner_html_page(path: Path, values: list[str]) -> Path:
    path.write_text(INNER_HTML_PAGE.format(values=json.dumps(values).replace("<", "\\u003c")))
    return path


def test_a_hostile_snapshot_runs_nothing_in_the_report_or_the_explorer(tmp_path, browser):
    (tmp_path / "hostile.pickle").write_bytes(pickle.dumps(hostile_snapshot()))
    write_report(tmp_path / "hostile.pickle", tmp_path / "report.html")
    explorer = SnapshotExplorer(tmp_path, "hostile.pickle", shipped={})
    widgets = inner_html_page(tmp_path / "explorer.html", [getattr(explorer, name).value for name in EXPLORER_HTML])
    control = inner_html_page(tmp_path / "control.html", [SCRIPT_LABEL])  # the label as markup: it must run
    command = ["node", str(PAGE_DRIVER), "--chromium", str(browser)]
    for page in (tmp_path / "report.html", widgets, control):
        command += ["--page", str(page)]
    done = subprocess.run(command, cwd=PAGE_DRIVER.parent, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-3000:]
    report, shown, markup = json.loads(done.stdout.strip().splitlines()[-1])
    brief = json.dumps([{k: v for k, v in p.items() if k != "text"} for p in (report, shown, markup)])[:3000]
    assert markup["pwned"] == "1" and markup["dialogs"] == ["1"], f"the check itself does not work: {brief}"
    for page in (report, shown):
        assert "driver_error" not in page and not page["page_errors"], brief
        assert page["pwned"] is None and not page["dialogs"], f"the snapshot ran script in {page['page']}: {brief}"
        text = words(page["text"])
        for label in (MODULE_LABEL, SCRIPT_LABEL, POOL_NAME):
            assert words(label) in text, f"{page['page']} does not show {label!r} as text"
    assert report["plots"] == 2, brief
    # Plotly runs no script from its text but draws <b> and <br>: the legend and the groups read as written.
    assert {f"{MODULE_LABEL}: allocated", f"{SCRIPT_LABEL}: free"} <= set(report["plot_text"]), brief
    assert {f"{POOL_NAME} / {MODULE_LABEL}", f"{POOL_NAME} / {SCRIPT_LABEL}"} <= set(report["plot_text"]), brief
    assert any(POOL_NAME in hover for hover in report["hover_text"]), brief

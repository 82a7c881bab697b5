"""Execute every notebook headless and write it as HTML under build/ (`make walkthrough`).

Notebooks run from their paired percent-format sources in notebooks/, in name
order, each in a fresh kernel with notebooks/ as its working folder. A cell that
raises stops that notebook, and the script exits 1 after trying the rest.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jupytext
import nbformat
import plotly.io as pio
import plotly.offline
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from nbconvert import HTMLExporter

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kit.fileio import atomic_write  # noqa: E402

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PLOTLY_MIME = "application/vnd.plotly.v1+json"


def inline_plotly(nb: nbformat.NotebookNode) -> None:
    """Give every plotly output an HTML rendering, since nbconvert has no plotly renderer."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if PLOTLY_MIME in data and "text/html" not in data:
                fig = pio.from_json(json.dumps(data[PLOTLY_MIME]))
                data["text/html"] = pio.to_html(fig, include_plotlyjs=False, full_html=False)


def with_plotlyjs(page: str) -> str:
    """Put plotly.js in the page head, hidden from require.js so that it defines `Plotly`."""
    script = (
        "<script>window.__kit_define = window.define; window.define = undefined;</script>"
        f"<script>{plotly.offline.get_plotlyjs()}</script>"
        "<script>window.define = window.__kit_define;</script>"
    )
    return page.replace("<head>", "<head>" + script, 1)


def run_notebook(source: Path, out_dir: Path, timeout: int) -> Path:
    """Execute one notebook; write the executed .ipynb and its .html to `out_dir`."""
    nb = jupytext.read(source)
    NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(source.parent)}}
    ).execute()
    inline_plotly(nb)
    html, _ = HTMLExporter().from_notebook_node(nb)
    html = with_plotlyjs(html)
    target = out_dir / f"{source.stem}.html"
    with atomic_write(target) as f:
        f.write(html)
    with atomic_write(out_dir / f"{source.stem}.ipynb") as f:
        nbformat.write(nb, f)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("build"))
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebooks/*.py")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for source in args.notebooks or sorted(NOTEBOOKS.glob("[0-9]*.py")):
        started = time.perf_counter()
        try:
            written = run_notebook(source, args.out, args.timeout)
            print(f"{source.name}: wrote {written} in {time.perf_counter() - started:.1f} s", flush=True)
        except CellExecutionError as e:
            failed += 1
            print(f"{source.name}: FAILED\n{e}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

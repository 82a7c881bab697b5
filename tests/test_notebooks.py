"""The notebooks: reviewable sources, paired and output-free, and they run top to bottom on CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "notebooks").glob("[0-9]*.py"))


def test_every_notebook_is_paired_and_output_free():
    assert SOURCES
    for source in SOURCES:
        paired = source.with_suffix(".ipynb")
        assert paired.exists(), f"{paired.name} missing: run jupytext --sync {source}"
        nb = nbformat.read(paired, as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{paired.name} has outputs"
        text = jupytext.read(source)
        assert [c.source for c in nb.cells] == [c.source for c in text.cells], f"{paired.name} out of sync"


def test_walkthrough_runs_every_notebook_on_cpu(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "walkthrough.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1800,
        env={"CUDA_VISIBLE_DEVICES": "", **__import__("os").environ},
    )
    assert done.returncode == 0, done.stderr[-5000:]
    for source in SOURCES:
        html = (tmp_path / f"{source.stem}.html").read_text()
        assert "data source: recorded" in html, f"{source.name} names no data source"
        executed = nbformat.read(tmp_path / f"{source.stem}.ipynb", as_version=4)
        for cell in executed.cells:
            for out in cell.get("outputs", []):
                assert out.output_type != "error", f"{source.name}: {out.get('ename')}: {out.get('evalue')}"
                text = out.get("text", "") if out.output_type == "stream" else ""
                assert "Traceback" not in text, f"{source.name} printed a traceback:\n{text[-2000:]}"

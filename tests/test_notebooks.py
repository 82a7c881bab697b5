"""The notebooks: reviewable sources, paired and output-free, and they run top to bottom on CPU."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "notebooks").glob("[0-9]*.py"))
HAS_VLLM = importlib.util.find_spec("vllm") is not None

# Lines a notebook prints from the shipped H200 recordings: the headline figures of 01's map (the
# two-capture experiment's 42 MiB, the replica's 24 MiB and 730 MiB), measured again where each is shown.
KEY_LINES = {
    "01_start_here": (
        "(44,040,192 bytes): two-capture experiment: the replay capture's new graph-pool segments",
        "42.00 MiB = 0.041 GiB (44,040,192 bytes): two-capture experiment: what sharing the stream saves",
        "24.00 MiB = 0.023 GiB (25,165,824 bytes): replica, small preset: graph pool saved by the patch",
        "730.00 MiB = 0.713 GiB (765,460,480 bytes): replica, large preset: graph pool saved by the patch",
        "5.18 GiB on DeepSeek-V4.1-Flash: stated in PR 63155, not measured by the kit",
        "new stream: the replay capture added 42.00 MiB (44,040,192 bytes) of graph-pool segments",
        "shared stream: the replay capture added 0 B (0 bytes) of graph-pool segments",
        "global graph pool: 108.00 MiB reserved before, 66.00 MiB after (saved 42.00 MiB)",
    ),
    "02_root_cause": (
        "3 new segments, 42.00 MiB of new graph-pool memory",
        "printed: the installed vLLM 0.33.0" if HAS_VLLM else "printed: the replica's mirror",
        "GraphCaptureContext(torch.cuda.Stream(device=device))    # <-- a new stream on every call",
    ),
    "03_the_fix": (
        "small unpatched: the replay captures added 24.00 MiB (25,165,824 bytes) of graph-pool segments",
        "small patched: the replay captures added 0 B (0 bytes) of graph-pool segments",
        "large unpatched: the replay captures added 730.00 MiB (765,460,480 bytes) of graph-pool segments",
        "large patched: the replay captures added 0 B (0 bytes) of graph-pool segments",
        "under the patch the replay captures add no graph-pool segment: True (0 bytes)",
    ),
    # The safety recordings (kit/recordings/safety/, readwrite/): every pairing, and the obligation per policy.
    "04_safety": (
        "pr: all 9 pairings bit-exact (6 dispatchable)",
        "unpatched: all 9 pairings bit-exact (6 dispatchable)",
        "early_aux_shared: 5 of 9 pairings differ from eager (3 of them dispatchable): "
        "(128, 128), (256, 64), (256, 128), (256, 256), (512, 128)",
        "obligation under pr: Holds for all 6 pairings that can run.",
        "obligation under unpatched: Holds for all 6 pairings that can run.",
        "obligation under early_aux_shared: Violated in 3 of 6 pairings that can run: (256, 64), (256, 128), "
        "(512, 128) (model graph, replay graph), 1.62 MiB in all.",
        "pr, lifetime analysis from the trace alone: flags 7 pairing(s) the obligation clears, (128, 128)*, "
        "(256, 64), (256, 128), (256, 256)*, (512, 64), (512, 128), (512, 256);",
        "early_aux_shared: the lifetime analysis agrees with the obligation on all 9 pairings",
    ),
    # The alternatives recording (kit/recordings/alternatives/small.json): (a) and (b), and what the saving buys.
    "05_alternatives": (
        "preset large: not recorded",
        "pr: graph pool 48.00 MiB, saves 24.00 MiB (25,165,824 bytes) against unpatched's 72.00 MiB",
        "share_all: graph pool 24.00 MiB, saves 48.00 MiB (50,331,648 bytes) against unpatched's 72.00 MiB",
        "share_all: the drafter's graph overwrote the target's outputs in 9 of 9 steps; every step bit-exact, "
        "target outputs and drafts: True",
        "cap 64: graph pool 50.00 MiB, saves 22.00 MiB (23,068,672 bytes) against unpatched's 72.00 MiB; "
        "replay batches of 128, 256 rows would run eagerly (in steps of 256, 512 tokens)",
        "every cap saves less than the PR: True",
        "pr: the profile estimate falls from 312.00 MiB to 256.00 MiB: 56.00 MiB more KV budget = 112 blocks, "
        "1,792 tokens",
        "DeepSeek-V4.1-Flash (assumed): 32,918 blocks of 64, 2,106,752 tokens",
    ),
}


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
        printed = []
        for cell in executed.cells:
            for out in cell.get("outputs", []):
                assert out.output_type != "error", f"{source.name}: {out.get('ename')}: {out.get('evalue')}"
                text = out.get("text", "") if out.output_type == "stream" else ""
                assert "Traceback" not in text, f"{source.name} printed a traceback:\n{text[-2000:]}"
                printed.append(text)
        for line in KEY_LINES.get(source.stem, ()):
            assert line in "".join(printed), f"{source.name} did not print {line!r}"

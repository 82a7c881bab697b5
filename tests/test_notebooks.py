"""The notebooks: reviewable sources, paired and output-free, and what each must show when it runs.

Each notebook runs once in the suite, in JupyterLab in a real browser
(tests/test_browser.py), from the shipped H200 recordings: there it must show
its key lines (`KEY_LINES`) and its key figures and verdicts (`SHOWN`), name
its data source, show progress in any cell slower than `SLOW_CELL`, and react
to its main control. The headless runner, `scripts/walkthrough.py` (`make walkthrough`: every
notebook executed into HTML), is checked here on two small notebooks of its own.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
SLOW_CELL = 3.0  # seconds: a cell that runs longer must show progress (kit.progress.watch_cells)
SOURCES = sorted((ROOT / "notebooks").glob("[0-9]*.py"))
HAS_VLLM = importlib.util.find_spec("vllm") is not None
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

# Lines a notebook prints from the shipped H200 recordings: the headline figures of 01's map (the
# model-and-replay experiment's 42 MiB, the replica's 24 MiB and 1.42 GiB), measured again where each is shown.
KEY_LINES = {
    "01_start_here": (
        "(44,040,192 bytes): model-and-replay experiment: the replay capture's new graph-pool segments",
        "42.00 MiB = 0.041 GiB (44,040,192 bytes): model-and-replay experiment: what sharing the stream saves",
        "24.00 MiB = 0.023 GiB (25,165,824 bytes): replica, small preset: graph pool saved by the patch",
        "1.42 GiB = 1.424 GiB (1,528,823,808 bytes): replica, large preset: graph pool saved by the patch",
        "5.18 GiB on DeepSeek-V4.1-Flash: stated in PR 63155, not measured by the kit",
        "new stream: the replay capture added 42.00 MiB (44,040,192 bytes) of graph-pool segments",
        "shared stream: the replay capture added 0 B (0 bytes) of graph-pool segments",
        "global graph pool: 108.00 MiB reserved before, 66.00 MiB after (saved 42.00 MiB)",
    ),
    "02_root_cause": (
        "202 allocator operations, 42 of them allocations in the graph pool",
        "simulated final state equals the recording, segment by segment and block by block: True",
        "replay capture: 14 requests in the graph pool, 3 new segments, 42.00 MiB of new graph-pool memory",
        "free on the model graphs' stream when it began: 5 blocks, 60.00 MiB, the largest 16.00 MiB; its largest "
        "request: 8.00 MiB",
        "printed: the installed vLLM 0.33.0" if HAS_VLLM else "printed: the replica's mirror",
        "GraphCaptureContext(torch.cuda.Stream(device=device))    # <-- a new stream on every call",
    ),
    "03_the_fix": (
        "small unpatched: the replay captures added 24.00 MiB (25,165,824 bytes) of graph-pool segments",
        "small patched: the replay captures added 0 B (0 bytes) of graph-pool segments",
        "large unpatched: the replay captures added 1.42 GiB (1,528,823,808 bytes) of graph-pool segments",
        "large patched: the replay captures added 0 B (0 bytes) of graph-pool segments",
        "under the patch the replay captures add no graph-pool segment: True (0 bytes)",
        "vLLM's path, unpatched: the replay captures added 28.00 MiB; for the stream's sake (a fitting free block on "
        "another stream): 28.00 MiB",
        "vLLM's path, patched: the replay captures added 2.00 MiB; for the stream's sake (a fitting free block on "
        "another stream): 0 B",
        "  2.00 MiB small-pool segment for a request of 1,048,576 B (rounded 1,048,576 B) on model graphs stream in "
        "decoder replay graphs 512 graph 0, at forward (vllm_standin.py:254) (trace entry 2317)",
        "small: graph pool predicted 24.00 MiB, measured 24.00 MiB; saved: predicted 25,165,824 bytes, measured "
        "25,165,824 bytes",
        "large: graph pool predicted 1.53 GiB, measured 1.53 GiB; saved: predicted 1,528,823,808 bytes, measured "
        "1,528,823,808 bytes",
        "large patched: graphs equal eager bit for bit (10 outputs over 5 sizes)",
    ),
    # The safety recordings (kit/recordings/safety/, readwrite/): every pairing, and the obligation per policy.
    "04_safety": (
        "pr: all 18 pairings bit-exact (11 dispatchable)",
        "unpatched: all 18 pairings bit-exact (11 dispatchable)",
        "early_aux_shared: 13 of 18 pairings differ from eager (7 of them dispatchable): "
        "(128, 384), (128, 480), (128, 512), (256, 96), (256, 192), (256, 288), (256, 384), (256, 480), (256, 512), "
        "(512, 288), (512, 384), (512, 480), (512, 512)",
        "obligation under pr: Holds for all 11 pairings that can run.",
        "obligation under unpatched: Holds for all 11 pairings that can run.",
        "obligation under early_aux_shared: Violated in 7 of 11 pairings that can run: (256, 96), (256, 192), "
        "(256, 288), (512, 288), (512, 384), (512, 480), (512, 512) (model graph, replay graph), 3.44 MiB in all.",
        "early_aux_shared: of the 11 pairings vLLM's dispatch can produce, the obligation fails on 7; over all 18, "
        "the pairings that differ from eager and those the lifetime analysis flags with the breaks' reads are "
        "exactly the pairings that fail it",
        "unpatched: the lifetime analysis agrees with the obligation on all 18 pairings",
        # early aux on vLLM's semantics, from vLLM's path's recordings: which shape the replica's rows ran, the verdict
        "replica's early_aux_shared rows: aux handed out flat",
        "    forced to share: graphs equal eager bit for bit, the obligation holds on 11 of 11 dispatchable pairings",
        "  on vLLM 0.33 the exception is DEFENSIVE, not needed: ",
        "  it becomes NECESSARY under a change that hands the early aux out weak (early_aux_shared_flat shows it fail)",
    ),
    # The alternatives recording (kit/recordings/alternatives/small.json): (a) and (b), and what the saving buys.
    "05_alternatives": (
        "preset large: recorded",
        "pr: graph pool 48.00 MiB, saves 24.00 MiB (25,165,824 bytes) against unpatched's 72.00 MiB",
        "share_all: graph pool 24.00 MiB, saves 48.00 MiB (50,331,648 bytes) against unpatched's 72.00 MiB",
        "share_all: the drafter's graph overwrote the target's outputs in 9 of 9 steps; every step bit-exact, "
        "target outputs and drafts: True",
        "share_all: drafter read/write obligation holds on 3 dispatchable pairings (up to 1,048,576 B of the "
        "target's outputs overwritten, every read of them before the drafter); lifetime analysis with the step's "
        "reads: no conflict",
        "share_all safe by graphs vs eager and both analyses: True",
        "cap 96: graph pool 52.00 MiB, saves 20.00 MiB (20,971,520 bytes) against unpatched's 72.00 MiB; "
        "replay batches of more than 96 rows run eagerly (sizes 192, 288, 384, 480, 512 not captured), possible in "
        "steps padded to 128, 256, 512 tokens",
        "every cap saves less than the PR: True",
        "pr: the profile estimate falls from 314.00 MiB to 258.00 MiB: 56.00 MiB more KV budget = 112 blocks, "
        "1,792 tokens",
        "DeepSeek-V4.1-Flash (assumed): 32,918 blocks of 64, 2,106,752 tokens",
    ),
    "07_your_snapshot": (
        "trace: 716 entries, starting mid-process: 9 segments already there",
        "$ python -m kit check kit/recordings/plain/two_captures_separate.pickle   (exit 1)",
        "graph pool 1 (0, 1), stream of capture_second (two_captures.py:61) (stream 404756496): 22.00 MiB stranded "
        "(23068672 bytes), 22.00 MiB of it still reserved",
        "graph pool 1 (0, 1): 56.00 MiB reserved as recorded, 34.00 MiB predicted (saves 22.00 MiB)",
        "graph pool 1: 56.00 MiB reserved before, 34.00 MiB after (saved 22.00 MiB)",
        "kit: error: upload hostile.pickle: refused to load global 'builtins.print': a snapshot holds plain data only",
    ),
    "06_vllm_in_process": (
        f"vLLM installed: {HAS_VLLM}; CUDA: False; model: (KIT_VLLM_MODEL not set)",
        "reverted: graph_capture (device: torch.device)",
        "patch applied: False",
        "Showing vLLM 0.33's own capture code recorded on the H200, vllm/patched.pickle, instead: vLLM's capture "
        "path, real CUDA graphs, a stand-in model (section 4b says what was stood in).",
        "  graph-pool bytes the replay captures added: 28.00 MiB",
        "  read/write obligation: VIOLATED on 10 of 11 dispatchable pairings (N, R): (128, 96), (128, 192), (256, 96), "
        "(256, 192), (256, 288), (512, 96), (512, 288), (512, 384), (512, 480), (512, 512), 5.88 MiB in all",
        "  graph-pool bytes the replay captures added: 2.00 MiB",
        "graph pool saved by the patch on vLLM's own code: 26.00 MiB (27262976 bytes)",
        # section 6: the plugin's recording, vLLM's estimate moving by what the replay stream holds
        "vLLM's estimate, unpatched minus under the PR:      86.00 MiB",
        "the estimate counts what the replay graphs' own stream holds: its graph pool and its default-pool segments",
    )
    + (
        ("<PrPatch PR 63155 on vLLM 0.33.0 (pr): applied>", "patched:  graph_capture (device: torch.device, stream: ")
        if HAS_VLLM
        else ()
    ),
}

# What a notebook shows at its first view, in its tables and widgets (whitespace collapsed, markup dropped).
SHOWN = {
    "01_start_here": ("global graph pool: 108.00 MiB reserved before, 66.00 MiB after (saved 42.00 MiB)",),
    "02_root_cause": (
        "Step 29 of 42 (replay graph capture): replay graphs stream asks for 8.00 MiB (8,388,608 bytes rounded, "
        "large blocks) in the global graph pool.",
        "refused: other stream: 5 blocks (60.00 MiB)",
        "Nothing it may take fits: a new 20.00 MiB segment",
    ),
    "03_the_fix": ("graph pool: 48.00 MiB before, 24.00 MiB after: 24.00 MiB saved (25,165,824 bytes)",),
    "04_safety": (
        # the overview: only early aux forced to share and returned flat puts a replay graph over what is held, and
        # differs from eager; V4.1's nested return keeps the aux blocks, bit-exact
        "early_aux_pr pr True replay graphs stream 50.00 MiB 1.75 MiB 0 B True bit-exact",
        "early_aux_shared share True model graphs stream 28.00 MiB 1.75 MiB 0 B True bit-exact",
        "early_aux_shared_flat share True model graphs stream 26.00 MiB 1.75 MiB 1.75 MiB True differ, up to 6.64",
        "early_aux_shared 18 (128, 384)*, (128, 480)*, (128, 512)*, (256, 96), (256, 192), (256, 288), (256, 384)*, "
        "(256, 480)*, (256, 512)*, (512, 288), (512, 384), (512, 480), (512, 512)",
        # the policy explorer's first view: the PR's rule on a model with early aux keeps the streams apart
        "policy pr, early aux on: the replay graphs keep a stream of their own; capture early_aux_pr;",
        "graphs vs eager: graphs equal eager bit for bit (9 outputs over 3 sizes)",
        "model graphs 256: safe: 1.00 MiB held across 1 break (512.00 KiB released by the break, 512.00 KiB held "
        "after the break); no replay graph allocates over them",
    ),
    "05_alternatives": (
        "unpatched: vLLM 0.33: every capture on a stream of its own",
        "graph pool 72.00 MiB (model graphs stream 24.00 MiB, replay graphs stream 24.00 MiB, DFlash speculator "
        "graphs stream 24.00 MiB); saves 0 B against unpatched",
    ),
    "07_your_snapshot": (
        "check (python -m kit check exits 1): failed: 1 group(s) stranded more than 0 B",
        "graph pool 1 (0, 1): 56.00 MiB reserved as recorded, 34.00 MiB predicted (saves 22.00 MiB)",
    ),
    "06_vllm_in_process": (
        # the PR's captures: the replay graphs on the model graphs' stream, adding no segment
        "decoder replay graphs 480 model graphs stream 1 0 0 0 B",
    )
    + (
        (
            "+++ vllm.distributed.parallel_state.graph_capture (PR 63155)",
            "+def graph_capture(device: torch.device, stream: torch.cuda.Stream | None = None):",
        )
        if HAS_VLLM
        else ()
    ),
}
# What a notebook's widgets must not show at their first view.


def headless_env() -> dict[str, str]:
    """This process's environment with CUDA hidden: the notebooks read the shipped recordings."""
    return {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def test_every_notebook_is_paired_and_output_free():
    assert SOURCES
    for source in SOURCES:
        paired = source.with_suffix(".ipynb")
        assert paired.exists(), f"{paired.name} missing: run jupytext --sync {source}"
        nb = nbformat.read(paired, as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{paired.name} has outputs"
        text = jupytext.read(source)
        assert [c.source for c in nb.cells] == [c.source for c in text.cells], f"{paired.name} out of sync"


def test_the_headless_run_hides_cuda_even_where_it_is_visible(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # a GPU machine's inherited setting must not win
    assert headless_env()["CUDA_VISIBLE_DEVICES"] == ""


def test_every_notebook_has_its_expectations():
    assert {s.stem for s in SOURCES} == set(KEY_LINES) == set(SHOWN)


WALKED = """# %%
print("data source: recorded")

# %%
import plotly.graph_objects as go

go.Figure(go.Bar(x=["a"], y=[1]))
"""


@pytest.mark.slow
def test_the_headless_runner_writes_each_notebook_and_exits_1_after_one_fails(tmp_path):
    good, bad = tmp_path / "01_good.py", tmp_path / "02_bad.py"
    good.write_text(WALKED)
    bad.write_text('# %%\nraise ValueError("planted")\n')
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "walkthrough.py"), "--out", str(tmp_path / "out"), str(bad), str(good)],
        capture_output=True,
        text=True,
        timeout=600,
        env=headless_env(),
    )
    assert done.returncode == 1 and "02_bad.py: FAILED" in done.stderr and "planted" in done.stderr
    page = (tmp_path / "out" / "01_good.html").read_text()
    assert "data source: recorded" in page and "Plotly.newPlot" in page  # plotly.js in the page, the figure drawn
    assert nbformat.read(tmp_path / "out" / "01_good.ipynb", as_version=4).cells[0].outputs
    assert not (tmp_path / "out" / "02_bad.html").exists()

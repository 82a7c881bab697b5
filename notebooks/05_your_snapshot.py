# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Debug your own snapshot
#
# **The question.** The other notebooks read the kit's own recordings. Does your process
# strand graph-pool memory on a second stream? Point the kit at a pickle written by
# `torch.cuda.memory._dump_snapshot` (a path, or an upload) and read the same tables and
# figures: memory per `(pool, stream)` group, how each allocation was served, and a
# one-line verdict per stream that made segments while the pool had fitting free blocks on
# another stream.
#
# ## Recording one from vLLM
#
# The trace (memory history) must be on *before* the graphs are captured, since the reuse
# table reads how each allocation was served. With the engine in this process:
#
# ```python
# import os, torch
# os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # the engine core in this process
# torch.cuda.memory._record_memory_history(max_entries=1_000_000)
# llm = LLM(model, ...)                                 # capture_model() runs in here
# torch.cuda.memory._dump_snapshot("capture.pickle")
# ```
#
# In your own runner, put the same two calls around `capture_model()`. With workers in
# other processes (tensor or data parallel), wrap the capture in `kit.CaptureRecorder()` in
# the worker, or collect every rank's allocator from the driver with
# `kit.record.vllm_ranks.snapshot_all_ranks(llm)`, which returns one snapshot per rank (see
# `06_vllm_in_process`).
#
# The same analyses from a shell:
#
# ```bash
# python -m kit table capture.pickle                 # one row per (pool, stream) group
# python -m kit reuse capture.pickle                 # reuse per group, then the stranding verdicts
# python -m kit report capture.pickle -o report.html # tables and figures on one offline page
# ```

# %%
import subprocess
import sys
from pathlib import Path

import plotly.io as pio
from IPython.display import display

import kit
from kit.recordings import LIVE, default_source, recording
from kit.show.explorer import SnapshotExplorer, load_path, load_upload

pio.renderers.default = "plotly_mimetype"  # JupyterLab's renderer; `make walkthrough` inlines plotly.js
REPO = Path(kit.__file__).resolve().parents[1]  # relative paths are read from the repository, not the cwd
DEFAULT_PATH = str(recording("two_streams.pickle").relative_to(REPO))  # kit/recordings/two_streams.pickle
HAS_CUDA = default_source() == LIVE
print(f"data source: {default_source()} (and any snapshot you point it at)")

# %% [markdown]
# The shell commands on the default path, to compare with the tables below:

# %%
for command in ("table", "reuse"):
    done = subprocess.run(
        [sys.executable, "-m", "kit", command, DEFAULT_PATH], cwd=REPO, capture_output=True, text=True
    )
    print(f"$ python -m kit {command} {DEFAULT_PATH}   (exit {done.returncode})")
    print(done.stdout or done.stderr)

# %% [markdown]
# ## Loading
#
# `kit.load_snapshot` takes a path (pickle or JSON), a dict, or `"live"`. A pickle is read
# by an unpickler that admits no class or function, so a hostile file is refused and nothing
# in it runs. Whatever is wrong with a file, the kit says so in one line (`KitError`). The
# explorer below reads a typed path with `kit.show.explorer.load_path` and an upload with
# `load_upload`:

# %%
hostile = b"cbuiltins\nprint\n(S'this never runs'\ntR."  # a pickle that calls print() when loaded
for attempt, load in (
    ("bytes that are not a pickle", lambda: load_upload(b"\x80\x04 these bytes are not a snapshot", "notes.pickle")),
    ("a path that does not exist", lambda: load_path("my_runs/no_such_snapshot.pickle", REPO)),
    ("a pickle that would call a function", lambda: load_upload(hostile, "hostile.pickle")),
):
    try:
        load()
    except kit.KitError as e:
        print(f"{attempt}:\n  kit: error: {e}")

# %% [markdown]
# ## Your snapshot
#
# Pick a recording shipped with the kit, or **path** to read the path in the box (relative
# to the repository) and press Load, or upload a file. Where this process has CUDA, **live**
# runs the two-capture experiment of `01_start_here` in this process, with memory history
# on, and reads this process's allocator (`kit.load_snapshot("live")` reads it as it is at
# any moment). The app is `kit.show.explorer.SnapshotExplorer`.

# %%
explorer = SnapshotExplorer(REPO, DEFAULT_PATH, live=HAS_CUDA)
print(f"data source: {explorer.first.data_source} ({explorer.first.source_label})")
display(explorer.widget)

# %% [markdown]
# Read the graph pool's rows first. One group per `(pool, stream)`: a graph pool with two
# streams is two sets of segments, and a stream whose group is mostly free while its new
# segments were *stranded* (a fitting free block sat on the other stream) is the PR's
# pattern. The verdicts name the streams, the bytes, and the first stack frames of the
# allocation that made the first stranded segment, so you can find the capture that
# created the stream.
#
# **What it shows.** The same tables, verdicts and figures as the rest of the kit, on any
# snapshot from torch 2.1 on, and a one-line error for anything that is not one.
#
# **Next question.** Found a second stream in your graph pool? `python -m kit what-if
# capture.pickle --map "replay graphs stream=model graphs stream"` predicts the pool had
# that stream shared the other's, and `04_safety` shows what must hold before it may.

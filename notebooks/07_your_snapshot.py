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
# **The question.** The other notebooks read the kit's own recordings. Does *your* process
# strand graph-pool memory on a second stream, and what would sharing the stream save? In a
# debugging session you have a plain `torch.cuda.memory._dump_snapshot()` file: no `kit`
# key, no names for the streams, and a trace that starts mid-process (history went on after
# the model was loaded). Point the kit at it and read the same tables, verdicts and figures,
# a `check` line for CI, and a what-if that moves one stream onto another.
#
# ## Recording one
#
# The trace (memory history) must be on *before* the graphs are captured, since the reuse
# table reads how each allocation was served. Around the captures in your process:
#
# ```python
# torch.cuda.memory._record_memory_history(max_entries=1_000_000)
# ...                                                   # capture the graphs
# torch.cuda.memory._dump_snapshot("capture.pickle")
# ```
#
# With vLLM's engine in this process, set `VLLM_ENABLE_V1_MULTIPROCESSING=0` and put the two
# calls around `LLM(model, ...)` (its `capture_model()` runs in there). With workers in other
# processes (tensor or data parallel), collect every rank's allocator from the driver with
# `kit.record.vllm_ranks.snapshot_all_ranks(llm)`, one snapshot per rank (see
# `06_vllm_in_process`).
#
# This notebook's default snapshot is such a file: `kit/recordings/plain/two_captures_separate.pickle`,
# recorded on an H200 from `scripts/plain_programs/two_captures.py`, a torch program the kit did
# not write. It captures two graphs into one graph pool, the second on a stream of its own;
# its twin `two_captures_shared.pickle` captures the second on the first one's stream.

# %%
# Any cell still running after two seconds shows a bar with its time so far.
from kit.progress import watch_cells

watch_cells()

# %%
import shlex
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
DEFAULT_PATH = str(recording("plain/two_captures_separate.pickle").relative_to(REPO))
SHARED_PATH = str(recording("plain/two_captures_shared.pickle").relative_to(REPO))
HAS_CUDA = default_source() == LIVE  # offers "live" in the explorer; the default stays the recording

snap = kit.load_snapshot(REPO / DEFAULT_PATH)
walk = kit.walk_trace(snap)
print(f"data source: {snap.data_source}: {snap.source_label}")
print(f"  kit key: {snap.kit or 'none (a plain torch snapshot)'}")
print(f"  trace: {len(snap.traces[0])} entries, starting mid-process: {walk.rewound_segments} segments already there")

# %% [markdown]
# ## From a shell
#
# The same analyses as commands, on the default path: `table` (one row per `(pool, stream)`
# group), `reuse` (how each allocation was served, then the stranding verdicts), `check` (the
# CI guard: exit 1 when a graph pool stranded memory) and `what-if`, whose `--map` names the
# streams by the labels `table` printed. The exit codes are the point of `check`:

# %%
SECOND = "stream of capture_second (two_captures.py:61)"  # the labels `table` prints
FIRST = "stream of capture_first (two_captures.py:44)"
COMMANDS = [
    ["table", DEFAULT_PATH],
    ["reuse", DEFAULT_PATH],
    ["check", DEFAULT_PATH],
    ["what-if", DEFAULT_PATH, "--map", f"{SECOND}={FIRST}"],
]
for args in COMMANDS:
    done = subprocess.run([sys.executable, "-m", "kit", *args], cwd=REPO, capture_output=True, text=True)
    print(f"$ python -m kit {shlex.join(args)}   (exit {done.returncode})")
    print(done.stdout + done.stderr)

# %% [markdown]
# `check` exits 1: graph pool 1 made 22 MiB of new segments on the second capture's stream
# while a fitting free block sat on the first's. `what-if` predicts 34 MiB for graph pool 1 had
# the second capture used the first one's stream, against 56 MiB recorded. Its correction
# line is about the default pool only: the moved stream's own cuBLAS workspace, which a
# shared-stream run would not need.
#
# ## Names that survive a second run
#
# Stream ids are addresses and pool ids counters of one process, so the kit names them from
# what the snapshot shows: a stream by the first Python frame outside torch of its first
# allocation, a graph pool by the order it was made. A table lists the labels the kit made
# up in `attrs["generated_labels"]`:

# %%
table = kit.segment_table(snap)
print(f"data source: {table.attrs['source']}")
for sid, label in kit.stream_labels(snap).items():
    print(f"  stream {sid} ({sid:#x}): {label}")
for pool, label in kit.pool_labels(snap).items():
    print(f"  pool {pool}: {label}")
print(f"  made up by the kit: {'; '.join(table.attrs['generated_labels'])}")

# %% [markdown]
# A second run of the same program gets other ids but the same labels: here the shared-stream
# run, whose first capture's stream has another id. So `diff --by-label` pairs its groups with
# the separate-stream run's and answers "what did sharing the stream save" directly
# (`kit.diff_tables(..., by="label")` and `kit.diff_summary`). It warns where it paired labels
# the kit generated rather than names the programs gave:

# %%
shared = kit.load_snapshot(REPO / SHARED_PATH)
shared_table = kit.segment_table(shared)
print(f"data source: {shared_table.attrs['source']}")
for sid, label in kit.stream_labels(shared).items():
    print(f"  stream {sid} ({sid:#x}): {label}")
diff = kit.diff_tables(table, shared_table, by="label")
print(f"\ndiff --by-label; data source: {diff.attrs['source']}")
for line in kit.diff_summary(diff):
    print(f"  {line}")
print(f"  paired by generated labels: {'; '.join(diff.attrs['paired_generated'])}")
args = ["diff", "--by-label", DEFAULT_PATH, SHARED_PATH]
done = subprocess.run([sys.executable, "-m", "kit", *args], cwd=REPO, capture_output=True, text=True)
print(f"\n$ python -m kit {shlex.join(args)}   (exit {done.returncode}; its table is below)\n{done.stderr.strip()}")
columns = ["pool_label", "stream_label", "status", "reserved_before", "reserved_after", "reserved"]
view = diff[columns].copy()
view.attrs = diff.attrs
display(kit.style_table(view))

# %% [markdown]
# Graph pool 1 measured 34 MiB with the stream shared: exactly what `what-if` predicted from
# the separate-stream run alone. The default pool is 34 MiB smaller too: the moved stream's own
# cuBLAS workspace, which `what-if`'s correction line named.
#
# ## Loading
#
# `kit.load_snapshot` takes a path (pickle or JSON), a dict, or `"live"`. A pickle is read
# by an unpickler that admits no class or function, so a hostile file is refused and nothing
# in it runs. Whatever is wrong with a file, the kit says so in one line (`KitError`). The
# explorer below reads a typed path with `kit.show.explorer.load_path` and an upload with
# `load_upload`:

# %%
hostile = b"cbuiltins\nprint\n(S'this never runs'\ntR."  # a pickle that calls print() when loaded
print("data source: bytes and a path made up in this cell")
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
# Pick a recording shipped with the kit (the plain ones: two captures on separate or shared
# streams, record_stream on separate or shared streams, torch.compile's reduce-overhead mode;
# then the kit's own), or **path** to read the path in the box (relative to the repository)
# and press Load, or upload a file. Where this process has CUDA, **live** runs the
# model-and-replay experiment of `01_start_here` in this process, with memory history on. The app
# is `kit.show.explorer.SnapshotExplorer`; below the tables and verdicts come:
#
# - the **check** line: `kit.check_snapshot(snap)`, ok or one line per offending group, with
#   the exit code `python -m kit check` would give;
# - the **capture attribution**: which capture added which segments
#   (`kit.capture_attribution`), saying when the windows were inferred from the trace because
#   the snapshot has none of the capture recorder's;
# - the group bars and the segment map;
# - the **what-if** panel: FROM and TO list the snapshot's streams by label; by default FROM
#   is the second stream that allocated in a graph pool and TO the first (the same stream
#   twice, the identity map, where only one did). It shows each pool's reserved bytes as
#   recorded and as predicted (`WhatIf.summary()`) and the predicted table with its source,
#   and predicts again whenever a dropdown changes.

# %%
explorer = SnapshotExplorer(REPO, DEFAULT_PATH, live=HAS_CUDA)
print("the explorer's first view (printed once; the app below follows your picks):")
print(f"data source: {explorer.first.data_source} ({explorer.first.source_label})")
print(f"what-if: {explorer.whatif_from.value} onto {explorer.whatif_to.value}")
for line in explorer.whatif.summary():
    print(f"  {line}")
display(explorer.widget)

# %% [markdown]
# Read the graph pool's rows first. One group per `(pool, stream)`: a graph pool with two
# streams is two sets of segments, and a stream whose group is mostly free while its new
# segments were *stranded* (a fitting free block sat on the other stream at that moment) is
# the PR's pattern. The verdicts and the `check` line name the streams, the bytes, and the
# first stack frames of the allocation that made the first stranded segment, so you can find
# the capture that created the stream. Then set FROM to that stream and TO to the one whose
# free blocks it refused: the what-if says what sharing would save. Try `record_stream_separate`
# (22 MiB saved in graph pool 1 again; its default-pool verdicts name blocks pending on
# `record_stream`) and `compile_reduce_overhead` (one stream in the graph pool: `check` passes
# and the identity map reproduces the pool).
#
# **What it shows.** The same tables, verdicts, guard and what-if as the rest of the kit, on
# a plain snapshot from a program the kit did not write, with labels that stay the same
# across runs, and a one-line error for anything that is not a snapshot.
#
# **Where this leaves you.** A what-if says what sharing a stream would save; whether the
# sharing is allowed is `04_safety`'s question: nothing the first graph still needs may be
# live while the second runs. For vLLM's own capture code, with the PR applied in this
# process, go back to `06_vllm_in_process`.

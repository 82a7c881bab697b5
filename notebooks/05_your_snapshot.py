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
import tempfile
from html import escape
from pathlib import Path

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio
from IPython.display import display

import kit
from kit.analysis.trace.reports import stranding_verdicts
from kit.experiments.two_captures import default_source, two_captures
from kit.recordings import RECORDINGS as FIXTURES

pio.renderers.default = "plotly_mimetype"  # JupyterLab's renderer; `make walkthrough` inlines plotly.js
REPO = Path(kit.__file__).resolve().parents[1]  # relative paths are read from the repository, not the cwd
DEFAULT_PATH = "tests/fixtures/two_streams.pickle"
SHIPPED = {
    "shared_stream": FIXTURES / "shared_stream.pickle",
    "small_unpatched": FIXTURES / "replica" / "small_unpatched.pickle",
    "small_patched": FIXTURES / "replica" / "small_patched.pickle",
}
HAS_CUDA = default_source() == "live GPU"
print(f"data source: {'live GPU' if HAS_CUDA else 'recorded'} (and any snapshot you point it at)")

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
# in it runs. Whatever is wrong with a file, the kit says so in one line (`KitError`):


# %%
def load_bytes(data: bytes, name: str) -> kit.Snapshot:
    """An uploaded file: written to a scratch folder under its own name, then loaded like a path."""
    folder = Path(tempfile.mkdtemp(prefix="kit-upload-"))
    path = folder / Path(name).name
    path.write_bytes(data)
    try:
        return kit.load_snapshot(path, label=f"upload {name}")
    except kit.KitError as e:
        raise kit.KitError(str(e).replace(f"{folder}/", "")) from None


def load_path(text: str) -> kit.Snapshot:
    path = Path(text.strip()).expanduser()
    return kit.load_snapshot(path if path.is_absolute() else REPO / path)


hostile = b"cbuiltins\nprint\n(S'this never runs'\ntR."  # a pickle that calls print() when loaded
for attempt, load in (
    ("bytes that are not a pickle", lambda: load_bytes(b"\x80\x04 these bytes are not a snapshot", "notes.pickle")),
    ("a path that does not exist", lambda: load_path("tests/fixtures/no_such_snapshot.pickle")),
    ("a pickle that would call a function", lambda: load_bytes(hostile, "hostile.pickle")),
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
# any moment).

# %%
live_cache: dict[str, kit.Snapshot] = {}


def live_snapshot() -> kit.Snapshot:
    if "live" not in live_cache:
        live_cache["live"] = two_captures(shared_stream=False, source="live GPU")
    return live_cache["live"]


def load_choice(choice: str) -> kit.Snapshot:
    if choice == "live":
        return live_snapshot()
    if choice == "path":
        return load_path(path_box.value)
    return kit.load_snapshot(SHIPPED[choice])


def segment_view(snapshot: kit.Snapshot):
    table = kit.segment_table(snapshot)
    columns = ["pool_label", "pool", "stream_label", "segments", "reserved", "allocated", "active", "free"]
    view = table[[*columns, "largest_free"]].copy()
    view.attrs = table.attrs
    return kit.style_table(view)


def reuse_section(snapshot: kit.Snapshot) -> tuple[str, str]:
    """The reuse table and the stranding verdicts, or the one line saying why there are none."""
    try:
        reuse = kit.reuse_table(snapshot)
        verdicts = stranding_verdicts(snapshot)
    except kit.KitError as e:
        return f"<p><i>reuse table: {escape(str(e))}</i></p>", ""
    styled = kit.style_table(reuse).format({c: kit.format_bytes for c in ("new_segment_bytes", "stranded_bytes")})
    warnings = "".join(f"<br>warning: {escape(m)}" for m in reuse.attrs["mismatches"])
    lines = verdicts or ["no stranded segments: every new segment was needed on its own stream"]
    if snapshot.kit.get("captures"):  # capture windows: the liveness check across eager breaks too
        try:
            lines += kit.liveness_verdicts(snapshot) or ["no eager breaks in the recorded captures"]
        except kit.KitError as e:
            lines.append(str(e))
    return styled.to_html() + warnings, "<b>verdicts</b><ul>" + "".join(
        f"<li>{escape(v)}</li>" for v in lines
    ) + "</ul>"


main = widgets.ToggleButtons(options=[*(["live"] if HAS_CUDA else []), "path", *SHIPPED], description="snapshot")
main.add_class("kit-main-control")
path_box = widgets.Text(value=DEFAULT_PATH, description="path", layout={"width": "60%"})
load_button = widgets.Button(description="Load", button_style="primary")
upload = widgets.FileUpload(accept=".pickle,.pkl,.json", multiple=False, description="upload")
status, segments_html, reuse_html, verdicts_html = widgets.HTML(), widgets.HTML(), widgets.HTML(), widgets.HTML()

first = load_choice(main.value)
figures = {kit.group_bar_figure: go.FigureWidget(kit.group_bar_figure(first))}
figures[kit.segment_map_figure] = go.FigureWidget(kit.segment_map_figure(first))


def show(snapshot: kit.Snapshot) -> None:
    status.value = f"data source: {escape(snapshot.data_source)}: {escape(snapshot.source_label)}"
    segments_html.value = segment_view(snapshot).to_html()
    reuse_html.value, verdicts_html.value = reuse_section(snapshot)
    for make, widget in figures.items():
        kit.show_in(widget, make(snapshot))


def show_or_say(load) -> None:
    try:
        show(load())
    except kit.KitError as e:  # a user's file: one line, no traceback
        status.value = f"<b>kit: error:</b> {escape(str(e))}"


def on_main(change=None) -> None:
    if main.value in SHIPPED:  # the path box names the file on show
        path_box.value = str(SHIPPED[main.value].relative_to(REPO))
    show_or_say(lambda: load_choice(main.value))


def on_load(button=None) -> None:
    if main.value == "path":
        on_main()
    else:
        main.value = "path"  # observed: loads the path


def on_upload(change=None) -> None:
    files = list(upload.value.values()) if isinstance(upload.value, dict) else list(upload.value)
    if files:
        name = files[-1].get("name") or files[-1].get("metadata", {}).get("name", "upload")
        show_or_say(lambda: load_bytes(bytes(files[-1]["content"]), name))


main.observe(on_main, names="value")
load_button.on_click(on_load)
upload.observe(on_upload, names="value")
show(first)
print(f"data source: {first.data_source} ({first.source_label})")
controls = [main, widgets.HBox([path_box, load_button, upload]), status]
display(widgets.VBox([*controls, segments_html, reuse_html, verdicts_html, *figures.values()]))

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

"""Notebook 07's snapshot explorer: any snapshot in, the kit's tables, verdicts, what-if and figures out.

A reader picks a snapshot four ways: a recording shipped with the kit (the
plain `_dump_snapshot()` files of `kit/recordings/plain/` among them), a path
(read relative to a root folder), an uploaded file, or, where the process has
CUDA, the model-and-replay experiment run live. `SnapshotExplorer` shows for it
what the CLI's `table`, `reuse`, `check` and `what-if` print: one row per
(pool, stream) group, how each allocation was served, the stranding verdicts
and, when the snapshot has the capture recorder's windows, the liveness
verdicts across eager breaks; the `check` line; which capture added which
segments (from windows inferred from the trace where the snapshot has none);
the group bars and the segment map; and a what-if panel that moves one
stream (FROM) onto another (TO) and shows the predicted pools. Whatever is
wrong with a file is said in one line (`KitError`), never as a traceback,
and everything the snapshot names is escaped in the HTML parts (`kit.markup`).

`load_upload` and `load_path` are the two loaders a user's input goes
through; `segment_view`, `reuse_section`, `check_section`,
`attribution_section` and `whatif_section` are the HTML parts, and
`graph_pool_streams` picks the what-if panel's default pair.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go
from pandas.io.formats.style import Styler

from kit.allocator.rules import DEFAULT_POOL, DEFAULT_STREAM
from kit.analysis.attribution import capture_attribution
from kit.analysis.check import check_snapshot
from kit.analysis.liveness import liveness_verdicts
from kit.analysis.names import DEFAULT_STREAM_LABEL, stream_labels
from kit.analysis.tables import segment_table, style_table
from kit.analysis.trace.reports import reuse_table, stranding_verdicts
from kit.analysis.trace.walk import walk_trace
from kit.analysis.whatif import WhatIf, what_if
from kit.errors import KitError
from kit.experiments.model_and_replay import model_and_replay
from kit.load.snapshot import Snapshot, load_snapshot, snapshot_from_bytes
from kit.markup import html_text
from kit.recordings import LIVE, recording
from kit.show.pictures import FigureWidget, group_bar_figure, segment_map_figure, show_in
from kit.units import format_bytes

SHIPPED = {  # the explorer's choices of shipped recording -> file under kit/recordings/
    # Plain snapshots first; the shared-stream run leads, since the default path is its separate-stream twin.
    "two_captures_shared": "plain/two_captures_shared.pickle",
    "two_captures_separate": "plain/two_captures_separate.pickle",
    "record_stream_separate": "plain/record_stream_separate.pickle",
    "record_stream_shared": "plain/record_stream_shared.pickle",
    "compile_reduce_overhead": "plain/compile_reduce_overhead.pickle",
    "shared_stream": "shared_stream.pickle",
    "small_unpatched": "replica/small_unpatched.pickle",
    "small_patched": "replica/small_patched.pickle",
}
SEGMENT_COLUMNS = ["pool_label", "pool", "stream_label", "segments", "reserved", "allocated", "active", "free"]
SEGMENT_COLUMNS += ["largest_free"]


def load_upload(data: bytes, name: str) -> Snapshot:
    """An uploaded file's bytes, read as `load_snapshot` reads a file; errors name the upload."""
    return snapshot_from_bytes(data, origin=f"upload {Path(name).name}")


def load_path(text: str, root: Path) -> Snapshot:
    """The snapshot at a path typed by the user: `~` expanded, a relative path read from `root`."""
    path = Path(text.strip()).expanduser()
    return load_snapshot(path if path.is_absolute() else root / path)


def shown_path(path: Path, root: Path) -> str:
    """`path` as the path box shows it: relative to `root` where it lies under it."""
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def segment_columns(table: pd.DataFrame) -> Styler:
    """A `segment_table` (recorded or predicted) as the explorer shows it: bytes readable, its source named."""
    view = table[SEGMENT_COLUMNS].copy()
    view.attrs = table.attrs
    return style_table(view)


def segment_view(snapshot: Snapshot) -> Styler:
    """The segment-by-stream table: one row per (pool, stream) group, bytes readable, its source named."""
    return segment_columns(segment_table(snapshot))


def verdict_lines(snapshot: Snapshot) -> list[str]:
    """The stranding verdicts, then the liveness verdicts where the snapshot has capture windows."""
    lines = stranding_verdicts(snapshot) or ["no stranded segments: every new segment was needed on its own stream"]
    if snapshot.kit.get("captures"):  # capture windows: the liveness check across eager breaks too
        try:
            lines += liveness_verdicts(snapshot) or ["no eager breaks in the recorded captures"]
        except KitError as e:
            lines.append(str(e))
    return lines


def reuse_section(snapshot: Snapshot) -> tuple[str, str]:
    """The reuse table and the verdicts as HTML, or the one line saying why there are none (no trace)."""
    try:
        reuse = reuse_table(snapshot)
        lines = verdict_lines(snapshot)
    except KitError as e:
        return f"<p><i>reuse table: {html_text(str(e))}</i></p>", ""
    styled = style_table(reuse).format({c: format_bytes for c in ("new_segment_bytes", "stranded_bytes")})
    warnings = "".join(f"<br>warning: {html_text(m)}" for m in reuse.attrs["mismatches"])
    return styled.to_html() + warnings, f"<b>verdicts</b>{_items(lines)}"


def check_section(snapshot: Snapshot) -> str:
    """`python -m kit check` as HTML: ok, or one line per graph pool group that stranded memory."""
    try:
        result = check_snapshot(snapshot)
    except KitError as e:
        return f"<p><b>check</b>: <i>{html_text(str(e))}</i></p>"
    exit_code = 0 if result.ok else 1
    head = f"<p><b>check</b> (<code>python -m kit check</code> exits {exit_code}): {html_text(result.summary())}</p>"
    return head + (_items(result.lines()) if result.lines() else "")


def attribution_section(snapshot: Snapshot) -> str:
    """Which capture added which segments, saying whether the windows were recorded or inferred from the trace."""
    try:
        table = capture_attribution(snapshot)
    except KitError as e:
        return f"<p><b>capture attribution</b>: <i>{html_text(str(e))}</i></p>"
    if table.attrs["inferred"]:
        how = "capture windows inferred from the trace (the snapshot has no recorder windows)"
    elif snapshot.captures:
        how = "capture windows as the capture recorder wrote them"
    else:
        how = "no capture windows: the snapshot has no trace to infer them from"
    head = f"<p><b>capture attribution</b>: {html_text(how)}</p>"
    if table.empty:
        return head + "<p><i>no capture added a segment</i></p>"
    table.attrs["byte_columns"] = ["bytes"]
    return head + style_table(table).to_html()


def graph_pool_streams(snapshot: Snapshot) -> list[int]:
    """The streams that allocated in a graph pool, in the order they first did (by id without a trace)."""
    if snapshot.has_trace:
        try:
            allocs = walk_trace(snapshot).allocs
        except KitError:
            allocs = None
        if allocs is not None:
            graph = [s for s, p in zip(allocs["stream"], allocs["pool"], strict=True) if tuple(p) != DEFAULT_POOL]
            return list(dict.fromkeys(int(s) for s in graph))
    table = segment_table(snapshot)
    return sorted({int(s) for s, p in zip(table["stream"], table["pool"], strict=True) if tuple(p) != DEFAULT_POOL})


def default_pair(snapshot: Snapshot, labels: Mapping[int, str]) -> tuple[str, str]:
    """The what-if panel's default (FROM, TO): the second stream to allocate in a graph pool onto the first.

    With one such stream, that stream onto itself (the identity map); with
    none, the default stream onto itself.
    """
    streams = [labels[s] for s in graph_pool_streams(snapshot) if s in labels]
    streams = streams or [labels.get(DEFAULT_STREAM) or next(iter(labels.values()), DEFAULT_STREAM_LABEL)]
    return streams[1 if len(streams) > 1 else 0], streams[0]


def whatif_section(snapshot: Snapshot, source: str, target: str) -> tuple[str, WhatIf | None]:
    """`python -m kit what-if --map "FROM=TO"` as HTML: per-pool lines, corrections, the predicted table."""
    try:
        result = what_if(snapshot, {source: target})
    except KitError as e:
        return f"<p><b>prediction</b>: <i>{html_text(str(e))}</i></p>", None
    if source == target:
        head = (
            f"identity map ({html_text(source)} onto itself): the prediction must reproduce the recording, "
            "a self-check of the simulator"
        )
    else:
        head = f"{html_text(source)} onto {html_text(target)}: what each pool would reserve had FROM allocated on TO"
    corrections = "".join(f"<br>correction: {html_text(c)}" for c in result.corrections)
    table = segment_columns(result.predicted).to_html()
    return f"<p><b>prediction</b>: {head}</p>{_items(result.summary())}{corrections}{table}", result


def _items(lines: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{html_text(line)}</li>" for line in lines) + "</ul>"


def uploaded_file(value) -> tuple[bytes, str] | None:
    """The last uploaded file's bytes and name from a `FileUpload` value (ipywidgets 7: a dict; 8: a tuple)."""
    files = list(value.values()) if isinstance(value, dict) else list(value)
    if not files:
        return None
    name = files[-1].get("name") or files[-1].get("metadata", {}).get("name", "upload")
    return bytes(files[-1]["content"]), name


UPLOADED = "uploaded file"  # the picker's choice once a file is uploaded


class SnapshotExplorer:
    """Pick a snapshot (live, a path, a shipped recording, an upload) and read its tables, verdicts and figures.

    `root` is the folder relative paths are read from; `default_path` fills
    the path box and is the first snapshot shown; `live` offers the
    model-and-replay experiment run in this process (it needs CUDA). `widget` is
    the app to display; `main` is its main control (the snapshot picker).
    The what-if panel's `whatif_from` and `whatif_to` dropdowns list the
    shown snapshot's streams by label; `whatif` holds the last prediction
    (None where the snapshot allows none, e.g. without a trace).
    """

    def __init__(
        self, root: Path, default_path: str, *, live: bool = False, shipped: Mapping[str, str] = SHIPPED
    ) -> None:
        self.root, self.shipped = Path(root), {name: recording(file) for name, file in shipped.items()}
        self._live: Snapshot | None = None
        self._quiet = False  # set while the dropdowns are refilled, so that the what-if runs once
        self.whatif: WhatIf | None = None
        self.main = widgets.ToggleButtons(
            options=[*(["live"] if live else []), "path", *self.shipped],
            value="path",
            description="snapshot",
            style={"button_width": "auto"},  # the recordings' names in full
        )
        self.main.add_class("kit-main-control")
        # Synced on Enter (and on leaving the box), not per key: Enter loads the path.
        self.path_box = widgets.Text(
            value=default_path, description="path", layout={"width": "60%"}, continuous_update=False
        )
        self._uploaded: Snapshot | None = None
        self._drawn: Snapshot | None = None  # the snapshot the figures show
        self._setting = False  # set while the explorer itself sets the picker or the path box
        self.load_button = widgets.Button(description="Load", button_style="primary")
        self.upload = widgets.FileUpload(accept=".pickle,.pkl,.json", multiple=False, description="upload")
        self.status, self.segments_html = widgets.HTML(), widgets.HTML()
        self.reuse_html, self.verdicts_html = widgets.HTML(), widgets.HTML()
        self.check_html, self.attribution_html = widgets.HTML(), widgets.HTML()
        wide = {"width": "48%"}
        self.whatif_from = widgets.Dropdown(
            description="FROM stream", layout=wide, style={"description_width": "initial"}
        )
        self.whatif_to = widgets.Dropdown(description="TO stream", layout=wide, style={"description_width": "initial"})
        self.whatif_html = widgets.HTML()
        self.first = self.load_choice(self.main.value)
        self.current = self._drawn = self.first
        self.figures = {make: FigureWidget(make(self.first)) for make in (group_bar_figure, segment_map_figure)}
        self.main.observe(self.on_main, names="value")
        self.load_button.on_click(self.on_load)
        self.path_box.observe(self.on_load, names="value")
        self.upload.observe(self.on_upload, names="value")
        for dropdown in (self.whatif_from, self.whatif_to):
            dropdown.observe(self.on_whatif, names="value")
        self.show(self.first)

    @property
    def widget(self) -> widgets.VBox:
        controls = [self.main, widgets.HBox([self.path_box, self.load_button, self.upload]), self.status]
        tables = [self.segments_html, self.reuse_html, self.verdicts_html, self.check_html, self.attribution_html]
        whatif = [
            widgets.HTML("<b>what-if</b>: move FROM's allocations onto TO, as <code>python -m kit what-if</code>"),
            widgets.HBox([self.whatif_from, self.whatif_to]),
            self.whatif_html,
        ]
        return widgets.VBox([*controls, *tables, *self.figures.values(), *whatif])

    def live_snapshot(self) -> Snapshot:
        """The model-and-replay experiment (replay capture on a new stream), run in this process once."""
        if self._live is None:
            self._live = model_and_replay(shared_stream=False, source=LIVE)
        return self._live

    def load_choice(self, choice: str) -> Snapshot:
        if choice == "live":
            return self.live_snapshot()
        if choice == UPLOADED:
            return self._uploaded
        if choice == "path":
            return load_path(self.path_box.value, self.root)
        return load_snapshot(self.shipped[choice])

    def show(self, snapshot: Snapshot) -> None:
        self.status.value = f"data source: {html_text(snapshot.data_source)}: {html_text(snapshot.source_label)}"
        self.segments_html.value = segment_view(snapshot).to_html()
        self.reuse_html.value, self.verdicts_html.value = reuse_section(snapshot)
        self.check_html.value = check_section(snapshot)
        self.attribution_html.value = attribution_section(snapshot)
        if snapshot is not self._drawn:  # the first is drawn already: a second draw races the first render
            for make, widget in self.figures.items():
                show_in(widget, make(snapshot))
        self.current = self._drawn = snapshot
        self.set_streams(snapshot)

    def set_streams(self, snapshot: Snapshot) -> None:
        """Fill both dropdowns with the snapshot's stream labels, pick the default pair, and predict once."""
        labels = stream_labels(snapshot)
        source, target = default_pair(snapshot, labels)
        choices = list(labels.values()) or [source]  # a snapshot with no stream at all: its what-if says why
        self._quiet = True
        try:
            for dropdown, value in ((self.whatif_from, source), (self.whatif_to, target)):
                dropdown.options = choices
                dropdown.value = value
        finally:
            self._quiet = False
        self.on_whatif()

    def on_whatif(self, change=None) -> None:
        """Predict again for the dropdowns' FROM and TO."""
        if self._quiet or self.whatif_from.value is None or self.whatif_to.value is None:
            return
        self.whatif_html.value, self.whatif = whatif_section(self.current, self.whatif_from.value, self.whatif_to.value)

    def show_or_say(self, load: Callable[[], Snapshot]) -> bool:
        """Show what `load` returns; for a user's file that is no snapshot, one line and no traceback.

        After an error nothing of the previous snapshot stays: its tables and figures would read as the new one's.
        """
        try:
            self.show(load())
            return True
        except KitError as e:
            self.clear()
            self.status.value = f"<b>kit: error:</b> {html_text(str(e))} (nothing shown: pick or load a snapshot)"
            return False

    def clear(self) -> None:
        """Empty every table, verdict and figure."""
        for html in (self.segments_html, self.reuse_html, self.verdicts_html, self.check_html, self.attribution_html):
            html.value = ""
        self.whatif_html.value, self.whatif = "", None
        for widget in self.figures.values():
            show_in(widget, go.Figure(layout=dict(title="no snapshot shown", height=120)))
        self._drawn = None

    def pick(self, choice: str) -> None:
        """Set the picker to `choice` without loading anything (what is shown is already `choice`)."""
        self._setting = True
        try:
            if choice not in self.main.options:
                self.main.options = [*self.main.options, choice]
            self.main.value = choice
        finally:
            self._setting = False

    def on_main(self, change=None) -> None:
        if self._setting:
            return
        if self.main.value in self.shipped:  # the path box names the file shown
            self._setting = True
            try:
                self.path_box.value = shown_path(self.shipped[self.main.value], self.root)
            finally:
                self._setting = False
        self.show_or_say(lambda: self.load_choice(self.main.value))

    def on_load(self, change=None) -> None:
        """The Load button or Enter in the path box: read the path."""
        if self._setting:
            return
        if self.main.value == "path":
            self.on_main()
        else:
            self.main.value = "path"  # observed: loads the path

    def on_upload(self, change=None) -> None:
        if (file := uploaded_file(self.upload.value)) is not None and self.show_or_say(lambda: load_upload(*file)):
            self._uploaded = self.current
            self.pick(UPLOADED)  # the picker names what is shown

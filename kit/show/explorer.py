"""Notebook 05's snapshot explorer: any snapshot in, the kit's tables, verdicts and figures out.

A reader picks a snapshot four ways: a recording shipped with the kit, a path
(read relative to a root folder), an uploaded file, or, where the process has
CUDA, the two-capture experiment run live. `SnapshotExplorer` shows for it
what the CLI's `table` and `reuse` print: one row per (pool, stream) group,
how each allocation was served, the stranding verdicts and, when the
snapshot has the capture recorder's windows, the liveness verdicts across
eager breaks; then the group bars and the segment map. Whatever is wrong with
a file is said in one line (`KitError`), never as a traceback.

`load_upload` and `load_path` are the two loaders a user's input goes
through; `segment_view` and `reuse_section` are the HTML parts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from html import escape
from pathlib import Path

import ipywidgets as widgets
import plotly.graph_objects as go
from pandas.io.formats.style import Styler

from kit.analysis.liveness import liveness_verdicts
from kit.analysis.tables import format_bytes, segment_table, style_table
from kit.analysis.trace.reports import reuse_table, stranding_verdicts
from kit.errors import KitError
from kit.experiments.two_captures import two_captures
from kit.load.snapshot import Snapshot, load_snapshot, snapshot_from_bytes
from kit.recordings import LIVE, recording
from kit.show.pictures import group_bar_figure, segment_map_figure, show_in

SHIPPED = {  # the explorer's choices of shipped recording -> file under kit/recordings/
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


def segment_view(snapshot: Snapshot) -> Styler:
    """The segment-by-stream table: one row per (pool, stream) group, bytes readable, its source named."""
    table = segment_table(snapshot)
    view = table[SEGMENT_COLUMNS].copy()
    view.attrs = table.attrs
    return style_table(view)


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
        return f"<p><i>reuse table: {escape(str(e))}</i></p>", ""
    styled = style_table(reuse).format({c: format_bytes for c in ("new_segment_bytes", "stranded_bytes")})
    warnings = "".join(f"<br>warning: {escape(m)}" for m in reuse.attrs["mismatches"])
    items = "".join(f"<li>{escape(line)}</li>" for line in lines)
    return styled.to_html() + warnings, f"<b>verdicts</b><ul>{items}</ul>"


def uploaded_file(value) -> tuple[bytes, str] | None:
    """The last uploaded file's bytes and name from a `FileUpload` value (ipywidgets 7: a dict; 8: a tuple)."""
    files = list(value.values()) if isinstance(value, dict) else list(value)
    if not files:
        return None
    name = files[-1].get("name") or files[-1].get("metadata", {}).get("name", "upload")
    return bytes(files[-1]["content"]), name


class SnapshotExplorer:
    """Pick a snapshot (live, a path, a shipped recording, an upload) and read its tables, verdicts and figures.

    `root` is the folder relative paths are read from; `default_path` fills
    the path box; `live` offers the two-capture experiment run in this
    process (it needs CUDA). `widget` is the app to display; `main` is its
    main control.
    """

    def __init__(
        self, root: Path, default_path: str, *, live: bool = False, shipped: Mapping[str, str] = SHIPPED
    ) -> None:
        self.root, self.shipped = Path(root), {name: recording(file) for name, file in shipped.items()}
        self._live: Snapshot | None = None
        self.main = widgets.ToggleButtons(
            options=[*(["live"] if live else []), "path", *self.shipped], description="snapshot"
        )
        self.main.add_class("kit-main-control")
        self.path_box = widgets.Text(value=default_path, description="path", layout={"width": "60%"})
        self.load_button = widgets.Button(description="Load", button_style="primary")
        self.upload = widgets.FileUpload(accept=".pickle,.pkl,.json", multiple=False, description="upload")
        self.status, self.segments_html = widgets.HTML(), widgets.HTML()
        self.reuse_html, self.verdicts_html = widgets.HTML(), widgets.HTML()
        self.first = self.load_choice(self.main.value)
        self.figures = {make: go.FigureWidget(make(self.first)) for make in (group_bar_figure, segment_map_figure)}
        self.main.observe(self.on_main, names="value")
        self.load_button.on_click(self.on_load)
        self.upload.observe(self.on_upload, names="value")
        self.show(self.first)

    @property
    def widget(self) -> widgets.VBox:
        controls = [self.main, widgets.HBox([self.path_box, self.load_button, self.upload]), self.status]
        tables = [self.segments_html, self.reuse_html, self.verdicts_html]
        return widgets.VBox([*controls, *tables, *self.figures.values()])

    def live_snapshot(self) -> Snapshot:
        """The two-capture experiment (replay capture on a new stream), run in this process once."""
        if self._live is None:
            self._live = two_captures(shared_stream=False, source=LIVE)
        return self._live

    def load_choice(self, choice: str) -> Snapshot:
        if choice == "live":
            return self.live_snapshot()
        if choice == "path":
            return load_path(self.path_box.value, self.root)
        return load_snapshot(self.shipped[choice])

    def show(self, snapshot: Snapshot) -> None:
        self.status.value = f"data source: {escape(snapshot.data_source)}: {escape(snapshot.source_label)}"
        self.segments_html.value = segment_view(snapshot).to_html()
        self.reuse_html.value, self.verdicts_html.value = reuse_section(snapshot)
        for make, widget in self.figures.items():
            show_in(widget, make(snapshot))

    def show_or_say(self, load: Callable[[], Snapshot]) -> None:
        """Show what `load` returns; for a user's file that is no snapshot, one line and no traceback."""
        try:
            self.show(load())
        except KitError as e:
            self.status.value = f"<b>kit: error:</b> {escape(str(e))}"

    def on_main(self, change=None) -> None:
        if self.main.value in self.shipped:  # the path box names the file shown
            self.path_box.value = shown_path(self.shipped[self.main.value], self.root)
        self.show_or_say(lambda: self.load_choice(self.main.value))

    def on_load(self, button=None) -> None:
        if self.main.value == "path":
            self.on_main()
        else:
            self.main.value = "path"  # observed: loads the path

    def on_upload(self, change=None) -> None:
        if (file := uploaded_file(self.upload.value)) is not None:
            self.show_or_say(lambda: load_upload(*file))

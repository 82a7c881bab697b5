"""Loading snapshots: from a file, a dict or this process, checked, and kept as numpy columns.

Three layers, each importing only the one before it:
- `unpickle`: reading a file safely (a pickle that names no global and
  cannot expand, or JSON) with the garbage collector paused;
- `rows`: the snapshot format's names and limits, typed records (`Segment`,
  `Block`, `TraceEntry`) and the row parsers that check one row at a time;
- `columns`: whole snapshots checked in bulk into numpy columns, falling back
  to the row parsers for anything unusual;
- `snapshot`: `Snapshot` and `load_snapshot`, what the rest of the kit reads.
"""

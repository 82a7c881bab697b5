"""Loading snapshots: from a file, a dict or this process, checked, and kept as numpy columns.

The layers, each importing only those before it:
- `unpickle`: reading a file safely (a pickle that names no global and
  cannot expand, or JSON) with the garbage collector paused;
- `rows`: the snapshot format's names and limits, typed records (`Segment`,
  `Block`, `TraceEntry`) and the row parsers that check one row at a time;
- `columns`: whole snapshots checked in bulk into numpy columns, falling back
  to the row parsers for anything unusual; distinct frames and stacks kept once;
- `incremental`: a pickle whose trace becomes columns batch by batch while it is
  unpickled, so the whole trace is never in memory;
- `cache`: the columns of a large snapshot kept beside it and memory-mapped
  when it is opened again;
- `snapshot`: `Snapshot` and `load_snapshot`, what the rest of the kit reads.

The map of all the kit's packages and their layers is `docs/architecture.md`.
"""

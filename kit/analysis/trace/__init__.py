"""The trace walk: how each allocation of a snapshot's trace was served, and what was stranded.

`walk.walk_trace` is the entry point. It runs one of two walks over the
same state (`state`): the columnar walk (`columnar`, numpy, millions of
events, its forward pass over plain arrays in `forward`, compiled by numba
on long traces) or, for expandable segments, the walk entry by entry (`rows`), which
is also the columnar walk's reference in the tests. `reports` turns a walk
into the reuse table and the stranding verdicts.

The map of all the kit's packages and their layers is `docs/architecture.md`.
"""

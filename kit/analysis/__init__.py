"""What a snapshot says: tables, the trace walk and its reports, what-if, attribution, safety, ranks.

- `names`: labels for streams and pools that hold across processes, and
  streams as users type them;
- `tables`: the segment-by-stream table per (pool, stream) group, diffs;
- `pairing`: which graph pool of one snapshot is which of another (`diff`):
  by id where id, role and captures agree, by content where ids moved;
- `trace`: the walk that infers how every allocation of a trace was served
  (`trace.walk.walk_trace`) and its reports (`trace.reports`: reuse,
  stranding);
- `attribution`: which capture added which segments (the recorder's windows,
  or windows inferred from the trace);
- `added_segments`: each segment the captures added, the request that made it
  and why no free block served it;
- `whatif`: the recorded trace replayed on the simulator with streams mapped;
- `ranking`: every map of a snapshot's graph pools simulated, ranked by the bytes it saves;
- `answer`: the answer in one paragraph (`kit explain`, the report's first section);
- `liveness`: what each model graph holds across its eager break, and who
  writes over it; `readwrite`: the same question from the bytes read and
  written (the proof obligation); `invariant`: the PR's argument as a
  structural invariant (no graph-pool value from before the replay break
  read after it, early aux apart); `equivalence`: graph outputs against eager
  ones on a GPU;
- `check`: the CI guard (no graph pool stranded memory);
- `kv_cache`: what freed graph-pool bytes buy in KV cache blocks and tokens;
- `ranks`: the ranks of a multi-GPU run side by side;
- `workspaces`: per-stream cuBLAS workspaces in a trace, which what-if leaves out;
- `frames`: stack frames as one short line.

The map of all the kit's packages and their layers is `docs/architecture.md`.
"""

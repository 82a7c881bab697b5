"""What a snapshot says: tables, the trace walk and its reports, what-if, attribution, safety, ranks.

- `tables`: the segment-by-stream table per (pool, stream) group, diffs, labels;
- `trace`: the walk that infers how every allocation of a trace was served
  (`trace.replay.replay_trace`) and its reports (`trace.reports`: reuse,
  stranding);
- `attribution`: which capture added which segments (the recorder's windows);
- `whatif`: the recorded trace replayed on the simulator with streams mapped;
- `liveness`: what each model graph holds across its eager break, and who
  writes over it; `equivalence`: graph outputs against eager ones on a GPU;
- `ranks`: the ranks of a multi-GPU run side by side;
- `frames`: stack frames as one short line.
"""

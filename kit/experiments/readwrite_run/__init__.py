"""The proof obligation on the replica's captures: reads and writes against lifetimes, per pairing.

Each scenario (`pr`, `unpatched`, `early_aux_shared`, the scenarios of
`kit.experiments.scenarios`) is captured in a fresh process under the
capture recorder (the allocator trace) and the read/write recorder
(`kit.record.readwrite`), with phases set from the replica's breakable
capture (`replica_phases`; `capture_phases` is the one phase recorder, for
the replica's breakable graphs and, through `vllm.safety.vllm_phases`,
vLLM's): model graph N segment J, its break J, its outputs (read by the
caller after the forward), replay graph R. Then, side
by side for every (model graph, replay graph) pairing:

- the read/write analysis (`kit.analysis.readwrite.readwrite_table`): do the
  bytes R writes overlap the bytes N carries across its break;
- the lifetime analysis (`kit.analysis.liveness.liveness_table`) with what
  each break read attached to the snapshot (`break input` is a block the
  break read), and as a trace alone would give it (`trace_only`: no block is
  a break input);
- whether they agree, and for each disagreement an `explanation` built from
  the blocks involved;
- the structural invariant (`kit.analysis.invariant`): the graph-pool bytes
  read after R starts whose value came before it, from the capture
  recorder's segments in the same process, early aux told apart
  (`invariant` per scenario; `graph_pool_carried_bytes`,
  `early_aux_carried_bytes`, `invariant_holds` per pairing). A recording made
  before it lacks them, and says "not recorded" (`invariant_lines`).

`dispatchable` marks the pairings vLLM's dispatch can produce
(`kit.experiments.dispatch`); the rest are stress. Model graphs break at every
attention (`ReplicaConfig.attention_breaks`) as V4.1's do, and R is paired
with the break where the replay layers ran; the break is recorded in three
parts (before the replay layers, while they run, after them), so reads after
R starts, in the break too, are checked.
`run.record(preset, out_dir)` writes `<preset>.json` and its `PROVENANCE.json`
entry to `out_dir`; the shipped recordings are `readwrite/<preset>.json` in
the kit's recordings (`kit.recordings.RECORDINGS`, `result.RECORDINGS_DIR`):

    python -m kit.experiments.readwrite_run --preset small --out OUT   # every scenario into OUT/small.json
    python -m kit.experiments.readwrite_run --scenario pr --preset small --out pr.json   # one scenario, this process

The package, by what a reader looks for:

- `result`: the two analyses side by side and the structural invariant, computed from a
  recording of reads and writes, and the recording read back and summarized (no torch);
- `run`: the phases set from the replica's breakable capture (`capture_phases` is the one
  phase recorder), one scenario captured on CUDA, and the recording of every scenario, each
  in a fresh process;
- `__main__`: `python -m kit.experiments.readwrite_run`.
"""

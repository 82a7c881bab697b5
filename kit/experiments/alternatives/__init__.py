"""PR 63155's two alternatives measured on the replica with its speculator, and what the saving buys.

The PR's "Alternatives" section names two other ways to stop the replay graphs stranding a
graph-pool group of their own:

- (a) one `graph_capture()` for every capture, which also puts the speculator's capture on the
  model graphs' stream. The speculator runs after the target forward and reads its outputs, "so
  it needs its own lifetime argument". Here `SHARE_ALL` is the PR plus that: the replay graphs on
  the model graphs' stream (policy `share`), and the speculator's `capture()` handed the same
  stream (two more hunks, on `DSparkSpeculator.capture` and `DFlashCudaGraphManager.capture`,
  and one on `GPUModelRunner.capture_model`). `kit.patch.policy.STREAM_POLICIES` is left as it is.
- (b) shrinking `decoder_replay_cudagraph_capture_sizes`, which the PR says saves
  "proportionally": vLLM 0.33 (unpatched) capturing fewer replay sizes, two ways. `cap_<N>`
  caps them at N: every replay batch of more than N rows runs eagerly (vLLM's dispatch finds
  no graph), which under vLLM's rule any step padded to a model graph above N and at or over
  the trim threshold can make (its replay batch holds 1 up to all of its rows). `keep_<a>_<b>...`
  keeps only the sizes named and drops the ones in between: a replay batch runs in the
  smallest kept size that fits it (padded further), eagerly only above the largest kept.
  Which sizes each leaves to eager is a property of the config (`eager_replay_sizes`); the
  graph pool each leaves is measured, and from the figures the text says whether dropping
  intermediate sizes shrank the replay graphs' group or only capping the largest did
  (`replay_group_lines`).

  The sweep is a handful of fresh processes, not one per replay size: with vLLM's default
  sizing the large preset has about 30 replay sizes. Caps (`cap_sweep`): the smallest replay
  size, and for each model capture size the largest replay size at or below it (the model
  capture sizes that are replay sizes), then none. Kept sets (`keep_sweep`): the largest
  alone, the smallest and the largest, then every size (vLLM as it is, `unpatched`).

Every scenario runs the replica with its speculator (`ReplicaConfig.speculator`, a DSpark
drafter whose FULL graphs are captured last, `kit/replica/speculator.py`), each in a fresh
process (patches and the graph pool are per process):

- `unpatched`, `pr`, `share_all`: the graph pool after the capture (`graph_pool_bytes`, by
  stream), and graphs against eager, step by step: for every capture size after a step of every
  size, the target's outputs as the sampler reads them and the drafter's output (run on the
  target's real outputs, as they are left in the graph pool after a graph forward) compared bit
  for bit with an eager step (`safe`, `evidence`). Each step also says whether the drafter's
  graph overwrote the target's outputs in the pool (it may: `propose` copies them out first).
  `safe` is safe in the replica's step only (`SAFE_IN_THE_REPLICAS_STEP`): vLLM's
  `sample_tokens` also starts asynchronous output copies on a side stream before `propose`,
  which the replica does not model;
- `cap_<N>`, `keep_<sizes>`: the graph pool with fewer replay capture sizes (no graphs-vs-eager
  run: neither moves a capture to another stream, so their streams, and what is at risk, are
  `unpatched`'s; they change only which replay batches have a graph);
- every scenario: `capture_model(profile_only=True)`'s estimate (`profile_cudagraph_memory`,
  as vLLM sizes the KV cache), and from the estimates the KV cache each scenario frees
  (`kit.analysis.kv_cache`), and what the PR's 5.18 GiB buys on DeepSeek-V4.1-Flash.

The phases an analysis of reads and writes can wrap are named in `kit/replica/speculator.py`.
`run.record(preset, out_dir)` writes `<preset>.json` and its `PROVENANCE.json` entry to `out_dir`;
the shipped recordings are `alternatives/<preset>.json` under `kit/recordings/`:

    python -m kit.experiments.alternatives --preset small --out DIR
    python -m kit.experiments.alternatives --scenario share_all --preset small --out share_all.json
    python -m kit alternatives [--preset small|large] [--live] [--json]

The package, by what a reader looks for:

- `scenarios`: the scenario names (`cap_<N>`, `keep_<a>_<b>...`), the replay sizes
  each leaves to a graph or to eager, and the replica config they run on (no torch);
- `run`: alternative (a)'s patch (`SHARE_ALL`), one scenario run on CUDA, and the
  recording made of every scenario, each in a fresh process;
- `result`: the recording read back and checked, and its text and JSON (no torch);
- `__main__`: `python -m kit.experiments.alternatives`.
"""

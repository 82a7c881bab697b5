"""Pairings: every replay graph run in every model graph's break, against eager.

The safety argument for sharing a stream is that, for every model graph N and
every replay graph R that can run in N's eager break, what R writes does not
change what is read after R starts. Here every pairing is run, on fresh
random token ids, and N's outputs (hidden states and aux hidden states) are
compared bit for bit with an eager forward of the same ids and replay rows:

- a pairing vLLM's dispatch can produce (`kit.experiments.dispatch`: N at or
  above the trim threshold, R = dispatch(r) for some r in 1..N, R = N and
  R > N included) runs as vLLM runs it: N's step is given `rows_for(N, R)`
  replay rows, which the replica's dispatch pads to R, and nothing else is
  added (`how`: `dispatched`);
- any other pairing is stress: N's step runs all its N rows in replay graph
  R, forced past the dispatch (`Adversary`; `how`: `forced`), as vLLM would
  run them if its dispatch picked R (under prefill context parallelism it
  can pick R > N); the eager reference pads the same rows with zeros to R.

Either way R is the one replay graph in N's break, as in vLLM. An earlier
adversary replayed R on random inputs and then N's own replay graph; where
that own graph rewrote what R could reach (model graph 2048 at the large
preset: its own replay graph 1024 overwrites the whole early aux output) the
check could not fail, on 24 pairings at the large preset and 3 at the small.
With R the last writer in the break nothing can mask it, and running R on
N's own rows keeps the comparison one against eager (a graph-vs-graph
comparison with the same inputs' run without R would need another replay
graph in the break, the masking writer itself).

Every pairing carries its power (`kit.experiments.power`): the pairing's
graph run again with every graph-pool byte but R's outputs poisoned right
after R, against the unpoisoned run, graph against graph, bit for bit. A
pairing whose outputs survive the poison (`power` false) could not have
failed, and the verdicts never count it as shown: they say how many
pairings are shown (with power), and which are not, and why.

Model graphs below the trim threshold keep the replay layers inside the graph
and have no break for R (`no_break`); they are listed, not paired.

The hook leaves the replica's modules alone, so the PR's hunks still apply
to them: `adversary()` shadows the model state's `prepare_replay_batch` on
the instance, and arms each replay batch it sets (`Adversary.arm`: the
forced graph, the eager padding, `run_graph` wrapped to record the replay
and poison after it).

Scenarios, each captured in a fresh process (patches and the graph pool are
per process): `pr` (PR 63155), `unpatched` (vLLM 0.33) and
`early_aux_shared` (an aux hidden state at layer 1, before the replay
layers, with the replay graphs forced onto the model graphs' stream), the
scenarios of `kit.experiments.scenarios`. The replica runs with V4.1's
hyper-connection inputs to the break and an eager break at every layer's
attention (`ReplicaConfig.attention_breaks`), so model graphs break several
times and replay graphs have breaks of their own. `run.record(preset, out_dir)`
writes `<preset>.json` and its `PROVENANCE.json` entry to `out_dir`; the
shipped recordings are `safety/<preset>.json` under `kit/recordings/`:

    python -m kit.experiments.safety_run --preset small --out DIR   # the shipped: DIR = the recordings' safety/
    python -m kit.experiments.safety_run --scenario pr --preset small --out pr.json   # one scenario, this process
    python -m kit safety [--preset small|large] [--live] [--json]

The package, by what a reader looks for:

- `result`: the scenarios and which pairings they run (no torch), the recording read back and
  checked, and its tables, verdicts, text and JSON;
- `run`: the adversary and every pairing run on CUDA, one scenario in this process, and the
  recording of every scenario, each in a fresh process;
- `__main__`: `python -m kit.experiments.safety_run`.
"""

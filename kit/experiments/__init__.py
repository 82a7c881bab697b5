"""The kit's own experiments, run live on a GPU or read from their H200 recordings.

- `model_and_replay`: the root cause in a dozen lines of torch: two captures into
  one pool, on two streams or one;
- `scenarios`: the replica captured unpatched, under the PR and with early
  aux, each in a fresh process, with graphs checked against eager;
- `tensor_parallel`: the same with the replica split over several GPUs;
- `dispatch`: which replay graph can run in which model graph's break, vLLM
  0.33's rule with the lines it comes from;
- `safety_run`: every pairing of a model graph and a replay graph, as vLLM's
  dispatch runs it or, where it cannot, with the step's rows forced into the
  replay graph; graphs against eager, per scenario (`kit safety`);
- `power`: whether each pairing's check could have failed, a positive control
  that poisons the graph pool right after the replay graph (the replica's
  pairings and vLLM's path alike);
- `readwrite_run`: the bytes each post-break op reads and each replay graph
  writes, recorded during capture, and the proof obligation per pairing;
- `alternatives`: the PR's alternatives measured (every capture on one
  stream, the speculator included; capped replay sizes) and the KV cache the
  saving buys (`kit alternatives`);
- `drafter_run`: alternative (a)'s own lifetime argument, what the drafter's
  graphs write against what the step still reads;
- `vllm`: vLLM 0.33's own capture code (not the replica) with real CUDA
  graphs around a stand-in DeepSeek-V4.1, unpatched and under the PR, from
  vLLM's sources on a GPU machine without vLLM (`kit demo --vllm`), in a
  sub-package of its own (`vllm.capture`, `vllm.recordings`, `vllm.importing`,
  `vllm.standin`, `vllm.safety`: its docstring says which is which);
- `early_aux`: the PR's early-aux exception on vLLM's semantics, read from the
  vLLM-path recordings in both return shapes (V4.1's nested aux list, and the
  hypothetical flat one): needed or defensive, its cost, what would need it;
- `summary`: one experiment's figures from its snapshot, the replica's and
  vLLM's alike, and what a change saved in the graph pool;
- `recorded`: what the JSON experiments share: their recordings read and
  written (provenance and manifests by `kit.record.provenance`), and each
  scenario run in a fresh process, its error kept (`child_error`).

An experiment too large for one module is a sub-package split by what a
reader looks for: its run on the GPU (`run`, `capture` in `vllm`) apart from
its result (`result`, `scenarios`, `vllm.recordings`: the recording read back,
its text and JSON, none of it importing torch, so that `kit.show` and
`kit.cli` read results without it), and `__main__` where it is run as
`python -m` (the command its recordings' provenance names).

The map of all the kit's packages and their layers is `docs/architecture.md`.
"""

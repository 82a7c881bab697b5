"""The kit's own experiments, run live on a GPU or read from their H200 recordings.

- `two_captures`: the root cause in a dozen lines of torch: two captures into
  one pool, on two streams or one;
- `scenarios`: the replica captured unpatched, under the PR and with early
  aux, each in a fresh process, with graphs checked against eager;
- `tensor_parallel`: the same with the replica split over several GPUs;
- `dispatch`: which replay graph can run in which model graph's break, vLLM
  0.33's rule with the lines it comes from;
- `pairings`: every pairing of a model graph and a replay graph, as vLLM's
  dispatch runs it or, where it cannot, with the replay graph replayed in the
  break; graphs against eager, per policy (`kit safety`);
- `readwrite_run`: the bytes each post-break op reads and each replay graph
  writes, recorded during capture, and the proof obligation per pairing;
- `alternatives`: the PR's alternatives measured (every capture on one
  stream, the speculator included; capped replay sizes) and the KV cache the
  saving buys (`kit alternatives`);
- `drafter_run`: alternative (a)'s own lifetime argument, what the drafter's
  graphs write against what the step still reads;
- `vllm_capture`: vLLM 0.33's own capture code (not the replica) with real
  CUDA graphs around a stand-in DeepSeek-V4.1, unpatched and under the PR,
  from vLLM's sources on a GPU machine without vLLM (`kit demo --vllm`), with
  `vllm_safety`: the read/write obligation and the pairings on that path;
- `recorded`: what those three share: their JSON recordings read and written
  with their provenance, and each policy or variant run in a fresh process.

The map of all the kit's packages and their layers is `docs/architecture.md`.
"""

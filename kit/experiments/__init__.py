"""The kit's own experiments, run live on a GPU or read from their H200 recordings.

- `two_captures`: the root cause in a dozen lines of torch: two captures into
  one pool, on two streams or one;
- `scenarios`: the replica captured unpatched, under the PR and with early
  aux, each in a fresh process, with graphs checked against eager;
- `tensor_parallel`: the same with the replica split over several GPUs;
- `pairings`: every replay graph run inside every model graph's eager break
  before the real one, graphs against eager, per policy (`kit safety`);
- `readwrite_run`: the bytes each post-break op reads and each replay graph
  writes, recorded during capture, and the proof obligation per pairing;
- `alternatives`: the PR's alternatives measured (every capture on one
  stream, the speculator included; capped replay sizes) and the KV cache the
  saving buys (`kit alternatives`);
- `vllm_capture`: vLLM 0.33's own capture code (not the replica) with real
  CUDA graphs around a stand-in DeepSeek-V4.1, unpatched and under the PR,
  from vLLM's sources on a GPU machine without vLLM (`kit demo --vllm`);
- `recorded`: what those three share: their JSON recordings read and written
  with their provenance, and each policy or variant run in a fresh process.
"""

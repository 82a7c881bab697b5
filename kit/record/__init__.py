"""Recording on a GPU: every CUDA graph capture labelled, memory history managed, a snapshot per rank.

- `recorder`: `CaptureRecorder`, which wraps `CUDAGraph.capture_begin` and
  `capture_end`, labels each capture by the graph manager on the stack and
  writes capture windows into the snapshot's `kit` key;
- `history`: memory history switched on for a recording and left as found;
- `vllm_ranks`: one recorded snapshot per worker of a running vLLM;
- `workload`: `run_on_gpu`, a version-1 workload run on this process's real
  allocator (the simulator's counterpart, `kit.allocator.simulator`);
- `provenance`: where a recording was made, the `PROVENANCE.json` manifests
  with each file's sha256, and `require_cuda`, for every recorder above, for
  `kit.experiments` and for the recording scripts (`scripts/record_plain.py`
  and the others);
- `readwrite`: `ReadWriteRecorder`, a `TorchDispatchMode` that records the
  device bytes every op reads and writes, by phase of the capture.
"""

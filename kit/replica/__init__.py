"""A small vLLM-shaped runner that reproduces PR 63155's story on any CUDA GPU.

vLLM itself cannot run on the kit's GPU machine, and DeepSeek-V4.1-Flash would
not fit one GPU anyway, so this package rebuilds the capture path the PR
changes, with vLLM's names, real kernels, real CUDA graphs and the real
caching allocator:

- `parallel_state.graph_capture`: a new CUDA stream for every call (vLLM 0.33);
- `forward_context`: the batch size and graph mode of the running forward;
- `cudagraph_utils.CudaGraphManager`: one graph per capture size, largest
  first, into the global graph pool, each after a warm-up;
- `breakable_cudagraph`: breakable PIECEWISE capture, graph segments separated
  by eager breaks (`eager_break_during_capture`) recorded for replay;
- `decoder_replay_layers.DecoderReplayLayers`: the layers from the replay
  start, run in an eager break on gathered rows;
- `decoder_replay_cudagraph.DecoderReplayCudaGraphManager`: their graphs,
  captured after the model graphs into the same pool;
- `model`: the decoder (with aux hidden states), its config and presets;
- `model_state.DeepseekV41ModelState`: owns the replay graphs and picks each
  step's replay rows;
- `model_runner.GPUModelRunner`: `capture_model()` (with `profile_only`, as
  vLLM's `profile_cudagraph_memory` uses it) and `run()`;
- `speculator`: a DSpark-style drafter reading the aux hidden states, its
  FULL graphs captured last on a stream of their own (`ReplicaConfig.speculator`).

Import from the modules: `from kit.replica.model import PRESETS`,
`from kit.replica.model_runner import GPUModelRunner`.

The functions PR 63155 changes are written in vLLM 0.33's shape, unpatched,
so that `kit.patch.replica` applies the PR to them as `kit.patch.vllm` does
to vLLM: by editing their lines in-process.

Everything imports and the model builds and runs eagerly on the CPU; capture
needs CUDA.

The map of all the kit's packages and their layers is `docs/architecture.md`.
"""

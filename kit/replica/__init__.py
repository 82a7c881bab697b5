"""A small vLLM-shaped runner that reproduces PR 63155's story on any CUDA GPU.

vLLM itself cannot run on the kit's GPU machine, and DeepSeek-V4.1-Flash would
not fit one GPU anyway, so this package rebuilds the capture path the PR
changes, with vLLM's names, real kernels, real CUDA graphs and the real
caching allocator:

- `parallel_state.graph_capture`: a new CUDA stream for every call (vLLM 0.33);
- `cudagraph_utils.CudaGraphManager`: one graph per capture size, largest
  first, into the global graph pool, each after a warm-up;
- `breakable_cudagraph`: breakable PIECEWISE capture, graph segments separated
  by eager breaks (`eager_break_during_capture`) recorded for replay;
- `decoder_replay`: `DecoderReplayLayers`, which run the layers from the replay
  start in an eager break on gathered rows, and `DecoderReplayCudaGraphManager`,
  which captures them after the model graphs into the same pool;
- `model`: the decoder (with aux hidden states) and its model state;
- `model_runner.GPUModelRunner`: `capture_model()` and `run()`.

Everything imports and the model builds and runs eagerly on the CPU; capture
needs CUDA. `kit.patch.replica` applies the PR to this package in-process.
"""

from kit.replica.model import PRESETS, Decoder, DeepseekV41ModelState, ReplicaConfig
from kit.replica.model_runner import GPUModelRunner

__all__ = ["PRESETS", "Decoder", "DeepseekV41ModelState", "GPUModelRunner", "ReplicaConfig"]

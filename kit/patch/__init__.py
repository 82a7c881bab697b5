"""PR 63155 applied in-process, and taken back: to the replica (`kit.patch.replica`) and to vLLM (`kit.patch.vllm`)."""

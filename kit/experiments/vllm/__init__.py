"""vLLM 0.33's own capture path on a GPU, around a stand-in DeepSeek-V4.1: the kit's experiment on vLLM itself.

- `capture`: the entry point (`python -m kit.experiments.vllm.capture`): each
  scenario, unpatched and under the PR, in a fresh process, recorded with its
  provenance;
- `recordings`: the scenarios, and their shipped recordings read back
  (`kit demo --vllm`'s figures, the invariants, the early-aux verdict);
  no torch, no vLLM;
- `importing`: importing vLLM's capture path from its sources where vLLM's
  compiled parts are missing, with the stub packages shipped in
  `kit/experiments/vllm/stubs/` (data, put on the import path; not modules
  of the kit);
- `standin`: the stand-in model and vLLM's own runner built around it;
- `safety`: the read/write obligation, the invariant and the pairings on
  vLLM's path.

The map of all the kit's packages and their layers is `docs/architecture.md`.
"""

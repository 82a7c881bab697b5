"""PR 63155 applied in-process, and taken back: one mechanism (`pr`) for the replica (`replica`) and vLLM (`vllm`).

`policy` is the PR's replay-stream rule, `source` rewrites a function by hunks,
`install` replaces attributes all or nothing.

The map of all the kit's packages and their layers is `docs/architecture.md`.
"""

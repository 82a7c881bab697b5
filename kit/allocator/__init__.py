"""PyTorch's CUDA caching allocator: its rules, a simulator of it, and workloads for both it and the real one.

- `rules`: rounding, size classes, the split rule, the small-segment test and
  the pool constants, each written once (used by the simulator, the loaders
  and both trace walks);
- `workload`: the version-1 workload format (allocations, frees, captures,
  `empty_cache`), checked, and generators for random and PR-shaped ones;
- `simulator`: `CachingAllocatorSim`, which runs a workload and writes a
  snapshot in torch's own format.

The same workload run on this process's real allocator is a recording made
on the GPU: `kit.record.workload.run_on_gpu`.

The map of all the kit's packages and their layers is `docs/architecture.md`.
"""

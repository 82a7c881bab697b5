"""The kit's own experiments, run live on a GPU or read from their H200 recordings.

- `two_captures`: the root cause in a dozen lines of torch: two captures into
  one pool, on two streams or one;
- `scenarios`: the replica captured unpatched, under the PR and with early
  aux, each in a fresh process, with graphs checked against eager;
- `tensor_parallel`: the same with the replica split over several GPUs.
"""

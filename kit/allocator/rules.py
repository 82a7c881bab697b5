"""The caching allocator's rules, each written once.

PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`) sizes,
rounds, splits and classifies blocks by a handful of constants. The simulator
applies these rules to run a workload, the loaders use them to classify a
segment a snapshot does not label, and both trace walks use them to infer how
each recorded allocation was served. Every one of them reads the rule from
here; the constants keep the C++ names. `docs/allocator.md` says where each
rule comes from and what the H200 recordings confirmed.
"""

from __future__ import annotations

import numpy as np

K_MIN_BLOCK_SIZE = 512  # every request rounds up to a multiple of this
K_SMALL_SIZE = 1 << 20  # requests up to this size use the small pool
K_SMALL_BUFFER = 2 << 20  # a small-pool segment
K_MIN_LARGE_ALLOC = 10 << 20  # large requests below this share a 20 MiB segment
K_ROUND_LARGE = 2 << 20  # larger segments round up to a multiple of this
K_LARGE_BUFFER = 20 << 20

DEFAULT_POOL = (0, 0)  # the pool every allocation outside a graph capture uses
DEFAULT_STREAM = 0  # the device's default (legacy) stream id


def round_size(size: int) -> int:
    """Request rounding: at least 512 bytes, in multiples of 512."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def round_sizes(sizes: np.ndarray) -> np.ndarray:
    """`round_size` of every element of an int64 array."""
    return np.where(sizes < K_MIN_BLOCK_SIZE, K_MIN_BLOCK_SIZE, -(-sizes // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE)


def is_small_request(rounded: int) -> bool:
    """Whether a rounded request is served from the small pool."""
    return rounded <= K_SMALL_SIZE


def get_allocation_size(size: int) -> int:
    """The size of a new segment (one cudaMalloc) for a rounded request."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


def split_limit(small: bool) -> int:
    """A block is split when more than this many bytes would be left over.

    A small-pool block keeps a remainder of 512 bytes or more; a large-pool
    block only one above 1 MiB (smaller remainders stay part of the allocation).
    """
    return K_MIN_BLOCK_SIZE - 1 if small else K_SMALL_SIZE


def should_split(remaining: int, small: bool, expandable: bool = False) -> bool:
    """Whether a block with `remaining` bytes left after the request is split.

    Under `expandable_segments:True` every pool splits as the small pool does.
    """
    return remaining > split_limit(small or expandable)


def expandable_page_size(small: bool) -> int:
    """The granule an expandable segment maps and unmaps: 2 MiB pages in the small pool, 20 MiB in the large."""
    return K_SMALL_BUFFER if small else K_LARGE_BUFFER


def expandable_range_size(small: bool, gpu_memory: int) -> int:
    """The virtual range an expandable segment reserves: 1 1/8 of the GPU's memory, in whole pages."""
    page = expandable_page_size(small)
    return -(-(gpu_memory + gpu_memory // 8) // page) * page


def is_small_segment(total_size: int) -> bool:
    """The size class of a segment a snapshot or trace does not label: small segments are 2 MiB."""
    return total_size <= K_SMALL_BUFFER


def is_default_pool(pool: tuple[int, int] | list[int]) -> bool:
    return tuple(pool) == DEFAULT_POOL

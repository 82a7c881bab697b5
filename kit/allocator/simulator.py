"""A model of PyTorch's CUDA caching allocator, faithful enough to match it block for block.

The rules (`kit.allocator.rules`) are those of `c10/cuda/CUDACachingAllocator.cpp`
as `docs/allocator.md` states them, with what the H200 recordings added; the
names follow the C++ where one exists:

- free blocks are kept per (pool, small/large) and looked up by
  (stream, size, address): a request takes the smallest free block of *its
  own stream* that fits, lowest address first, and never a block of another
  stream (the root cause PR 63155 is about);
- the low end of a found block serves the request, the rest stays free if
  `should_split` says so; freed blocks merge with free neighbours of their
  segment (`_merge`);
- captures route allocations on the capture's stream to a private pool,
  shared between captures that name the same pool;
- `empty_cache` releases whole free segments of the default pool (pools of
  live graphs keep theirs, and graphs stay alive to the end).

With `expandable_segments=True` it models `expandable_segments:True` as torch
2.11 runs it, graph pools included: a request no free block serves maps pages
(2 MiB in the small pool, 20 MiB in the large) into a per-(stream, pool)
virtual range instead of calling cudaMalloc (`_allocate_expandable`), every
pool splits down to 512 bytes, the best fit ranks a block before an unmapped
one by the size it could grow to, blocks merge only with neighbours of their
own mapped state, and `empty_cache` unmaps the whole pages of free blocks.

`CachingAllocatorSim.run` executes a workload; `snapshot()` writes the state in
`torch.cuda.memory._snapshot()`'s own format, trace included, plus the `kit`
key naming streams, pools and graphs. With `explain=True` every allocation
records a `Decision`: the block that served it, or why a new segment was
needed, and which free blocks were refused and why.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from kit import progress
from kit.allocator.rules import (
    DEFAULT_POOL,
    K_ROUND_LARGE,
    expandable_page_size,
    expandable_range_size,
    get_allocation_size,
    is_small_request,
    round_size,
    should_split,
)
from kit.allocator.workload import DEFAULT, Op
from kit.errors import KitError

# Where simulated cudaMallocs land when no recorded addresses are given.
FIRST_ADDRESS = 0x7F00_0000_0000
RNG_STATE_BYTES = 8  # seed_extragraph_ and offset_extragraph_: one int64 each
# About an H100 80GB HBM3's memory (79.18 GiB), as the recordings bound it: 1 1/8 of it in 20 MiB
# pages, the range an expandable segment reserves, fits the 0x1646000000 bytes between recorded
# ranges. It only sizes the unmapped tail, which no snapshot shows.
GPU_MEMORY = 85_020_000_000


class ExpandableRange:
    """The virtual address range of one expandable segment, mapped page by page."""

    __slots__ = ("base", "size", "page")

    def __init__(self, base: int, size: int, page: int) -> None:
        self.base = base
        self.size = size
        self.page = page

    def pages_in(self, address: int, size: int) -> tuple[int, int]:
        """The whole pages inside [address, address + size), as (start, end); start >= end: none."""
        offset = address - self.base
        start = self.base + -(-offset // self.page) * self.page
        end = self.base + (offset + size) // self.page * self.page
        return start, end


class Block:
    __slots__ = (
        "address",
        "size",
        "requested",
        "stream",
        "pool",
        "small",
        "prev",
        "next",
        "allocated",
        "mapped",
        "range",
        "free_list",
    )

    def __init__(self, address, size, stream, pool, small, range_=None):
        self.address = address
        self.size = size
        self.requested = size
        self.stream = stream
        self.pool = pool
        self.small = small
        self.prev = None
        self.next = None
        self.allocated = False
        self.mapped = True  # False only for an expandable segment's unmapped pages
        self.range = range_  # the ExpandableRange of an expandable segment's block
        self.free_list = (pool, small, stream)  # the key of its free-block list, made once (a hot path)


@dataclass
class Decision:
    """How one allocation was served, for step-by-step pictures of block reuse."""

    index: int  # position of the op in the workload
    id: str
    requested: int
    rounded: int
    stream: str
    pool: tuple[int, int]
    small: bool
    outcome: str  # "reused" or "new_segment"
    block: int  # address of the block that served it
    split: bool
    segment_size: int = 0  # bytes of the new segment, if one was made
    refused: list[tuple[int, int, str, tuple[int, int], str]] = field(default_factory=list)
    # refused: (address, size, stream name, pool, reason) with reason in
    # "other stream", "too small", "other pool", "other size class"


class CachingAllocatorSim:
    """The caching allocator of one device, driven op by op."""

    def __init__(
        self,
        *,
        addresses: Iterable[int] | None = None,
        explain: bool = False,
        rng_state: bool = True,
        expandable_segments: bool = False,
        gpu_memory: int = GPU_MEMORY,
        stream_ids: Mapping[str, int] | None = None,
    ) -> None:
        """`addresses`: where new segments land, in order (cudaMalloc's results, or with
        `expandable_segments` the bases of the virtual ranges reserved). `stream_ids`: the
        streams' cudaStream_t values, as recorded: torch orders free blocks by them, so they
        decide which stream's segments `empty_cache` releases first."""
        self.expandable = expandable_segments
        self.gpu_memory = gpu_memory
        self.unmapped: dict[tuple, list[int]] = {}  # (pool, small, stream) -> sorted addresses of unmapped blocks
        self.ranges: dict[int, ExpandableRange] = {}  # base -> live expandable segment
        self._addresses: Iterator[int] | None = iter(addresses) if addresses is not None else None
        self._next_address = FIRST_ADDRESS
        self.explain = explain
        self.decisions: list[Decision] = []
        self.segments: dict[int, Block] = {}  # segment address -> first block
        self.free: dict[tuple, list[tuple[int, int]]] = {}  # (pool, small, stream) -> sorted (size, address)
        self.blocks: dict[int, Block] = {}  # address -> block, every block
        self.whole_free: set[int] = set()  # default-pool segments that are one free block
        self.tensors: dict[str, Block] = {}
        self.trace: list[tuple[str, int, int, int]] = []  # (action, addr, size, stream id)
        self.stream_ids: dict[str, int] = {DEFAULT: 0, **(stream_ids or {})}
        self.pool_ids: dict[str, tuple[int, int]] = {}
        self.graph_pools: dict[str, tuple[int, int]] = {}
        self.capture: tuple[str, tuple[int, int]] | None = None  # (stream, pool) while capturing
        self._uuid = 1  # graph_pool_handle() counter: (0, n)
        self._uid = 1  # private pool counter: (n, 0)
        self._rng_registered = not rng_state  # False: a replayed trace holds those allocations
        self._op_index = 0

    # -- ids ---------------------------------------------------------------
    def stream_id(self, name: str) -> int:
        if name not in self.stream_ids:
            self.stream_ids[name] = 0x1000 * len(self.stream_ids)
        return self.stream_ids[name]

    def _cuda_malloc(self, size: int) -> int:
        if self._addresses is not None:
            try:
                return next(self._addresses)
            except StopIteration:
                raise KitError(
                    "the recorded snapshot has fewer segment_alloc addresses than this workload needs"
                ) from None
        address = self._next_address
        self._next_address += (size + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE
        return address

    # -- free-block sets -----------------------------------------------------
    def _insert_free(self, b: Block) -> None:
        insort(self.free.setdefault(b.free_list, []), (b.size, b.address))

    def _remove_free(self, b: Block) -> None:
        lst = self.free[b.free_list]
        del lst[bisect_left(lst, (b.size, b.address))]

    def _get_free_block(self, pool, small, stream, size) -> Block | None:
        lst = self.free.get((pool, small, stream))
        if not lst:
            return None
        i = bisect_left(lst, (size, -1))
        if i == len(lst):
            return None
        if self.expandable:
            i = self._best_expandable_fit(lst, i)
        _, address = lst.pop(i)
        self.whole_free.discard(address)
        return self.blocks[address]

    def _best_expandable_fit(self, lst: list[tuple[int, int]], i: int) -> int:
        """The index torch's get_free_block settles on from the best fit `lst[i]` under expandable segments.

        A block right before unmapped pages is ranked by the size it could grow to
        (its own plus theirs), so the search walks on to later, bigger blocks while
        theirs is smaller.
        """
        while self.blocks[lst[i][1]].range is not None and i + 1 < len(lst):
            if self._expandable_size(lst[i + 1][1]) >= self._expandable_size(lst[i][1]):
                break
            i += 1
        return i

    def _expandable_size(self, address: int) -> int:
        b = self.blocks[address]
        return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

    # -- expandable segments ------------------------------------------------------
    def _insert_unmapped(self, b: Block) -> None:
        insort(self.unmapped.setdefault((b.pool, b.small, b.stream), []), b.address)

    def _remove_unmapped(self, b: Block) -> None:
        lst = self.unmapped[(b.pool, b.small, b.stream)]
        del lst[bisect_left(lst, b.address)]

    def _allocate_expandable(self, pool, small, stream, size) -> Block:
        """torch's try_allocate_expandable_block: map pages until a free block of `size` bytes exists; it is taken."""
        block = self._find_expandable_block(pool, small, stream, size)
        if not block.mapped:
            block = self._map_block(block, min(block.size, size))
        while block.size < size:  # free -> unmapped: map the rest, which merges into the free block
            block = self._map_block(block.next, min(size - block.size, block.next.size))
        self._remove_free(block)
        return block

    def _find_expandable_block(self, pool, small, stream, size) -> Block:
        """The lowest-addressed run of free and unmapped blocks of `size` bytes in the stream's pool, else a new range.

        The run starts at an unmapped block, or at the free block right before it.
        """
        for address in self.unmapped.get((pool, small, stream), ()):
            candidate = self.blocks[address]
            if candidate.prev is not None and not candidate.prev.allocated:
                candidate = candidate.prev
            if self._has_room(candidate, size):
                return candidate
        return self._reserve_range(pool, small, stream)

    @staticmethod
    def _has_room(b: Block | None, size: int) -> bool:
        room = 0
        while room < size and b is not None and not b.allocated:
            room += b.size
            b = b.next
        return room >= size

    def _reserve_range(self, pool, small, stream) -> Block:
        """A new expandable segment: one unmapped block spanning its whole virtual range."""
        size = expandable_range_size(small, self.gpu_memory)
        rng = ExpandableRange(self._cuda_malloc(size), size, expandable_page_size(small))
        self.ranges[rng.base] = rng
        block = Block(rng.base, size, stream, pool, small, rng)
        block.mapped = False
        self.blocks[rng.base] = block
        self._insert_unmapped(block)
        return block

    def _map_block(self, block: Block, size: int) -> Block:
        """Map the pages covering the first `size` bytes of an unmapped block; the mapped part joins free neighbours."""
        mapped = -(-size // block.range.page) * block.range.page
        self._remove_unmapped(block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(block.address + mapped, block.size - mapped, block.stream, block.pool, block.small)
            rest.range, rest.mapped = block.range, False
            self._splice_after(block, rest)
            self._insert_unmapped(rest)
            block.size = mapped
        self.trace.append(("segment_map", block.address, mapped, block.stream))
        block = self._merge_free_neighbours(block)
        self._insert_free(block)
        return block

    def _splice_after(self, block: Block, new: Block) -> None:
        new.prev, new.next = block, block.next
        if block.next is not None:
            block.next.prev = new
        block.next = new
        self.blocks[new.address] = new

    def _unmap_block(self, block: Block) -> Block:
        """torch's unmap_block: unmap the whole pages inside a free block; partial pages at its ends stay mapped."""
        start, end = block.range.pages_in(block.address, block.size)
        if start >= end:
            return block
        self._remove_free(block)
        if start > block.address:  # the partial page before: a free block of its own
            before = Block(block.address, start - block.address, block.stream, block.pool, block.small, block.range)
            before.prev, before.next = block.prev, block
            if block.prev is not None:
                block.prev.next = before
            block.prev = before
            self.blocks[before.address] = before
            self._insert_free(before)
        if block.address + block.size > end:  # and the partial page after
            after = Block(end, block.address + block.size - end, block.stream, block.pool, block.small, block.range)
            self._splice_after(block, after)
            self._insert_free(after)
        if self.blocks.get(block.address) is block:
            del self.blocks[block.address]
        block.address, block.size, block.mapped = start, end - start, False
        self.blocks[start] = block
        block = self._merge_free_neighbours(block)
        self._insert_unmapped(block)
        self.trace.append(("segment_unmap", start, end - start, block.stream))
        return block

    def _release_range(self, block: Block) -> None:
        """Give back the virtual range of an expandable segment with no page mapped."""
        self._remove_unmapped(block)
        del self.blocks[block.address]
        del self.ranges[block.range.base]

    def _release_expandable(self, pools: Iterable[tuple[int, int]]) -> None:
        """empty_cache under expandable segments: torch's release_blocks on each block pool in its order.

        The default pool's large blocks, then its small ones, then each freed graph
        pool's small and large; within one, free blocks in (stream, size, address)
        order: unsplit cudaMalloc segments are freed first, then expandable blocks unmapped.
        """
        order = [(DEFAULT_POOL, False), (DEFAULT_POOL, True)]
        order += [(p, small) for p in pools if p != DEFAULT_POOL for small in (True, False)]
        for pool, small in order:
            free = sorted(
                (stream, size, address)
                for (p, s, stream), lst in self.free.items()
                if p == pool and s == small
                for size, address in lst
            )
            blocks = [self.blocks[address] for _, _, address in free]
            for b in blocks:
                if b.range is None and b.prev is None and b.next is None:
                    self._free_segment(b)
            for b in blocks:
                if b.range is not None:
                    b = self._unmap_block(b)
                    if b.prev is None and b.next is None:
                        self._release_range(b)

    def _free_segment(self, b: Block) -> None:
        """cudaFree a segment that is one free block."""
        del self.blocks[b.address]
        del self.segments[b.address]
        self._remove_free(b)
        self.whole_free.discard(b.address)
        self.trace.append(("segment_free", b.address, b.size, b.stream))

    def _refusals(self, pool, small, stream, size) -> list[tuple]:
        names = {v: k for k, v in self.stream_ids.items()}
        out = []
        for (p, s, st), lst in self.free.items():
            for bsize, address in lst:
                if p != pool:
                    reason = "other pool"
                elif s != small:
                    reason = "other size class"
                elif st != stream:
                    reason = "other stream"
                elif bsize < size:
                    reason = "too small"
                else:
                    continue
                out.append((address, bsize, names.get(st, str(st)), p, reason))
        return sorted(out, key=lambda r: (r[4] != "other stream", r[3], r[0]))

    # -- allocation ------------------------------------------------------------
    def _pool_for(self, stream: int) -> tuple[int, int]:
        if self.capture and self.capture[0] == stream:
            return self.capture[1]
        return DEFAULT_POOL

    def malloc(self, tid: str, size: int, stream_name: str, pool: tuple[int, int] | None = None) -> Block:
        """Serve `size` bytes on a stream; `pool` overrides the capture's routing (replaying a recorded trace)."""
        stream = self.stream_id(stream_name)
        rounded = round_size(size)
        small = is_small_request(rounded)
        pool = self._pool_for(stream) if pool is None else pool
        refused = self._refusals(pool, small, stream, rounded) if self.explain else []
        block = self._get_free_block(pool, small, stream, rounded)
        new_segment = 0
        if block is None and self.expandable:
            mapped_before = len(self.trace)
            block = self._allocate_expandable(pool, small, stream, rounded)
            new_segment = sum(e[2] for e in self.trace[mapped_before:])
        elif block is None:
            new_segment = get_allocation_size(rounded)
            address = self._cuda_malloc(new_segment)
            block = Block(address, new_segment, stream, pool, small)
            self.blocks[address] = block
            self.segments[address] = block
            self.trace.append(("segment_alloc", address, new_segment, stream))
        remaining = block.size - rounded
        split = should_split(remaining, small, self.expandable)
        if split:
            rest = Block(block.address + rounded, remaining, stream, pool, small, block.range)
            rest.prev, rest.next = block, block.next
            if block.next:
                block.next.prev = rest
            block.next = rest
            block.size = rounded
            self.blocks[rest.address] = rest
            self._insert_free(rest)
        block.allocated = True
        block.requested = size
        self.tensors[tid] = block
        self.trace.append(("alloc", block.address, size, stream))
        if self.explain:
            self.decisions.append(
                Decision(
                    index=self._op_index,
                    id=tid,
                    requested=size,
                    rounded=rounded,
                    stream=stream_name,
                    pool=pool,
                    small=small,
                    outcome="new_segment" if new_segment else "reused",
                    block=block.address,
                    split=split,
                    segment_size=new_segment,
                    refused=refused,
                )
            )
        return block

    def free_tensor(self, tid: str) -> None:
        block = self.tensors.pop(tid)
        self.trace.append(("free_requested", block.address, block.requested, block.stream))
        self.trace.append(("free_completed", block.address, block.requested, block.stream))
        block.allocated = False
        block = self._merge_free_neighbours(block)
        self._insert_free(block)
        if block.prev is None and block.next is None and block.pool == DEFAULT_POOL:
            self.whole_free.add(block.address)

    def _merge_free_neighbours(self, block: Block) -> Block:
        """Fold the free neighbours of `block` that share its mapped state into it (torch's try_merge_blocks)."""
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated and neighbour.mapped == block.mapped:
                block = self._merge(block, neighbour)
        return block

    def _merge(self, block: Block, neighbour: Block) -> Block:
        """Fold a free neighbour into `block`; the merged block keeps the lower address."""
        if neighbour.mapped:
            self._remove_free(neighbour)
        else:
            self._remove_unmapped(neighbour)
        low, high = (neighbour, block) if neighbour.address < block.address else (block, neighbour)
        low.size += high.size
        low.next = high.next
        if high.next:
            high.next.prev = low
        del self.blocks[high.address]
        return low

    def seed_segment(
        self,
        address: int,
        size: int,
        stream_name: str,
        pool: tuple[int, int],
        small: bool,
        active: dict[int, int],
        requested: dict[int, int] | None = None,
    ) -> None:
        """A segment that existed before the first op, its `active` blocks ({address: size}) allocated.

        `requested` gives the bytes asked for of any block that did not ask for its whole size.

        Each active block is the tensor `seeded:<address in hex>`; the gaps between them are free blocks.
        """
        stream = self.stream_id(stream_name)
        cuts = sorted(active.items())
        pieces, cursor = [], address
        for start, length in cuts:
            if start > cursor:
                pieces.append((cursor, start - cursor, False))
            pieces.append((start, length, True))
            cursor = start + length
        if address + size > cursor:
            pieces.append((cursor, address + size - cursor, False))
        prev = None
        for start, length, allocated in pieces:
            b = Block(start, length, stream, pool, small)
            b.allocated = allocated
            b.requested = (requested or {}).get(start, length)
            b.prev = prev
            if prev is not None:
                prev.next = b
            prev = b
            self.blocks[start] = b
            if allocated:
                self.tensors[seeded_id(start)] = b
            else:
                self._insert_free(b)
        first = self.blocks[pieces[0][0]]
        self.segments[address] = first
        if len(pieces) == 1 and not pieces[0][2] and pool == DEFAULT_POOL:
            self.whole_free.add(address)

    def empty_cache(self, pools: Iterable[tuple[int, int]] = ()) -> None:
        """Release every whole free segment of the default pool (graph pools stay: their graphs live).

        `pools` names graph pools whose graphs are gone, so their free segments go too.
        """
        extra = set(pools)
        if self.expandable:
            self._release_expandable(sorted(extra))
            return
        if extra:
            for address, first in self.segments.items():
                if first.pool in extra and first.next is None and not first.allocated:
                    self.whole_free.add(address)
        # torch releases the large pool's blocks, then the small pool's, each set in
        # (stream, size, address) order; only the trace's order depends on it.
        released = sorted(
            self.whole_free, key=lambda a: (self.blocks[a].small, self.blocks[a].stream, self.blocks[a].size, a)
        )
        for address in released:
            b = self.blocks.pop(address)
            del self.segments[address]
            self._remove_free(b)
            self.trace.append(("segment_free", address, b.size, b.stream))
        self.whole_free.clear()

    def capture_begin(self, graph: str, pool_name: str | None, stream_name: str) -> None:
        stream = self.stream_id(stream_name)
        if not self._rng_registered:
            # The first capture registers the default CUDA generator, which allocates its
            # seed and offset tensors on the capture stream, in the default pool, before
            # capturing starts; they live as long as any graph does.
            self._rng_registered = True
            for name in ("kit:rng seed", "kit:rng offset"):
                self.malloc(f"{name} ({graph})", RNG_STATE_BYTES, stream_name)
        if pool_name is None:
            pool = (self._uid, 0)
            self._uid += 1
        else:
            if pool_name not in self.pool_ids:
                self.pool_ids[pool_name] = (0, self._uuid)
                self._uuid += 1
            pool = self.pool_ids[pool_name]
        self.graph_pools[graph] = pool
        self.capture = (stream, pool)

    def capture_end(self, graph: str) -> None:
        self.capture = None

    def run(self, ops: list[Op]) -> CachingAllocatorSim:
        for i, op in enumerate(progress.track(ops, "simulating the workload", every=4096)):
            self._op_index = i
            kind = op.op
            if kind == "alloc":
                self.malloc(op.id, op.bytes, op.stream)
            elif kind == "free":
                self.free_tensor(op.id)
            elif kind == "capture_begin":
                self.capture_begin(op.graph, op.pool, op.stream)
            elif kind == "capture_end":
                self.capture_end(op.graph)
            else:
                self.empty_cache()
        return self

    # -- snapshot ----------------------------------------------------------------
    def _segment_heads(self) -> dict[int, Block]:
        """The first block of each segment as torch's snapshot lists them: one per contiguous mapped range."""
        heads = dict(self.segments)
        for base in self.ranges:
            b, prev_mapped = self.blocks[base], False
            while b is not None:
                if b.mapped and not prev_mapped:
                    heads[b.address] = b
                prev_mapped, b = b.mapped, b.next
        return heads

    def reserved_by_pool(self) -> dict[tuple[int, int], int]:
        """Bytes reserved per pool now: what `snapshot()` would show, without building it."""
        out: dict[tuple[int, int], int] = {}
        for head in self._segment_heads().values():
            b, total = head, 0
            while b is not None and b.mapped:
                total += b.size
                b = b.next
            pool = tuple(head.pool)
            out[pool] = out.get(pool, 0) + total
        return out

    def snapshot(self, *, trace: bool = True) -> dict:
        """The state as `torch.cuda.memory._snapshot()` would return it, plus the `kit` key.

        `trace=False` leaves the trace out (an empty one): for a caller that reads the segments only.
        """
        segments = []
        for address, head in sorted(self._segment_heads().items()):
            b = head
            blocks = []
            total = allocated = requested = 0
            while b is not None and b.mapped:
                state = "active_allocated" if b.allocated else "inactive"
                blocks.append(
                    {"address": b.address, "size": b.size, "requested_size": b.requested, "state": state, "frames": []}
                )
                total += b.size
                if b.allocated:
                    allocated += b.size
                    requested += b.requested
                b = b.next
            first = head
            segments.append(
                {
                    "device": 0,
                    "address": address,
                    "total_size": total,
                    "allocated_size": allocated,
                    "active_size": allocated,
                    "requested_size": requested,
                    "stream": first.stream,
                    "segment_type": "small" if first.small else "large",
                    "segment_pool_id": first.pool,
                    "is_expandable": first.range is not None,
                    "frames": [],
                    "blocks": blocks,
                }
            )
        entries = [
            {"action": a, "addr": addr, "size": size, "stream": stream, "time_us": i, "frames": []}
            for i, (a, addr, size, stream) in enumerate(self.trace if trace else ())
        ]
        return {
            "segments": segments,
            "device_traces": [entries],
            "allocator_settings": {},
            "kit": {
                "source": "simulator",
                "workload": True,
                "streams": dict(self.stream_ids),
                "pools": {name: list(pid) for name, pid in self.pool_ids.items()},
                "graphs": {g: list(pid) for g, pid in self.graph_pools.items()},
            },
        }


def seeded_id(address: int) -> str:
    """The tensor id of a block that was active before the first op (`seed_segment`)."""
    return f"seeded:{address:#x}"


def simulate(
    ops: list[Op],
    *,
    addresses: Iterable[int] | None = None,
    explain: bool = False,
    expandable_segments: bool = False,
    stream_ids: Mapping[str, int] | None = None,
) -> CachingAllocatorSim:
    """Run `ops` on a fresh simulated allocator (`expandable_segments`: as under `expandable_segments:True`)."""
    sim = CachingAllocatorSim(
        addresses=addresses, explain=explain, expandable_segments=expandable_segments, stream_ids=stream_ids
    )
    return sim.run(ops)


def recorded_segment_addresses(snapshot: dict) -> list[int]:
    """The addresses of a recorded trace's `segment_alloc` entries, in order."""
    traces = snapshot.get("device_traces") or []
    return [e["addr"] for t in traces for e in t if e.get("action") == "segment_alloc"]


def recorded_range_bases(snapshot: dict, gpu_memory: int = GPU_MEMORY) -> list[int]:
    """The bases of the virtual ranges a recorded trace's expandable segments reserved, in order."""
    events = ((e.get("action"), e.get("addr"), e.get("size")) for t in snapshot.get("device_traces") or [] for e in t)
    return range_bases(events, gpu_memory)


def range_bases(events: Iterable[tuple[str, int, int]], gpu_memory: int = GPU_MEMORY) -> list[int]:
    """The bases of the virtual ranges reserved over trace events (action, address, size), in order.

    A range's first `segment_map` is at its base; a map inside a live range is
    not a new one. A range is given back once its last page is unmapped, and
    the driver may hand its addresses out again.
    """
    span = expandable_range_size(False, gpu_memory)  # the large pool's, the longer
    mapped: dict[int, int] = {}  # live base -> bytes mapped
    bases = []
    for action, addr, size in events:
        if action not in ("segment_map", "segment_unmap"):
            continue
        base = next((b for b in mapped if b <= addr < b + span), None)
        if action == "segment_map":
            if base is None:
                base = addr
                bases.append(base)
            mapped[base] = mapped.get(base, 0) + size
        elif base is not None:
            mapped[base] -= size
            if mapped[base] == 0:
                del mapped[base]
    return bases

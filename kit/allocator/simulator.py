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

`CachingAllocatorSim.run` executes a workload; `snapshot()` writes the state in
`torch.cuda.memory._snapshot()`'s own format, trace included, plus the `kit`
key naming streams, pools and graphs. With `explain=True` every allocation
records a `Decision`: the block that served it, or why a new segment was
needed, and which free blocks were refused and why.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from kit import progress
from kit.allocator.rules import (
    DEFAULT_POOL,
    K_ROUND_LARGE,
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


class Block:
    __slots__ = ("address", "size", "requested", "stream", "pool", "small", "prev", "next", "allocated")

    def __init__(self, address, size, stream, pool, small):
        self.address = address
        self.size = size
        self.requested = size
        self.stream = stream
        self.pool = pool
        self.small = small
        self.prev = None
        self.next = None
        self.allocated = False


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
        self, *, addresses: Iterable[int] | None = None, explain: bool = False, rng_state: bool = True
    ) -> None:
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
        self.stream_ids: dict[str, int] = {DEFAULT: 0}
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
        insort(self.free.setdefault((b.pool, b.small, b.stream), []), (b.size, b.address))

    def _remove_free(self, b: Block) -> None:
        lst = self.free[(b.pool, b.small, b.stream)]
        del lst[bisect_left(lst, (b.size, b.address))]

    def _get_free_block(self, pool, small, stream, size) -> Block | None:
        lst = self.free.get((pool, small, stream))
        if not lst:
            return None
        i = bisect_left(lst, (size, -1))
        if i == len(lst):
            return None
        _, address = lst.pop(i)
        self.whole_free.discard(address)
        return self.blocks[address]

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
        if block is None:
            new_segment = get_allocation_size(rounded)
            address = self._cuda_malloc(new_segment)
            block = Block(address, new_segment, stream, pool, small)
            self.blocks[address] = block
            self.segments[address] = block
            self.trace.append(("segment_alloc", address, new_segment, stream))
        remaining = block.size - rounded
        split = should_split(remaining, small)
        if split:
            rest = Block(block.address + rounded, remaining, stream, pool, small)
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
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                block = self._merge(block, neighbour)
        self._insert_free(block)
        if block.prev is None and block.next is None and block.pool == DEFAULT_POOL:
            self.whole_free.add(block.address)

    def _merge(self, block: Block, neighbour: Block) -> Block:
        """Fold a free neighbour into `block`; the merged block keeps the lower address."""
        self._remove_free(neighbour)
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
    def snapshot(self) -> dict:
        """The state as `torch.cuda.memory._snapshot()` would return it, plus the `kit` key."""
        segments = []
        for address in sorted(self.segments):
            b = self.segments[address]
            blocks = []
            total = allocated = requested = 0
            while b is not None:
                state = "active_allocated" if b.allocated else "inactive"
                blocks.append(
                    {"address": b.address, "size": b.size, "requested_size": b.requested, "state": state, "frames": []}
                )
                total += b.size
                if b.allocated:
                    allocated += b.size
                    requested += b.requested
                b = b.next
            first = self.segments[address]
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
                    "is_expandable": False,
                    "frames": [],
                    "blocks": blocks,
                }
            )
        trace = [
            {"action": a, "addr": addr, "size": size, "stream": stream, "time_us": i, "frames": []}
            for i, (a, addr, size, stream) in enumerate(self.trace)
        ]
        return {
            "segments": segments,
            "device_traces": [trace],
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


def simulate(ops: list[Op], *, addresses: Iterable[int] | None = None, explain: bool = False) -> CachingAllocatorSim:
    """Run `ops` on a fresh simulated allocator."""
    return CachingAllocatorSim(addresses=addresses, explain=explain).run(ops)


def recorded_segment_addresses(snapshot: dict) -> list[int]:
    """The addresses of a recorded trace's `segment_alloc` entries, in order."""
    traces = snapshot.get("device_traces") or []
    return [e["addr"] for t in traces for e in t if e.get("action") == "segment_alloc"]

"""A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, DeviceCachingAllocator, as of
torch 2.11) in its default configuration: no expandable segments, max_split_size unlimited, no garbage collection
threshold, no roundup_power2_divisions.

Replaying a run's storage allocations and frees through it gives what torch.cuda.memory_stats() would report on
the GPU: allocated, reserved, requested, active and inactive-split bytes, segments, retries and OOMs (current and
peak, pooled into "all", "small_pool" and "large_pool" as torch does), and where each block would lie.

Not modelled, being absent or inert in inference replays: recordStream and its CUDA events (a block used on a
second stream is freed at once here, not when that stream's work ends), the free-memory callbacks (CUDA IPC only),
memory fractions and garbage collection, expandable segments, max_split_size and its oversize rules, and private
pool checkpoints (torch.compile's CUDA-graph trees).
"""
from __future__ import annotations

from bisect import bisect_left, insort

KiB, MiB = 1024, 1024 * 1024
MIN_BLOCK = 512  # kMinBlockSize: every size is rounded up to a multiple of it
SMALL_SIZE = 1 * MiB  # kSmallSize: the largest request served from the small pool
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: the small pool's segment
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: the segment of a request between 1 and 10 MiB
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: from here a request gets a segment of its own size...
ROUND_LARGE = 2 * MiB  # kRoundLarge: ...rounded up to 2 MiB
_VA_BASE = 0x7F00_0000_0000  # where the first segment lies; any 2 MiB-aligned, non-zero base would do

# memory_stats() keys that are Stat arrays, each with .all/.small_pool/.large_pool and current/peak/allocated/freed
STAT_NAMES = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes", "active_bytes",
              "inactive_split_bytes", "requested_bytes")
_ALL, _SMALL, _LARGE = 0, 1, 2
_POOL_TYPES = ("all", "small_pool", "large_pool")


class OutOfMemoryError(MemoryError):
    """A segment the allocator needed would not fit in the device's capacity, even after freeing cached segments
    (a MemoryError: the harness reports the item's error as out of memory, as it does torch's own)."""


def round_size(size: int) -> int:
    """round_size: up to a multiple of 512 B, at least 512 B."""
    return MIN_BLOCK if size < MIN_BLOCK else -(-size // MIN_BLOCK) * MIN_BLOCK


def allocation_size(size: int) -> int:
    """get_allocation_size: the segment cudaMalloc'd for a (rounded) request no cached block can serve."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class _Stat:
    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0

    def add(self, n: int) -> None:  # increase_stat / decrease_stat (n < 0)
        self.current += n
        if n >= 0:
            self.allocated += n
            if self.current > self.peak:
                self.peak = self.current
        else:
            self.freed -= n


class _Block:
    """A piece of a segment: handed out (allocated) or cached free in its pool. prev/next link the segment's pieces."""
    __slots__ = ("addr", "size", "requested", "stream", "pool", "allocated", "prev", "next")

    def __init__(self, addr: int, size: int, stream: int, pool: "_Pool"):
        self.addr, self.size, self.stream, self.pool = addr, size, stream, pool
        self.requested, self.allocated, self.prev, self.next = 0, False, None, None

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class _Pool:
    """BlockPool: the free blocks of one size class, per stream, sorted by (size, address) for best fit."""
    __slots__ = ("small", "owner", "free")

    def __init__(self, small: bool, owner: "_PrivatePool | None" = None):
        self.small, self.owner = small, owner
        self.free: dict[int, list[tuple[int, int]]] = {}  # stream -> sorted [(size, addr)]


class _PrivatePool:
    """PrivatePool: a CUDA graph's own small and large pools. use_count: live captures/graphs using it;
    segments: its cudaMalloc'd segments not yet freed (cudaMalloc_count)."""
    __slots__ = ("small", "large", "use_count", "segments")

    def __init__(self):
        self.small, self.large = _Pool(True, self), _Pool(False, self)
        self.use_count, self.segments = 1, 0


class CachingAllocator:
    """One device's caching allocator. malloc returns the block's address (0 for 0 bytes, as torch's nullptr);
    free, address and the stats take it back."""

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity  # bytes cudaMalloc can hand out in all; None: never fails
        self._small, self._large = _Pool(True), _Pool(False)
        self._blocks: dict[int, _Block] = {}  # addr -> every live block, free or allocated
        self._graph_pools: dict[object, _PrivatePool] = {}
        self._freeable: set[object] = set()  # graph_pools_freeable: pools no graph uses any more
        self._captures: list[tuple[object, int]] = []  # captures_underway: (pool id, capturing stream)
        self._next_va = _VA_BASE
        self._stats = {name: (_Stat(), _Stat(), _Stat()) for name in STAT_NAMES}
        self._counts = dict.fromkeys(("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                                      "num_device_free"), 0)

    # -- stats -------------------------------------------------------------------------------------
    def _add(self, name: str, pool: _Pool, n: int) -> None:
        """for_each_selected_stat_type: the aggregate and the pool's size class."""
        s = self._stats[name]
        s[_ALL].add(n)
        s[_SMALL if pool.small else _LARGE].add(n)

    def stats(self) -> dict[str, int]:
        """Flat keys as torch.cuda.memory_stats() names them."""
        out = dict(self._counts)
        for name, per_type in self._stats.items():
            for kind, stat in zip(_POOL_TYPES, per_type):
                for field in ("current", "peak", "allocated", "freed"):
                    out[f"{name}.{kind}.{field}"] = getattr(stat, field)
        for name in ("oversize_allocations", "oversize_segments"):  # nothing is oversize without max_split_size
            out.update({f"{name}.{field}": 0 for field in ("current", "peak", "allocated", "freed")})
        out["max_split_size"] = -1  # SIZE_MAX as torch's int64 reports it: unlimited
        return dict(sorted(out.items()))

    def reset_peak(self) -> None:
        """resetPeakStats: every peak to its current value."""
        for per_type in self._stats.values():
            for stat in per_type:
                stat.peak = stat.current

    # -- malloc / free ---------------------------------------------------------------------------
    def _pool_for(self, size: int, stream: int) -> _Pool:
        """get_pool: a capture's private pool when the stream is capturing into one, else the global pools."""
        for pool_id, capturing in self._captures:
            if capturing == stream:
                private = self._graph_pools[pool_id]
                return private.small if size <= SMALL_SIZE else private.large
        return self._small if size <= SMALL_SIZE else self._large

    def _take_free(self, pool: _Pool, stream: int, size: int) -> _Block | None:
        """get_free_block: the smallest cached block of this pool and stream that fits, lowest address first."""
        free = pool.free.get(stream)
        if not free:
            return None
        i = bisect_left(free, (size, 0))
        if i == len(free):
            return None
        return self._blocks[free.pop(i)[1]]

    def _segment(self, pool: _Pool, stream: int, size: int) -> _Block | None:
        """alloc_block: cudaMalloc a segment, or None where it would exceed the capacity."""
        if self.capacity is not None and self._stats["reserved_bytes"][_ALL].current + size > self.capacity:
            return None
        block = _Block(self._next_va, size, stream, pool)
        self._next_va += -(-size // ROUND_LARGE) * ROUND_LARGE  # cudaMalloc's ranges are 2 MiB-aligned
        self._blocks[block.addr] = block
        if pool.owner is not None:
            pool.owner.segments += 1
        self._add("segment", pool, 1)
        self._add("reserved_bytes", pool, size)
        self._counts["num_device_alloc"] += 1
        return block

    def malloc(self, size: int, stream: int = 0) -> int:
        """DeviceCachingAllocator::malloc for `size` requested bytes; the block's address is its handle."""
        if size == 0:  # NativeCachingAllocator::allocate hands out nullptr and touches no block
            return 0
        rounded = round_size(size)
        pool = self._pool_for(rounded, stream)
        block = self._take_free(pool, stream, rounded)
        if block is None:
            need = allocation_size(rounded)
            block = self._segment(pool, stream, need)
            # release_available_cached_blocks frees nothing while max_split_size is unlimited; then, outside a
            # capture, release_cached_blocks (empty_cache) and one more try, counted as a retry.
            if block is None and not self._captures:
                self._release_cached()
                self._counts["num_alloc_retries"] += 1
                block = self._segment(pool, stream, need)
            if block is None:
                self._counts["num_ooms"] += 1
                raise OutOfMemoryError(
                    f"CUDA out of memory (predicted). Tried to allocate {need} bytes with "
                    f"{self._stats['reserved_bytes'][_ALL].current} of {self.capacity} reserved")
        return self._hand_out(block, rounded, size)

    def _hand_out(self, block: _Block, size: int, requested: int) -> int:
        """alloc_found_block: split off the remainder when should_split says so, then count the block as allocated."""
        pool, remaining = block.pool, block.size - size
        # should_split: a small pool keeps any remainder of 512 B or more; a large pool only one over 1 MiB.
        if (remaining >= MIN_BLOCK) if pool.small else (remaining > SMALL_SIZE):
            rest = _Block(block.addr + size, remaining, block.stream, pool)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            was_split = block.is_split
            block.next, block.size = rest, size
            self._blocks[rest.addr] = rest
            insort(pool.free.setdefault(rest.stream, []), (remaining, rest.addr))
            if was_split:  # an inactive split block shrinks by what is handed out
                self._add("inactive_split_bytes", pool, -size)
            else:  # a new inactive split block: the remainder
                self._add("inactive_split_bytes", pool, remaining)
                self._add("inactive_split", pool, 1)
        elif block.is_split:  # a whole inactive split block becomes active
            self._add("inactive_split_bytes", pool, -block.size)
            self._add("inactive_split", pool, -1)
        block.allocated, block.requested = True, requested
        self._add("allocation", pool, 1)
        self._add("allocated_bytes", pool, block.size)
        self._add("active", pool, 1)
        self._add("active_bytes", pool, block.size)
        self._add("requested_bytes", pool, requested)
        return block.addr

    def free(self, handle: int) -> None:
        """free + free_block: back to its own pool (a private pool's block stays there), merged with free neighbours."""
        if handle == 0:
            return
        block = self._blocks.get(handle)
        if block is None or not block.allocated:
            raise ValueError(f"free of {handle:#x}, which is not an allocated block")
        pool, size, requested = block.pool, block.size, block.requested
        block.allocated = False
        self._add("allocation", pool, -1)
        self._add("allocated_bytes", pool, -size)
        split_blocks = split_bytes = 0
        for neighbour in (block.prev, block.next):  # try_merge_blocks
            if neighbour is None or neighbour.allocated:
                continue
            free = pool.free[neighbour.stream]
            del free[bisect_left(free, (neighbour.size, neighbour.addr))]
            del self._blocks[neighbour.addr]
            if neighbour is block.prev:
                del self._blocks[block.addr]
                block.addr, block.prev = neighbour.addr, neighbour.prev
                if block.prev is not None:
                    block.prev.next = block
                self._blocks[block.addr] = block
            else:
                block.next = neighbour.next
                if block.next is not None:
                    block.next.prev = block
            block.size += neighbour.size
            split_blocks -= 1
            split_bytes -= neighbour.size
        insort(pool.free.setdefault(block.stream, []), (block.size, block.addr))
        if block.is_split:
            split_blocks += 1
            split_bytes += block.size
        if split_blocks:
            self._add("inactive_split", pool, split_blocks)
        if split_bytes:
            self._add("inactive_split_bytes", pool, split_bytes)
        self._add("active", pool, -1)
        self._add("active_bytes", pool, -size)
        self._add("requested_bytes", pool, -requested)

    def address(self, handle: int) -> int:
        """The block's device address (its handle: blocks keep their address while allocated)."""
        return handle

    # -- releasing segments ----------------------------------------------------------------------
    def _release_pool(self, pool: _Pool) -> None:
        """release_blocks: cudaFree every cached block that is a whole segment (never split), on any stream."""
        for stream, free in pool.free.items():
            keep = []
            for size, addr in free:
                block = self._blocks[addr]
                if block.is_split:
                    keep.append((size, addr))
                    continue
                del self._blocks[addr]  # release_block
                if pool.owner is not None:
                    pool.owner.segments -= 1
                self._add("segment", pool, -1)
                self._add("reserved_bytes", pool, -size)
                self._counts["num_device_free"] += 1
            pool.free[stream] = keep

    def _release_cached(self) -> None:
        """release_cached_blocks: the global pools, then the pools no graph uses; an empty one is forgotten."""
        self._counts["num_sync_all_streams"] += 1  # synchronize_and_free_events
        self._release_pool(self._large)
        self._release_pool(self._small)
        for pool_id in list(self._freeable):
            private = self._graph_pools[pool_id]
            self._release_pool(private.small)
            self._release_pool(private.large)
            if private.segments == 0:
                del self._graph_pools[pool_id]
                self._freeable.discard(pool_id)

    def empty_cache(self) -> None:
        """emptyCache: torch.cuda.empty_cache()."""
        if self._captures:  # synchronize_and_free_events asserts no capture is underway
            raise RuntimeError("empty_cache during a CUDA graph capture")
        self._release_cached()

    # -- CUDA graph private pools -------------------------------------------------------------------
    def begin_allocate_to_pool(self, pool, stream: int) -> None:
        """beginAllocateToPool (CUDAGraph::capture_begin): the stream's allocations go to the pool until the end
        call; a pool id already in use (graph_pool_handle() shared by several captures) gains one user."""
        private = self._graph_pools.get(pool)
        if private is None:
            self._graph_pools[pool] = _PrivatePool()
        elif private.use_count == 0:  # create_or_incref_pool asserts the shared pool is still live
            raise ValueError(f"pool {pool!r} was released; it cannot take a new capture")
        else:
            private.use_count += 1
        if any(p == pool for p, _ in self._captures):
            raise ValueError(f"already capturing into pool {pool!r}")
        self._captures.append((pool, stream))

    def end_allocate_to_pool(self, pool) -> None:
        """endAllocateToPool (capture_end): later allocations go to the global pools again."""
        for i, (p, _) in enumerate(self._captures):
            if p == pool:
                del self._captures[i]
                return
        raise ValueError(f"not capturing into pool {pool!r}")

    def release_pool(self, pool) -> None:
        """releasePool (CUDAGraph::reset, the graph's destruction): one user fewer; with none left, the next
        empty_cache may cudaFree the pool's segments that are wholly free. Its blocks never serve other allocations."""
        private = self._graph_pools[pool]
        if private.use_count <= 0:
            raise ValueError(f"pool {pool!r} released more often than used")
        private.use_count -= 1
        if private.use_count == 0:
            self._freeable.add(pool)

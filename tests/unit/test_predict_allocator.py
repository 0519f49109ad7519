"""The caching-allocator model against hand-computed cases, one rule each (sizes as
c10/cuda/CUDACachingAllocator.cpp computes them), and the cuBLAS workspaces it is given."""
import random

import pytest

from memcheck.predict.allocator import MiB, CachingAllocator, OutOfMemoryError, allocation_size, round_size
from memcheck.predict.cublas import CublasWorkspaces, chosen_workspace_size, lt_workspace_size, parse_op


def stat(a, key, field="current", kind="all"):
    return a.stats()[f"{key}.{kind}.{field}"]


def test_round_size():
    assert [round_size(n) for n in (1, 511, 512, 513, 1000, 1024)] == [512, 512, 512, 1024, 1024, 1024]


def test_allocation_size():
    assert allocation_size(512) == allocation_size(MiB) == 2 * MiB
    assert allocation_size(MiB + 512) == allocation_size(10 * MiB - 512) == 20 * MiB
    assert allocation_size(10 * MiB) == 10 * MiB
    assert allocation_size(12 * MiB + 512) == 14 * MiB


def test_one_byte_counts_512_allocated_1_requested_in_a_2mib_small_segment():
    a = CachingAllocator()
    a.malloc(1)
    s = a.stats()
    assert s["allocated_bytes.all.current"] == s["allocated_bytes.small_pool.current"] == 512
    assert s["requested_bytes.all.current"] == 1
    assert s["reserved_bytes.all.current"] == s["reserved_bytes.small_pool.current"] == 2 * MiB
    assert s["segment.all.current"] == 1
    assert s["inactive_split_bytes.all.current"] == 2 * MiB - 512
    assert s["inactive_split.all.current"] == 1


def test_zero_bytes_takes_no_block():
    a = CachingAllocator()
    assert a.malloc(0) == 0
    a.free(0)
    assert stat(a, "reserved_bytes") == stat(a, "allocation") == 0


def test_one_mib_plus_one_takes_a_20mib_segment_and_splits():
    a = CachingAllocator()
    a.malloc(MiB + 1)
    assert stat(a, "allocated_bytes", kind="large_pool") == MiB + 512
    assert stat(a, "reserved_bytes", kind="large_pool") == 20 * MiB
    assert stat(a, "inactive_split_bytes") == 20 * MiB - MiB - 512
    # the 19 MiB remainder serves the next mid-size request: no new segment
    a.malloc(5 * MiB)
    assert stat(a, "segment") == 1
    assert stat(a, "inactive_split_bytes") == 14 * MiB - 512
    assert stat(a, "allocated_bytes") == 6 * MiB + 512


def test_large_remainder_of_one_mib_or_less_is_not_split_off():
    a = CachingAllocator()
    h = a.malloc(12 * MiB)  # a 12 MiB segment of its own
    a.free(h)
    a.malloc(11 * MiB)  # reuses it whole: the 1 MiB left is not > kSmallSize
    assert stat(a, "allocated_bytes") == 12 * MiB
    assert stat(a, "requested_bytes") == 11 * MiB
    assert stat(a, "inactive_split_bytes") == 0
    assert stat(a, "segment") == 1


def test_twelve_mib_gets_its_own_segment():
    a = CachingAllocator()
    a.malloc(12 * MiB)
    assert stat(a, "reserved_bytes") == 12 * MiB
    assert stat(a, "inactive_split_bytes") == 0
    a.malloc(12 * MiB + 1)
    assert stat(a, "reserved_bytes") == 12 * MiB + 14 * MiB


def test_small_allocations_share_a_segment():
    a = CachingAllocator()
    handles = [a.malloc(100 * 1024) for _ in range(20)]  # 20 x 100 KiB = 2000 KiB < 2 MiB
    assert stat(a, "segment") == 1
    assert stat(a, "inactive_split_bytes") == 2 * MiB - 20 * 100 * 1024
    assert [a.address(h) - a.address(handles[0]) for h in handles[:3]] == [0, 100 * 1024, 200 * 1024]
    a.malloc(100 * 1024)  # 48 KiB left: a second segment
    assert stat(a, "segment") == 2
    assert stat(a, "reserved_bytes", kind="small_pool") == 4 * MiB


def test_frees_merge_so_a_larger_request_reuses_the_segment():
    a = CachingAllocator()
    x, y = a.malloc(4 * MiB), a.malloc(4 * MiB)  # one 20 MiB segment: 4 + 4 + 12 free
    a.free(x)
    assert stat(a, "inactive_split_bytes") == 16 * MiB  # two free pieces, 4 and 12
    assert stat(a, "inactive_split") == 2
    a.free(y)  # merges with both neighbours: one whole free segment again
    assert stat(a, "inactive_split_bytes") == 0
    assert stat(a, "inactive_split") == 0
    z = a.malloc(18 * MiB)
    assert stat(a, "segment") == 1
    assert a.address(z) == a.address(x)
    assert stat(a, "active_bytes") == 18 * MiB  # the 2 MiB remainder (> 1 MiB) is split off
    assert stat(a, "inactive_split_bytes") == 2 * MiB


def test_best_fit_takes_the_smallest_block_that_fits():
    a = CachingAllocator()
    big, _, small, _ = a.malloc(14 * MiB), a.malloc(12 * MiB), a.malloc(12 * MiB), a.malloc(12 * MiB)
    a.free(big)
    a.free(small)
    assert a.malloc(11 * MiB) == small  # 12 MiB fits better than 14 MiB at a lower address
    assert stat(a, "segment") == 4
    b = CachingAllocator()
    first, second = b.malloc(12 * MiB), b.malloc(12 * MiB)
    b.free(second)
    b.free(first)
    assert b.malloc(12 * MiB) == first  # equal sizes: the lower address


def test_streams_do_not_share_blocks():
    a = CachingAllocator()
    h = a.malloc(MiB, stream=1)
    a.free(h)
    a.malloc(MiB, stream=2)
    assert stat(a, "segment") == 2
    assert stat(a, "reserved_bytes") == 4 * MiB
    assert a.malloc(MiB, stream=1) == h


def test_empty_cache_releases_only_wholly_free_segments():
    a = CachingAllocator()
    kept = a.malloc(4 * MiB)  # holds a 20 MiB segment, 16 MiB of it free
    freed = a.malloc(20 * MiB)  # does not fit the 16 MiB: a segment of its own
    small = a.malloc(512)
    a.free(freed)
    a.free(small)
    a.empty_cache()
    assert stat(a, "reserved_bytes") == 20 * MiB
    assert stat(a, "segment") == 1
    assert a.stats()["num_device_free"] == 2
    assert stat(a, "inactive_split_bytes") == 16 * MiB
    a.free(kept)
    a.empty_cache()
    assert stat(a, "reserved_bytes") == 0
    assert stat(a, "reserved_bytes", "peak") == 42 * MiB


def test_private_pool_blocks_are_not_reused_and_survive_empty_cache_until_released():
    a = CachingAllocator()
    a.begin_allocate_to_pool("g1", stream=7)
    inside = a.malloc(4 * MiB, stream=7)
    a.malloc(512, stream=3)  # another stream during the capture: the global pool
    a.end_allocate_to_pool("g1")
    assert stat(a, "segment") == 2
    a.free(inside)  # back to the graph's pool
    a.malloc(4 * MiB, stream=7)  # the capture ended: a global 20 MiB segment, not the private block
    assert stat(a, "segment") == 3
    a.empty_cache()
    assert stat(a, "reserved_bytes") == 20 * MiB + 2 * MiB + 20 * MiB  # the private segment stays
    a.release_pool("g1")
    a.empty_cache()
    assert stat(a, "reserved_bytes") == 20 * MiB + 2 * MiB
    with pytest.raises(KeyError):
        a.release_pool("g1")  # forgotten once empty


def test_private_pool_is_reused_within_and_shared_across_captures():
    a = CachingAllocator()
    a.begin_allocate_to_pool("shared", stream=5)
    x = a.malloc(12 * MiB, stream=5)
    a.free(x)
    assert a.malloc(12 * MiB, stream=5) == x  # freed during capture, reused by the same capture
    a.end_allocate_to_pool("shared")
    a.free(x)
    a.begin_allocate_to_pool("shared", stream=5)  # a second graph on the same pool_handle
    assert a.malloc(10 * MiB, stream=5) == x
    a.end_allocate_to_pool("shared")
    a.free(x)
    assert stat(a, "segment") == 1
    a.release_pool("shared")
    a.empty_cache()
    assert stat(a, "segment") == 1  # one graph still uses it
    a.release_pool("shared")
    a.empty_cache()
    assert stat(a, "segment") == 0


def test_live_output_keeps_released_pool():
    a = CachingAllocator()
    a.begin_allocate_to_pool(1, stream=9)
    out = a.malloc(3 * MiB, stream=9)
    a.end_allocate_to_pool(1)
    a.release_pool(1)
    a.empty_cache()
    assert stat(a, "reserved_bytes") == 20 * MiB  # the output still lives in it
    a.free(out)
    a.empty_cache()
    assert stat(a, "reserved_bytes") == 0


def test_capacity_retries_then_ooms():
    a = CachingAllocator(capacity=40 * MiB)
    a.free(a.malloc(20 * MiB))
    a.malloc(20 * MiB, stream=1)  # stream 1 cannot use stream 0's cached 20 MiB
    assert a.stats()["num_alloc_retries"] == 0
    assert stat(a, "reserved_bytes") == 40 * MiB
    a.malloc(12 * MiB, stream=2)  # no room: frees stream 0's cached segment, retries
    assert a.stats()["num_alloc_retries"] == 1
    assert stat(a, "reserved_bytes") == 32 * MiB
    with pytest.raises(OutOfMemoryError):
        a.malloc(10 * MiB, stream=2)
    s = a.stats()
    assert (s["num_alloc_retries"], s["num_ooms"]) == (2, 1)
    assert s["reserved_bytes.all.current"] == 32 * MiB


def test_no_retry_during_capture():
    a = CachingAllocator(capacity=20 * MiB)
    a.free(a.malloc(20 * MiB))
    a.begin_allocate_to_pool("g", stream=4)
    with pytest.raises(OutOfMemoryError):
        a.malloc(12 * MiB, stream=4)
    assert (a.stats()["num_alloc_retries"], a.stats()["num_ooms"]) == (0, 1)
    with pytest.raises(RuntimeError):
        a.empty_cache()


def test_peaks_and_reset_peak():
    a = CachingAllocator()
    x = a.malloc(12 * MiB)
    a.free(x)
    assert stat(a, "allocated_bytes", "peak") == 12 * MiB
    assert stat(a, "allocated_bytes", "allocated") == stat(a, "allocated_bytes", "freed") == 12 * MiB
    a.reset_peak()
    assert stat(a, "allocated_bytes", "peak") == 0
    assert stat(a, "reserved_bytes", "peak") == 12 * MiB  # still reserved: its peak is its current
    a.malloc(512)
    assert stat(a, "allocated_bytes", "peak") == 512
    assert stat(a, "reserved_bytes", "peak") == 14 * MiB


def test_addresses_are_2mib_aligned_and_do_not_overlap():
    a = CachingAllocator()
    rng = random.Random(0)
    live = {}
    for _ in range(3000):
        if live and rng.random() < 0.45:
            h = rng.choice(list(live))
            del live[h]
            a.free(h)
        else:
            size = rng.choice([rng.randrange(1, 4096), rng.randrange(1, 3 * MiB), rng.randrange(1, 40 * MiB)])
            h = a.malloc(size, stream=rng.choice([0, 0, 1]))
            live[h] = round_size(size)
    spans = sorted((a.address(h), a.address(h) + n) for h, n in live.items())
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    assert stat(a, "allocated_bytes") <= stat(a, "reserved_bytes")
    assert stat(a, "requested_bytes") == stat(a, "requested_bytes", "allocated") - stat(a, "requested_bytes", "freed")
    a2 = CachingAllocator()
    seg_starts = [a2.address(a2.malloc(n)) for n in (512, 12 * MiB, 3 * MiB, 30 * MiB)]  # each a new segment
    assert all(s % (2 * MiB) == 0 for s in seg_starts)
    assert seg_starts[1] - seg_starts[0] == 2 * MiB and seg_starts[2] - seg_starts[1] == 12 * MiB


def test_everything_freed_leaves_only_cache():
    a = CachingAllocator()
    rng = random.Random(1)
    handles = [a.malloc(rng.randrange(1, 30 * MiB), stream=rng.randrange(3)) for _ in range(500)]
    rng.shuffle(handles)
    for h in handles:
        a.free(h)
    s = a.stats()
    assert s["allocated_bytes.all.current"] == s["active_bytes.all.current"] == s["requested_bytes.all.current"] == 0
    assert s["inactive_split_bytes.all.current"] == 0  # every segment merged back whole
    a.empty_cache()
    assert a.stats()["reserved_bytes.all.current"] == 0


# -- cuBLAS workspaces ---------------------------------------------------------------------------
def test_workspace_sizes():
    assert chosen_workspace_size((9, 0)) == 32 * MiB
    assert chosen_workspace_size((8, 0)) == 8 * MiB + 128 * 1024
    assert chosen_workspace_size((9, 0), {"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8"}) == 8 * MiB + 128 * 1024
    assert chosen_workspace_size((9, 0), {"CUBLAS_WORKSPACE_CONFIG": "bogus"}) == 32 * MiB
    assert lt_workspace_size((9, 0)) == MiB
    assert lt_workspace_size((9, 0), {"CUBLASLT_WORKSPACE_SIZE": "65536"}) == 32 * MiB  # capped at cuBLAS's
    assert lt_workspace_size((9, 0), {"CUBLASLT_WORKSPACE_SIZE": "65536",
                                      "TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0"}) == 64 * MiB
    assert parse_op("aten.addmm_.default") == ("addmm", True)
    assert parse_op("torch.ops.aten._scaled_mm.default") == ("_scaled_mm", False)


def test_first_cublas_op_per_stream_allocates_32mib_once_and_keeps_it():
    a = CachingAllocator()
    w = CublasWorkspaces(a)
    w.before_op("aten.add.Tensor")
    assert stat(a, "allocated_bytes") == 0
    w.before_op("aten.mm.default")
    w.before_op("aten.bmm.default")
    assert stat(a, "allocated_bytes") == stat(a, "reserved_bytes") == 32 * MiB
    a.empty_cache()
    assert stat(a, "reserved_bytes") == 32 * MiB  # held by the handle's map
    w.before_op("aten.mm.default", stream=1)
    assert stat(a, "allocated_bytes") == 64 * MiB


def test_lt_op_adds_a_separate_1mib_workspace():
    a = CachingAllocator()
    w = CublasWorkspaces(a)
    w.before_op("aten.addmm.default")
    w.before_op("aten._scaled_mm.default")
    assert stat(a, "allocated_bytes") == 33 * MiB
    assert stat(a, "reserved_bytes") == 32 * MiB + 2 * MiB  # the 1 MiB comes from a small-pool segment
    w.before_op("aten.addmm.default", stream=1, lt=False)  # a decode-shaped addmm: cuBLAS only
    assert stat(a, "allocated_bytes") == 65 * MiB
    unified = CachingAllocator()
    CublasWorkspaces(unified, env={"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "1"}).before_op("addmm")
    assert stat(unified, "allocated_bytes") == 32 * MiB


def test_capture_stream_workspace_comes_from_the_private_pool():
    a = CachingAllocator()
    w = CublasWorkspaces(a)
    w.before_op("mm", stream=0)
    a.begin_allocate_to_pool("g", stream=8)
    w.at_capture_begin()
    w.before_op("mm", stream=8)  # a new stream: its workspace is allocated during the capture
    a.end_allocate_to_pool("g")
    a.release_pool("g")
    a.empty_cache()
    assert stat(a, "reserved_bytes") == 64 * MiB  # the workspace pins the graph's pool
    w.at_capture_begin(cudagraph_trees=True)  # clearCublasWorkspaces
    assert stat(a, "allocated_bytes") == 0
    a.empty_cache()
    assert stat(a, "reserved_bytes") == 0

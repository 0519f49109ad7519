"""kv.page_footprint's unit: distinct 2 MiB pages under byte ranges of the KV cache, counted one way for
every stack (hf: the cache tensors; paged: the blocks a decode step reads; vllm: the scheduled blocks)."""
from __future__ import annotations

PAGE_SHIFT = 21  # 2 MiB pages: the GPU's large-page size, the unit the TLB maps KV reads in


def pages_spanned(first_byte, last_byte):
    """Page numbers under each inclusive byte range [first_byte[i], last_byte[i]] (int64 tensors of addresses),
    with repeats: every range's first and last page and, for a range longer than two pages, those between."""
    import torch

    first, last = first_byte >> PAGE_SHIFT, last_byte >> PAGE_SHIFT
    long = last - first > 1
    inner = [torch.arange(a + 1, b) for a, b in zip(first[long].tolist(), last[long].tolist())]
    return torch.cat([first, last, *inner])


def distinct_pages(first_byte, last_byte) -> int:
    import torch

    return int(torch.unique(pages_spanned(first_byte, last_byte)).numel()) if first_byte.numel() else 0

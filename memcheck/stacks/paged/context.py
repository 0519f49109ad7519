"""What one forward pass needs to know about its batch: where each token's K/V goes, and which
cached tokens each sequence attends over. Built by the model runner, read by every attention layer.

Rows of a batch: decode tokens first (one per sequence, handed to the paged decode kernel), then the
prefill chunks packed back to back (the paged prefill kernel)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StepContext:
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64: cache slot of each token's K/V
    num_decode: int  # the first num_decode rows are single-token steps
    decode_block_table: torch.Tensor | None = None  # [num_decode, max_blocks] int32
    decode_seq_lens: torch.Tensor | None = None  # [num_decode] int32, the new token included
    prefill_block_table: torch.Tensor | None = None  # [num_prefill, max_blocks] int32
    cu_seqlens_q: torch.Tensor | None = None  # [num_prefill + 1] int32, offsets within the prefill rows
    prefill_seq_lens: torch.Tensor | None = None  # [num_prefill] int32: cached + new tokens
    max_q_len: int = 0
    prefill_context_tokens: int = 0  # the sum of prefill_seq_lens (host side: no device sync to size a buffer)
    prefill_pairs: int = 0  # (new token, context token) pairs the prefill rows attend over, causal: host side
    mla_prefill_absorbed: bool | None = None  # MLA prefill's form forced (the warm-up compiles both); None: weighed
    image_rows: torch.Tensor | None = None  # rows whose embedding is an image feature row
    image_feats: torch.Tensor | None = None  # [len(image_rows), hidden]
    cos: torch.Tensor | None = None  # rotary tables for `positions`, set by the model
    sin: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode

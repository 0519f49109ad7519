"""The model runner: turns a scheduled batch into packed tensors (token ids, positions, cache slots,
block tables), runs the model, and samples greedily from the last row of every sequence that reached
the end of its tokens."""
from __future__ import annotations

import torch

from .block_manager import BlockManager
from .context import StepContext
from .graphs import DecodeGraphs
from .mla import MLAttention
from .model import CausalLM
from .pending import PendingTokens
from .request import Request


class ModelRunner:
    def __init__(self, model: CausalLM, device, vision=None, graphs: DecodeGraphs | None = None):
        self.model, self.device, self.vision, self.graphs = model, device, vision, graphs

    @torch.inference_mode()
    def step(self, batch: list[tuple[Request, int]], return_logits: bool = False, after: PendingTokens | None = None,
             defer: bool = False):
        """Feed each (sequence, n): its next n tokens. Returns {seq_id: token} for every sequence whose
        last token was fed (and the float32 logits of those rows, in batch order, when asked).
        after: the previous step's tokens if they have not landed (their sequences end in placeholders): a
        decode-only step takes those ids on the device, any other step lands them first. defer: a decode-only
        step returns its own PendingTokens instead of waiting for its tokens.
        A batch of decodes only replays a CUDA graph when the engine captured them."""
        decode_only = not return_logits and self._decode_only(batch)
        if after is not None and not after.landed and not decode_only:
            after.land()
        live = after if after is not None and not after.landed else None
        seqs = [s for s, _ in batch]
        graphs = self.graphs
        if decode_only and graphs is not None and graphs.fits(len(batch), max(len(s.block_table) for s in seqs)):
            if live is not None and live.tokens.data_ptr() != graphs.buffer.data_ptr():
                live.land()  # an eager step's tokens: not where the graph reads them
                live = None
            positions = [s.num_computed for s in seqs]
            sources = [live.rows.get(s.seq_id, -1) for s in seqs] if live is not None else None
            tokens, host, ready = graphs.launch([max(0, s.token_ids[p]) for s, p in zip(seqs, positions)], positions,
                                                [s.slot(p) for s, p in zip(seqs, positions)],
                                                [s.block_table for s in seqs], sources)
            pending = PendingTokens(seqs, tokens, host, ready)
            return pending if defer else pending.read()
        decode = [(s, n) for s, n in batch if n == 1]
        prefill = [(s, n) for s, n in batch if n > 1]
        ids, positions, slots, sample_rows, samplers = [], [], [], [], []
        image_rows, image_feats = [], []
        for s, n in decode + prefill:
            start, end = s.num_computed, s.num_computed + n
            if start < s.image_tokens:  # this chunk reaches image placeholders
                if s.image_embeds is None:
                    s.image_embeds = self.vision.encode(s.image_source)
                stop = min(end, s.image_tokens)
                image_rows += range(len(ids), len(ids) + stop - start)
                image_feats.append(s.image_embeds[start:stop])
                if end >= s.image_tokens:
                    s.image_embeds = None  # the last placeholders are in this pass
            ids += s.token_ids[start:end]
            positions += range(start, end)
            slots += s.slot_mapping(start, end)
            if end == len(s):
                sample_rows.append(len(ids) - 1)
                samplers.append(s)
        ctx = self._context(decode, prefill, positions, slots)
        input_ids = self._tensor(ids, torch.int64)
        if live is not None:  # decode-only: the previous step's tokens, still on the device, for its sequences
            rows = [(i, live.rows[s.seq_id]) for i, s in enumerate(seqs) if s.seq_id in live.rows]
            if rows:
                dst, src = zip(*rows)
                input_ids[list(dst)] = live.tokens[list(src)].to(torch.int64)
        if image_rows:
            ctx.image_rows, ctx.image_feats = self._tensor(image_rows, torch.int64), torch.cat(image_feats)
        hidden = self.model(input_ids, ctx)
        logits = self.model.logits(hidden[self._tensor(sample_rows, torch.int64)])
        del hidden
        if defer and decode_only:  # every row samples, in batch order
            return PendingTokens(samplers, logits.argmax(-1))
        tokens = logits.argmax(-1).tolist()
        sampled = {s.seq_id: t for s, t in zip(samplers, tokens)}
        return (sampled, logits) if return_logits else sampled

    @torch.inference_mode()
    def warm_prefill(self, num_tokens: int, block_size: int) -> None:
        """A prefill pass of num_tokens (one sequence) that writes no cache slot and attends over block 0:
        the prefill-shaped kernels compile (Triton JIT) here rather than inside the first timed step. MLA models
        make a second pass in the other form of MLA prefill (memcheck/stacks/paged/mla.py: a step may take either),
        of 16 tokens: the kernels compile the same for any count, and the warm-up runs inside the memory metrics'
        window (at 2,048 tokens, v2-4layers' absorbed pass raised gpu.heap_alloc.peak by 240 MiB on the H200)."""
        mla = any(isinstance(m, MLAttention) for m in self.model.modules())
        for absorbed, n in ((False, num_tokens), (True, min(num_tokens, 16))) if mla else ((None, num_tokens),):
            ctx = StepContext(torch.arange(n, device=self.device), torch.full((n,), -1, device=self.device), 0)
            ctx.prefill_block_table = torch.zeros(1, -(-n // block_size), dtype=torch.int32, device=self.device)
            ctx.cu_seqlens_q = self._tensor([0, n], torch.int32)
            ctx.prefill_seq_lens = self._tensor([n], torch.int32)
            ctx.max_q_len = ctx.prefill_context_tokens = n
            ctx.prefill_pairs = n * (n + 1) // 2
            ctx.mla_prefill_absorbed = absorbed
            hidden = self.model(torch.zeros(n, dtype=torch.int64, device=self.device), ctx)
            self.model.logits(hidden[-1:]).argmax(-1).tolist()

    def _decode_only(self, batch) -> bool:
        """Every sequence feeds its last token (past any image placeholders)."""
        return all(n == 1 and s.num_computed + 1 == len(s) and s.num_computed >= s.image_tokens for s, n in batch)

    def _context(self, decode, prefill, positions, slots) -> StepContext:
        ctx = StepContext(self._tensor(positions, torch.int64), self._tensor(slots, torch.int64), len(decode))
        if decode:
            ctx.decode_block_table = BlockManager.block_tables([s for s, _ in decode], self.device)
            ctx.decode_seq_lens = self._tensor([s.num_computed + 1 for s, _ in decode], torch.int32)
        if prefill:
            q_lens = [n for _, n in prefill]
            seq_lens = [s.num_computed + n for s, n in prefill]
            cu = [0]
            for n in q_lens:
                cu.append(cu[-1] + n)
            ctx.prefill_block_table = BlockManager.block_tables([s for s, _ in prefill], self.device)
            ctx.cu_seqlens_q = self._tensor(cu, torch.int32)
            ctx.prefill_seq_lens = self._tensor(seq_lens, torch.int32)
            ctx.max_q_len = max(q_lens)
            ctx.prefill_context_tokens = sum(seq_lens)
            ctx.prefill_pairs = sum(n * s.num_computed + n * (n + 1) // 2 for s, n in prefill)
        return ctx

    def _tensor(self, values, dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

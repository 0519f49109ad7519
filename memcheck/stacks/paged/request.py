"""One request as the engine tracks it: a Sequence (token ids and block table) plus how far
its K/V has been computed, what it may still generate, and its timestamps."""
from __future__ import annotations

from .sequence import Sequence


class Request(Sequence):
    def __init__(self, index: int, prompt: list[int], max_new_tokens: int, arrival_step: int, block_size: int,
                 image_tokens: int = 0, image_source=None):
        super().__init__(prompt, block_size)
        self.index = index  # position in the workload's request list
        self.num_prompt_tokens = len(prompt)
        self.max_new_tokens = max_new_tokens
        self.arrival_step = arrival_step
        self.num_computed = 0  # leading tokens whose K/V is in the cache
        self.needs_slot = False  # a sampled token was appended and has no cache slot yet
        self.preemptions = 0
        self.t_arrived = self.t_first = self.t_last = 0.0
        self.image_tokens = image_tokens  # leading placeholder tokens whose embeddings come from images
        self.image_source = image_source  # which seeded images (vision.image_sources)
        self.image_embeds = None  # [image_tokens, hidden] while the prefill has placeholders left

    @property
    def num_pending(self) -> int:
        """Tokens still to feed: the rest of the prompt (or of a recompute), or the one sampled token."""
        return len(self) - self.num_computed

    @property
    def output(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def finished(self) -> bool:
        return len(self) - self.num_prompt_tokens >= self.max_new_tokens

"""The paged engine with two regressions a change could bring, each switched on by the environment: a stack plugin
(entry point `leaky = leakystack:LeakyPaged`) for showing that a prediction on the CPU and a measurement on the GPU
fail the same change (benchmarks/predict_leaks.py, tests/e2e/test_predict_gate.py).

    LEAK_KIB_PER_STEP=N   a device buffer of N KiB kept per engine step (a cache that is never trimmed)
    LEAK_BLOCKS=1         the first finished sequence's KV blocks never handed back
"""
import os

import torch

from memcheck.stacks.paged.block_manager import BlockManager
from memcheck.stacks.paged.stack import PagedStack


class LeakyPaged(PagedStack):
    name = "leaky"

    def run(self, collectors):
        kept, per_step = [], int(os.environ.get("LEAK_KIB_PER_STEP", "0"))
        advance = self.engine.advance

        def advance_keeping(batch):
            advance(batch)
            if per_step:
                kept.append(torch.empty(per_step * 1024, dtype=torch.uint8, device=self.device))

        self.engine.advance = advance_keeping
        if os.environ.get("LEAK_BLOCKS"):
            free, first = BlockManager.free, []

            def free_all_but_the_first(blocks, seq):
                if first:
                    return free(blocks, seq)
                first.append(seq)  # its blocks are never handed back

            self.engine.blocks.free = free_all_but_the_first.__get__(self.engine.blocks)
        return super().run(collectors)

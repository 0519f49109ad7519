"""The `hf` stack: stock transformers generate() with its default cache and the attention transformers picks for
the model, as users get them; `hf:sdpa`, `hf:eager`, `hf:flash_attention_2` pin one (hf_attention.py).

Stock generate() batches statically: requests that arrive at the same step form one batch,
left-padded to the longest prompt, and decode until the longest request is done. That padding and
over-decoding is what the KV metrics show as waste. Image requests (DeepSeek-VL) carry their
images' placeholder tokens before the prompt; the towers run inside generate()'s prefill.
"""
from __future__ import annotations

import time
from itertools import groupby

from ..devices import is_cuda
from ..errors import StackUnavailable
from ..metrics.value import MetricValue
from ..transformers_compat import text_config
from . import hf_attention
from .base import RunResult, Stack
from .hf_kv import CacheWatcher
from .time_metrics import time_metrics


class HFStack(Stack):
    name = "hf"
    attentions = hf_attention.ATTENTIONS
    warmup_moves_memory = False  # the warm-up is the workload once: the host heap is traced through it

    @classmethod
    def check_prediction(cls, workload) -> None:
        raise StackUnavailable("transformers' generate() decides after every step whether to stop from a value "
                               "computed on the device (GenerationMixin._sample: `unfinished_sequences.max() == 0`, "
                               "then `if this_peer_finished`), which a fake tensor does not have: the loop's length "
                               "would be a guess")

    @classmethod
    def check(cls, workload, device) -> None:
        try:
            import transformers  # noqa: F401
        except ImportError as e:
            raise StackUnavailable(f"transformers is not installed ({e})") from None
        if workload.tensor_parallel > 1:
            raise StackUnavailable(f"the hf stack runs generate() on one device; tensor_parallel "
                                   f"{workload.tensor_parallel} runs through the paged (or vllm) stack")
        from ..models import hf_config

        hf_config(workload)  # SoftwareUnsupported where this transformers lacks the architecture

    @classmethod
    def check_attention(cls, attention: str, workload, device) -> None:
        hf_attention.check(attention, workload, device)

    def prepare(self) -> None:
        from ..models import build_hf_model

        implementation, self.notes = (hf_attention.per_part(self.attention, self.workload) if self.attention
                                      else (None, []))
        self.model = build_hf_model(self.workload, self.device, attn_implementation=implementation)
        self.resolved_attention = hf_attention.resolved(self.model)
        how = "pinned" if self.attention else "transformers' default for this model"
        flash = (f", flash-attn {hf_attention.flash_attn_version()}" if self.attention == "flash_attention_2" else "")
        self.notes.insert(0, f"attention: {self.resolved_attention} ({how}{flash})")
        self.vocab = text_config(self.model.config).vocab_size

    def software(self) -> dict[str, str]:
        return {"attention": self.resolved_attention}

    def warmup(self) -> None:
        """On CUDA, the whole workload once, untimed: stock generate() pays a one-time cost per new shape (every
        decode step's cache length is a new attention shape), which made an R1 item's first run 3.6x slower than
        its second on an H200 (benchmarks/collector_parts.py). Its memory is the
        timed run's (same workload). Nothing on the CPU, where a first run is no slower than the next."""
        if self.has_warmup():
            self.run(_Unobserved())

    def has_warmup(self) -> bool:  # on CUDA only: time.warmup stays null on the CPU
        return is_cuda(self.device)

    def weights_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.model.parameters(), *self.model.buffers()))

    def run(self, collectors) -> RunResult:
        import torch

        from ..models import sequence_ids

        requests = self.workload.request_list()
        prompts = sequence_ids(self.workload, self.vocab)
        order = list(range(len(requests)))
        outputs: list[list[int]] = [[] for _ in requests]
        watcher = CacheWatcher(collectors)
        ttfts, tpots = [], []
        start = time.perf_counter()
        with torch.inference_mode():
            for _, wave in groupby(order, key=lambda i: requests[i].arrival_step):
                wave = list(wave)
                new_tokens = [requests[i].max_new_tokens for i in wave]
                batch = self._batch([prompts[i] for i in wave])
                batch.update(self._images(sum(requests[i].images for i in wave)))
                watcher.begin_wave([len(prompts[i]) for i in wave], new_tokens, batch["input_ids"].shape[1])
                handle = self.model.register_forward_hook(watcher.after_forward, with_kwargs=True)
                try:
                    out = self.model.generate(
                        **batch, max_new_tokens=max(new_tokens), min_new_tokens=max(new_tokens), do_sample=False,
                        pad_token_id=0, use_cache=True, return_dict_in_generate=True,
                    )
                finally:
                    handle.remove()
                gen = out.sequences[:, batch["input_ids"].shape[1]:].tolist()
                for row, i in enumerate(wave):
                    outputs[i] = gen[row][: requests[i].max_new_tokens]
                ttfts.append(watcher.step_times[0])
                tpots.extend(watcher.step_times[1:])
                del out, batch
        wall = time.perf_counter() - start
        metrics = watcher.metrics()
        metrics.update(time_metrics(sum(len(o) for o in outputs), wall, ttfts, tpots))
        metrics["kv.blocks_unreclaimed"] = MetricValue.null("the hf stack's dynamic cache has no blocks")
        return RunResult(outputs, metrics, list(self.notes))

    def _batch(self, prompts: list[list[int]]) -> dict:
        """Left-padded batch, as stock generate() expects for decoder-only models."""
        import torch

        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        return {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}

    def _images(self, count: int) -> dict:
        if not count:
            return {}
        from ..models import image_pixels

        return image_pixels(self.workload, count, self.device, self.model.dtype)

    def close(self) -> None:
        self.model = None


class _Unobserved:
    """Stands in for the collectors in the warm-up run: its steps are not the measurement's."""

    def step(self, step: int, **values) -> None:
        pass

"""The `paged` stack: memcheck's own engine (block-managed paged KV cache, the Triton kernels of
kernels/, continuous batching, chunked prefill) on the very weights the `hf` stack builds."""
from __future__ import annotations

import gc

from ...errors import StackUnavailable
from ...metrics.value import MetricValue
from ..base import RunResult, Stack


class PagedStack(Stack):
    name = "paged"

    @classmethod
    def check(cls, workload, device) -> None:
        try:
            import transformers  # noqa: F401

            import kernels  # noqa: F401
        except ImportError as e:
            raise StackUnavailable(f"the paged stack needs transformers and kernels/ ({e})") from None
        if any(r.images for r in workload.requests):
            raise StackUnavailable("image requests through the paged stack are not supported yet "
                                   "(the DeepSeek-VL vision tower is not wired in; text-only requests run)")
        if workload.tensor_parallel > 1:
            raise StackUnavailable("the paged stack runs on one device (tensor_parallel: 1)")
        if getattr(device, "type", device) == "cuda":
            try:
                import triton  # noqa: F401
            except ImportError as e:
                raise StackUnavailable(f"the paged stack's CUDA kernels need triton ({e})") from None

    def prepare(self) -> None:
        import torch

        from ...models import build_hf_model, torch_dtype
        from .config import EngineConfig, ModelSpec
        from .engine import Engine
        from .model import CausalLM
        from .workspace import declare, mla_score_elems

        self.device = torch.device(self.device)
        self.dtype = torch_dtype(self.workload, self.device)
        self.requests = self.workload.request_list()
        hf = build_hf_model(self.workload, self.device)
        self.spec = ModelSpec.from_hf(hf.config)
        self.cfg = EngineConfig.from_workload(self.workload, self.requests)
        self.model = CausalLM.from_hf(hf, self.spec, mla_score_elems(self.spec, self.cfg))
        del hf  # its parameters live on in self.model; the rest (vision towers, buffers) goes
        gc.collect()
        dtype_bytes = torch.empty(0, dtype=self.dtype).element_size()
        self.workspace = declare(self.spec, self.cfg, self.requests, dtype_bytes, self.device.type == "cuda")
        self.engine = Engine(self.model, self.spec, self.cfg, self.dtype, self.device)

    def weights_bytes(self) -> int:
        seen, total = set(), 0
        for t in (*self.model.parameters(), *self.model.buffers()):
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return total

    def workspace_bytes(self) -> int:
        """The declared activation workspace (beside the floors: weights + KV + workspace)."""
        return self.workspace.total

    def run(self, probe) -> RunResult:
        from ...models import prompt_ids

        prompts = prompt_ids(self.workload, self.spec.vocab)
        seqs, meter, wall = self.engine.generate(self.requests, prompts, probe)
        outputs = [s.output for s in seqs]
        metrics = meter.metrics()
        tokens = sum(len(o) for o in outputs)
        metrics["tokens_per_s"] = MetricValue(tokens / wall if wall else None)
        metrics["ttft"] = MetricValue(sum(s.t_first - s.t_arrived for s in seqs) / len(seqs),
                                      detail="from the step a request arrives to its first token")
        decoding = [s for s in seqs if len(s.output) > 1]
        metrics["tpot"] = (MetricValue(sum((s.t_last - s.t_first) / (len(s.output) - 1) for s in decoding)
                                       / len(decoding)) if decoding else MetricValue.null("one new token only"))
        cfg, pool = self.cfg, self.engine.pool
        notes = [
            self.workspace.describe(),
            f"KV pool: {cfg.num_blocks} blocks of {cfg.block_size} tokens ({pool.nbytes} bytes, sized from "
            f"{cfg.num_blocks_source}); token budget {cfg.max_num_batched_tokens}, max_num_seqs {cfg.max_num_seqs}, "
            f"chunked prefill {'on' if cfg.chunked_prefill else 'off'}",
            f"{self.engine.steps} engine steps, {self.engine.scheduler.preemptions} preemptions (recompute)",
        ]
        return RunResult(outputs, metrics, notes)

    def close(self) -> None:
        self.engine = self.model = None

"""The `paged` stack: memcheck's own engine (block-managed paged KV cache, the Triton kernels of
memcheck/kernels/, continuous batching, chunked prefill) on the very weights the `hf` stack builds."""
from __future__ import annotations

import gc

from memcheck.kernels import TRITON_MODULES

from ...devices import is_cuda
from ...errors import SoftwareUnsupported, StackUnavailable
from ..base import RunResult, Stack
from ... import transformers_compat as compat
from ..time_metrics import time_metrics


# DeepSeek V2/V3's modules (fused experts, the latent projections) in the layout the engine loads from; 4.51-4.57's
# state dicts miss keys it needs.
MLA_WEIGHTS_SINCE = (5, 0)


class PagedStack(Stack):
    name = "paged"
    rank_processes = True  # one worker per rank at tensor_parallel > 1; tensor_parallel.py shards the model
    # What a round imports (the engine; on a GPU, the Triton kernels): the fork server imports them once.
    fork_preload = ("triton", *(f"memcheck.kernels.{m}" for m in TRITON_MODULES), "memcheck.stacks.paged.engine",
                    "memcheck.stacks.paged.model", "memcheck.stacks.paged.vision")

    @classmethod
    def check(cls, workload, device) -> None:
        try:
            import transformers  # noqa: F401

            from memcheck import kernels  # noqa: F401
        except ImportError as e:
            raise StackUnavailable(f"the paged stack needs transformers and memcheck.kernels ({e})") from None
        from ...models import hf_config
        from .config import ModelSpec

        config = hf_config(workload)
        try:  # a user's config.json may name an architecture this engine does not implement
            spec = ModelSpec.from_hf(config)
        except ValueError as e:
            raise StackUnavailable(str(e)) from None
        if spec.kv_lora_rank and compat.version_tuple() < MLA_WEIGHTS_SINCE:
            raise SoftwareUnsupported(f"the paged stack takes DeepSeek V2/V3 weights in the module layout of "
                                      f"transformers {'.'.join(map(str, MLA_WEIGHTS_SINCE))} and newer; "
                                      f"transformers {compat.version()} lays them out otherwise")
        window = getattr(compat.text_config(config), "sliding_window", None)
        longest = max(r.prompt_tokens + r.max_new_tokens for r in workload.requests)
        if window and getattr(compat.text_config(config), "use_sliding_window", True) and window < longest:
            raise StackUnavailable(f"the paged stack does not implement sliding-window attention "
                                   f"(sliding_window {window} < {longest} tokens of the longest request)")
        if workload.tensor_parallel > 1:  # one process per rank (memcheck.rank_workers), dense decoders
            from .tensor_parallel import check

            check(workload, spec, device)
        if is_cuda(device):
            try:
                import triton  # noqa: F401
            except ImportError as e:
                raise StackUnavailable(f"the paged stack's CUDA kernels need triton ({e})") from None

    @classmethod
    def check_prediction(cls, workload) -> None:
        """The engine's schedule never reads a token's value (greedy, every request to its max_new_tokens) and its
        kernels write into buffers it allocated: a fake launch is enough. Ranks at tensor_parallel > 1 need a
        process group of GPUs (NCCL) that a fake device does not have."""
        if workload.tensor_parallel > 1:
            raise StackUnavailable("a prediction runs one fake GPU: tensor_parallel > 1 needs an NCCL group of GPUs")

    def prepare(self) -> None:
        import torch

        from memcheck import kernels
        from memcheck.kernels.dispatch import sm_count

        from ...models import build_hf_model, torch_dtype
        from .config import EngineConfig, ModelSpec, blocks_needed
        from .engine import Engine
        from .model import CausalLM
        from .workspace import declare

        self.device = torch.device(self.device)
        kernels.preload(self.device)
        self.dtype = torch_dtype(self.workload, self.device)
        self.requests = self.workload.request_list()
        weights = None
        if self.workload.tensor_parallel > 1:  # parameters on the meta device, their seeded init recorded
            from .seeded_weights import SeededWeights

            weights = SeededWeights(self.device)
        hf = build_hf_model(self.workload, self.device, weights=weights)
        self.spec = ModelSpec.from_hf(hf.config)
        self.cfg = EngineConfig.from_workload(self.workload, self.requests)
        self.model = CausalLM.from_hf(hf, self.spec)
        self.shard_note = None
        if weights is not None:  # this rank's slices drawn one at a time; the spec becomes the rank-local one
            from .tensor_parallel import shard

            hf = None  # (no images at tensor_parallel > 1)
            self.spec, self.shard_note = shard(self.model, self.spec, weights)
            del weights
        self.vision = None
        dtype_bytes = torch.empty(0, dtype=self.dtype).element_size()
        multiprocessors = sm_count(self.device) if is_cuda(self.device) else None
        self.workspace = declare(self.spec, self.cfg, self.requests, dtype_bytes, multiprocessors,
                                 self.workload.image_tokens)
        if any(r.images for r in self.requests):
            from .vision import VisionEncoder, tower_bytes

            vl = hf.model
            del vl.language_model  # its tensors live on in self.model
            self.vision = VisionEncoder(vl, self.workload, self.device, self.dtype)
            per_image = self.workload.image_tokens * self.spec.hidden * dtype_bytes
            self.workspace.parts["vision towers (one image at a time)"] = tower_bytes(hf.config, dtype_bytes)
            self.workspace.parts["image features"] = per_image * max(r.images for r in self.requests) * 2
        del hf  # its parameters live on in self.model (and the towers in self.vision); the rest goes
        gc.collect()
        self.model.fuse_projections()  # now that the transformers modules no longer hold the originals
        # Every rank sizes the same graphs from the same requests: at tensor_parallel > 1 they capture their
        # all-reduces (NCCL collectives are capturable) in the same order.
        per_image = self.workload.image_tokens
        graph_sizes = (min(self.cfg.max_num_seqs, len(self.requests)),
                       max(blocks_needed(r, self.cfg.block_size, per_image) for r in self.requests))
        self.engine = Engine(self.model, self.spec, self.cfg, self.dtype, self.device, self.vision, graph_sizes)

    def warmup(self) -> None:
        """Compile the prefill kernels (one prefill pass as large as the run's largest, no cache written) and
        capture the decode CUDA graphs before the timed run; without this call the first decode step
        captures them and the first prefill compiles. With images, one image through the vision towers too
        (their first CUDA work), after the capture: the capture gave the allocator's cache back, and so does
        the towers' pass, so the run starts from the allocator state it started from without it. Nothing on
        the CPU."""
        from .config import input_tokens

        per_image = self.workload.image_tokens
        longest = max(input_tokens(r, per_image) for r in self.requests)
        self.engine.warmup(min(self.cfg.max_num_batched_tokens, longest))  # every rank the same pass
        if self.vision is not None and self.on_cuda():
            self.vision.warmup()

    def on_cuda(self) -> bool:
        """Whether the warm-up has one-time work to take out of the run (CUDA; a first run on the CPU is no slower)."""
        return is_cuda(self.device)

    def weights_bytes(self) -> int:
        seen, total = set(), 0
        tensors = [*self.model.parameters(), *self.model.buffers()]
        if self.vision is not None:
            tensors += [*self.vision.model.parameters(), *self.vision.model.buffers()]
        for t in tensors:
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return total

    def workspace_bytes(self) -> int:
        """The declared activation workspace (beside the floors: weights + KV + workspace), with the CUDA
        graphs' memory pool once run() has counted it."""
        return self.workspace.total

    def run(self, collectors) -> RunResult:
        from .compile_watch import CompileWatch

        with CompileWatch() as compiles:
            seqs, meter, wall = self._generate(collectors)
        outputs = [s.output for s in seqs]
        metrics = meter.metrics()
        metrics.update(time_metrics(
            sum(len(o) for o in outputs), wall, [s.t_first - s.t_arrived for s in seqs],
            [(s.t_last - s.t_first) / (len(s.output) - 1) for s in seqs if len(s.output) > 1],
            ttft_detail="from the step a request arrives to its first token"))
        cfg, pool = self.cfg, self.engine.pool
        graphs = self.engine.runner.graphs
        if graphs is not None and graphs.captured:  # measured at capture; held for the whole run
            self.workspace.parts["CUDA graphs (pool and capture stream)"] = graphs.pool_bytes
        notes = [
            self.workspace.describe(),
            f"KV pool: {cfg.num_blocks} blocks of {cfg.block_size} tokens ({pool.nbytes} bytes, sized from "
            f"{cfg.num_blocks_source}); token budget {cfg.max_num_batched_tokens}, max_num_seqs {cfg.max_num_seqs}, "
            f"chunked prefill {'on' if cfg.chunked_prefill else 'off'}",
            f"{self.engine.steps} engine steps, {self.engine.scheduler.preemptions} preemptions (recompute); "
            + (graphs.describe() if graphs is not None and graphs.captured else "decode steps run eagerly"),
        ]
        if self.workload.tensor_parallel > 1:
            from .tensor_parallel import outputs_note

            notes += [outputs_note(outputs), self.shard_note]
        if compiles.note():
            notes.append(compiles.note())
        if self.vision is not None:
            notes.append(f"{self.vision.images_encoded} images through the DeepSeek-VL towers (transformers modules), "
                         f"{self.workload.image_tokens} tokens each")
        return RunResult(outputs, metrics, notes)

    def _generate(self, collectors):
        if self.vision is None:
            from ...models import prompt_ids

            return self.engine.generate(self.requests, prompt_ids(self.workload, self.spec.vocab), collectors)
        from ...models import sequence_ids  # image placeholders first, then the text (as the hf stack lays them out)
        from .vision import image_sources

        per_image = self.workload.image_tokens
        return self.engine.generate(self.requests, sequence_ids(self.workload, self.spec.vocab), collectors,
                                    [r.images * per_image for r in self.requests], image_sources(self.requests))

    def close(self) -> None:
        self.engine = self.model = self.vision = None

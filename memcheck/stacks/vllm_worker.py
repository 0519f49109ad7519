"""The GPU worker the vllm stack runs vLLM with: vLLM's own `Worker`, keeping its memory profile.

vLLM profiles one forward pass (`memory_profiling` around `model_runner.profile_run`) to size its KV
pool, then drops the result. This subclass, passed to vLLM as `worker_cls`, keeps it as
`memcheck_profile` (a `MemoryProfilingResult`) and the bytes `capture_model` took for CUDA graphs as
`memcheck_cuda_graph_bytes`, for `vllm_profile.read_profile` to collect over `collective_rpc`.
When the KV size is given (`kv_cache_memory_bytes`: the stack's default, the pool sized from the
workload) vLLM skips its profile and only runs `profile_run`; here that run is wrapped in vLLM's own
`memory_profiling`, so both ways the numbers are the same function of the same pass.
Imports vllm: loaded only by vLLM itself, through `parallel_config.worker_cls`.
"""
from __future__ import annotations

import contextlib

from vllm.utils import mem_utils
from vllm.v1.worker import gpu_worker


class ProfiledWorker(gpu_worker.Worker):
    memcheck_profile: mem_utils.MemoryProfilingResult | None = None
    memcheck_cuda_graph_bytes: int | None = None

    def determine_available_memory(self) -> int:
        if self.cache_config.kv_cache_memory_bytes:  # vLLM will not profile: profile its profile run here
            with mem_utils.memory_profiling(self.init_snapshot,
                                            weights_memory=int(self.model_runner.model_memory_usage)) as result:
                available = super().determine_available_memory()
            self.memcheck_profile = result
            return available
        with self._keeping_profile():
            return super().determine_available_memory()

    @contextlib.contextmanager
    def _keeping_profile(self):
        """vLLM's own profile, kept: gpu_worker's `memory_profiling` is wrapped for this one call."""
        profiling = gpu_worker.memory_profiling

        @contextlib.contextmanager
        def kept(*args, **kwargs):
            with profiling(*args, **kwargs) as result:
                yield result
            self.memcheck_profile = result  # filled in when vLLM's context exits

        gpu_worker.memory_profiling = kept
        try:
            yield
        finally:
            gpu_worker.memory_profiling = profiling

    def compile_or_warm_up_model(self):
        runner = self.model_runner
        capture = runner.capture_model

        def captured(*args, **kwargs):
            self.memcheck_cuda_graph_bytes = capture(*args, **kwargs)
            return self.memcheck_cuda_graph_bytes

        runner.capture_model = captured
        try:
            return super().compile_or_warm_up_model()
        finally:
            del runner.capture_model  # the class's method again

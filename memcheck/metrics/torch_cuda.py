"""GPU metrics from the torch caching allocator: peaks, leak at the end, retries, OOMs."""
from __future__ import annotations

from .value import MetricValue


class CudaAllocatorCollector:
    def __init__(self, device):
        import torch

        self.torch, self.device = torch, device
        self._before_run = self._after_run = 0
        self._counts0 = (0, 0)

    def _counts(self) -> tuple[int, int]:
        stats = self.torch.cuda.memory_stats(self.device)
        return stats.get("num_alloc_retries", 0), stats.get("num_ooms", 0)

    def start(self) -> None:
        self.torch.cuda.synchronize(self.device)
        self.torch.cuda.reset_peak_memory_stats(self.device)
        self._counts0 = self._counts()

    def run_started(self) -> None:
        self.torch.cuda.synchronize(self.device)
        self._before_run = self.torch.cuda.memory_allocated(self.device)

    def run_finished(self) -> None:
        """After the run returned and its garbage is collected, before the stack is closed: what the
        engine still holds now, beyond what it held before the run, is what a finished workload leaks."""
        self.torch.cuda.synchronize(self.device)
        self._after_run = self.torch.cuda.memory_allocated(self.device)

    def stop(self, fragmentation: MetricValue) -> dict[str, MetricValue]:
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        stats = cuda.memory_stats(self.device)
        retries, ooms = self._counts()
        return {
            "gpu.heap_alloc.peak": MetricValue(stats["allocated_bytes.all.peak"], detail="torch allocator"),
            "gpu.heap_alloc.end": MetricValue(self._after_run - self._before_run,
                                              detail="allocated after the run minus before it (model still loaded)"),
            "gpu.reserved.peak": MetricValue(stats["reserved_bytes.all.peak"], detail="torch allocator"),
            "gpu.fragmentation.peak": fragmentation,
            "gpu.alloc_retries": MetricValue(retries - self._counts0[0]),
            "gpu.ooms": MetricValue(ooms - self._counts0[1]),
        }

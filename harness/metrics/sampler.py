"""A background thread that samples device memory (NVML) and the torch allocator at a fixed period.

NVML sees what torch cannot: the CUDA context, cuBLAS workspaces, memory of child processes
(a vLLM engine). The samples also feed the memory-over-time timeline of the report.
"""
from __future__ import annotations

import threading
import time

from .value import MetricValue


class DeviceSampler:
    def __init__(self, device, period_s: float = 0.01):
        import torch

        self.torch, self.device, self.period_s = torch, device, period_s
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = self._handle = None
        self.nvml_error: str | None = None
        self.per_process = True
        self._seen_pids: set[int] = set()  # every pid NVML has reported so far
        self._tree: set[int] = set()  # this process and its children at the last scan
        self._open_nvml()

    def _open_nvml(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            uuid = str(self.torch.cuda.get_device_properties(self.device).uuid)
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                if pynvml.nvmlDeviceGetUUID(handle).removeprefix("GPU-") == uuid.removeprefix("GPU-"):
                    self._nvml, self._handle = pynvml, handle
                    return
            self.nvml_error = f"NVML lists no device with the UUID of torch device {self.device}"
        except ImportError:
            self.nvml_error = "nvidia-ml-py (pynvml) is not installed"
        except Exception as e:  # NVMLError: driver missing, permission, ...
            self.nvml_error = f"NVML unavailable: {e}"

    def _our_pids(self, reported: set[int]) -> set[int]:
        """Which of the pids NVML reports are this process or its children. The process tree is
        scanned again only when NVML reports a pid not seen before: a scan reads /proc/*/stat of
        every process (~2 ms of GIL with 70 processes), which at a 10 ms period took a quarter of
        a Python-bound stack's speed (stock transformers on an H200, 2026-12-01)."""
        if not reported <= self._seen_pids:
            import psutil

            me = psutil.Process()
            self._tree = {me.pid} | {child.pid for child in me.children(recursive=True)}
            self._seen_pids |= reported
        return reported & self._tree

    def _device_used(self) -> int | None:
        if self._nvml is None:
            return None
        pynvml = self._nvml
        if self.per_process:
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
                ours = self._our_pids({p.pid for p in procs})
                used = [p.usedGpuMemory for p in procs if p.pid in ours and p.usedGpuMemory is not None]
                if used:
                    return sum(used)
            except pynvml.NVMLError:
                pass
            # The driver did not attribute memory to our pid (containers hide pids): use the device total.
            self.per_process = False
        return pynvml.nvmlDeviceGetMemoryInfo(self._handle).used

    def sample(self, step: int | None = None, driver: bool = True) -> dict:
        """One point of the torch allocator's counters; with `driver`, NVML's device use too. A stack's
        step() takes the allocator's only: an NVML query (and the process scan behind it) costs
        milliseconds, which the sampling thread pays off the timed path."""
        stats = self.torch.cuda.memory.memory_stats_as_nested_dict(self.device)  # no flattening: cheaper
        current = lambda key: stats.get(key, {}).get("all", {}).get("current", 0)  # noqa: E731 - {} before CUDA init
        point = {
            "t": time.perf_counter(), "step": step,
            "gpu.allocated": current("allocated_bytes"),
            "gpu.reserved": current("reserved_bytes"),
            "gpu.inactive_split": current("inactive_split_bytes"),
            "gpu.device_used": self._device_used() if driver else None,
        }
        self.samples.append(point)
        return point

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def start(self) -> None:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="memcheck-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, MetricValue]:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.sample()
        period = f"sampled every {self.period_s * 1000:g} ms"
        if self._nvml is None:
            used = MetricValue.null(self.nvml_error or "NVML unavailable")
        else:
            scope = "this process and its children" if self.per_process else "whole device (per-process use not reported)"
            used = MetricValue(max(s["gpu.device_used"] for s in self.samples if s["gpu.device_used"] is not None),
                               detail=f"NVML, {scope}, {period}")
        at_peak = max(self.samples, key=lambda s: s["gpu.reserved"])
        frag = at_peak["gpu.inactive_split"] / at_peak["gpu.reserved"] if at_peak["gpu.reserved"] else 0.0
        return {
            "gpu.device_used.peak": used,
            "gpu.fragmentation.peak": MetricValue(frag, detail=f"at the sampled reserved peak, {period}"),
        }

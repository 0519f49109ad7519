"""GPU memory over a run: the driver's view (NVML) polled by a process of its own, and the torch
allocator's counters at every engine step.

NVML sees what torch cannot: the CUDA context, cuBLAS workspaces, memory of child processes (a vLLM
engine). It is polled outside the worker (nvml_poll.py) so that polling takes no GIL from the stack; the
allocator's counters are read in the worker at each step the stack reports, which also feeds the
memory-over-time timeline of the report.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from .value import MetricValue

POLLER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nvml_poll.py")


class DeviceSampler:
    def __init__(self, device, period_s: float = 0.01, pid: int | None = None, shared: bool = False,
                 nvml: bool = True):
        """pid: the process (and children) whose device memory NVML counts; this one unless told. shared: other
        items run on the device meanwhile, so NVML's reading is this process tree's or null, never the device's."""
        import torch

        self.torch, self.device, self.period_s, self.shared = torch, device, period_s, shared
        self.pid = os.getpid() if pid is None else pid
        self.samples: list[dict] = []
        self._poller: subprocess.Popen | None = None
        self.nvml_error: str | None = None if nvml else "no driver to poll"
        self.nvml = nvml

    def sample(self, step: int | None = None) -> dict:
        """The torch allocator's counters now (a stack's step() calls this after each step)."""
        stats = self.torch.cuda.memory.memory_stats_as_nested_dict(self.device)  # no flattening: cheaper
        current = lambda key: stats.get(key, {}).get("all", {}).get("current", 0)  # noqa: E731 - {} before CUDA init
        point = {
            "step": step,
            "gpu.allocated": current("allocated_bytes"),
            "gpu.reserved": current("reserved_bytes"),
            "gpu.inactive_split": current("inactive_split_bytes"),
        }
        self.samples.append(point)
        return point

    def start(self) -> None:
        self.sample()
        if not self.nvml:
            return
        uuid = str(self.torch.cuda.get_device_properties(self.device).uuid)
        try:
            self._poller = subprocess.Popen([sys.executable, POLLER, uuid, str(self.pid), str(self.period_s),
                                             *(["shared"] if self.shared else [])],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self._poller.stdout.readline()  # "ready": its first poll is in, before the model is built
        except OSError as e:
            self._poller, self.nvml_error = None, f"the NVML poller did not start: {e}"

    def _stop_poller(self) -> dict:
        if self._poller is None:
            return {"error": self.nvml_error}
        try:
            out, _ = self._poller.communicate(timeout=30)  # closing its stdin stops it after one last poll
            return json.loads(out.strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
            self._poller.kill()
            return {"error": f"the NVML poller gave no result ({type(e).__name__})"}

    def stop(self) -> dict[str, MetricValue]:
        self.sample()
        polled = self._stop_poller()
        period = f"polled every {self.period_s * 1000:g} ms by a process of its own"
        if polled.get("peak") is None:
            used = MetricValue.null(polled.get("error") or "NVML reported nothing")
        else:
            scope = ("this process and its children" if polled["per_process"]
                     else "whole device (per-process use not reported)")
            used = MetricValue(polled["peak"], detail=f"NVML, {scope}, {period}")
        at_peak = max(self.samples, key=lambda s: s["gpu.reserved"])
        frag = at_peak["gpu.inactive_split"] / at_peak["gpu.reserved"] if at_peak["gpu.reserved"] else 0.0
        return {
            "gpu.device_used.peak": used,
            "gpu.fragmentation.peak": MetricValue(frag, detail="at the highest reserved bytes of the engine steps"),
        }

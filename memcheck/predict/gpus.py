"""The GPUs a prediction can stand for: what the stacks and kernels ask of torch.cuda about the device.

Figures are the device's as torch reports them (torch.cuda.get_device_properties on the H200 runner)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    device_class: str  # the baselines' folder of the measured device (memcheck.environment.device_class)
    name: str
    major: int
    minor: int
    multi_processor_count: int
    total_memory: int
    regs_per_multiprocessor: int = 65536
    shared_memory_per_multiprocessor: int = 233472
    max_threads_per_multi_processor: int = 2048
    L2_cache_size: int = 50 << 20
    warp_size: int = 32

    @property
    def uuid(self) -> str:
        return f"predicted-{self.device_class}"


GPUS = {
    "nvidia-h200": GPU("nvidia-h200", "NVIDIA H200", 9, 0, multi_processor_count=132, total_memory=150_754_820_096),
}


def gpu(name: str) -> GPU:
    from ..errors import UsageError

    if name not in GPUS:
        raise UsageError(f"no GPU named {name!r} (known: {', '.join(GPUS)})")
    return GPUS[name]

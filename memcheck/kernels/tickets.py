"""Zeroed int32 counters that each launch leaves at zero: the tickets of kernels whose last program to finish a
piece of work merges the others' partials (memcheck/kernels/skinny_gemm.py's split-K sums). A program stores its partial, takes a ticket (atomic add), and the one drawing the last merges and puts
the counter back to 0, so the next launch, or the next replay of a CUDA graph that captured this tensor, finds it
zeroed. Kernels launched on one stream run one after another, so every launch uses the counters from index 0.

One tensor per device, made at the first (eager) call: a tensor made while a CUDA graph captures would come from
the graph's private pool. Outgrown tensors are kept, not freed: a graph captured earlier still points at them."""
from __future__ import annotations

import torch

LEAST = 1 << 16  # 256 KiB: 64K split-K column blocks
_counters: dict[torch.device, torch.Tensor] = {}
_outgrown: list[torch.Tensor] = []


def counters(device: torch.device, count: int, user: str) -> torch.Tensor:
    """At least `count` zeroed counters on `device`; `user` names the kernel in the error raised when they are
    first asked for (or outgrown) inside a CUDA graph capture."""
    held = _counters.get(device)
    if held is None or held.numel() < count:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            made = 0 if held is None else held.numel()
            raise RuntimeError(f"kernels.{user}: {count} ticket counters needed inside a CUDA graph capture, {made} "
                               "made before it; run the step once eagerly before capturing")
        if held is not None:
            _outgrown.append(held)
        held = _counters[device] = torch.zeros(max(count, LEAST), dtype=torch.int32, device=device)
    return held

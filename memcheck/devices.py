"""The device an item runs on: resolved once from --memcheck-device, and its type asked one way everywhere.

Stacks, collectors and the fingerprint receive a torch.device; tests and callers may pass a name ("cuda:1",
"cpu") or None (the CPU). `device_type` and `is_cuda` accept all three.
"""
from __future__ import annotations

from .errors import StackUnavailable


def resolve_device(name: str = "auto"):
    """The torch.device for --memcheck-device NAME: auto is CUDA where there is one; CUDA is made current."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise StackUnavailable("--memcheck-device asks for CUDA but this runner has no CUDA device")
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    return device


def device_type(device) -> str:
    """'cuda', 'cpu', ... of a torch.device, a device name or None (the CPU)."""
    if device is None:
        return "cpu"
    if isinstance(device, str):
        return device.partition(":")[0]
    return device.type


def is_cuda(device) -> bool:
    return device_type(device) == "cuda"

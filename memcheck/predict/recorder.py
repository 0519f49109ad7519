"""Every CUDA storage a fake run allocates and frees, in program order, handed to the allocator model.

A TorchDispatchMode above FakeTensorMode sees each operator's outputs: a CUDA storage not seen before is an
allocation on the current stream (sized as torch sizes it: the storage's bytes), and a finalizer on the storage
frees it when its last tensor dies, as the caching allocator's free does (CPython frees on the last reference,
so the order of frees is the real run's, cycles aside, which gc.collect() at the points the stack collects
settles the same way). Views and in-place results share a storage already seen.

Values never exist: random initialisation is skipped (the weights' bytes are what counts), and a read of a value
the fake tensors cannot know (`.item()`, `.tolist()` of a computed tensor) reads 0: the paged engine's schedule
never depends on a token's value."""
from __future__ import annotations

import weakref

import torch
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException, FakeTensor,
                                           unset_fake_temporarily)
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# In-place random fills: no values to draw. Skipping them keeps the fake mode from decomposing them into ops
# that would run for real on the (absent) device.
RANDOM_FILLS = {aten.uniform_.default, aten.normal_.default, aten.random_.default, getattr(aten.random_, "from"),
                aten.random_.to, aten.bernoulli_.float, aten.bernoulli_.Tensor, aten.exponential_.default,
                aten.cauchy_.default, aten.log_normal_.default, aten.geometric_.default}


class Recorder(TorchDispatchMode):
    def __init__(self, allocator, on_op=None):
        """allocator: malloc(size, stream) -> handle and free(handle) (memcheck/predict/allocator.py).
        on_op(func, stream): called before each operator with a CUDA tensor argument (the cuBLAS workspaces)."""
        super().__init__()
        self.allocator, self.on_op = allocator, on_op
        self.stream = 0
        self.live: dict[int, int] = {}  # storage (its C++ address) -> allocator handle
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in RANDOM_FILLS:
            return args[0]
        self.ops += 1
        if func.overloadpacket is aten.to:  # (under inference_mode `to` arrives whole)
            named = _bound(func, args, kwargs)
            if _moves_to_cuda(named):  # as _to_copy, the one move the fake mode never constant-folds onto the device
                func, args = aten._to_copy.default, (named.pop("self"),)
                kwargs = {k: v for k, v in named.items() if k != "copy"}
        if _host_only(args, kwargs):  # the host's tensors stay real: their values (prompt ids, tables) are known
            with unset_fake_temporarily():
                return func(*args, **{k: v for k, v in kwargs.items() if k != "pin_memory"})
        if self.on_op is not None and _any_cuda(args):
            self.on_op(func, self.stream)
        try:
            out = func(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException):
            if func in (aten._local_scalar_dense.default, aten.item.default):  # a token's value: 0
                return 0.0 if args[0].dtype.is_floating_point else 0
            raise
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                self.track(t)
        return out

    def track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self.live:
            return
        self.live[key] = self.allocator.malloc(storage.nbytes(), self.stream)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        handle = self.live.pop(key, None)
        if handle is not None:
            self.allocator.free(handle)


def _host_only(args, kwargs) -> bool:
    """No fake tensor in, no device asked for: an operator on the host's real tensors (pinning dropped: a CPU-only
    torch has no pinned allocator, and pinning moves no device memory)."""
    for a in pytree.tree_leaves((args, kwargs)):
        if isinstance(a, FakeTensor) or (isinstance(a, torch.device) and a.type != "cpu"):
            return False
    return True


def _bound(func, args, kwargs) -> dict:
    """An operator's arguments by name, from its schema."""
    named = {arg.name: value for arg, value in zip(func._schema.arguments, args)}
    named.update(kwargs)
    return named


def _moves_to_cuda(named: dict) -> bool:
    device, t = named.get("device"), named.get("self")
    return (device is not None and torch.device(device).type == "cuda" and isinstance(t, torch.Tensor)
            and t.device.type != "cuda")


def _any_cuda(args) -> bool:
    return any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in pytree.tree_leaves(args))

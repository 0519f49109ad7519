"""The workload's seeded weights, drawn one tensor at a time: what a tensor-parallel rank builds instead of
the whole model, so the full model never sits on its device (nor twice in host memory).

While transformers builds the model (`build_hf_model(..., weights=SeededWeights(device))`), every parameter
goes to the meta device as it is registered (buffers, such as the rotary frequencies, stay real), and every
torch.nn.init call on it is recorded. A call that draws random numbers is also run once on a scratch tensor of
the same shape on the device, right then, so the device's generator advances exactly as it does when the whole
model is built (tensor_parallel 1), and the generator's state before the call is kept. materialise() replays a
parameter's calls on one full tensor (the generator set back to each call's state), keeps the slice the rank
asks for and drops the rest: the values are those of tensor_parallel 1, bit for bit, drawn in any order.

At most one full tensor exists at a time beside what the rank keeps (the scratch while recording, the largest
tensor's size; the replayed tensor while materialising)."""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

# torch.nn.init functions that draw from the generator (the others write constants or copies)
RANDOM = frozenset(("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_",
                    "xavier_uniform_", "xavier_normal_", "orthogonal_", "sparse_"))


@dataclass
class Init:
    fn: Callable
    args: tuple
    kwargs: dict
    view: tuple | None  # (size, stride, storage_offset) when the call wrote a view of the parameter
    rng: Any  # the device generator's state before a random call; None for a constant one


class SeededWeights:
    def __init__(self, device):
        self.device = torch.device(device)
        self.inits: dict[int, list[Init]] = {}
        self.tensors: dict[int, torch.Tensor] = {}  # keeps every recorded meta tensor alive: ids stay unique
        self._buffer = None  # recording's scratch (_scratch)

    @contextlib.contextmanager
    def recording(self):
        """Parameters to the meta device as they are registered; torch.nn.init calls on them recorded. Patches
        the same names transformers' own init guard patches (transformers.initialization)."""
        from transformers import initialization as hf_init

        saved_register = nn.Module.register_parameter
        saved_table = dict(hf_init.TORCH_INIT_FUNCTIONS)
        saved_modules = []
        for module_name in hf_init.TORCH_MODULES_TO_PATCH:
            module = sys.modules.get(module_name)
            for fn_name in hf_init.TORCH_INIT_FUNCTIONS:
                if module is not None and hasattr(module, fn_name):
                    saved_modules.append((module, fn_name, getattr(module, fn_name)))
        try:
            nn.Module.register_parameter = _on_meta(saved_register)
            for fn_name, fn in saved_table.items():
                hf_init.TORCH_INIT_FUNCTIONS[fn_name] = self._recorder(fn_name, fn)
            for module, fn_name, _ in saved_modules:
                setattr(module, fn_name, hf_init.TORCH_INIT_FUNCTIONS[fn_name])
            yield self
        finally:
            self._buffer = None
            nn.Module.register_parameter = saved_register
            hf_init.TORCH_INIT_FUNCTIONS.update(saved_table)
            for module, fn_name, fn in saved_modules:
                setattr(module, fn_name, fn)

    def _recorder(self, name: str, fn: Callable) -> Callable:
        def record(tensor, *args, **kwargs):
            base = tensor if tensor._base is None else tensor._base
            if not base.is_meta:  # a buffer or a temporary on the device: as transformers would
                return fn(tensor, *args, **kwargs)
            view = None if base is tensor else (tuple(tensor.size()), tuple(tensor.stride()), tensor.storage_offset())
            state = None
            if name in RANDOM:
                state = self._rng_state()
                fn(_view(self._scratch(base), view), *args, **kwargs)
            self.inits.setdefault(id(base), []).append(Init(fn, args, kwargs, view, state))
            self.tensors[id(base)] = base
            return tensor

        return record

    def materialise(self, tensor: torch.Tensor, pick: Callable[[torch.Tensor], torch.Tensor] | None = None):
        """This rank's part (pick(full); the whole tensor without pick) of a recorded meta tensor, on the device,
        with tensor_parallel 1's values. A tensor that is not on the meta device is picked from as it is."""
        if not tensor.is_meta:
            return tensor if pick is None else pick(tensor).clone()
        inits = self.inits.get(id(tensor))
        if not inits:
            raise RuntimeError(f"no seeded init was recorded for a {tuple(tensor.shape)} parameter: its values "
                               "at tensor_parallel 1 would not be reproducible either")
        full = self._empty_like(tensor)
        saved = self._rng_state()
        with torch.no_grad():
            for i in inits:
                if i.rng is not None:
                    self._set_rng_state(i.rng)
                i.fn(_view(full, i.view), *i.args, **i.kwargs)
        self._set_rng_state(saved)
        return full if pick is None else pick(full).clone()

    def _scratch(self, meta: torch.Tensor) -> torch.Tensor:
        """A tensor of meta's shape, dtype and strides to draw into while recording: a view of one buffer kept at the
        largest size asked so far (a fresh tensor per call leaves the host allocator holding freed chunks)."""
        if not meta.is_contiguous():
            return self._empty_like(meta)
        size = meta.numel() * meta.element_size()
        if self._buffer is None or self._buffer.numel() < size:
            self._buffer = None
            self._buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
        return self._buffer[:size].view(meta.dtype).view(meta.shape)

    def _empty_like(self, meta: torch.Tensor) -> torch.Tensor:
        return torch.empty_strided(meta.size(), meta.stride(), dtype=meta.dtype, device=self.device)

    def _rng_state(self):
        if self.device.type == "cuda":
            return torch.cuda.get_rng_state(self.device)
        return torch.get_rng_state()

    def _set_rng_state(self, state) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(state, self.device)
        else:
            torch.set_rng_state(state)


def _view(t: torch.Tensor, view: tuple | None) -> torch.Tensor:
    return t if view is None else t.as_strided(*view)


def _on_meta(register: Callable) -> Callable:
    """nn.Module.register_parameter that moves the parameter to the meta device (its data is drawn later)."""
    def register_on_meta(module: nn.Module, name: str, param):
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    return register_on_meta

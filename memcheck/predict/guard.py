"""A no-op CUDA device guard for a CPU-only torch, built once per torch version.

A CPU build of torch registers no device guard for CUDA, so every C++ path that asks one (indexing a tensor,
`.to("cuda")`, `nn.init`'s decompositions) raises "PyTorch is not linked with support for cuda devices" even
on fake tensors, which never touch a device. torch's own `_ensureCUDADeviceGuardSet` installs a no-op guard
only where a CUDA runtime is linked but has no device. This one fills the empty slot: device 0, the default
stream, one device. It is a 20-line C++ extension (torch.utils.cpp_extension, cached under
TORCH_EXTENSIONS_DIR), so a prediction needs a C++ compiler and ninja on the runner."""
from __future__ import annotations

import os
import sys

from ..errors import StackUnavailable

SOURCE = r"""
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/extension.h>

namespace {
struct FakeCudaGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::CUDA; }
  c10::Device exchangeDevice(c10::Device) const override { return c10::Device(c10::DeviceType::CUDA, 0); }
  c10::Device getDevice() const override { return c10::Device(c10::DeviceType::CUDA, 0); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
};
}  // namespace

// True when installed now; False when a guard was there already (a CUDA build, or installed before).
bool install() {
  static FakeCudaGuard guard;
  auto& slot = c10::impl::device_guard_impl_registry[static_cast<size_t>(c10::DeviceType::CUDA)];
  if (slot.load()) return false;
  slot.store(&guard);
  return true;
}
"""

_installed = False


def _build_folder() -> str:
    from torch.utils.cpp_extension import _get_build_directory

    try:
        return _get_build_directory("memcheck_fake_cuda_guard", verbose=False)
    except Exception:  # a private helper of torch's: its absence must not hide the build's own error
        return "TORCH_EXTENSIONS_DIR"


def install() -> None:
    """Make CUDA a device this process's torch can name (fake tensors only: nothing ever runs there)."""
    global _installed
    if _installed:
        return
    import torch

    if torch.version.cuda is not None:  # a CUDA build registers its own guard (benchmarks/predict_leaks.py predicts
        _installed = True                 # on the GPU runner beside the measurement)
        return
    from torch.utils.cpp_extension import load_inline

    # ninja from a virtual environment's bin folder, where `pip install ninja` puts it, when that is not on PATH
    os.environ["PATH"] = os.pathsep.join([os.path.join(sys.prefix, "bin"), os.environ.get("PATH", "")])
    try:
        module = load_inline("memcheck_fake_cuda_guard", cpp_sources=[SOURCE], functions=["install"], verbose=False)
    except (RuntimeError, OSError, ImportError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0].split(": [", 1)[0][:200]
        raise StackUnavailable(f"a prediction builds a small C++ extension (a no-op CUDA device guard) and this "
                               f"runner cannot: {first} (it needs a C++ compiler, $CXX or c++, and ninja; the build "
                               f"log is under {_build_folder()})") from None
    module.install()
    _installed = True

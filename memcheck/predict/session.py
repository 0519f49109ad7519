"""One prediction: the fake device, the recorder and the allocator model around a stack's whole item
(model build, warm-up, run, close), as the collectors are around it on a GPU."""
from __future__ import annotations

import contextlib
import warnings

from .gpus import GPU


class Prediction:
    def __init__(self, gpu: GPU):
        from .allocator import CachingAllocator
        from .cublas import CublasWorkspaces
        from .recorder import Recorder

        self.gpu = gpu
        self.allocator = CachingAllocator(capacity=gpu.total_memory)
        self.cublas = CublasWorkspaces(self.allocator, (gpu.major, gpu.minor))
        self.recorder = Recorder(self.allocator, on_op=self.cublas.before_op)

    @contextlib.contextmanager
    def running(self):
        """Inside: CUDA tensors are fake and every allocation goes to the allocator model."""
        from torch._subclasses.fake_tensor import FakeTensorMode

        from . import guard
        from .fake_cuda import FakeCuda

        guard.install()

        class DeviceFreeFakeMode(FakeTensorMode):
            # torch.cuda.is_available() answers True inside (the stacks ask it); the fake mode must still never
            # constant-fold across a move to the device, which would run that op for real.
            @property
            def avoid_device_init(self) -> bool:
                return True

        fake = FakeCuda(self.gpu, self.allocator, self.recorder, self.cublas)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
            with fake.patched(), DeviceFreeFakeMode(allow_non_fake_inputs=True), self.recorder:
                yield self

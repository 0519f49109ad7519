"""torch.cuda, CUDA graphs and Triton launches as a prediction sees them: a device that exists, whose memory is
the allocator model's, whose streams and events order nothing (nothing runs), whose graphs capture into a
private pool and replay nothing, and whose kernels are launched without running (they write into buffers their
callers allocated, which the recorder has already counted).

Everything is patched for the span of `FakeCuda.patched()` and restored after it."""
from __future__ import annotations

import contextlib
import gc
import itertools
from types import SimpleNamespace
from unittest import mock

from .gpus import GPU


class FakeStream:
    """torch.cuda.Stream: a class (transformers annotates with `torch.cuda.Stream | None`), bound to its runtime
    by FakeCuda, which makes a subclass per prediction."""

    runtime: "FakeCuda"

    def __init__(self, device=None, priority: int = 0, stream_id: int | None = None, **kwargs):
        import torch

        self.id = next(self.runtime.stream_ids) if stream_id is None else stream_id
        self.runtime.streams[self.id] = self
        self.device = torch.device("cuda", 0)

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        return event or FakeEvent()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def __eq__(self, other) -> bool:
        return isinstance(other, FakeStream) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)


class FakeEvent:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other) -> float:
        raise RuntimeError("a prediction runs nothing: there is no time between two events")


class FakeGraph:
    """A captured graph: its allocations went to its pool while capturing; a replay allocates nothing."""

    def __init__(self, *args, **kwargs):
        self.pool_id = None

    def replay(self) -> None:
        pass

    def reset(self) -> None:
        pass

    def pool(self):
        return self.pool_id


class FakeCompiled:
    """What a Triton kernel's warmup() returns, for the callers that size a one-wave grid from its registers and
    shared memory (memcheck/kernels/dispatch.py: resident_programs): the counts are unknown without compiling for
    the device, and 0 gives the largest grid the multiprocessor's thread limit allows (an upper bound)."""

    n_regs = 0
    n_spills = 0
    metadata = SimpleNamespace(shared=0)

    def _init_handles(self) -> None:
        pass


class FakeCuda:
    def __init__(self, gpu: GPU, allocator, recorder, cublas=None):
        self.gpu, self.allocator, self.recorder, self.cublas = gpu, allocator, recorder, cublas
        self.stream_ids = itertools.count(1)  # 0: the default stream
        self.pool_ids = itertools.count(1)
        self.streams: dict[int, FakeStream] = {}
        self.Stream = type("Stream", (FakeStream,), {"runtime": self})
        self.Stream(stream_id=0)
        self.capturing = None  # the pool a graph captures into, while it captures
        self.graph_rng: list = []  # the default generator's seed and offset for graphs, once a graph registers

    # --- devices ---
    def properties(self, device=None):
        g = self.gpu
        return SimpleNamespace(name=g.name, major=g.major, minor=g.minor, total_memory=g.total_memory,
                               multi_processor_count=g.multi_processor_count, uuid=g.uuid,
                               regs_per_multiprocessor=g.regs_per_multiprocessor,
                               shared_memory_per_multiprocessor=g.shared_memory_per_multiprocessor,
                               max_threads_per_multi_processor=g.max_threads_per_multi_processor,
                               L2_cache_size=g.L2_cache_size, warp_size=g.warp_size, is_integrated=False)

    # --- memory ---
    def stats(self, device=None) -> dict:
        return self.allocator.stats()

    def nested_stats(self, device=None) -> dict:
        nested: dict = {}
        for key, value in self.allocator.stats().items():
            parts = key.split(".")
            node = nested
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = value
        return nested

    def empty_cache(self) -> None:
        self.allocator.empty_cache()

    # --- streams ---
    def current_stream(self, device=None) -> FakeStream:
        stream = self.recorder.stream
        return self.streams[stream] if stream in self.streams else self.Stream(stream_id=stream)

    @contextlib.contextmanager
    def stream(self, s):
        before = self.recorder.stream
        if s is not None:
            self.recorder.stream = s.id
        try:
            yield s
        finally:
            self.recorder.stream = before

    # --- graphs ---
    def graph_pool_handle(self):
        return (0, next(self.pool_ids))

    @contextlib.contextmanager
    def graph(self, cuda_graph, pool=None, stream=None, capture_error_mode: str = "global"):
        """torch.cuda.graph: empty the cache, capture on a side stream, allocate to the graph's pool meanwhile."""
        self.empty_cache()
        pool = pool if pool is not None else self.graph_pool_handle()
        cuda_graph.pool_id = pool
        side = stream if stream is not None else self.Stream()
        with self.stream(side):
            if not self.graph_rng:  # CUDAGraph::capture_begin -> CUDAGeneratorState::register_graph, before capture:
                import torch  # the first graph gets an int64 seed and offset, held while any graph lives

                self.graph_rng = [torch.empty(1, dtype=torch.int64, device="cuda") for _ in range(2)]
            if self.cublas is not None:
                self.cublas.at_capture_begin()
            self.allocator.begin_allocate_to_pool(pool, side.id)
            self.capturing = pool
            try:
                yield cuda_graph
            finally:
                self.capturing = None
                self.allocator.end_allocate_to_pool(pool)

    @contextlib.contextmanager
    def patched(self):
        import torch
        import torch.cuda.memory

        cuda = torch.cuda
        allocated = lambda device=None: self.allocator.stats()["allocated_bytes.all.current"]  # noqa: E731
        reserved = lambda device=None: self.allocator.stats()["reserved_bytes.all.current"]  # noqa: E731
        patches = {
            "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
            "set_device": lambda device: None, "init": lambda: None, "_lazy_init": lambda: None,
            "is_initialized": lambda: True,
            "get_device_properties": self.properties, "get_device_name": lambda device=None: self.gpu.name,
            "get_device_capability": lambda device=None: (self.gpu.major, self.gpu.minor),
            "synchronize": lambda device=None: None, "empty_cache": self.empty_cache,
            "memory_allocated": allocated, "memory_reserved": reserved, "memory_stats": self.stats,
            "max_memory_allocated": lambda device=None: self.allocator.stats()["allocated_bytes.all.peak"],
            "max_memory_reserved": lambda device=None: self.allocator.stats()["reserved_bytes.all.peak"],
            "reset_peak_memory_stats": lambda device=None: self.allocator.reset_peak(),
            "Stream": self.Stream, "Event": FakeEvent, "current_stream": self.current_stream,
            "default_stream": lambda device=None: self.streams[0], "stream": self.stream,
            "CUDAGraph": FakeGraph, "graph": self.graph, "graph_pool_handle": self.graph_pool_handle,
            "is_current_stream_capturing": lambda: self.capturing is not None,
            "manual_seed": lambda seed: None, "manual_seed_all": lambda seed: None,
        }
        with contextlib.ExitStack() as stack:
            for name, value in patches.items():
                stack.enter_context(mock.patch.object(cuda, name, value, create=True))
            stack.enter_context(mock.patch.object(torch.cuda.memory, "memory_stats_as_nested_dict", self.nested_stats))
            stack.enter_context(mock.patch.object(torch.cuda.memory, "memory_stats", self.stats))
            stack.enter_context(_triton_launches_nothing())
            yield self
            gc.collect()  # the run's last storages freed while the allocator model still counts them


@contextlib.contextmanager
def _triton_launches_nothing():
    """A launch returns at once; a warmup (compile without running) returns a FakeCompiled."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:  # no Triton: the stacks that need it say so in their check()
        yield
        return

    def run(self, *args, grid=None, warmup=False, **kwargs):
        return FakeCompiled() if warmup else None

    with mock.patch.object(JITFunction, "run", run):
        yield

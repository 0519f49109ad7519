"""Measure one round of one (workload, stack) item in this process: collectors around the stack."""
from __future__ import annotations

import gc
import time
import traceback

from . import environment, floors, stacks
from .errors import StackUnavailable, UsageError
from .measurement import Measurement
from .metrics.collect import CollectorOptions, Collectors
from .metrics.value import MetricValue
from .states import ErrorKind, ItemError


def measure(workload, stack_name: str, device, options: CollectorOptions | None = None,
            launched_at: float | None = None) -> Measurement:
    """launched_at: time.time() when the runner started this process, for the startup phase."""
    attention = stacks.split(stack_name)[1]
    m = Measurement.of_item(workload, stack_name)
    m.environment = environment.of_item(device, workload.profile, m.digest)
    m.model = workload.preset.identity
    try:
        stack_cls = stacks.load(stack_name)
        stack_cls.check(workload, device)
        if attention:
            stack_cls.check_attention(attention, workload, device)
    except StackUnavailable as e:
        m.skip(e)
        return m
    except UsageError as e:  # an entry point that names no Stack subclass
        m.error = ItemError(ErrorKind.USAGE, str(e))
        return m
    finally:
        if launched_at is not None:
            m.phases["startup"] = round(time.time() - launched_at, 3)  # process start, imports, the stack's check
    stack = stack_cls(workload, device)
    stack.attention = attention
    collectors = Collectors(device, options)
    result = warmup = None
    collectors.start()
    t0 = time.perf_counter()
    try:
        stack.prepare()
        m.environment.update(stack.software())
        m.phases["build"] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()
        # A rank traces no warm-up: its trace runs on until the group is left (CollectorOptions.in_rank).
        heap_in_warmup = (collectors.options.heap_in_warmup and not collectors.options.in_rank
                          and not stack.warmup_moves_memory and stack.has_warmup())
        if heap_in_warmup:
            collectors.host.trace_warmup()
        warmup = _warm_up(stack)
        if heap_in_warmup:
            collectors.host.stop_heap_trace()
            warmup = MetricValue.null("the warm-up ran under tracemalloc to measure host.heap_alloc.peak: "
                                      "its time is not the stack's")
        m.phases["warmup"] = round(time.perf_counter() - t0, 3)
        collectors.run_started()
        t0 = time.perf_counter()
        result = stack.run(collectors)
        collectors.run_finished()
        m.phases["run"] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()
    except BaseException as e:  # noqa: BLE001 - one failing workload must not stop the rest
        m.error = ItemError(_kind(e), f"{type(e).__name__}: {e}".strip()[:2000])
        m.notes.append(traceback.format_exc(limit=8))
        if isinstance(e, KeyboardInterrupt):
            raise
    finally:
        weights = _safe(stack.weights_bytes)
        workspace = _safe(stack.workspace_bytes)
        stack.close()
        del stack
        gc.collect()
        m.metrics = collectors.stop()
        m.phases["teardown"] = round(time.perf_counter() - t0, 3)  # close, collectors (the CPU profiler's events)
    m.timeline = collectors.timeline
    if result is not None:
        m.metrics.update(result.metrics)
        m.notes.extend(result.notes)
        m.metrics["time.wall"] = MetricValue(collectors.wall)
    if warmup is not None:
        m.metrics["time.warmup"] = warmup
    for name in ("kv.bytes.peak", "kv.live_bytes.peak", "kv.waste.peak", "kv.blocks_unreclaimed",
                 "kv.page_footprint", "tokens_per_s", "ttft", "tpot", "time.wall", "time.warmup"):
        why = "the run failed" if m.error else f"the {stack_name} stack does not report it"
        m.metrics.setdefault(name, MetricValue.null(why))
    import torch

    from .models import torch_dtype

    dtype_bytes = torch.empty(0, dtype=torch_dtype(workload, device)).element_size()
    m.floors = {"kv": floors.kv_floor(workload, dtype_bytes)}
    if weights is not None:
        m.floors["weights"] = weights
        m.floors["weights+kv"] = weights + m.floors["kv"]
    if workspace is not None:
        m.floors["workspace"] = workspace  # the stack's declared activation workspace, beside the floors
    return m


def _warm_up(stack) -> MetricValue:
    """The stack's warm-up, timed: after prepare() and before the timed run, inside the collectors."""
    if not stack.has_warmup():
        return MetricValue.null(f"the {stack.name or type(stack).__name__} stack has no warm-up")
    start = time.perf_counter()
    stack.warmup()
    return MetricValue(time.perf_counter() - start, detail="the stack's warm-up, before the timed run")


def _safe(fn):
    try:
        return fn()
    except Exception:  # the model may not exist when prepare() failed
        return None


def _kind(e: BaseException) -> ErrorKind:
    import torch

    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return ErrorKind.OOM
    if isinstance(e, RuntimeError) and "can't allocate memory" in str(e):  # torch's CPU allocator
        return ErrorKind.OOM
    return ErrorKind.CRASH

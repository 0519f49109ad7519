"""One item predicted: the measurement path itself (memcheck/measure_round.py: collectors around prepare, warm-up,
run, close) on a fake GPU, then every number named for what it is. The allocator's counters become
`predicted.gpu.*`; the KV metrics are the engine's own bookkeeping of the same schedule and keep their names;
what a fake run cannot know (the driver's view, the host's memory and time of the stack, device addresses) is null
with the reason."""
from __future__ import annotations

from ..errors import StackUnavailable
from ..measurement import Measurement
from ..metrics.value import MetricValue
from .gpus import gpu as gpu_named

RENAMED = {"gpu.heap_alloc.peak": "predicted.gpu.heap_alloc.peak", "gpu.reserved.peak": "predicted.gpu.reserved.peak",
           "gpu.heap_alloc.end": "predicted.gpu.heap_alloc.end",
           "gpu.fragmentation.peak": "predicted.gpu.fragmentation.peak", "gpu.ooms": "predicted.gpu.ooms"}
TIMELINE = {"gpu.allocated": "predicted.gpu.allocated", "gpu.reserved": "predicted.gpu.reserved"}
MEASURED_ONLY = "a prediction measures no GPU: see the predicted.gpu.* metrics"
NOT_THE_STACK = "a prediction's process runs fake tensors: its host memory and time are the predictor's, not the stack's"
NO_ADDRESSES = "a prediction has no device addresses (its tensors are fake): measured on the GPU runner only"


def device_class(gpu) -> str:
    """The baselines' folder of predictions for `gpu`, beside (never in) the measured device's."""
    return f"{gpu.device_class}-predicted"


def predict(workload, stack_name: str, gpu_name: str, options, launched_at: float | None = None) -> Measurement:
    import torch

    from .. import stacks
    from ..measure_round import measure

    gpu = gpu_named(gpu_name)
    try:
        stacks.load(stack_name).check_prediction(workload)
    except StackUnavailable as e:
        m = Measurement.of_item(workload, stack_name)
        m.skip(e)
        return m
    from .session import Prediction

    prediction = Prediction(gpu)
    options.predicted = True
    try:
        with prediction.running():
            m = measure(workload, stack_name, torch.device("cuda", 0), options, launched_at=launched_at)
    except StackUnavailable as e:  # the fake device could not be made here (no compiler)
        m = Measurement.of_item(workload, stack_name)
        m.skip(e)
        return m
    m.environment.update(device_class=device_class(gpu), gpu=f"{gpu.name} (predicted)", driver=None)
    _name_what_it_is(m, prediction)
    return m


def _name_what_it_is(m: Measurement, prediction) -> None:
    metrics = m.metrics
    for measured, predicted in RENAMED.items():
        if measured in metrics:
            value = metrics.pop(measured)
            if value.value is not None:
                value.detail = "allocator model, fake tensors"
            metrics[predicted] = value
            metrics[measured] = MetricValue.null(MEASURED_ONLY)
    for name in ("gpu.device_used.peak", "gpu.alloc_retries"):
        metrics[name] = MetricValue.null(MEASURED_ONLY)
    for name in list(metrics):
        if name.startswith(("host.", "time.", "cpu.")) or name in ("tokens_per_s", "ttft", "tpot"):
            metrics[name] = MetricValue.null(NOT_THE_STACK)
    if "kv.page_footprint" in metrics:
        metrics["kv.page_footprint"] = MetricValue.null(NO_ADDRESSES)
    for point in m.timeline:
        for measured, predicted in TIMELINE.items():
            if measured in point:
                point[predicted] = point.pop(measured)
    m.notes.append(f"predicted for {prediction.gpu.name} on this CPU runner: {prediction.recorder.ops} operators on "
                   f"fake tensors, their allocations replayed through the caching allocator model")

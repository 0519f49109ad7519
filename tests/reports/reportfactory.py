"""Reports built from real harness objects (Measurement, baselines, the built-in rules, judge()), shaped like
what a GPU runner and a CPU runner produce, for the report, export and publish tests. No GPU needed."""
from __future__ import annotations

from pathlib import Path

from memcheck import project
from memcheck.baselines import Baseline
from memcheck.measurement import Measurement
from memcheck.metrics.catalog import METRICS, reported_by
from memcheck.metrics.value import MetricValue
from memcheck.reports.report import Report
from memcheck.verdict import judge

HOSTILE = "<img src=x onerror=alert(1)>"
GiB, MiB = 2**30, 2**20

GPU_ENV = {"device_class": "nvidia-h200", "gpu": "NVIDIA H200", "driver": "580.65.06", "cuda": "13.0",
           "torch": "2.11.0+cu130", "triton": "3.6.0", "transformers": "5.17.0", "vllm": None, "memcheck": "0.1.0",
           "python": "3.11.7", "platform": "Linux-x86_64", "cpu": "x86_64", "git_sha": "0123456789abcdef0123",
           "profile": "full", "workload": "d1"}
CPU_ENV = {**GPU_ENV, "device_class": "cpu-x86_64", "gpu": None, "driver": None, "cuda": None,
           "torch": "2.13.0+cpu", "profile": "ci"}


def rules():
    return project.load("/nonexistent-root").thresholds


def gpu_timeline(steps: int, weights: float, kv_per_step: float, transient: float, reserved_slack: float):
    points = []
    for step in range(steps + 1):
        kv = kv_per_step * (step + 8)
        allocated = weights + kv + (transient if step % 4 == 1 else transient / 3)
        points.append({"t": 0.05 * step, "step": step, "gpu.allocated": allocated,
                       "gpu.reserved": allocated * reserved_slack + 64 * MiB,
                       "kv.bytes": kv * 1.25, "kv.live_bytes": kv})
    return points


def cpu_timeline(steps: int, rss0: float):
    return [{"t": 0.1 * s, "step": s, "host.rss": rss0 + s * 120_000 + (s > 3) * 2 * MiB,
             "kv.bytes": 524288 + 8192 * s, "kv.live_bytes": 524288 + 8192 * s} for s in range(steps + 1)]


def measurement(workload: str, stack: str, env: dict, metrics: dict[str, float | None], timeline=(),
                **kw) -> Measurement:
    values = {}
    for name in (n for n in METRICS if reported_by(n, stack)):  # an hf item has no vllm.* metrics at all
        v = metrics.get(name)
        if v is None:
            reason = "no CUDA device on this runner" if name.startswith("gpu.") and env is CPU_ENV \
                else f"the {stack} stack does not report it"
            values[name] = MetricValue.null(reason)
        else:
            values[name] = MetricValue(v)
    return Measurement(workload, stack, f"suites/{workload}.yaml", env["profile"], scaled=env is CPU_ENV,
                       digest="d1", metrics=values, floors={"kv": 1 * GiB, "weights": 15 * GiB,
                                                            "weights+kv": 16 * GiB},
                       environment=dict(env), timeline=list(timeline), **kw)


def baseline(m: Measurement, scale: dict[str, float]) -> Baseline:
    metrics = {k: MetricValue(None if v.value is None else v.value / scale.get(k, 1.0), v.reason)
               for k, v in m.metrics.items()}
    return Baseline(Path(f"baselines/{m.environment['device_class']}/{m.workload}/{m.stack}.json"), metrics,
                    dict(m.environment), "2026-11-01T00:00:00+00:00")


def gpu_report(workload: str = "r1-distill-batch8") -> Report:
    rs = rules()
    items = []
    # hf regressed: peak +12% over its baseline; an allocator snapshot was saved for it.
    hf = measurement(workload, "hf", GPU_ENV, {
        "gpu.heap_alloc.peak": 18.3 * GiB, "gpu.reserved.peak": 19.1 * GiB, "gpu.heap_alloc.end": 0,
        "gpu.device_used.peak": 19.9 * GiB, "gpu.fragmentation.peak": 0.04, "gpu.alloc_retries": 0, "gpu.ooms": 0,
        "kv.bytes.peak": 1.2 * GiB, "kv.waste.peak": 0.0, "host.rss.peak": 2.1 * GiB,
        "host.heap_alloc.peak": 80 * MiB, "kv.page_footprint": 4100},
        gpu_timeline(128, 15 * GiB, 8 * MiB, 1.1 * GiB, 1.04),
        artifacts={"allocator_snapshot": "memcheck-snapshots/r1-distill-batch8-hf.pickle"})
    items.append(judge(hf, rs, baseline(hf, {"gpu.heap_alloc.peak": 1.12})))
    paged = measurement(workload, "paged", GPU_ENV, {
        "gpu.heap_alloc.peak": 16.4 * GiB, "gpu.reserved.peak": 16.6 * GiB, "gpu.heap_alloc.end": 0,
        "gpu.device_used.peak": 17.2 * GiB, "gpu.fragmentation.peak": 0.01, "gpu.alloc_retries": 0, "gpu.ooms": 0,
        "kv.bytes.peak": 1.02 * GiB, "kv.waste.peak": 0.012, "kv.blocks_unreclaimed": 0,
        "host.rss.peak": 1.9 * GiB, "host.heap_alloc.peak": 70 * MiB, "kv.page_footprint": 520},
        gpu_timeline(128, 15 * GiB, 7.6 * MiB, 0.2 * GiB, 1.01))
    items.append(judge(paged, rs, baseline(paged, {})))
    vllm = Measurement(workload, "vllm", f"suites/{workload}.yaml", "full", skipped="vllm is not installed here")
    items.append(judge(vllm, rs, None))
    oom = Measurement("deepseek-v2-lite-32k", "hf", "suites/dsv2.yaml", "full", environment=dict(GPU_ENV),
                      error={"kind": "oom", "message": "OutOfMemoryError: CUDA out of memory. Tried to allocate "
                                                       "4.00 GiB (GPU 0; 139.8 GiB total capacity)"})
    items.append(judge(oom, rs, None))
    return Report(items=items, profile="full", created="2026-11-29T10:00:00+00:00")


def cpu_report(workload: str = "tiny-dense-batch") -> Report:
    rs = rules()
    m = measurement(workload, "hf", CPU_ENV, {"cpu.heap_alloc.peak": 9.6 * MiB, "host.rss.peak": 430 * MiB,
                                              "host.heap_alloc.peak": 1.0 * MiB, "kv.bytes.peak": 632 * 1024,
                                              "kv.waste.peak": 0.0, "kv.page_footprint": 4},
                    cpu_timeline(16, 420 * MiB))
    return Report(items=[judge(m, rs, baseline(m, {}))], profile="ci", created="2026-11-29T09:00:00+00:00")


def hostile_report() -> Report:
    """A report as an attacker's fork could write it: user-controlled names and messages full of markup."""
    rs = rules()
    m = measurement(HOSTILE, "hf", CPU_ENV, {"cpu.heap_alloc.peak": 9.6 * MiB, "host.rss.peak": 430 * MiB},
                    cpu_timeline(4, 420 * MiB))
    item = judge(m, rs, baseline(m, {"cpu.heap_alloc.peak": 1.5}))
    item.reason += f" {HOSTILE} [click](javascript:alert(1)) @everyone | `code` ```"
    return Report(items=[item], profile="ci")


def big_report(copies: int) -> Report:
    """The GPU report's items `copies` times over, under distinct workload names: a body over GitHub's limit."""
    items = []
    for i in range(copies):
        for r in gpu_report().items:
            r.measurement.workload = f"w{i:04d}-{r.measurement.workload}"
            items.append(r)
    return Report(items=items, profile="full")


def write(report: Report, path) -> str:
    report.write_json(str(path))
    return str(path)

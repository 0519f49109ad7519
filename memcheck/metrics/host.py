"""Host-side metrics of the workload's process: Python heap, RSS peak, page faults, GC passes, dTLB misses."""
from __future__ import annotations

import gc
import os
import resource
import sys
import threading
import tracemalloc

from . import perf
from .value import MetricValue

# ru_maxrss is KiB on Linux, bytes on macOS.
_RSS_UNIT = 1 if sys.platform == "darwin" else 1024


def _status_bytes() -> dict[str, int]:
    """The kB fields of /proc/self/status, in bytes; empty where there is no /proc."""
    try:
        with open("/proc/self/status") as f:
            fields = (line.split(":", 1) for line in f)
            return {k: int(v.split()[0]) * 1024 for k, v in fields if v.strip().endswith("kB")}
    except OSError:
        return {}


def owned_resident() -> int:
    """Resident memory this process owns now: anonymous pages and shared memory, not file-backed pages."""
    status = _status_bytes()
    if "RssAnon" in status:
        return status["RssAnon"] + status.get("RssShmem", 0)
    import psutil

    info = psutil.Process().memory_info()
    return info.rss - getattr(info, "shared", 0)


class ResidentReader:
    """`owned_resident` for a stack's step(): /proc/self/status kept open, re-read in place and only its two
    fields parsed (opening it and parsing every field cost ~400 us a step on a loaded 2-core runner)."""

    KEYS = (b"RssAnon:", b"RssShmem:")

    def __init__(self):
        try:
            self._fd = os.open("/proc/self/status", os.O_RDONLY)
        except OSError:
            self._fd = None

    def __call__(self) -> int:
        text = os.pread(self._fd, 16384, 0) if self._fd is not None else b""
        at = [text.find(key) for key in self.KEYS]
        if min(at) < 0:
            return owned_resident()
        return sum(int(text[i + len(key):text.index(b"kB", i)]) * 1024 for i, key in zip(at, self.KEYS))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def peak_rss() -> tuple[int, str]:
    """This process's peak resident set, less its file-backed pages, and how it was counted.

    File-backed pages (the mapped code of torch and its libraries) follow the page cache, not the
    workload: the same imports in two venvs of identical packages held 180 MB of anonymous memory in
    both and 83 vs 159 MB of file pages, the freshly installed venv the larger. Counted here: VmHWM,
    the high-water mark of this process's own address space (not ru_maxrss, which a forked worker
    inherits from its parent), less the file pages resident now. File pages only grow during a run,
    so this is the anonymous + shared-memory peak, short of it only by code first touched after it."""
    status = _status_bytes()
    if "VmHWM" in status and "RssFile" in status:
        files = status["RssFile"]
        return status["VmHWM"] - files, f"VmHWM less {files / 2**20:.0f} MiB of file-backed pages (library code)"
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _RSS_UNIT,
            "getrusage ru_maxrss, file-backed pages included (no /proc on this runner)")


HEAP_OFF = "Python heap tracing switched off (--memcheck-no-host-heap)"


class HostCollector:
    """Start before the model is built, `run_started` before the stack runs, `stop` after it."""

    def __init__(self, python_heap: bool = True, rss_sampled: bool = False, period_s: float = 0.01,
                 stops_trace: bool = True):
        # A worker process is fresh, so its high-water mark is the item's exact peak; a block measured
        # inside a longer-lived process (the fixture) needs a sampled peak instead.
        self.python_heap = python_heap
        self.stops_trace = stops_trace  # False: the trace's peak is read, its owner stops it (CollectorOptions.in_rank)
        self._rss = RssSampler(period_s) if rss_sampled else None
        self.gc_passes = 0
        self._dtlb = self._dtlb_error = None
        self._faults_at_run = 0
        self._heap_peak: int | None = None
        self._heap_detail = "tracemalloc, during the run"

    def _on_gc(self, phase, info):
        if phase == "start":
            self.gc_passes += 1

    def start(self) -> None:
        if self._rss:
            self._rss.start()
        try:
            self._dtlb = perf.dtlb_misses()
        except perf.PerfCounterError as e:
            self._dtlb_error = f"the PMU of this runner has no data-TLB miss counter ({e.strerror})"

    def run_started(self) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self._faults_at_run = usage.ru_minflt + usage.ru_majflt
        self.gc_passes = 0
        gc.callbacks.append(self._on_gc)
        if self.python_heap and self._heap_peak is None:  # None: not traced through the warm-up already
            # Started here, not before the model is built: under tracemalloc, imports that the
            # build triggers run several times slower, and they are not the workload.
            tracemalloc.start(1)  # one frame: the smallest trace, the smallest overhead
        if self._dtlb:
            self._dtlb.start()

    def run_finished(self) -> None:
        """The Python heap's peak is read when the run returns: what the harness allocates after it
        (closing the stack, processing the profiler's events) is not the workload's."""
        self.stop_heap_trace()

    def stop_heap_trace(self) -> None:
        """Read the traced Python heap's peak and stop tracing (after the run, or after a traced warm-up)."""
        if tracemalloc.is_tracing() and self._heap_peak is None:
            self._heap_peak = tracemalloc.get_traced_memory()[1]
            if self.stops_trace:
                tracemalloc.stop()

    def trace_warmup(self) -> None:
        """Trace the Python heap through the stack's warm-up instead of the run (its warm-up is the workload
        once): the peak is the workload's, and the timed run that follows runs untraced."""
        self.python_heap = True
        self._heap_detail = "tracemalloc, during the warm-up (the workload once; the timed run runs untraced)"
        tracemalloc.start(1)

    def stop(self) -> dict[str, MetricValue]:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        if self._rss:
            rss = MetricValue(self._rss.stop(), detail=f"anonymous + shared memory, sampled every {self._rss.period_s * 1000:g} ms")
        else:
            peak, source = peak_rss()
            rss = MetricValue(peak, detail=source)
        out = {
            "host.rss.peak": rss,
            "host.page_faults": MetricValue(usage.ru_minflt + usage.ru_majflt - self._faults_at_run,
                                            detail="getrusage minor+major, during the run (with the CPU-tensor profiler on, its own buffers fault too)"),
            "host.gc_collections": MetricValue(self.gc_passes),
        }
        if self.python_heap and self._heap_peak is not None:
            out["host.heap_alloc.peak"] = MetricValue(self._heap_peak, detail=self._heap_detail)
        else:
            out["host.heap_alloc.peak"] = MetricValue.null(HEAP_OFF)
        if self._dtlb:
            out["host.dtlb_misses"] = MetricValue(self._dtlb.stop(), detail="perf dTLB-load-misses, user space")
            self._dtlb.close()
        else:
            out["host.dtlb_misses"] = MetricValue.null(self._dtlb_error)
        return out


class RssSampler:
    """Peak resident memory this process owns (anonymous + shared, as `owned_resident`), sampled on a thread."""

    def __init__(self, period_s: float):
        self.period_s, self.peak = period_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="memcheck-rss", daemon=True)

    def _sample(self) -> None:
        self.peak = max(self.peak, owned_resident())

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def start(self) -> None:
        self._sample()
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self._sample()
        return self.peak

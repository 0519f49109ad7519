"""Device memory as the driver sees it (NVML), polled by a process of its own beside the measured worker.

Why a process: a thread in the worker takes the GIL from the stack at every poll. On an H200, polling NVML
and the torch allocator every 10 ms on a thread cost stock transformers' generate(), which is bound by
Python, 16-25% of its speed (benchmarks/collector_overhead.py). Here it
costs the stack nothing but part of a core that a GPU runner has idle.

    python nvml_poll.py DEVICE_UUID PID PERIOD_S [shared]
Counts the memory NVML attributes to PID and its children (or the whole device where the driver does not
attribute memory to processes, e.g. pids hidden by a container). `shared`: other items run on the device at the
same time, so the whole device would count their memory: a poll that attributes none to PID's tree is skipped,
and if none does the peak is null with the reason. Prints "ready" after its first poll,
polls until its stdin closes, then prints one JSON line: peak, per_process, polls, error. Imports no
torch (it starts in ~0.1 s), and runs as a file, not a module, so it imports nothing of the harness.
"""
import json
import sys
import threading


def open_device(uuid: str):
    import pynvml

    pynvml.nvmlInit()
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        if pynvml.nvmlDeviceGetUUID(handle).removeprefix("GPU-") == uuid.removeprefix("GPU-"):
            return pynvml, handle
    raise LookupError(f"NVML lists no device with the UUID {uuid}")


SHARED_UNATTRIBUTED = ("NVML attributed no device memory to this item's processes (pids hidden from this container?), "
                      "and other items share the device: its device-wide reading would count their memory")


class Poller:
    def __init__(self, pynvml, handle, pid: int, shared: bool = False):
        self.pynvml, self.handle, self.pid, self.shared = pynvml, handle, pid, shared
        self.per_process = True
        self._seen: set[int] = set()  # every pid NVML has reported so far
        self._tree: set[int] = set()  # the measured process and its children at the last scan

    def _ours(self, reported: set[int]) -> set[int]:
        """The process tree is scanned again only when NVML reports a pid not seen before."""
        if not reported <= self._seen:
            import psutil

            try:
                me = psutil.Process(self.pid)
                self._tree = {self.pid} | {child.pid for child in me.children(recursive=True)}
            except psutil.NoSuchProcess:
                self._tree = set()
            self._seen |= reported
        return reported & self._tree

    def used(self) -> int | None:
        """Bytes of ours on the device now; None for a poll that can say nothing of ours (shared device)."""
        nvml = self.pynvml
        if self.per_process:
            try:
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(self.handle)
                ours = self._ours({p.pid for p in procs})
                used = [p.usedGpuMemory for p in procs if p.pid in ours and p.usedGpuMemory is not None]
                if used:
                    return sum(used)
            except nvml.NVMLError:
                if self.shared:
                    raise
            if self.shared:  # not ours yet (no CUDA context), or never attributable: never another item's bytes
                return None
            self.per_process = False  # no memory attributed to our pids: count the whole device from now on
        return nvml.nvmlDeviceGetMemoryInfo(self.handle).used


def main(uuid: str, pid: int, period_s: float, shared: bool = False) -> int:
    result = {"peak": None, "per_process": None, "polls": 0, "error": None}
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    poller = None
    try:
        poller = Poller(*open_device(uuid), pid, shared)
    except ImportError:
        result["error"] = "nvidia-ml-py (pynvml) is not installed"
    except Exception as e:  # NVMLError (driver missing, permission), no such device
        result["error"] = f"NVML unavailable: {e}"
    peak, first = None, True
    while True:
        if poller is not None:
            try:
                used = poller.used()
                if used is not None:
                    peak = used if peak is None else max(peak, used)
                result["polls"] += 1
            except Exception as e:  # noqa: BLE001 - the driver went away mid-run: report, do not crash the worker
                result["error"], poller = f"NVML failed during the run: {e}", None
        if first:
            print("ready", flush=True)
            first = False
        if stop.wait(period_s):
            break
    result["peak"] = peak
    if peak is None and poller is not None and result["error"] is None:
        result["error"] = SHARED_UNATTRIBUTED
    result["per_process"] = poller.per_process if poller is not None and peak is not None else None
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:5] == ["shared"]))

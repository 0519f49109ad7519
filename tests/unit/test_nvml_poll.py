"""The NVML poller (memcheck/metrics/nvml_poll.py) run as the sampler runs it, against a stand-in pynvml
module: what it counts as ours, its fallback to the whole device, its one-line errors."""
import json
import os
import subprocess
import sys
import textwrap
import time

from memcheck.metrics.sampler import POLLER

FAKE_PYNVML = textwrap.dedent('''
    import os, time
    from types import SimpleNamespace

    class NVMLError(Exception):
        pass

    def nvmlInit():
        if os.environ.get("FAKE_NVML_FAIL"):
            raise NVMLError("Driver Not Loaded")

    def nvmlDeviceGetCount():
        return 2

    def nvmlDeviceGetHandleByIndex(i):
        return i

    def nvmlDeviceGetUUID(handle):
        return f"GPU-uuid-{handle}"

    def nvmlDeviceGetComputeRunningProcesses(handle):
        owner = int(os.environ["FAKE_NVML_OWNER"])
        rising = 1000 + int((time.monotonic() % 1) * 100)
        return [SimpleNamespace(pid=owner, usedGpuMemory=rising), SimpleNamespace(pid=1, usedGpuMemory=10**9)]

    def nvmlDeviceGetMemoryInfo(handle):
        return SimpleNamespace(used=123456)
''')


def poll(tmp_path, uuid, pid, owner, seconds=0.3, fail=False, shared=False):
    (tmp_path / "pynvml.py").write_text(FAKE_PYNVML)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "FAKE_NVML_OWNER": str(owner)}
    env.pop("FAKE_NVML_FAIL", None)
    if fail:
        env["FAKE_NVML_FAIL"] = "1"
    proc = subprocess.Popen([sys.executable, POLLER, uuid, str(pid), "0.01", *(["shared"] if shared else [])],
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(seconds)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    return json.loads(out.strip().splitlines()[-1])


def test_counts_only_the_measured_process_tree(tmp_path):
    me = os.getpid()
    result = poll(tmp_path, "uuid-1", me, owner=me)
    assert result["error"] is None and result["per_process"] is True
    assert 1000 <= result["peak"] < 1100  # pid 1's gigabyte is not ours
    assert result["polls"] >= 5


def test_whole_device_where_the_driver_attributes_nothing_to_our_pids(tmp_path):
    result = poll(tmp_path, "GPU-uuid-0", os.getpid(), owner=999999)
    assert result["per_process"] is False and result["peak"] == 123456


def test_unknown_device_and_driver_errors_are_reasons_not_crashes(tmp_path):
    missing = poll(tmp_path, "uuid-7", os.getpid(), owner=os.getpid(), seconds=0)
    assert missing["peak"] is None and "no device with the UUID uuid-7" in missing["error"]
    failing = poll(tmp_path, "uuid-1", os.getpid(), owner=os.getpid(), seconds=0, fail=True)
    assert failing["peak"] is None and failing["error"] == "NVML unavailable: Driver Not Loaded"


def test_a_pid_no_process_has_reads_the_whole_device(tmp_path):
    # benchmarks/collector_parts.py times the poller's device-wide query this way (DeviceSampler(pid=...))
    result = poll(tmp_path, "GPU-uuid-0", 2**22 + 1, owner=os.getpid())
    assert result["error"] is None and result["per_process"] is False and result["peak"] == 123456


def test_on_a_shared_device_only_the_measured_tree_counts_never_the_whole_device(tmp_path):
    me = os.getpid()
    ours = poll(tmp_path, "uuid-1", me, owner=me, shared=True)
    assert ours["error"] is None and ours["per_process"] is True and 1000 <= ours["peak"] < 1100
    # No poll attributes memory to our tree: null with the reason, not the device's 123456 bytes (others' memory)
    unattributed = poll(tmp_path, "GPU-uuid-0", me, owner=999999, shared=True)
    assert unattributed["peak"] is None and unattributed["per_process"] is None
    assert "other items share the device" in unattributed["error"]

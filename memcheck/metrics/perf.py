"""perf_event_open through ctypes: hardware and software counters for this process and its threads.

Where the PMU lacks a counter (virtual machines, Hopper GPUs have none at all) the open fails and
the caller reports the metric as null with the errno, never as 0.
"""
from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

_SYSCALL = {"x86_64": 298, "aarch64": 241}.get(platform.machine())
PERF_TYPE_SOFTWARE, PERF_TYPE_HW_CACHE = 1, 3
PERF_COUNT_SW_PAGE_FAULTS = 2
# dTLB read misses: cache id DTLB (3) | op READ (0) << 8 | result MISS (1) << 16
DTLB_READ_MISS = 3 | (0 << 8) | (1 << 16)
_ENABLE, _DISABLE, _RESET = 0x2400, 0x2401, 0x2403
_DISABLED, _INHERIT, _EXCLUDE_KERNEL, _EXCLUDE_HV = 1 << 0, 1 << 1, 1 << 5, 1 << 6


class _Attr(ctypes.Structure):
    # struct perf_event_attr up to config2 (PERF_ATTR_SIZE_VER1, 72 bytes); the kernel accepts it.
    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
                ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
                ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64),
                ("wakeup_events", ctypes.c_uint32), ("bp_type", ctypes.c_uint32),
                ("config1", ctypes.c_uint64), ("config2", ctypes.c_uint64)]


class PerfCounterError(OSError):
    pass


class PerfCounter:
    """One counter over this process (inherited by threads created after it opens)."""

    def __init__(self, type_: int, config: int, user_only: bool = True):
        if _SYSCALL is None:
            raise PerfCounterError(errno.ENOSYS, f"perf_event_open: no syscall number for {platform.machine()}")
        attr = _Attr(type=type_, size=ctypes.sizeof(_Attr), config=config)
        attr.flags = _DISABLED | _INHERIT | ((_EXCLUDE_KERNEL | _EXCLUDE_HV) if user_only else 0)
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.syscall(_SYSCALL, ctypes.byref(attr), 0, -1, -1, 0)
        if fd < 0:
            err = ctypes.get_errno()
            raise PerfCounterError(err, f"perf_event_open: {errno.errorcode.get(err, err)} ({os.strerror(err)})")
        self.fd = fd
        self._ioctl = libc.ioctl
        self._ioctl(fd, _RESET, 0)

    def start(self) -> None:
        self._ioctl(self.fd, _ENABLE, 0)

    def stop(self) -> int:
        self._ioctl(self.fd, _DISABLE, 0)
        return struct.unpack("Q", os.read(self.fd, 8))[0]

    def close(self) -> None:
        os.close(self.fd)


def dtlb_misses() -> PerfCounter:
    return PerfCounter(PERF_TYPE_HW_CACHE, DTLB_READ_MISS)


def page_faults() -> PerfCounter:
    return PerfCounter(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS, user_only=False)

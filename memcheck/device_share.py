"""Items measured at once on one GPU, each in processes of its own: which item may start, and what each cost in
GPU seconds.

Under `-n N` (pytest-xdist) every runner that measures on a GPU holds it through one ledger file per device,
under a file lock. An item claims the device memory its baseline peaked at, with room to regress, and starts
when the claims of the items holding the device and its own fit in the device and no item expected to run longer
(its baseline's time.wall) still waits; an item with no baseline, whose
time metrics are judged, or whose stack reads the device's free memory claims the whole device and waits until
nothing else holds it. Each item's torch allocator metrics are its own process's; NVML counts its process tree
only (memcheck/metrics/nvml_poll.py, `shared`).

GPU seconds: the time an item held the device, each moment split evenly among the items holding it then, so
the items' GPU seconds add up to the time the device was held at all (what a GPU runner is paid for).
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from dataclasses import dataclass

# A claim above the baseline's peak: a regression past gpu.device_used.peak's default rule (5%) still fits, and
# an item that runs out of memory beside others is measured again alone (runner.py).
CLAIM_MARGIN = 1.25
RESERVE = 2 << 30  # left to the driver and to processes outside the ledger


@dataclass
class Held:
    """One item's hold on the device: whether others could run beside it, and its GPU seconds once released."""

    alone: bool
    start: float
    end: float | None = None
    gpu_seconds: float | None = None  # its share: time alone counts whole, time beside k-1 others counts 1/k
    most_at_once: int = 1  # the most items holding the device at one moment, this one included
    waited: float = 0.0  # seconds it waited for the claim to fit: what bounds a job of items at once, if anything

    @property
    def held_seconds(self) -> float:
        return (self.end or time.time()) - self.start

    def describe(self) -> str:
        if self.most_at_once <= 1:
            return f"held the GPU alone for {self.held_seconds:.1f} s"
        return (f"held the GPU {self.held_seconds:.1f} s beside up to {self.most_at_once - 1} other items: "
                f"its share {self.gpu_seconds:.1f} GPU s")


class Ledger:
    """The holders of one device, in a JSON file beside a lock file: {holders: {token: {pid, item, bytes, start}},
    waiting: {token: {pid, item, bytes, length, since}}, spans: [[start, end], ...] of holds that ended while others
    were still held (for their shares)}."""

    def __init__(self, path: str, capacity: int | None, poll_s: float = 0.25, clock=time.time,
                 device_class: str | None = None):
        self.path, self.capacity, self.poll_s, self.clock = path, capacity, poll_s, clock
        self.device_class = device_class  # the baselines' folder of this GPU, for the claims

    @contextlib.contextmanager
    def hold(self, item: str, claim: int | None, length: float = 0.0):
        """Wait until the item may start, hold the device while the block runs, then release it. claim: bytes of
        device memory, or None for the whole device; length: how long the item is expected to run (its baseline's).
        The longest waiting item goes first (as long: the first to ask): no item starts while one ahead of it waits,
        since a long item kept out by shorter ones and started last is what a job of items at once waits for."""
        token = f"{os.getpid()}-{id(object())}-{time.monotonic_ns()}"
        asked = self.clock()
        me = {"pid": os.getpid(), "item": item, "bytes": claim, "length": length, "since": asked}
        try:
            while True:
                with self._locked() as state:
                    ahead = [w for t, w in state["waiting"].items() if t != token and _ahead(w, me)]
                    if self._fits(state["holders"], claim, ahead):
                        state["waiting"].pop(token, None)
                        start = self.clock()
                        held = Held(alone=claim is None, start=start, waited=start - asked)
                        state["holders"][token] = {"pid": os.getpid(), "item": item, "bytes": claim,
                                                   "start": held.start}
                        break
                    state["waiting"][token] = me
                time.sleep(self.poll_s)
        except BaseException:  # interrupted while waiting: no longer ahead of anyone
            with self._locked() as state:
                state["waiting"].pop(token, None)
            raise
        try:
            yield held
        finally:
            with self._locked() as state:
                state["holders"].pop(token, None)
                held.end = self.clock()
                others = [(h["start"], held.end) for h in state["holders"].values()]
                held.gpu_seconds, held.most_at_once = share(held.start, held.end, state["spans"] + others)
                if state["holders"]:  # ours is needed for their shares until they end
                    first = min(h["start"] for h in state["holders"].values())
                    state["spans"] = [s for s in state["spans"] if s[1] > first] + [[held.start, held.end]]
                else:
                    state["spans"] = []

    def _fits(self, holders: dict, claim: int | None, ahead: list) -> bool:
        """Whether a claim may start beside the holders: none of the items ahead of it is still waiting (one that
        waits does not fit, so no room beside it is left to keep), and it fits."""
        if ahead:
            return False
        if not holders:
            return True
        if claim is None or self.capacity is None or any(h["bytes"] is None for h in holders.values()):
            return False
        return sum(h["bytes"] for h in holders.values()) + claim <= self.capacity - RESERVE

    @contextlib.contextmanager
    def _locked(self):
        import fcntl

        with open(self.path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = self._read()
                for key in ("holders", "waiting"):  # crashed jobs
                    state[key] = {k: h for k, h in state.get(key, {}).items() if _alive(h["pid"])}
                yield state
                tmp = f"{self.path}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    json.dump(state, f)
                os.replace(tmp, self.path)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _read(self) -> dict:
        try:
            with open(self.path) as f:
                state = json.load(f)
            if (isinstance(state.get("holders"), dict) and isinstance(state.get("spans"), list)
                    and isinstance(state.get("waiting", {}), dict)):
                return state
        except (OSError, ValueError, AttributeError):
            pass
        return {"holders": {}, "waiting": {}, "spans": []}  # none yet, or left unreadable by a killed job: start afresh


def _ahead(waiter: dict, me: dict) -> bool:
    """Whether a waiting item goes before this one: expected to run longer, or as long and asking first."""
    return (waiter["length"], -waiter["since"]) > (me["length"], -me["since"])


def share(start: float, end: float, others: list) -> tuple[float, int]:
    """Seconds of [start, end] each split evenly among the holds covering them (this one and `others`, a list of
    [start, end]), and the most holds covering one moment."""
    cuts = sorted({start, end, *(t for s, e in others for t in (s, e) if start < t < end)})
    seconds, most = 0.0, 1
    for a, b in zip(cuts, cuts[1:]):
        at_once = 1 + sum(1 for s, e in others if s <= a and e >= b)
        seconds += (b - a) / at_once
        most = max(most, at_once)
    return seconds, most


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def claim(workload, stack_cls, baseline_peak: float | None, rootdir: str, at_once: int) -> tuple[int | None, str]:
    """The device memory an item claims (None: the whole device) and, when it claims the whole device, why."""
    if at_once <= 1:
        return None, "items run one at a time"
    if workload.time_gated:
        return None, f"its time metrics are judged in this profile ({workload.rounds} rounds): measured alone"
    why = stack_cls.needs_device_alone(rootdir)
    if why:
        return None, why
    if workload.tensor_parallel > 1:
        return None, "a tensor-parallel item holds its GPUs alone"
    if not baseline_peak:
        return None, "no baseline gpu.device_used.peak to size its claim: measured alone"
    return int(baseline_peak * CLAIM_MARGIN), ""


def ledger(visible: str, device_index: int) -> Ledger:
    """The ledger of the GPU a runner measures on: `visible` is CUDA_VISIBLE_DEVICES as pinned (or ''), the
    index the device among those visible. Its capacity is NVML's total memory of that GPU, None without NVML
    (every item then claims the whole device)."""
    from .environment import _slug

    uuid, capacity, name = _nvml_device(visible, device_index)
    key = uuid or f"visible-{visible or 'all'}-{device_index}"
    folder = os.environ.get("MEMCHECK_DEVICE_LEDGER_DIR") or tempfile.gettempdir()
    return Ledger(os.path.join(folder, f"memcheck-gpu-{_safe(key)}.json"), capacity,
                  device_class=_slug(name) if name else None)


def _nvml_device(visible: str, device_index: int) -> tuple[str | None, int | None, str | None]:
    """(UUID, total bytes, name) of the device by NVML, which makes no CUDA context in this process. NVML numbers
    GPUs by PCI bus, CUDA fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID: on a runner of mixed GPUs the index
    can name another GPU, whose memory then sizes the claims."""
    try:
        import pynvml

        pynvml.nvmlInit()
        entries = [v.strip() for v in visible.split(",") if v.strip()] if visible else []
        entry = entries[device_index] if device_index < len(entries) else str(device_index)
        if entry.isdigit():
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(entry))
        else:
            handle = pynvml.nvmlDeviceGetHandleByUUID(entry if entry.startswith("GPU-") else f"GPU-{entry}")
        uuid, name = pynvml.nvmlDeviceGetUUID(handle), pynvml.nvmlDeviceGetName(handle)
        text = lambda v: v.decode() if isinstance(v, bytes) else v  # noqa: E731 - older pynvml returns bytes
        return text(uuid), int(pynvml.nvmlDeviceGetMemoryInfo(handle).total), text(name)
    except Exception:  # noqa: BLE001 - no NVML, no such device: claims of the whole device only
        return None, None, None


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in key)

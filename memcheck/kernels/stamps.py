"""Per-program time stamps in the decode kernels: a diagnostic, off unless a launch passes a buffer (config
"stamps": an int64 tensor of [programs, SLOTS]). Each program writes the GPU's global timer (ns) at SLOTS points of its
life, so benchmarks/decode_timeline.py can split a kernel's time into the launch's spread, each program's start-up,
its tiles, and the wait for the last program: the time a long sequence's decode spends apart from its bytes
(~1.13x of the floor plus ~9-13 us a layer at one sequence).
Off, the kernels compile as without it (a constexpr; the pointer goes unused).
"""
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import globaltimer, smid

SLOTS = 7
# started; past griddepcontrol.wait (where the kernel waits on the one before it, else as started); its range known,
# its first loads next; its last output or partial stored; where a kernel stamps them (mla_narrow), its first tile's
# data arrived and that tile's products done (0 elsewhere: how long a program's first request takes against its
# arithmetic); then not a time: the multiprocessor it ran on (%smid), so a slow program's place can be told from its
# work (a tail of some programs against others with as many tiles)
NAMES = ("started", "waited", "ranged", "done", "first_in", "first_done", "sm")
TIMES = 4  # the slots every stamping kernel writes
FIRST_IN, FIRST_DONE = 4, 5  # the optional ones
_SLOTS = tl.constexpr(SLOTS)  # a row's width, in the kernels


@triton.jit
def stamp(stamps_ptr, pid, SLOT: tl.constexpr):
    """Program pid's time at SLOT (one store, every thread the same value), with its multiprocessor at `done`."""
    tl.store(stamps_ptr + pid * _SLOTS + SLOT, globaltimer())
    if SLOT == 3:
        tl.store(stamps_ptr + pid * _SLOTS + _SLOTS - 1, smid().to(tl.int64))


def buffer(config: dict | None):
    """The stamps tensor a launch's config asks for (int64, [programs, SLOTS] at least), or None: off."""
    stamps = (config or {}).get("stamps")
    assert stamps is None or stamps.dtype == torch.int64, "config stamps: an int64 tensor of [programs, 4]"
    return stamps

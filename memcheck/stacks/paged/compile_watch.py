"""Triton kernels compiled inside the timed run. The warm-up is meant to take every one-time compile out of
time.wall, ttft and tpot; a kernel variant it did not cover (Triton specializes a kernel per constexpr and
per integer argument equal to 1 or divisible by 16) compiles on first use, inside the run: on a runner with a
cold Triton cache that is a compile of ~0.3-2 s, with a warm one a load from disk. Counted in-process, so
the count is the same either way; the seconds are what this process spent. With MEMCHECK_TRITON_COMPILES set to a
file, each compile's signature is appended there as a JSON line (argument types, the arguments Triton folded as
constants, e.g. an integer equal to 1, and its attributes: which arguments it took as divisible by 16)."""
from __future__ import annotations

import json
import os
import time
from collections import Counter

from ...errors import UsageError

LOG_ENV = "MEMCHECK_TRITON_COMPILES"


class CompileWatch:
    """with CompileWatch() as watch: ... ; watch.note() says what compiled in between (None if nothing)."""

    def __init__(self):
        self.kernels: Counter[str] = Counter()
        self.seconds = 0.0
        self._started: float | None = None
        self._knobs = None
        self._log = None

    def __enter__(self) -> CompileWatch:
        path = os.environ.get(LOG_ENV)
        if path:  # opened here: a path that cannot be written is the user's one-line error, not a failed compile
            try:
                self._log = open(path, "a")
            except OSError as e:
                raise UsageError(f"cannot append to it: {e.strerror}", path=path, field=LOG_ENV) from None
        try:
            from triton import knobs
        except ImportError:  # no Triton (a CPU runner without the kernels extra): nothing compiles
            return self
        self._knobs = knobs.runtime
        self._previous = (self._knobs.jit_cache_hook, self._knobs.jit_post_compile_hook)
        self._knobs.jit_cache_hook, self._knobs.jit_post_compile_hook = self._before, self._after
        return self

    def __exit__(self, *exc) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._knobs is not None:
            self._knobs.jit_cache_hook, self._knobs.jit_post_compile_hook = self._previous
            self._knobs = None

    def _before(self, **kwargs) -> bool:
        self._started = time.perf_counter()
        previous = self._previous[0]
        return bool(previous(**kwargs)) if previous else False  # True would skip the compile

    def _after(self, **kwargs) -> None:
        if self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None
        self.kernels[kwargs["fn"].name] += 1
        if self._log is not None:
            spec = kwargs.get("compile", {})
            self._log.write(json.dumps({"kernel": kwargs["fn"].name, "signature": repr(spec.get("signature")),
                                        "constants": repr(spec.get("constants")), "attrs": repr(spec.get("configs"))})
                            + "\n")  # (repr: Triton keys some of these by tuples)
            self._log.flush()
        if self._previous[1]:
            self._previous[1](**kwargs)

    def note(self) -> str | None:
        if not self.kernels:
            return None
        which = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in self.kernels.most_common())
        return (f"Triton compiled {sum(self.kernels.values())} kernel variants inside the timed run "
                f"({self.seconds:.2f} s, counted in time.wall/ttft/tpot; the warm-up missed them): {which}")

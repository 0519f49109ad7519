"""Tests of the benchmark scripts (benchmarks/) and the kernel tools (scripts/): their arithmetic, tables and dry runs
on the CPU; what they measure on a GPU is theirs to print, never asserted here.

This folder is collected before tests/kernels, and its scripts import triton: triton is imported here first as
tests/kernels/conftest.py would (under TRITON_INTERPRET=1, its own library interpreted), then the variable is put back,
so the kernel tests still find triton interpretable."""
import os

_before = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"
try:
    import triton  # noqa: F401
except ImportError:  # the tests that need it skip
    pass
finally:
    if _before is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = _before

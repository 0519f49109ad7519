"""Tests of the benchmark scripts (benchmarks/) and the kernel tools (scripts/): their arithmetic, tables and dry runs
on the CPU; what they measure on a GPU is theirs to print, never asserted here.

This folder is collected before tests/kernels, and its scripts import triton and the kernels: they are imported here
first as tests/kernels/conftest.py imports them (under TRITON_INTERPRET=1: triton's own library and Gluon's
interpretable, the kernels defined for the interpreter), then the variable is put back."""
import importlib
import os

_before = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"
try:
    import triton  # noqa: F401
except ImportError:  # the tests that need it skip
    pass
else:
    for name in ("mla", "mla_mha", "prefill"):  # with decode, work_split and the Gluon kernels they import
        importlib.import_module(f"memcheck.kernels.{name}")
finally:
    if _before is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = _before

"""The kernel tests run the Triton kernels on the CPU under Triton's interpreter.

triton.jit reads TRITON_INTERPRET when a kernel is defined, so it is set before the kernel modules
are imported (or they are reloaded if something imported them first). It is then put back as it
was, so tests outside this folder keep the torch reference on CPU tensors; tests here get it
again through an autouse fixture (kernels' public entry points read it at call time).

Triton's own library (tl.cdiv...) is interpreted only if triton is first imported here: nothing collected before
this folder may import it. tests/releases, whose config.json workloads import transformers' config classes (and
through torch._dynamo, triton), is named to be collected after it."""
import importlib
import os
import sys

import pytest

KERNEL_MODULES = tuple(f"memcheck.kernels.{name}" for name in (
    "dot", "work_split", "cache_write", "decode", "prefill", "mla", "mla_mha", "router", "moe", "norm", "rotary",
    "activation", "skinny_gemm"))

_before = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"
try:
    import triton  # noqa: F401
except ImportError:  # the kernel tests skip
    HAVE_TRITON = False
else:
    HAVE_TRITON = True
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(triton.language.cdiv, InterpretedFunction):  # say why, not 200 kernel failures
        raise RuntimeError("tests/kernels: triton was imported before this conftest set TRITON_INTERPRET (by a module "
                           "collected earlier), so its own tl.cdiv is compiled-mode and no kernel can be interpreted")
    for name in KERNEL_MODULES:
        if name in sys.modules:
            importlib.reload(sys.modules[name])
        else:
            importlib.import_module(name)
finally:
    if _before is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = _before


@pytest.fixture(autouse=True)
def triton_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


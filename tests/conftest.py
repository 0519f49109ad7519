import os

import pytest

# Nothing in the test suite may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Triton defines its own library (tl.cdiv, tl.maximum...) interpreted or compiled at its first import, whoever
# imports it: torch._dynamo does when transformers loads a config class, which collecting a workload with a
# config.json does before tests/kernels is reached. Imported first under the interpreter, the kernel tests
# (TRITON_INTERPRET=1, tests/kernels/conftest.py) never meet a compiled tl.cdiv; no test compiles a kernel in
# this process (the sm_90 compile tests run in their own), and elsewhere TRITON_INTERPRET stays unset.
_interpret = os.environ.get("TRITON_INTERPRET")
os.environ["TRITON_INTERPRET"] = "1"
try:
    import triton.language  # noqa: F401
except ImportError:  # the kernel tests skip
    pass
finally:
    if _interpret is None:
        del os.environ["TRITON_INTERPRET"]
    else:
        os.environ["TRITON_INTERPRET"] = _interpret

pytest_plugins = ["pytester"]


@pytest.fixture
def pytester(pytester, monkeypatch):
    """pytester, whose pytest runs are sessions of their own wherever this one runs.

    - Not xdist workers when this session runs under `-n`: a worker's PYTEST_XDIST_* variables would make
      pytest-benchmark switch itself off and memcheck mark every time metric as measured under contention.
    - Without hypothesis's plugin: no run under test uses hypothesis, and its plugin imports all of hypothesis at
      the end of every session (1.5-2.5 s of each of the ~45 runs here).
    """
    for name in [n for n in os.environ if n.startswith("PYTEST_XDIST_")]:
        monkeypatch.delenv(name)
    addopts = os.environ.get("PYTEST_ADDOPTS", "")
    monkeypatch.setenv("PYTEST_ADDOPTS", f"{addopts} -p no:hypothesispytest".strip())
    return pytester

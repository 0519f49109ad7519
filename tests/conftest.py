import os

import pytest

# Nothing in the test suite may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

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

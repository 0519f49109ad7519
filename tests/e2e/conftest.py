"""End-to-end fixtures: a throwaway project with a real tiny workload and a real stack plugin.

The `toy` stack is installed the way pip installs any plugin (a dist-info folder with an
entry_points.txt on the path), and is the stock hf stack plus one real knob: TOY_EXTRA_MIB keeps
that many extra MiB of tensors alive during the run - the kind of change a regression is.
"""
import os
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # this checkout: the runs under test import its harness, not an install

TOY_STACK = '''
import os, signal
import torch
from memcheck.stacks.hf import HFStack


class ToyStack(HFStack):
    name = "toy"

    def run(self, probe):
        if self.workload.name.startswith("crash"):
            os.kill(os.getpid(), signal.SIGSEGV)
        if self.workload.name.startswith("oom"):
            torch.empty(1 << 50, dtype=torch.uint8)
        extra = int(os.environ.get("TOY_EXTRA_MIB", "0"))
        held = torch.ones(extra * 2**18) if extra else None
        result = super().run(probe)
        del held
        return result
'''

WORKLOAD = """\
name: {name}
model:
  preset: r1-distill-qwen-7b
  layers: 1
  hidden_size: 64
  intermediate_size: 128
  num_attention_heads: 2
  num_key_value_heads: 1
  vocab_size: 128
requests:
  - count: 2
    prompt_tokens: 8
    max_new_tokens: 4
stacks: [{stacks}]
"""


def workload(name="tiny", stacks="toy") -> str:
    return WORKLOAD.format(name=name, stacks=stacks)


def install_stack(pytester, monkeypatch, name: str, source: str, entry: str) -> None:
    """A stack plugin installed as pip installs one: module `{name}stack`, entry point `name = {entry}`."""
    site = pytester.mkdir("site")
    (site / f"{name}stack.py").write_text(source)
    info = site / f"{name}stack-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}stack\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[memcheck.stacks]\n{name} = {name}stack:{entry}\n")
    # The checkout after the plugin site: the pytest subprocess must run this checkout's harness, not
    # whichever one the venv has installed editable.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(ROOT)]))


@pytest.fixture
def project(pytester, monkeypatch):
    install_stack(pytester, monkeypatch, "toy", TOY_STACK, "ToyStack")
    monkeypatch.delenv("TOY_EXTRA_MIB", raising=False)
    pytester.makefile(".toml", pyproject="[tool.memcheck]\n")
    (pytester.mkdir("suites") / "tiny.yaml").write_text(workload())
    return pytester


def run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def dedent(text: str) -> str:
    return textwrap.dedent(text)

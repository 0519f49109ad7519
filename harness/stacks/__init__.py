"""Stack registry: built-in stacks plus any installed under the entry-point group `memcheck.stacks`."""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from ..errors import StackUnavailable
from .base import RunResult, Stack

GROUP = "memcheck.stacks"
# Built-ins resolve from the source tree too (running from a checkout that is not installed).
BUILTIN = {"hf": "harness.stacks.hf:HFStack", "paged": "harness.stacks.paged:PagedStack",
           "vllm": "harness.stacks.vllm:VLLMStack"}

__all__ = ["RunResult", "Stack", "StackUnavailable", "names", "load"]


def _targets() -> dict[str, str]:
    targets = dict(BUILTIN)
    for ep in entry_points(group=GROUP):
        targets[ep.name] = ep.value
    return targets


def names() -> set[str]:
    return set(_targets())


def load(name: str) -> type[Stack]:
    module, _, attr = _targets()[name].partition(":")
    return getattr(importlib.import_module(module), attr)

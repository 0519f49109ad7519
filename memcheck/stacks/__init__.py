"""Stack registry: built-in stacks plus any installed under the entry-point group `memcheck.stacks`.

A workload's `stacks:` entry is a stack name, or `NAME:ATTENTION` for a stack that runs several attention
implementations (`hf:flash_attention_2`): one item each, with its own id and its own baseline.
"""
from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from ..errors import StackUnavailable, UsageError
from .base import RunResult, Stack

GROUP = "memcheck.stacks"
# The built-in stacks: listed here only (not as entry points), so they resolve from a checkout that is not
# installed as well. An installed plugin of the same name replaces one.
BUILTIN = {"hf": "memcheck.stacks.hf:HFStack", "paged": "memcheck.stacks.paged:PagedStack",
           "vllm": "memcheck.stacks.vllm:VLLMStack"}

__all__ = ["RunResult", "Stack", "StackUnavailable", "names", "load", "split"]
SEPARATOR = ":"


def _targets() -> dict[str, str]:
    targets = dict(BUILTIN)
    for ep in entry_points(group=GROUP):
        targets[ep.name] = ep.value
    return targets


def names() -> set[str]:
    return set(_targets())


def split(entry: str) -> tuple[str, str | None]:
    """`hf:flash_attention_2` -> ("hf", "flash_attention_2"); `hf` -> ("hf", None)."""
    name, _, attention = entry.partition(SEPARATOR)
    return name, attention or None


def load(entry: str) -> type[Stack]:
    """The stack class of a `stacks:` entry (its attention variant, if any, is the item's, not the class's)."""
    target = _targets()[split(entry)[0]]
    module, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, Stack)):
        raise UsageError(f"the stack {split(entry)[0]!r} ({target}, entry-point group {GROUP}) is not a subclass "
                         "of memcheck.stacks.Stack")
    return cls

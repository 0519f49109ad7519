"""Errors that are the user's mistake: shown as one line naming the file, line and field."""
from __future__ import annotations


class UsageError(Exception):
    """A user's mistake (bad workload, bad option, corrupt baseline). Rendered without a traceback."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None, field: str | None = None):
        self.message, self.path, self.line, self.field = message, path, line, field
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.path:
            where = f"{self.path}:{self.line}: " if self.line else f"{self.path}: "
        field = f"{self.field}: " if self.field else ""
        return f"{where}{field}{self.message}"


class StackUnavailable(Exception):
    """The stack cannot run on this runner (not installed, needs a GPU). The item is skipped with this reason."""

    software_changed = False


class SoftwareUnsupported(StackUnavailable):
    """The installed software does not implement what the item runs (a transformers release without the model's
    SDPA path, a vLLM without its architecture): skipped only while the item has no baseline; with one, the
    software it ran under did run it, so the item fails (a skip never hides a bump)."""

    software_changed = True

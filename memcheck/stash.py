"""Where a `pytest --memcheck` run keeps its state in pytest's config: the plugin puts it there, the fixture reads
it (a module of its own, so neither imports the other to find it)."""
import pytest

SESSION = pytest.StashKey["MemcheckSession"]()

"""memcheck: catch memory regressions in LLM inference before they merge."""

__version__ = "0.1.0"  # pyproject.toml reads it: one version, whether installed or run from a checkout

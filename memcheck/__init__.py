"""memcheck: catch memory regressions in LLM inference before they merge."""

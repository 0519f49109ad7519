"""`memcheck bisect`: from a regressed item to the release or commit that brought it.

The candidates between a good and a bad point (package releases from the index, or the commits of a range) are
probed by running only that item, each in an environment or worktree of its own, and judged against the good
point's run as `memcheck compare` judges; a binary search finds the first whose verdict is `regressed`.
"""

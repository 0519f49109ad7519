"""The commits of a range in the user's repository, and a worktree per probed commit."""
from __future__ import annotations

import subprocess
from pathlib import Path

from ..errors import UsageError


def _git(*args: str, cwd: str = ".") -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise UsageError(f"git {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout.strip()


def commits_between(spec: str, cwd: str = ".") -> list[str]:
    """GOOD..BAD as short commit ids: GOOD, then the first-parent commits after it up to BAD (a merge request's
    merges count as one step each, as its history reads)."""
    good, sep, bad = spec.partition("..")
    if not sep or not good or not bad:
        raise UsageError(f"--git takes GOOD..BAD, not {spec!r}")
    good, bad = _git("rev-parse", "--short", good, cwd=cwd), _git("rev-parse", "--short", bad, cwd=cwd)
    if subprocess.run(["git", "merge-base", "--is-ancestor", good, bad], cwd=cwd).returncode:
        raise UsageError(f"{good} is not an ancestor of {bad}")
    inside = _git("rev-list", "--first-parent", "--reverse", "--abbrev-commit", f"{good}..{bad}", cwd=cwd)
    return [good, *inside.split()]


def worktree(commit: str, cache: Path, cwd: str = ".") -> Path:
    """A detached worktree of the commit (kept for later probes of the same commit)."""
    path = cache / f"wt-{commit}"
    if not (path / ".git").exists():
        _git("worktree", "add", "--detach", "--force", str(path.resolve()), commit, cwd=cwd)
    return path


def repository_root(cwd: str = ".") -> Path:
    return Path(_git("rev-parse", "--show-toplevel", cwd=cwd))


def subject(commit: str, cwd: str = ".") -> str:
    return _git("log", "-1", "--format=%s", commit, cwd=cwd)

"""The releases of a package between two versions, as the package index this environment installs from lists them."""
from __future__ import annotations

import re
import subprocess
import sys

from packaging.version import InvalidVersion, Version

from ..errors import UsageError


def index_versions(name: str) -> list[str]:
    """Every version the index offers (pip's own index settings: PIP_INDEX_URL, pip.conf, extra indexes)."""
    done = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name], capture_output=True, text=True)
    found = re.search(r"^Available versions: (.*)$", done.stdout, re.M)
    if done.returncode or not found:
        why = (done.stderr.strip().splitlines() or ["no versions listed"])[-1]
        raise UsageError(f"cannot list the releases of {name} from the package index: {why}")
    return [v.strip() for v in found.group(1).split(",") if v.strip()]


def between(versions: list[str], good: str, bad: str) -> list[str]:
    """good, the releases after it up to bad, and bad, in version order. Pre-releases only where an end is one."""
    try:
        lo, hi = Version(good), Version(bad)
    except InvalidVersion as e:
        raise UsageError(f"not a version: {e}") from None
    if not lo < hi:
        raise UsageError(f"--good {good} is not older than --bad {bad}")
    pre = lo.is_prerelease or hi.is_prerelease
    inside = []
    for v in versions:
        try:
            parsed = Version(v)
        except InvalidVersion:
            continue
        if lo < parsed < hi and (pre or not parsed.is_prerelease):
            inside.append(parsed)
    return [good, *(str(v) for v in sorted(set(inside))), bad]

"""`memcheck check [PATHS]`: every workload file through the loader, under every profile it names, without
running anything: what pytest would refuse at collection, for pre-commit and editors. One line per error,
`file:line: field: message`; exit 1 when any."""
from __future__ import annotations

import os
from pathlib import Path

from . import project, stacks, yamlfile
from .errors import UsageError
from .workload import load_file


def workload_files(paths: list[str]) -> list[str]:
    files = []
    for path in paths:
        if os.path.isdir(path):
            files += sorted(str(p) for p in Path(path).rglob("*.y*ml") if not p.name.startswith("."))
        else:
            files.append(path)
    return files


def entries(data) -> list:
    """A workload file's entries as written: the file itself, or its `defaults:` and each of its `workloads:`."""
    if not isinstance(data, dict) or "workloads" not in data:
        return [data]
    workloads = data.get("workloads")
    return [data.get("defaults") or {}, *(workloads if isinstance(workloads, list) else [])]


def profiles_named(path: str) -> list[str]:
    """The profiles a file's workloads (or its defaults) override, each checked as `--memcheck-profile` would."""
    names = set()
    for entry in entries(yamlfile.load(path).data):
        if isinstance(entry, dict) and isinstance(entry.get("profiles"), dict):
            names |= set(entry["profiles"])
    return sorted(names)


def check(paths: list[str]) -> tuple[list[str], int]:
    """The errors of every file (the loader stops at a file's first), and the count of workloads in the files
    that loaded under every profile."""
    try:
        config = project.load(os.getcwd())
    except UsageError as e:
        return [str(e)], 0
    files = workload_files(paths or config.suites)
    if not files:
        return [f"no workload files (*.yaml) in {', '.join(paths or config.suites)}"], 0
    errors, loaded = [], 0
    for path in files:
        profile = None
        try:
            workloads = load_file(path, None, stacks.names(), config.thresholds)
            for profile in profiles_named(path):
                load_file(path, profile, stacks.names(), config.thresholds)
            loaded += len(workloads)
        except UsageError as e:
            errors.append(str(e) + (f" (under profile {profile!r})" if profile else ""))
        except OSError as e:
            errors.append(f"{path}: cannot read ({e.strerror or e})")
    return errors, loaded

"""`memcheck compare BEFORE.json AFTER.json`: judge one run's items against another run's, no baselines.

How a developer checks a dependency bump or bisects locally: run, change a version, run, compare. Each
AFTER item is judged against the BEFORE item of the same id and device class by the very rules of a
baseline comparison (verdict.judge): physical fields that differ make it incomparable, software versions
are compared across and named.

The rules are AFTER's: the rules the AFTER run judged its items by, stored in its report. A report
written before reports carried rules is judged by the rules resolved as that run resolved them: its
workload file (the path in the report) under its profile, over the project's [tool.memcheck] defaults
read from the current directory. Fields the project makes strict (strict_environment) are read there too.
"""
from __future__ import annotations

from pathlib import Path

from . import project as project_config
from .baselines import Baseline
from .errors import UsageError
from .reports.report import Report
from .verdict import ItemResult, judge


def compare(before: Report, after: Report, before_path: str, project=None) -> Report:
    project = project or project_config.load(".")
    earlier = {_key(r): r for r in before.items}
    items = []
    for item in after.items:
        m = item.measurement
        prior = earlier.get(_key(item))
        try:
            rule_set = item.rule_set or _workload_rules(item, project)
        except UsageError as e:
            items.append(ItemResult(m, "error", f"cannot tell the rules it was judged by: {e}"))
            continue
        baseline = None
        if prior is not None and not (prior.measurement.error or prior.measurement.skipped):
            pm = prior.measurement
            baseline = Baseline(Path(before_path), pm.metrics, pm.environment, before.created, pm.rounds)
        result = judge(m, rule_set, baseline, strict_environment=project.strict_environment)
        if result.verdict == "new":
            result.reason = f"not measured in {before_path}" + (f" ({prior.verdict})" if prior else "")
        items.append(result)
    return Report(items=items, profile=after.profile)


def _key(item: ItemResult) -> tuple[str, str]:
    return item.measurement.environment.get("device_class") or "", item.id


def _workload_rules(item: ItemResult, project) -> dict:
    """The rules a report without them was judged by, resolved from its workload file as the run did."""
    from . import stacks
    from .workload import load_file

    m = item.measurement
    if not m.file.endswith((".yaml", ".yml")):
        raise UsageError(f"the report holds no rules and {m.file or 'its source'} is not a workload file: "
                         "run both sides with this memcheck version")
    if not Path(m.file).is_file():
        raise UsageError("the report holds no rules and its workload file is not here", m.file)
    for workload in load_file(m.file, m.profile, set(stacks.names()) | {m.stack}, project.thresholds):
        if workload.name == m.workload:
            return workload.thresholds
    raise UsageError(f"no workload named {m.workload!r} in it any more", m.file)

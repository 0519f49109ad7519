"""The pytest plugin: hooks and the session object only. Measuring, judging and reporting live elsewhere."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from . import config as project_config
from . import options, stacks
from .errors import UsageError
from .fixture import memcheck, pytest_runtest_call  # noqa: F401 - registered through this plugin module
from .reports import Report
from .reports import terminal
from .runner import Settings, run_item
from .workload import load_file

STASH = pytest.StashKey["MemcheckSession"]()


def pytest_addoption(parser):
    options.register(parser)


def pytest_configure(config):
    config.addinivalue_line("markers", "memcheck(name=None, thresholds=None): measure this test's memory with "
                                       "memcheck's collectors and gate it against its baseline")
    if not config.getoption("memcheck"):
        return
    session = MemcheckSession(config)
    config.stash[STASH] = session
    config.pluginmanager.register(session, "memcheck-session")


def default_profile() -> str:
    import torch

    return "full" if torch.cuda.is_available() else "ci"


class MemcheckSession:
    """State of one `pytest --memcheck` session: settings, collected workloads, results."""

    def __init__(self, config):
        self.config = config
        root = str(config.rootpath)
        try:
            self.project = project_config.load(root)
        except UsageError as e:
            raise pytest.UsageError(str(e)) from None
        opt = config.getoption
        device = opt("memcheck_device")
        profile = opt("memcheck_profile") or (("ci" if device == "cpu" else default_profile()))
        baselines = opt("memcheck_baselines") or os.path.join(root, self.project.baselines)
        self.settings = Settings(
            baselines=baselines, profile=profile, device=device, update_baselines=opt("memcheck_update_baselines"),
            strict=opt("memcheck_strict"), rootdir=root, python_heap=not opt("memcheck_no_host_heap"),
            sample_period_ms=opt("memcheck_sample_period"), timeout_s=opt("memcheck_timeout"),
        )
        self.report = Report(profile=profile)
        self.errors: list[str] = []
        if config.args_source != pytest.Config.ArgsSource.ARGS:
            # A bare `pytest --memcheck` runs the suites, not the project's tests.
            config.args = [os.path.join(root, p) for p in self.project.suites]

    @pytest.hookimpl
    def pytest_collect_file(self, file_path: Path, parent):
        if file_path.suffix in (".yaml", ".yml") and not file_path.name.startswith("."):
            return WorkloadFile.from_parent(parent, path=file_path)
        return None

    @pytest.hookimpl
    def pytest_collection_finish(self, session):
        if self.errors:  # a user's mistake: one line each, pytest's usage-error exit code, no traceback
            raise pytest.UsageError("\n".join(self.errors))

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter):
        if not self.report.items:
            return
        terminalreporter.section("memcheck")
        for line in terminal.table(self.report):
            terminalreporter.write_line(line)

    @pytest.hookimpl
    def pytest_sessionfinish(self, session):
        opt = self.config.getoption
        if opt("memcheck_report"):
            self.report.write_json(opt("memcheck_report"))
        if opt("memcheck_markdown"):
            from .reports.markdown import render

            Path(opt("memcheck_markdown")).write_text(render(self.report))


class WorkloadFile(pytest.File):
    def collect(self):
        mc: MemcheckSession = self.config.stash[STASH]
        try:
            workloads = load_file(str(self.path), mc.settings.profile, stacks.names(), mc.project.thresholds)
        except UsageError as e:
            mc.errors.append(str(e))
            return
        for wl in workloads:
            for stack in wl.stacks:
                yield WorkloadItem.from_parent(self, name=f"{wl.name}[{stack}]", workload=wl, stack=stack)


class WorkloadItem(pytest.Item):
    def __init__(self, *, workload, stack, **kwargs):
        super().__init__(**kwargs)
        self.workload, self.stack = workload, stack
        self.result = None

    def runtest(self):
        mc: MemcheckSession = self.config.stash[STASH]
        self.result = run_item(self.workload, self.stack, mc.settings)
        mc.report.items.append(self.result)
        for check in self.result.checks:
            self.user_properties.append((f"memcheck.{check.metric}", check.value))
        self.user_properties.append(("memcheck.verdict", self.result.verdict))
        if self.result.verdict == "skipped":
            pytest.skip(self.result.reason)
        if self.result.failed:
            raise MemcheckFailure(self.result)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, MemcheckFailure):
            r = excinfo.value.result
            return f"{r.id}: {r.verdict}: {r.reason}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, self.workload.line - 1, self.name


class MemcheckFailure(Exception):
    def __init__(self, result):
        super().__init__(result.reason)
        self.result = result

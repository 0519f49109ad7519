"""The pytest plugin: hooks and the session object only. Measuring, judging and reporting live elsewhere."""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

from . import environment
from . import project as project_config
from . import options, stacks
from .errors import UsageError
from .fixture import memcheck, pytest_runtest_call  # noqa: F401 - registered through this plugin module
from .reports import Report
from .reports import snapshot, terminal
from .runner import Settings, run_item
from .stash import SESSION
from .states import Verdict
from .workload import load_file

def pytest_addoption(parser):
    options.register(parser)


def pytest_configure(config):
    config.addinivalue_line("markers", "memcheck(name=None, thresholds=None): measure this test's memory with "
                                       "memcheck's collectors and gate it against its baseline")
    if not config.getoption("memcheck"):
        return
    pin_xdist_worker(os.environ)
    session = MemcheckSession(config)
    config.stash[SESSION] = session
    config.pluginmanager.register(session, "memcheck-session")


def default_profile() -> str:
    if environment.torch_is_cpu_only():  # no GPU can be available: spare this process torch's import
        return "ci"
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
        predict = opt("memcheck_predict")
        if predict is not None:  # (an empty name too: `--memcheck-predict "$GPU"` with GPU unset must not measure)
            from .predict.gpus import gpu

            try:
                gpu(predict)
            except UsageError as e:
                raise pytest.UsageError(f"--memcheck-predict: {e}") from None
        profile = opt("memcheck_profile") or ("full" if predict else "ci" if device == "cpu" else default_profile())
        baselines = opt("memcheck_baselines") or _relative(os.path.join(root, self.project.baselines))
        self.settings = Settings(
            baselines=baselines, profile=profile, device=device, update_baselines=opt("memcheck_update_baselines"),
            strict=opt("memcheck_strict"), rootdir=root, python_heap=not opt("memcheck_no_host_heap"),
            sample_period_ms=opt("memcheck_sample_period"), timeout_s=opt("memcheck_timeout"),
            strict_environment=self.project.strict_environment,
            fork_server=not opt("memcheck_no_fork_server"), parallel_items=parallel_items(os.environ),
            predict=predict,
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
        count = self.config.getoption("memcheck_durations")
        if count is not None:
            from .reports import durations

            terminalreporter.section("memcheck durations")
            for line in durations.table(self.report, count):
                terminalreporter.write_line(line)

    @pytest.hookimpl
    def pytest_sessionfinish(self, session):
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: the controller merges and writes the reports
            workeroutput["memcheck_report"] = json.dumps(self.report.to_json())
            return
        opt = self.config.getoption
        from .reports import exports

        writers = {"memcheck_report": self.report.write_json,
                   "memcheck_markdown": lambda p: exports.write(self.report, markdown=p),
                   "memcheck_html": lambda p: exports.write(self.report, html=p),
                   "memcheck_openmetrics": lambda p: exports.write(self.report, openmetrics_path=p),
                   "memcheck_benchmark_json": lambda p: exports.write(self.report, benchmark=p),
                   "memcheck_bencher": lambda p: exports.write(self.report, bencher_path=p)}
        for option, write in writers.items():
            if opt(option):
                _write_or_fall_back(write, opt(option))
        exports.write(self.report, step_summary=not opt("memcheck_no_step_summary"))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        """xdist controller: take in the results of a worker that finished."""
        data = getattr(node, "workeroutput", {}).get("memcheck_report")
        if data:
            self.report.items.extend(Report.from_json(json.loads(data)).items)

    def snapshot_dir(self) -> str:
        opt = self.config.getoption
        if opt("memcheck_snapshots"):
            return opt("memcheck_snapshots")
        if opt("memcheck_report"):
            return os.path.join(os.path.dirname(os.path.abspath(opt("memcheck_report"))), "memcheck-snapshots")
        return os.path.join(str(self.config.rootpath), ".memcheck", "snapshots")

    def save_snapshot(self, item: "WorkloadItem", result) -> None:
        """A regressed item on a CUDA runner: rerun it with allocator history on, link the pickle."""
        path, note = snapshot.capture(item.workload, item.stack, self.settings, self.snapshot_dir())
        result.measurement.notes.append(note)
        if path:
            report = self.config.getoption("memcheck_report")
            base = os.path.dirname(os.path.abspath(report)) if report else os.getcwd()
            result.measurement.artifacts["allocator_snapshot"] = os.path.relpath(path, base)


def pin_xdist_worker(env, device_count=None) -> str | None:
    """Under pytest-xdist, give worker gwN its own GPU: CUDA_VISIBLE_DEVICES for the measuring processes it
    starts (N modulo the GPUs visible). Returns the device it was pinned to, or None."""
    worker = env.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return None
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = [d.strip() for d in visible.split(",") if d.strip()]
    else:
        if device_count is None:
            import torch

            device_count = torch.cuda.device_count
        devices = [str(i) for i in range(device_count())]
    if not devices:
        return None
    env["CUDA_VISIBLE_DEVICES"] = devices[int(worker[2:]) % len(devices)]
    return env["CUDA_VISIBLE_DEVICES"]


def parallel_items(env) -> int:
    """How many items are measured at once: pytest-xdist's worker count under `-n N`, else 1."""
    count = env.get("PYTEST_XDIST_WORKER_COUNT", "1")
    return int(count) if count.isdigit() and int(count) > 0 else 1


def _relative(path) -> str:
    """Paths in messages and reports as the user typed them: relative to where pytest was started."""
    rel = os.path.relpath(path)
    return str(path) if rel.startswith("..") else rel


class WorkloadFile(pytest.File):
    def collect(self):
        mc: MemcheckSession = self.config.stash[SESSION]
        try:
            workloads = load_file(_relative(self.path), mc.settings.profile, stacks.names(), mc.project.thresholds)
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
        mc: MemcheckSession = self.config.stash[SESSION]
        self.result = run_item(self.workload, self.stack, mc.settings)
        if snapshot.wanted(self.result):
            mc.save_snapshot(self, self.result)
        mc.report.items.append(self.result)
        # JUnit properties: every measured metric (a null one has no number to chart; its reason is
        # in the JSON and Markdown reports).
        for name, metric in sorted(self.result.measurement.metrics.items()):
            if metric.value is not None:
                self.user_properties.append((f"memcheck.{name}", metric.value))
        self.user_properties.append(("memcheck.verdict", self.result.verdict.value))  # plain str: xdist sends it
        if self.result.compared_across:  # a dependency bump the verdict was reached across
            self.user_properties.append(("memcheck.compared_across", "; ".join(self.result.compared_across)))
        if self.result.verdict == Verdict.SKIPPED:
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


def _write_or_fall_back(write, path: str) -> None:
    """A report that cannot be written where asked (permissions, a full disk) is written to the temporary folder,
    and one line says where: the run's results are never lost silently."""
    try:
        write(path)
    except OSError as e:
        fallback = os.path.join(tempfile.gettempdir(), f"memcheck-{os.path.basename(path) or 'report'}")
        write(fallback)
        print(f"memcheck: cannot write {path} ({e.strerror or e}); written to {fallback} instead", file=sys.stderr)

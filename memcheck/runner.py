"""Run one item: a fresh worker process per round, then baseline lookup, rules and verdict.

The plugin and the console script both go through here, so `pytest --memcheck` and
`memcheck baseline refresh` measure the same way.
"""
from __future__ import annotations

import atexit
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from . import device_share, environment, forkserver, rank_workers, stacks
from .baselines import MENDING, BaselineStore
from .errors import StackUnavailable, UsageError
from .measurement import Measurement
from .metrics.collect import SWITCHED_OFF
from .metrics.value import MetricValue
from .states import ErrorKind, ItemError, Verdict
from .verdict import ItemResult, judge


@dataclass
class Settings:
    baselines: str = "baselines"
    profile: str | None = None
    device: str = "auto"
    update_baselines: bool = False
    strict: bool = False
    rootdir: str = "."
    python_heap: bool = True
    cpu_tensors: bool = True
    sample_period_ms: float = 10.0
    timeout_s: float | None = None
    strict_environment: tuple[str, ...] = ()  # [tool.memcheck] software fields that make a baseline incomparable
    fork_server: bool = True  # fork each round from a server that imported torch once (forkserver.py)
    parallel_items: int = 1  # items measured at once (pytest-xdist -n): time metrics are then under contention
    predict: str | None = None  # predict for this GPU on the CPU (memcheck/predict/) instead of measuring


FORK_ENV = "MEMCHECK_FORK_SERVER"  # "0": a fresh interpreter per round, as --memcheck-no-fork-server
CONTENDED = ("time.wall", "tokens_per_s", "ttft", "tpot")


def measure_item(workload, stack: str, settings: Settings) -> Measurement:
    missing = _attention_missing(workload, stack, settings.device)
    if missing:  # skipped before any worker starts: a worker costs seconds of imports, on every CPU CI run
        m = Measurement.of_item(workload, stack)
        m.skip(missing)
        if missing.software_changed:  # judged against its baseline: the fingerprint names what changed
            m.environment = environment.of_item(_device_type(settings.device), workload.profile, m.digest)
        return m
    ledger = _device_ledger(settings.device)
    if ledger is not None and not _runs_on_gpu(workload, stack, settings.rootdir):  # skipped by its worker in a second
        return _measure_rounds(workload, stack, settings)
    if ledger is None:  # the CPU: items at once (-n) share its cores
        m = _measure_rounds(workload, stack, settings)
        if settings.parallel_items > 1:
            _mark_contended(m, f"{settings.parallel_items} items measured at once (-n {settings.parallel_items})")
        return m
    server_s = _start_fork_server_unclaimed(workload, stack, settings)
    claim, alone_because, length = _claim(ledger, workload, stack, settings)
    m, held = _measure_holding(ledger, workload, stack, settings, claim, length)
    if server_s:  # its worker's startup, paid before the claim
        m.phases["startup"] = round(m.phases.get("startup", 0.0) + server_s, 3)
        m.notes.append(f"this process's fork server started before the item claimed the GPU ({server_s:.1f} s of "
                       "imports, in the startup phase, not in its GPU seconds)")
    first = held
    squeezed = _squeezed(m) if held.most_at_once > 1 else None
    if squeezed:
        m, held = _measure_holding(ledger, workload, stack, settings, None, length)
        m.notes.append(f"{squeezed} beside {first.most_at_once - 1} other items: measured again alone")
        alone_because = "measured again alone after device memory ran short beside others"
    holds = [first] if held is first else [first, held]  # a second hold: measured again alone
    m.phases["gpu_wait"] = round(sum(h.waited for h in holds), 3)
    m.gpu_seconds = round(sum(h.gpu_seconds for h in holds), 3)
    m.gpu_held_seconds = round(sum(h.held_seconds for h in holds), 3)
    if held.most_at_once > 1:
        m.notes.append(held.describe())
        _mark_contended(m, f"{held.most_at_once} items on the GPU at once (-n {settings.parallel_items})")
    elif settings.parallel_items > 1:
        m.notes.append(f"{held.describe()}: {alone_because or 'no other item ran beside it'}")
    return m


def _squeezed(m: Measurement) -> str | None:
    """Why an item measured beside others must be measured again alone, or None: it ran out of device memory, or
    its allocator found none free and emptied its cache to retry (its reserved and fragmentation numbers then
    depend on what the other items held, and the retries are themselves judged)."""
    if m.error and m.error.kind is ErrorKind.OOM:
        return f"ran out of device memory ({m.error.message[:300]})"
    retries = m.metrics.get("gpu.alloc_retries")
    if retries is not None and retries.value:
        return f"its allocator emptied its cache and retried {retries.value:g} times (cudaMalloc failed)"
    return None


def _start_fork_server_unclaimed(workload, stack: str, s: Settings) -> float:
    """Start the fork server its rounds will fork from, if none runs yet, before the item claims the GPU: the
    server imports torch and transformers (10-16 s on an H200 runner) and touches no device, while a claim held
    meanwhile (its baseline's device peak) keeps other items off the GPU. The seconds it took, or 0."""
    python = _python(stack, s.rootdir)
    if _fork_refused(python, s) is not None or python in _SERVERS:
        return 0.0
    t0 = time.perf_counter()
    try:
        _fork_server(python, _worker_env(), s.rootdir)
    except forkserver.Unavailable as e:  # its rounds start fresh interpreters, and their notes say why
        _FORK_REFUSED[python] = str(e)
    return round(time.perf_counter() - t0, 3)


def _measure_holding(ledger, workload, stack: str, settings: Settings, claim: int | None, length: float = 0.0):
    """The item's rounds while it holds the GPU (device_share.py): a claim of bytes lets other items run beside
    it, whose memory NVML must then not count (the workers' --device-shared); length: its expected run, the
    longest waiting item admitted first."""
    with ledger.hold(f"{workload.name}[{stack}]", claim, length) as held:
        m = _measure_rounds(workload, stack, settings, shared=claim is not None)
    return m, held


def _measure_rounds(workload, stack: str, settings: Settings, shared: bool = False) -> Measurement:
    if settings.predict:  # one round: a prediction repeats to the byte and has no time or host memory to judge
        return _measure_in_worker(workload, stack, settings)
    rounds = [_measure_in_worker(workload, stack, settings, shared=shared) for _ in range(workload.rounds)]
    first = rounds[0]
    failed = next((r for r in rounds if r.error or r.skipped), None)
    if not failed and len(rounds) > 1:
        first.metrics = {name: MetricValue.from_rounds([r.metrics.get(name, MetricValue(None)) for r in rounds])
                         for name in first.metrics}
        first.rounds = len(rounds)
        first.phases = {k: round(sum(r.phases.get(k, 0.0) for r in rounds), 3) for k in first.phases}
    if not failed and _left_to_memory_round(first, settings):
        t0 = time.perf_counter()
        memory_round(workload, stack, settings, first, shared)
        first.phases["memory_round"] = round(time.perf_counter() - t0, 3)  # a whole round of its own
    return failed or first


def _claim(ledger, workload, stack: str, settings: Settings) -> tuple[int | None, str, float]:
    """The device memory the item claims (None: the whole GPU), from its baseline's gpu.device_used.peak; why it
    claims the whole GPU; and how long it is expected to run, its baseline's time.wall (0 without one), by which
    the ledger admits the longest waiting item first."""
    peak, length = None, 0.0
    if settings.parallel_items > 1 and ledger.device_class:
        try:
            baseline = BaselineStore(settings.baselines).load(ledger.device_class, workload.name, stack)
        except UsageError:  # a corrupt baseline: the item's verdict says so; here it only runs alone
            baseline = None
        if baseline:
            peak = (baseline.metrics.get("gpu.device_used.peak") or MetricValue(None)).value
            length = (baseline.metrics.get("time.wall") or MetricValue(None)).value or 0.0
    try:
        stack_cls = stacks.load(stack)
    except Exception:  # noqa: BLE001 - a stack that cannot load says why from inside its worker, alone
        return None, "its stack does not load here", length
    return (*device_share.claim(workload, stack_cls, peak, settings.rootdir, settings.parallel_items), length)


def _runs_on_gpu(workload, stack: str, rootdir: str) -> bool:
    """False for an item its worker will skip at once: its stack is not installed here, or it needs more GPUs than
    are visible. Such an item holds no GPU (a whole-device claim would make every other item wait for it)."""
    import torch

    try:
        installed = stacks.load(stack).installed(rootdir)
    except Exception:  # noqa: BLE001 - a stack that cannot load says why from inside its worker
        return False
    return installed and workload.tensor_parallel <= max(1, torch.cuda.device_count())


_LEDGERS: dict[tuple[str, int], device_share.Ledger] = {}


def _device_ledger(device: str) -> device_share.Ledger | None:
    """The ledger of the GPU this runner's items run on, or None on the CPU."""
    kind = _device_type(device)
    if kind.type != "cuda":
        return None
    key = (os.environ.get("CUDA_VISIBLE_DEVICES", ""), kind.index or 0)
    if key not in _LEDGERS:
        _LEDGERS[key] = device_share.ledger(*key)
    return _LEDGERS[key]


def _mark_contended(m: Measurement, at_once: str) -> None:
    why = f"measured under contention: {at_once}"
    for name in CONTENDED:
        v = m.metrics.get(name)
        if v is not None and v.value is not None:
            v.detail = f"{v.detail}; {why}" if v.detail else why
    m.notes.append(f"time metrics {why}; memory metrics are per process")


def _device_type(device: str):
    """The torch.device an item runs on, by type only: no CUDA context is made in this process."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def _attention_missing(workload, stack: str, device: str) -> StackUnavailable | None:
    """Why the item's pinned attention cannot run here (flash-attn not installed, not implemented by the installed
    transformers...), or None."""
    attention = stacks.split(stack)[1]
    if attention is None:
        return None
    try:
        stacks.load(stack).check_attention(attention, workload, _device_type(device))
    except StackUnavailable as e:
        return e
    except Exception:  # noqa: BLE001 - anything else is the worker's to report, as the item's error
        return None
    return None


# Measured in the memory round, not in the timed rounds.
MEMORY_ROUND = ("host.heap_alloc.peak", "cpu.heap_alloc.peak")


def _left_to_memory_round(timed: Measurement, s: Settings) -> list[str]:
    """The memory-round metrics asked for that the timed round switched off (on a GPU, cpu.heap_alloc.peak is
    not measured at all; hf traces the host heap through its warm-up there, so the timed round has it)."""
    wanted = [n for n, on in zip(MEMORY_ROUND, (s.python_heap, s.cpu_tensors)) if on]
    return [n for n in wanted if n not in timed.metrics or timed.metrics[n].reason == SWITCHED_OFF[n]]


def memory_round(workload, stack: str, settings: Settings, timed: Measurement, shared: bool = False) -> None:
    """host.heap_alloc.peak and cpu.heap_alloc.peak from a round of their own, into the timed measurement (and
    its ranks, for a tensor-parallel item): tracemalloc traces every Python allocation (the paged stack decoded
    3x slower under it on an H200) and the CPU allocator's memory events cost 5-12% of an allocation-heavy CPU
    run, so the timed rounds run without either and this round, the same workload in a fresh worker, runs with
    them (neither moves the other's bytes)."""
    wanted = _left_to_memory_round(timed, settings)
    m = _measure_in_worker(workload, stack, settings, memory_round=True, shared=shared)
    if m.error or m.skipped:
        why = f"the memory round failed: {m.error.message if m.error else m.skipped}"[:500]
        timed.metrics.update({name: MetricValue.null(why) for name in wanted})
        return
    for name in wanted:
        value = m.metrics[name]
        if value.value is not None:
            value.detail = f"{value.detail}, in a memory round of its own (the timed rounds run without it)"
        timed.metrics[name] = value
    ranks = {r["rank"]: r["metrics"] for r in m.ranks}
    for rank in timed.ranks:
        rank["metrics"].update({name: ranks.get(rank["rank"], {}).get(name) for name in wanted})


_RESOLVED: dict[bytes, str] = {}  # a workload's pickle -> its file: parsed once per item, read by each of its rounds


def _resolved(workload) -> str:
    """The workload as the runner resolved it, in a file its workers read instead of parsing the suite again."""
    data = pickle.dumps(workload)
    if data not in _RESOLVED:
        fd, path = tempfile.mkstemp(prefix="memcheck-workload-", suffix=".pickle")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        atexit.register(lambda: os.path.exists(path) and os.unlink(path))
        _RESOLVED[data] = path
    return _RESOLVED[data]


def _worker_command(workload, stack: str, s: Settings, out: str, memory_round: bool = False,
                    shared: bool = False) -> list[str]:
    cmd = [_python(stack, s.rootdir), "-m", "memcheck.worker", "--file", workload.path, "--workload", workload.name,
           "--resolved", _resolved(workload),
           "--stack", stack, "--device", s.device, "--out", out, "--rootdir", s.rootdir,
           "--sample-period-ms", str(s.sample_period_ms), "--launched-at", repr(time.time())]
    if workload.profile:
        cmd += ["--profile", workload.profile]
    if s.predict:
        return [*cmd, "--predict", s.predict]
    if memory_round and s.python_heap:  # tracemalloc and the CPU allocator's events: the memory round only
        cmd.append("--python-heap")
    if s.python_heap and not memory_round:  # ... or the warm-up, where it is the workload once (hf on a GPU)
        cmd.append("--heap-in-warmup")
    if memory_round and s.cpu_tensors:
        cmd.append("--cpu-tensors")
    if shared:  # other items on the GPU meanwhile: NVML counts this item's processes only
        cmd.append("--device-shared")
    return cmd


def _measure_in_worker(workload, stack: str, s: Settings, memory_round: bool = False,
                       shared: bool = False) -> Measurement:
    env = _worker_env()
    command = lambda out: _worker_command(workload, stack, s, out, memory_round, shared)  # noqa: E731
    if workload.tensor_parallel > 1 and rank_workers.runs_ranks(stack):  # one worker per rank
        return rank_workers.measure_ranks(workload, stack, command, env, s.timeout_s,
                                          lambda rc, err: _death(rc) + _tail(err), _rank_starter(stack, env, s))
    fd, out = tempfile.mkstemp(prefix="memcheck-", suffix=".json")
    os.close(fd)
    fd, log = tempfile.mkstemp(prefix="memcheck-", suffix=".log")
    os.close(fd)
    m = Measurement.of_item(workload, stack)
    try:
        t0 = time.perf_counter()
        cmd = command(out)
        try:
            returncode, timed_out, started = _start_worker(cmd, stack, env, log, s)
        except forkserver.ServerDied as e:
            m.error = ItemError(ErrorKind.CRASH, str(e))
            return m
        wall = time.perf_counter() - t0
        if os.path.getsize(out):
            with open(out) as f:
                m = Measurement.from_json(json.load(f))
            m.notes.append(f"worker process: {started}")
            m.phases["exit"] = round(max(0.0, wall - sum(m.phases.values())), 3)  # result written, process exit
            return m
        with open(log, "rb") as f:
            stderr = f.read()
        if timed_out:
            m.error = ItemError(ErrorKind.TIMEOUT, f"no result after {s.timeout_s:g} s" + _tail(stderr))
        else:
            m.error = ItemError(ErrorKind.CRASH, _death(returncode) + _tail(stderr))
    finally:
        os.unlink(out)
        os.unlink(log)
    return m


def _worker_env() -> dict:
    # PYTHONSAFEPATH (3.11+): `python -m` leaves the working directory off sys.path, so a repository's own top-level
    # packages (a `kernels/` of its own shadows the Hugging Face `kernels` transformers 5.25 imports) never reach
    # the stack; what is installed and PYTHONPATH still do.
    return {**os.environ, "PYTHONSAFEPATH": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [_source_root(), os.environ.get("PYTHONPATH")]))}


def _start_worker(cmd: list[str], stack: str, env: dict, log: str, s: Settings) -> tuple[int, bool, str]:
    """Run one worker round, forked from the interpreter's fork server where it can be, else as a fresh
    interpreter. Returns its exit status, whether it timed out, and how it was started (for the notes)."""
    python, module, argv = cmd[0], cmd[2], cmd[3:]  # cmd: python -m memcheck.worker ARGV
    why = _fork_refused(python, s)
    if why is None:
        try:
            server = _fork_server(python, env, s.rootdir)
            returncode, timed_out = server.run(module, argv, env, log, s.timeout_s)
            return returncode, timed_out, "forked from a fork server that imported torch and transformers once"
        except forkserver.Unavailable as e:
            why = _FORK_REFUSED[python] = str(e)
        except forkserver.ServerDied:
            _SERVERS.pop(python).close()
            raise
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=f, env=env)
        try:
            proc.wait(timeout=s.timeout_s)
            return proc.returncode, False, f"a fresh interpreter ({why})"
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return proc.returncode, True, f"a fresh interpreter ({why})"
        except BaseException:
            proc.kill()
            raise


def _rank_starter(stack: str, env: dict, s: Settings):
    """How a round's rank workers start: forked together from the interpreter's fork server where it can be (each
    a fresh interpreter took 3-4 s of imports a round on 2 cores), else as fresh interpreters."""
    python = _python(stack, s.rootdir)

    def start(cmds: list[list[str]], logs: list[str], rank_env: dict):
        if _fork_refused(python, s) is None:
            try:  # cmd: python -m memcheck.worker ARGV
                return _fork_server(python, env, s.rootdir).start_group(cmds[0][2], [c[3:] for c in cmds],
                                                                        rank_env, logs)
            except forkserver.Unavailable as e:
                _FORK_REFUSED[python] = str(e)
            except forkserver.ServerDied:
                _SERVERS.pop(python).close()
        return rank_workers.fresh_interpreters(cmds, logs, rank_env)
    return start


_SERVERS: dict[str, forkserver.ForkServer] = {}  # one per worker interpreter (this one, vLLM's)
_FORK_REFUSED: dict[str, str] = {}  # interpreters whose server could not fork safely: why


def _fork_refused(python: str, s: Settings) -> str | None:
    if not s.fork_server:
        return "the fork server is switched off (--memcheck-no-fork-server)"
    if os.environ.get(FORK_ENV) == "0":
        return f"the fork server is switched off ({FORK_ENV}=0)"
    return _FORK_REFUSED.get(python)


def _fork_server(python: str, env: dict, rootdir: str) -> forkserver.ForkServer:
    """The server of this interpreter, started on first use; restarted when the environment it imported under
    changed (a variable read at import, like OMP_NUM_THREADS, would otherwise keep the old value). It also
    imports the `fork_preload` modules of every stack whose rounds run in this interpreter."""
    server = _SERVERS.get(python)
    if server is not None and (not server.alive() or _env_key(server.env) != _env_key(env)):
        _SERVERS.pop(python).close()
        server = None
    if server is None:
        preload = ",".join(_fork_preload(python, rootdir))
        server = _SERVERS[python] = forkserver.ForkServer(python, {**env, forkserver.PRELOAD_ENV: preload})
    return server


def _fork_preload(python: str, rootdir: str) -> list[str]:
    modules: list[str] = []
    for name in sorted(stacks.names()):
        try:
            cls = stacks.load(name)
            if (cls.worker_python(rootdir) or sys.executable) != python:
                continue
        except Exception:  # noqa: BLE001 - a stack that cannot load says why from inside its worker
            continue
        modules += [m for m in cls.fork_preload if m not in modules]
    return modules


def _env_key(env: dict) -> dict:
    ignored = ("PYTEST_CURRENT_TEST", forkserver.PRELOAD_ENV)  # pytest changes the first per test
    return {k: v for k, v in env.items() if k not in ignored}


def _close_servers() -> None:
    while _SERVERS:
        _SERVERS.popitem()[1].close()


atexit.register(_close_servers)


def _python(stack: str, rootdir: str) -> str:
    """The worker's interpreter: the stack's own environment where it names one (vLLM's), else this one."""
    try:
        return stacks.load(stack).worker_python(rootdir) or sys.executable
    except Exception:  # noqa: BLE001 - a stack that cannot even load reports why from inside the worker
        return sys.executable


def _source_root() -> str:
    # The worker must import this very harness, installed or run from a checkout.
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _death(returncode: int) -> str:
    if returncode < 0:
        name = signal.Signals(-returncode).name
        hint = " (the kernel's OOM killer sends SIGKILL)" if name == "SIGKILL" else ""
        return f"the worker process died of {name}{hint}"
    return f"the worker process exited with status {returncode} without a result"


def _tail(stderr, lines: int = 6) -> str:
    if not stderr:
        return ""
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    kept = [ln for ln in text.strip().splitlines() if not ln.startswith("USDT:")][-lines:]
    return ("; stderr: " + " | ".join(kept)) if kept else ""


def run_item(workload, stack: str, settings: Settings, store: BaselineStore | None = None) -> ItemResult:
    return judge_item(measure_item(workload, stack, settings), workload.thresholds, settings, store)


def judge_item(m: Measurement, rule_set: dict, settings: Settings, store: BaselineStore | None = None) -> ItemResult:
    """From a measurement to a judged item, its baseline refreshed when asked: workload items and the
    `memcheck` fixture both come here."""
    store = store or BaselineStore(settings.baselines)
    t0 = time.perf_counter()
    baseline, baseline_error, unreadable = None, None, None
    device_class = m.environment.get("device_class")
    if device_class and not (m.error or (m.skipped and not m.software_changed)):
        try:
            baseline = store.load(device_class, m.workload, m.stack)
        except UsageError as e:
            baseline_error, unreadable = str(e), e.message.removesuffix("; " + MENDING)
    # A refresh replaces a baseline it cannot read, and the item says so; a gate leaves it for the user.
    replacing = unreadable if settings.update_baselines and not m.error else None
    result = judge(m, rule_set, baseline, None if replacing else baseline_error, settings.strict_environment)
    if settings.update_baselines and result.verdict not in (Verdict.ERROR, Verdict.SKIPPED):
        try:
            path, changes = store.write(m, replace_unreadable=bool(replacing))
            result.baseline_path = str(path)
            result.updated = changes
            if replacing:
                result.reason = f"replaced an unreadable baseline: {replacing}"
                result.updated = [result.reason]
        except OSError as e:  # permissions, a read-only file system, a full disk: this item's, not the run's
            where = store.path(device_class, m.workload, m.stack)
            result.verdict = Verdict.ERROR
            result.reason = f"cannot write the baseline {where}: {e.strerror or e}"
    elif result.verdict == Verdict.NEW and settings.strict:
        result.strict = True
        result.reason += "; --memcheck-strict fails it"
    m.phases["report"] = round(time.perf_counter() - t0, 3)  # baseline lookup, rules, verdict, baseline write
    return result

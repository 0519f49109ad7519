"""A fork server: one interpreter per worker Python that imports torch and transformers once and forks a fresh
child process per item round, so a round starts in a fraction of a second instead of re-importing for seconds.

Each child is still a process of its own: its RSS high-water mark is reset at its start (/proc/self/clear_refs),
its page faults and GC passes are counted by its own getrusage and gc hooks, it is the leader of its own
process group (a timeout kills it and whatever it started), and a crash or OOM kill ends only the child: the
server reports how it died and serves the next round.

Fork is only safe while the server is single-threaded and has not initialised CUDA or torch's thread pools:
the server only imports, and checks both before every fork. Where it cannot (no fork, no /proc, a thread an
import started, a preload that fails), the runner falls back to a fresh interpreter per round and says so.

Protocol (JSON lines on the server's stdin/stdout):
    server -> {"ready": true, "unsafe": null | why, "import_s": S,      once, after the imports
               "preloaded": [the optional modules it imported]}
    runner -> {"module": M, "argv": [...], "log": path, "env": {...}}     one round: M.main(argv), as python -m M
    server -> {"pid": P} | {"unsafe": why}                                the child started, or fork refused
    server -> {"pid": P, "returncode": RC}                                the child ended (RC < 0: its signal)
    runner -> {"module": M, "env": {...}, "group": [{"argv", "log"}, ...]} processes that run at once (ranks)
    server -> {"pids": [P, ...]}, then {"pid": P, "returncode": RC} for each as it ends
"""
from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time

PRELOAD = ("torch", "transformers", "memcheck.worker", "memcheck.measure_round", "memcheck.stacks")
PRELOAD_ENV = "MEMCHECK_FORK_PRELOAD"  # extra modules, comma-separated: the stack's `fork_preload` (vllm)
RESET_PEAK = "/proc/self/clear_refs"  # writing "5" resets VmHWM to the current RSS (Linux >= 4.0)
# Threads that do not make a fork unsound: jemalloc's background purger (pyarrow's bundled jemalloc starts it when
# transformers' generation utils import scikit-learn, pandas and pyarrow, as on the H200 image). jemalloc takes its
# locks in a pthread_atfork handler and the child runs without the thread (Redis forks under it for its snapshots).
FORK_SAFE_THREADS = ("jemalloc_bg_thd",)


def unsafe_reason() -> str | None:
    """Why forking this process now would not give a sound worker, or None when it is safe."""
    if not hasattr(os, "fork"):
        return "this platform has no fork()"
    if not os.access(RESET_PEAK, os.W_OK):
        return f"{RESET_PEAK} is not writable: a forked child's RSS peak could not be made its own"
    threads = _native_threads()
    if len(threads) != 1:
        return (f"the fork server runs {len(threads)} threads after its imports ({', '.join(threads)}): "
                "forking it is not safe")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialised in the fork server"
    return None


def _native_threads() -> list[str]:
    """Names of this process's threads, but those in FORK_SAFE_THREADS."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return [t.name for t in threading.enumerate()]
    names = []
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name not in FORK_SAFE_THREADS:
            names.append(name)
    return names


def _preload(imported: list[str]) -> str | None:
    """Import what every round would: PRELOAD, then what building a preset's model imports from transformers
    (2-3 s a round otherwise) and the served stacks' `fork_preload`, appending those to `imported`. A module
    this install lacks is left to the round (it imports it, or says why it cannot)."""
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - the worker itself will say why the stack cannot import
            return f"importing {name} in the fork server failed: {type(e).__name__}: {e}"
    from .models import transformers_modules

    extra = [m for m in os.environ.get(PRELOAD_ENV, "").split(",") if m]
    for name in (*transformers_modules(), *extra):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        except Exception as e:  # noqa: BLE001
            return f"importing {name} in the fork server failed: {type(e).__name__}: {e}"
        imported.append(name)
    gc.collect()
    gc.freeze()  # the imported objects stay out of the children's GC passes (and their pages stay shared)
    return None


def serve(requests=sys.stdin, replies=None) -> int:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches pytest, which stops the child and closes us
    # OpenBLAS (numpy's, OpenCV's) starts its thread pool when it loads, which makes a fork unsafe; at one
    # thread it starts none. The children's torch keeps its own thread pools (MKL, OpenMP), created after fork.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    replies = replies or os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # a stray print from an import or a child must not corrupt the protocol
    t0 = time.perf_counter()
    imported: list[str] = []
    unsafe = _preload(imported) or unsafe_reason()
    _send(replies, {"ready": True, "unsafe": unsafe, "import_s": round(time.perf_counter() - t0, 3),
                    "preloaded": imported})
    for line in requests:
        request = json.loads(line)
        unsafe = unsafe or unsafe_reason()
        if unsafe:
            _send(replies, {"unsafe": unsafe})
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        # a group: the ranks of a tensor-parallel round, each its own argv and log, running at once
        children = [{**request, **child} for child in request["group"]] if "group" in request else [request]
        pids = []
        for child in children:
            pid = os.fork()
            if pid == 0:
                _child(child, replies.fileno())  # never returns
            pids.append(pid)
        _send(replies, {"pids": pids} if "group" in request else {"pid": pids[0]})
        for _ in pids:  # each as it ends
            pid, status = os.wait()
            _send(replies, {"pid": pid, "returncode": os.waitstatus_to_exitcode(status)})
    return 0


def _send(replies, message: dict) -> None:
    replies.write(json.dumps(message) + "\n")
    replies.flush()


def _child(request: dict, replies: int) -> None:
    """The forked worker: its own process group, stdio to its log, its own RSS peak, then one worker round."""
    import atexit
    import signal
    import traceback

    code = 1
    try:
        os.setpgid(0, 0)
        os.close(replies)  # the runner must see the server's end of the pipe close, not wait on this child
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.environ.clear()
        os.environ.update(request["env"])
        with open(RESET_PEAK, "w") as f:  # VmHWM from here on is this child's own
            f.write("5")
        import importlib

        code = importlib.import_module(request["module"]).main(request["argv"])
        atexit._run_exitfuncs()  # what a fresh interpreter runs at exit (vLLM's and torch's shutdown hooks)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException:  # noqa: BLE001 - the runner reads the log's tail as the item's error
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


# -- the runner's side --------------------------------------------------------------------------------
class Unavailable(Exception):
    """This interpreter cannot serve forked workers: the runner starts fresh ones instead (the message says why)."""


class ServerDied(Exception):
    """The server ended in the middle of a round (killed from outside): this round is an error."""


class ForkServer:
    """The runner's handle on one server: start it, run a worker round in a forked child, close it."""

    def __init__(self, python: str, env: dict):
        import subprocess
        import tempfile

        self.python, self.env = python, env
        self._stderr = tempfile.TemporaryFile()
        self._buf = b""
        self.proc = subprocess.Popen([python, "-m", "memcheck.forkserver"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, env=env)
        ready = self._read(None)
        if ready is None:
            self.close()
            raise Unavailable(f"the fork server exited while importing{self._stderr_tail()}")
        if ready.get("unsafe"):
            self.close()
            raise Unavailable(ready["unsafe"])
        self.import_s = ready["import_s"]
        self.preloaded = ready.get("preloaded", [])

    def run(self, module: str, argv: list[str], env: dict, log: str, timeout_s: float | None) -> tuple[int, bool]:
        """One round of `python -m MODULE ARGV` (MODULE.main(argv): memcheck.worker) in a forked child writing its
        stdout and stderr to `log`. Returns its exit status (negative: its signal) and whether it timed out."""
        import signal

        self._write({"module": module, "argv": argv, "log": log, "env": env})
        started = self._read(None)
        if started is None:
            raise ServerDied(self._died())
        if "unsafe" in started:
            raise Unavailable(started["unsafe"])
        pid, timed_out = started["pid"], False
        try:
            ended = self._read(timeout_s)
            if ended == "timeout":
                timed_out = True
                _kill_group(pid, signal.SIGKILL)
                ended = self._read(None)
        except BaseException:  # Ctrl-C in pytest: the child is in a group of its own, stop it here
            _kill_group(pid, signal.SIGKILL)
            raise
        if ended is None:
            _kill_group(pid, signal.SIGKILL)
            raise ServerDied(self._died())
        return ended["returncode"], timed_out

    def start_group(self, module: str, argvs: list[list[str]], env: dict, logs: list[str]) -> list[Forked]:
        """Processes that run at once (a tensor-parallel round's ranks), each `python -m MODULE ARGV` forked with
        its own log; Popen-like handles on them (poll, wait, kill)."""
        self._write({"module": module, "env": env,
                     "group": [{"argv": argv, "log": log} for argv, log in zip(argvs, logs)]})
        started = self._read(None)
        if started is None:
            raise ServerDied(self._died())
        if "unsafe" in started:
            raise Unavailable(started["unsafe"])
        self._group = {pid: Forked(self, pid) for pid in started["pids"]}
        return list(self._group.values())

    def _collect_exits(self, timeout_s: float | None) -> None:
        """The group's exit statuses that have come, waiting up to timeout_s for the first."""
        reply = self._read(timeout_s)
        while reply != "timeout":
            if reply is None:  # the server died, and with it its children's statuses
                for forked in self._group.values():
                    if forked.returncode is None:
                        _kill_group(forked.pid, 9)
                        forked.returncode = -9
                return
            self._group[reply["pid"]].returncode = reply["returncode"]
            reply = self._read(0)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - a server that does not leave is stopped
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self._stderr.close()

    def _write(self, message: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            raise ServerDied(self._died()) from None

    def _read(self, timeout_s: float | None):
        """The next reply; None when the server closed its end; "timeout" when none came within timeout_s."""
        import select

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], wait)[0]:
                return "timeout"
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def _died(self) -> str:
        self.proc.wait()
        return f"the fork server exited with status {self.proc.returncode} during the round{self._stderr_tail()}"

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()[-3:]
        return ("; stderr: " + " | ".join(lines)) if lines else ""


class Forked:
    """One process of a group (ForkServer.start_group), as subprocess.Popen's poll, wait, kill and returncode."""

    def __init__(self, server: ForkServer, pid: int):
        self.server, self.pid, self.returncode = server, pid, None
        self.started = "forked together from a fork server that imported torch and transformers once"

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server._collect_exits(0)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self.server._collect_exits(None)
        return self.returncode

    def kill(self) -> None:
        import signal

        _kill_group(self.pid, signal.SIGKILL)


def _kill_group(pid: int, sig: int) -> None:
    for kill in (os.killpg, os.kill):  # the group, and the child itself if it had not made its group yet
        try:
            kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


if __name__ == "__main__":
    sys.exit(serve())

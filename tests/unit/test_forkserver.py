"""The fork server: each round a child process of its own (its own RSS peak, its own crash, its own timeout),
and a refusal to fork where that would not be sound. Real processes, no mocks."""
import json
import os
import sys
import time

import pytest

from memcheck.forkserver import ForkServer, Unavailable

# Imported by the server: holds 400 MiB at import and frees it, so the server's own high-water mark is high.
BIG_IMPORT = """
big = bytearray(400 * 2**20)
for i in range(0, len(big), 4096):
    big[i] = 1
del big
"""
# One round: report this process's pid, its parent, its RSS peak, then do what argv[1] says.
PROBE = """
import json, os, signal, subprocess, sys, time
from memcheck.metrics.host import peak_rss

def main(argv):
    with open(argv[0], "w") as f:
        json.dump({"pid": os.getpid(), "ppid": os.getppid(), "peak": peak_rss()[0],
                   "env": os.environ.get("PROBE_VALUE")}, f)
    if argv[1] == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if argv[1] == "hang":
        with open(argv[0] + ".grandchild", "w") as f:
            f.write(str(subprocess.Popen(["sleep", "60"]).pid))
        time.sleep(60)
    print("a line on stdout goes to the log")
    return 3
"""
THREADED = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
# A thread that names itself as jemalloc's background purger does (pyarrow's jemalloc, on the H200 image).
PURGER = """
import ctypes, threading, time
def purge():
    ctypes.CDLL(None).prctl(15, b"jemalloc_bg_thd")  # PR_SET_NAME
    time.sleep(60)
threading.Thread(target=purge, daemon=True).start()
time.sleep(0.2)
"""


def _env(tmp_path, preload):
    (tmp_path / "bigimport.py").write_text(BIG_IMPORT)
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "threaded.py").write_text(THREADED)
    (tmp_path / "purger.py").write_text(PURGER)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), root]), "MEMCHECK_FORK_PRELOAD": preload}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forkserver")
    env = _env(tmp, "bigimport,probe")
    server = ForkServer(sys.executable, env)
    yield server, env, tmp
    server.close()


def _round(served, what, timeout_s=None, **env):
    server, base, tmp = served
    out, log = tmp / f"{what}.json", tmp / f"{what}.log"
    log.write_text("")
    returncode, timed_out = server.run("probe", [str(out), what], {**base, **env}, str(log), timeout_s)
    return returncode, timed_out, json.loads(out.read_text()), log.read_text()


def test_each_round_is_a_child_of_the_server_with_its_own_rss_peak(served):
    returncode, timed_out, seen, log = _round(served, "ok", PROBE_VALUE="this round's")
    assert (returncode, timed_out) == (3, False)
    assert seen["ppid"] == served[0].proc.pid and seen["pid"] != served[0].proc.pid
    assert seen["peak"] < 300 * 2**20, f"child peak {seen['peak'] / 2**20:.0f} MiB includes the server's 400 MiB"
    assert seen["env"] == "this round's"  # the runner's environment of this round, not the server's
    assert "a line on stdout goes to the log" in log


def test_a_crashed_child_is_its_signal_and_the_server_serves_the_next_round(served):
    returncode, timed_out, _, _ = _round(served, "segv")
    assert returncode == -11 and not timed_out
    first, second = _round(served, "ok")[2], _round(served, "ok")[2]
    assert first["pid"] != second["pid"]  # a fresh child per round


def test_a_timeout_kills_the_child_and_what_it_started(served):
    returncode, timed_out, _, _ = _round(served, "hang", timeout_s=2)
    assert timed_out and returncode == -9
    grandchild = int((served[2] / "hang.json.grandchild").read_text())
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        import time

        time.sleep(0.05)
    else:
        pytest.fail("the round's own child process outlived the timeout")


def test_a_group_runs_at_once_each_process_its_own_log_and_status(served):
    """A tensor-parallel round's ranks: forked together, running at the same time, each its own status; a killed
    one is its signal, and the server serves the next round after the group."""
    server, base, tmp = served
    outs = [tmp / f"group{r}.json" for r in range(3)]
    logs = [tmp / f"group{r}.log" for r in range(3)]
    for log in logs:
        log.write_text("")
    group = server.start_group("probe", [[str(outs[0]), "ok"], [str(outs[1]), "segv"], [str(outs[2]), "hang"]],
                               {**base, "PROBE_VALUE": "the group's"}, [str(log) for log in logs])
    assert group[0].wait() == 3 and group[1].wait() == -11
    assert group[2].poll() is None  # still running while the others ended
    written = tmp / "group2.json.grandchild"  # made after its JSON is closed: on a loaded runner, not at once
    deadline = time.monotonic() + 60
    while not written.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    group[2].kill()
    assert group[2].wait() == -9
    seen = [json.loads(out.read_text()) for out in outs]
    assert {s["ppid"] for s in seen} == {server.proc.pid} and len({s["pid"] for s in seen}) == 3
    assert all(s["env"] == "the group's" for s in seen)
    assert "a line on stdout goes to the log" in logs[0].read_text() and not logs[1].read_text().strip()
    assert _round(served, "ok")[0] == 3


def test_a_server_with_threads_refuses_to_fork(tmp_path):
    with pytest.raises(Unavailable, match="threads after its imports"):
        ForkServer(sys.executable, _env(tmp_path, "threaded"))


def test_jemallocs_background_thread_does_not_stop_the_server_forking(tmp_path):
    server = ForkServer(sys.executable, _env(tmp_path, "purger,probe"))
    try:
        out, log = tmp_path / "round.json", tmp_path / "round.log"
        log.write_text("")
        assert server.run("probe", [str(out), "ok"], server.env, str(log), None) == (3, False)
    finally:
        server.close()


def test_the_server_of_this_interpreter_preloads_every_stack_it_serves_and_can_still_fork(tmp_path):
    """The runner's preload (the presets' transformers modules, the paged engine and its Triton kernels) must
    leave the server single-threaded, or every round would fall back to a fresh interpreter."""
    from memcheck.runner import _fork_preload
    from memcheck.stacks.paged import PagedStack

    preload = _fork_preload(sys.executable, ".")
    assert set(PagedStack.fork_preload) <= set(preload)
    server = ForkServer(sys.executable, _env(tmp_path, ",".join([*preload, "probe"])))
    try:
        out, log = tmp_path / "round.json", tmp_path / "round.log"
        log.write_text("")
        assert server.run("probe", [str(out), "ok"], server.env, str(log), None) == (3, False)
        assert {"transformers.modeling_utils", "memcheck.kernels.decode"} <= set(server.preloaded)
    finally:
        server.close()

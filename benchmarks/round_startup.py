"""Where a worker round's time goes before the model is built: one round per stack, forked from a fork server
started as the runner starts it, under cProfile; prints the round's phases and the functions that took longest.

    PYTHONPATH=. python benchmarks/round_startup.py [WORKLOAD_FILE WORKLOAD] [--stacks hf,paged]
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time

DEFAULT = ("benchmarks/workloads/harness_gpu.yaml", "gpu-tiny-dense")


def main(argv=None) -> int:
    """In the forked child (the fork server calls main(argv)): the worker round under cProfile."""
    if argv is not None:
        from memcheck import worker

        stats_path, worker_argv = argv[0], argv[1:]
        profile = cProfile.Profile()
        code = profile.runcall(worker.main, worker_argv)
        profile.dump_stats(stats_path)
        return code
    p = argparse.ArgumentParser()
    p.add_argument("file", nargs="?", default=DEFAULT[0])
    p.add_argument("workload", nargs="?", default=DEFAULT[1])
    p.add_argument("--stacks", default="hf,paged")
    args = p.parse_args()
    from memcheck import forkserver, runner

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    server = forkserver.ForkServer(sys.executable, {**env, forkserver.PRELOAD_ENV: ",".join(
        runner._fork_preload(sys.executable, "."))})
    print(f"fork server ready in {time.perf_counter() - t0:.2f} s (its imports {server.import_s:.2f} s), "
          f"preloaded {len(server.preloaded)} optional modules", flush=True)
    try:
        for stack in args.stacks.split(","):
            for attempt in (1, 2):
                out, stats, log = (tempfile.mkstemp(suffix=s)[1] for s in (".json", ".prof", ".log"))
                argv = [stats, "--file", args.file, "--workload", args.workload, "--stack", stack, "--out", out,
                        "--no-python-heap", "--no-cpu-tensors", "--launched-at", repr(time.time())]
                t0 = time.perf_counter()
                code, _ = server.run("benchmarks.round_startup", argv, env, log, 300)
                wall = time.perf_counter() - t0
                phases = json.load(open(out)).get("phases") if os.path.getsize(out) else None
                print(f"\n== {stack} round {attempt}: exit {code}, {wall:.2f} s, phases {phases}", flush=True)
                if code != 0 or phases is None:
                    print(open(log).read()[-2000:])
                    continue
                pstats.Stats(stats).sort_stats("cumulative").print_stats(22)
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

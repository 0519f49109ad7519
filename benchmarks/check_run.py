"""The device-call driver the kernel check runs share (mla_hopper_h200.py, prefill_hopper_h200.py): checks first,
then timed cells, every row printed and the JSON rewritten as it comes, so a call cut short keeps what it measured."""
import json

import torch

from kernel_bench import copy_bandwidth, matmul_rate


def check_then_time(path, checks, cells, time_cell, gen):
    """checks: (label, a callable returning a row with "ok"); an exception is recorded and ends the run (a fault
    poisons the CUDA context). Then the copy bandwidth and mm rate, and time_cell(cell, bandwidth, rate, gen) for
    each cell. Returns the result written to `path`, or None where a check raised."""
    result = {"device": torch.cuda.get_device_name(), "checks": [], "cells": []}

    def add(kind, row):
        print(kind[:-1], json.dumps(row), flush=True)
        result[kind].append(row)
        with open(path, "w") as f:
            json.dump(result, f, indent=1)

    for label, run in checks:
        try:
            row = run()
        except Exception as e:  # noqa: BLE001 - recorded, and the run stops here
            row = {"check": label, "error": repr(e)[:300], "ok": False}
        add("checks", row)
        if "error" in row:
            return None
    bandwidth, rate = copy_bandwidth(), matmul_rate()
    result.update(bandwidth=bandwidth, mm_rate=rate)
    print(f"copy {bandwidth / 1e12:.3f} TB/s, mm {rate / 1e12:.0f} TFLOP/s", flush=True)
    for c in cells:
        add("cells", time_cell(c, bandwidth, rate, gen))
    print(f"\nchecks: {sum(r['ok'] for r in result['checks'])} of {len(result['checks'])} ok", flush=True)
    return result

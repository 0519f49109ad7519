"""The time-stamp timelines' report (benchmarks/decode_timeline.py, benchmarks/prefill_timeline.py): a fixed-width
table of their rows, and the rows as JSON and log in the output folder."""
import json
import os

import torch


def collect(jobs):
    """The rows of jobs [(labels, run)]: each run's row, or its labels and the error where it raised (one failing
    case leaves the others' rows standing); each printed as JSON as it comes."""
    rows = []
    for labels, run in jobs:
        try:
            rows.append({**labels, **run()})
        except Exception as e:  # noqa: BLE001 - see the docstring
            rows.append({**labels, "error": repr(e)[:300]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows, columns, legend):
    """legend, the headings, then a line a row. columns: (key, heading, width, format), format "<" a left-aligned
    label; a row with "error" prints its labels and the error, one without a column's key "-" there."""
    labels = [(k, w) for k, _, w, f in columns if f == "<"]
    lines = [legend, " ".join(f"{h:<{w}}" if f == "<" else f"{h:>{w}}" for _, h, w, f in columns)]
    for r in rows:
        if "error" in r:
            lines.append(" ".join(f"{r[k]:<{w}}" for k, w in labels) + f" failed: {r['error']}")
            continue
        lines.append(" ".join(f"{r[k]:<{w}}" if f == "<" else f"{'-':>{w}}" if r.get(k) is None else f"{r[k]:>{w}{f}}"
                              for k, _, w, f in columns))
    return "\n".join(lines)


def write(out, name, rows, report):
    """out/name.json (the device and the rows) and out/name.log (a row a line, then the table); the table printed."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    with open(os.path.join(out, f"{name}.log"), "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n\n" + report + "\n")
    print("\n" + report)

"""What each item cost its GPU runner (GPU seconds) and the profile that gates no time, in the reports: the terminal
prints a GPU s column and the total, the JSON keeps both numbers per item, and 'time not gated in this profile' is
said once per report rather than once per time metric per item."""
import json

import reportfactory as f

from memcheck.metrics.value import MetricValue
from memcheck.reports import markdown, terminal
from memcheck.reports.report import Report
from memcheck.verdict import judge


def timed_report() -> Report:
    items = []
    for stack, seconds in (("hf", 30.0), ("paged", 10.0)):
        m = f.measurement("r1-32k", stack, f.GPU_ENV, {"gpu.heap_alloc.peak": 16 * f.GiB})
        m.metrics["time.wall"] = MetricValue(5.0)
        m.metrics["tokens_per_s"] = MetricValue(100.0)
        m.gpu_seconds, m.gpu_held_seconds = seconds, seconds * 2
        items.append(judge(m, f.rules(), f.baseline(m, {})))
    return Report(items=items, profile="full")


def test_the_terminal_prints_each_items_gpu_seconds_and_says_once_that_time_is_not_gated():
    lines = terminal.table(timed_report())
    assert lines[0].split()[-1] == "s" and "GPU s" in lines[0]
    assert lines[2].split()[-1] == "30.0" and lines[3].split()[-1] == "10.0"
    gate = [line for line in lines if "time not gated" in line]
    assert gate == ["memcheck: time not gated in this profile (noisy metrics, judged through 3 or more rounds), "
                    "not compared: time.wall, tokens_per_s"]
    assert any(line.startswith("memcheck: 40.0 GPU seconds over 2 items (they held a GPU 80.0 s") for line in lines)


def test_the_markdown_says_it_once_and_keeps_time_rows_out_of_the_item_tables():
    body = markdown.render(timed_report())
    assert body.count("Time not gated in this profile") == 1
    assert "| `time.wall` |" not in body and "| `gpu.heap_alloc.peak` |" in body
    assert "40.0 GPU seconds over 2 items" in body


def test_gpu_seconds_survive_the_json_report_and_a_cpu_report_has_no_column(tmp_path):
    path = f.write(timed_report(), tmp_path / "r.json")
    item = json.load(open(path))["items"][0]
    assert (item["gpu_seconds"], item["gpu_held_seconds"]) == (30.0, 60.0)
    assert Report.load(path).gpu_seconds == (40.0, 80.0, 2)
    assert "GPU s" not in terminal.table(f.cpu_report())[0]

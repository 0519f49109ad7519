"""A tensor-parallel item shows each rank's numbers under its own row in every report a reviewer reads:
the terminal table, the Markdown comment and the HTML page."""
from memcheck.reports import html, markdown, terminal
from memcheck.reports.report import Report
from memcheck.verdict import judge

from reportfactory import GPU_ENV, GiB, MiB, baseline, measurement, rules

RANKS = [{"rank": 0, "metrics": {"kv.bytes.peak": 2 * GiB, "gpu.heap_alloc.peak": 9 * GiB, "host.rss.peak": None}},
         {"rank": 1, "metrics": {"kv.bytes.peak": 2 * GiB, "gpu.heap_alloc.peak": 7 * GiB, "host.rss.peak": None}}]


def tp_report() -> Report:
    m = measurement("r1-tp2", "paged", GPU_ENV, {"kv.bytes.peak": 2 * GiB, "gpu.heap_alloc.peak": 9 * GiB,
                                                  "host.rss.peak": 300 * MiB}, ranks=RANKS)
    return Report(items=[judge(m, rules(), baseline(m, {}))], profile="full")


def test_terminal_rows_per_rank_under_the_item():
    lines = terminal.table(tp_report())
    item = next(i for i, line in enumerate(lines) if line.startswith("r1-tp2[paged]"))
    rank0, rank1 = lines[item + 1].split(), lines[item + 2].split()
    assert rank0[:2] == ["rank", "0"] and "9.00 GiB" in lines[item + 1] and "7.00 GiB" in lines[item + 2]
    assert rank1[-1] == "-"  # host.rss.peak: not measured per rank here, never 0


def test_html_table_per_rank_with_only_the_measured_metrics():
    page = html.render(tp_report())
    assert "Per rank (2 tensor-parallel ranks" in page
    table = page[page.index("Per rank ("):]
    table = table[:table.index("</table>")]
    assert table.count("<tr><td>") == 2 and "7.00 GiB" in table
    assert "host.<wbr>rss" not in table and "kv.<wbr>bytes.<wbr>peak" in table


def test_markdown_and_html_agree_on_the_columns():
    md = markdown.render(tp_report())
    assert "| rank | `kv.bytes.peak` | `gpu.heap_alloc.peak` |" in md

"""The README's metrics table is the catalog's: a metric added, renamed or redefined shows there."""
from pathlib import Path

from memcheck.metrics.catalog import METRICS, markdown_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_table_is_the_catalog():
    text = README.read_text()
    table = text.split("keeps it equal -->\n", 1)[1].split("<!-- end of metrics -->", 1)[0]
    assert table == markdown_table(), "run `memcheck metrics` and paste it between the README's markers"


def test_the_table_lists_every_metric_once():
    rows = [line for line in markdown_table().splitlines()[2:]]
    assert [row.split("`")[1] for row in rows] == list(METRICS)

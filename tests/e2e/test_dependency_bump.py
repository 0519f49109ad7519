"""A dependency bump is gated, not waved through: real runs of a real tiny workload whose baseline was
recorded under other software versions (its stored environment edited, as after `pip install -U`)."""
import json
import sys
import xml.etree.ElementTree as ET

from conftest import run

BASELINE = "baselines/cpu-x86_64/tiny/toy.json"
OLD = "4.0.0"  # the transformers version the baseline claims it was recorded under


def record_under_old_transformers(project) -> str:
    """Record the baseline, then make it one recorded under transformers 4.0.0; returns the version running."""
    assert run(project, "--memcheck", "--memcheck-update-baselines").ret == 0
    path = project.path / BASELINE
    data = json.loads(path.read_text())
    running = data["environment"]["transformers"]
    assert running and running != OLD
    data["environment"]["transformers"] = OLD
    path.write_text(json.dumps(data))
    return running


def item(project, name="r.json"):
    return json.loads((project.path / name).read_text())["items"][0]


def test_unchanged_workload_passes_across_the_bump_and_every_report_names_it(project):
    running = record_under_old_transformers(project)
    bump = f"transformers {OLD} -> {running}"
    result = run(project, "--memcheck", "--memcheck-report", "r.json", "--memcheck-markdown", "r.md",
                 "--memcheck-html", "r.html", "--junitxml", "j.xml")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([f"tiny[[]toy[]]: pass, compared across: {bump}"])
    got = item(project)
    assert got["verdict"] == "pass" and got["compared_across"] == [bump] and got["incomparable_fields"] == []
    assert [c["status"] for c in got["checks"] if c["metric"] == "cpu.heap_alloc.peak"] == ["pass"]
    escaped = bump.replace(">", "&gt;")  # as both render it: an arrow on the page
    assert f"compared across: {escaped}" in (project.path / "r.md").read_text()
    assert f"compared across: {escaped}" in (project.path / "r.html").read_text()
    props = {p.get("name"): p.get("value") for p in ET.parse(project.path / "j.xml").iter("property")}
    assert props["memcheck.verdict"] == "pass" and props["memcheck.compared_across"] == bump


def test_inflated_run_regresses_and_the_reason_names_the_bump(project, monkeypatch):
    running = record_under_old_transformers(project)
    monkeypatch.setenv("TOY_EXTRA_MIB", "16")  # the stack keeps 16 MiB more tensors alive: the regression
    result = run(project, "--memcheck", "--memcheck-report", "r.json")
    assert result.ret == 1
    result.stdout.fnmatch_lines([f"*tiny[[]toy[]]: regressed: cpu.heap_alloc.peak regressed: baseline *, now *, "
                                 f"+16.* MiB (+*%), rule max_increase 2% after transformers {OLD} -> {running}.*"])
    got = item(project)
    assert got["verdict"] == "regressed" and got["failed"]

    # Refreshing after the bump records the running versions and says what moved and why.
    result = run(project, "--memcheck", "--memcheck-update-baselines", "--memcheck-markdown", "r.md")
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"*baseline written to *: transformers {OLD} -> {running}; *cpu.heap_alloc.peak: *"])
    assert json.loads((project.path / BASELINE).read_text())["environment"]["transformers"] == running
    assert f"transformers {OLD} -&gt; {running}" in (project.path / "r.md").read_text()


def test_device_class_change_stays_incomparable(project):
    record_under_old_transformers(project)
    path = project.path / BASELINE
    data = json.loads(path.read_text())
    here = data["environment"]["device_class"]
    data["environment"]["device_class"] = "nvidia-h200"
    path.write_text(json.dumps(data))
    result = run(project, "--memcheck", "--memcheck-report", "r.json")
    assert result.ret == 0
    got = item(project)
    assert got["verdict"] == "incomparable"
    assert got["incomparable_fields"] == [f"device_class: nvidia-h200 -> {here}"]
    assert got["compared_across"] == []  # nothing was compared


def test_project_strict_field_is_incomparable(project):
    running = record_under_old_transformers(project)
    project.makefile(".toml", pyproject='[tool.memcheck]\nstrict_environment = ["transformers"]\n')
    result = run(project, "--memcheck", "--memcheck-report", "r.json")
    assert result.ret == 0
    got = item(project)
    assert got["verdict"] == "incomparable" and got["incomparable_fields"] == [f"transformers: {OLD} -> {running}"]
    assert "transformers: 4.0.0 -> " in got["reason"]

    project.makefile(".toml", pyproject='[tool.memcheck]\nstrict_environment = ["torch", "gpu_model"]\n')
    result = run(project, "--memcheck")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*pyproject.toml: tool.memcheck.strict_environment[[]1[]]: 'gpu_model' is not a "
                                 "software field; known: torch, *"])


def test_compare_two_real_reports(project, monkeypatch):
    assert run(project, "--memcheck", "--memcheck-report", "before.json").ret == 0
    monkeypatch.setenv("TOY_EXTRA_MIB", "16")
    assert run(project, "--memcheck", "--memcheck-report", "after.json").ret == 0  # no baseline: new
    before = json.loads((project.path / "before.json").read_text())
    running = before["items"][0]["environment"]["transformers"]
    before["items"][0]["environment"]["transformers"] = OLD
    (project.path / "before.json").write_text(json.dumps(before))

    def compare(*args):
        return project.run(sys.executable, "-m", "memcheck.cli", "compare", *args)

    result = compare("before.json", "after.json", "--markdown", "c.md", "--html", "c.html", "--report", "c.json")
    assert result.ret == 1, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["item *verdict*", "tiny[[]toy[]] *REGRESSED*",
                                 f"tiny[[]toy[]]: regressed: cpu.heap_alloc.peak regressed: baseline *, now *, "
                                 f"+16.* MiB (+*%), rule max_increase 2% after transformers {OLD} -> {running}.*"])
    assert "regressed" in (project.path / "c.md").read_text() and (project.path / "c.html").is_file()
    assert json.loads((project.path / "c.json").read_text())["items"][0]["baseline"]["path"] == "before.json"

    # The same run against itself passes; a report without stored rules is judged by its workload file's.
    after = json.loads((project.path / "after.json").read_text())
    del after["items"][0]["rules"]
    (project.path / "old.json").write_text(json.dumps(after))
    result = compare("after.json", "old.json")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["tiny[[]toy[]] *pass*", "memcheck: 1 pass"])

    result = compare("after.json", "missing.json")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["memcheck: error: missing.json: cannot read the report: *"])

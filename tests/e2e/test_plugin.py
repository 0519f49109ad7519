"""The plugin's surface: collection, ids, selection, usage errors, reports, the fixture."""
import json
import os
import sys
import xml.etree.ElementTree as ET

from conftest import dedent, run, workload


def test_without_memcheck_the_plugin_does_nothing(project):
    result = run(project, "suites", "--collect-only", "-q")
    assert "tiny[toy]" not in result.stdout.str()


def test_one_item_per_workload_and_stack_selectable_with_k(project):
    (project.path / "suites" / "two.yaml").write_text(workload("pair", "toy, hf"))
    result = run(project, "--memcheck", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*tiny.yaml::tiny[[]toy[]]", "*two.yaml::pair[[]toy[]]", "*two.yaml::pair[[]hf[]]"])
    result = run(project, "--memcheck", "--collect-only", "-q", "-k", "pair and hf")
    assert "pair[hf]" in result.stdout.str() and "pair[toy]" not in result.stdout.str()


def test_bad_workload_is_a_one_line_usage_error(project):
    (project.path / "suites" / "bad.yaml").write_text(workload("bad").replace("count: 2", "count: -2"))
    result = run(project, "--memcheck")
    assert result.ret == 4  # pytest's usage-error exit code
    err = result.stderr.str()
    assert "ERROR: suites/bad.yaml:11: requests[0].count: must be at least 1, got -2\n" == err
    assert "Traceback" not in err + result.stdout.str()


def test_json_markdown_and_junit_reports(project):
    result = run(project, "--memcheck", "--memcheck-report", "out/r.json", "--memcheck-markdown", "r.md",
                 "--junitxml", "j.xml")
    assert result.ret == 0
    data = json.loads((project.path / "out" / "r.json").read_text())
    assert data["schema"] == "memcheck.report/1" and data["summary"] == {"new": 1}
    item = data["items"][0]
    assert item["metrics"]["gpu.heap_alloc.peak"] == {"value": None, "reason": "no CUDA device on this runner"}
    assert item["floors"]["kv"] > 0 and item["timeline"]
    md = (project.path / "r.md").read_text()
    assert md.startswith("<!-- memcheck-report -->") and "`tiny[toy]` (scaled)" in md
    props = {p.get("name"): p.get("value") for p in ET.parse(project.path / "j.xml").iter("property")}
    assert props["memcheck.verdict"] == "new" and float(props["memcheck.cpu.heap_alloc.peak"]) > 0


MEMCHECK = os.path.join(os.path.dirname(sys.executable), "memcheck")  # the installed console script


def test_console_script_refresh_prints_what_changed(project):
    result = project.run(MEMCHECK, "baseline", "refresh")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*tiny[[]toy[]]: baseline written to baselines/cpu-x86_64/tiny/toy.json: new baseline*"])
    result = project.run(MEMCHECK, "run")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["memcheck: 1 pass"])


def test_fixture_and_marker_measure_python_blocks(project):
    project.makepyfile(test_blocks=dedent("""
        import pytest, torch

        def test_block(memcheck):
            with memcheck():
                x = torch.ones(1024, 1024)
            assert memcheck.measurement.metrics["cpu.heap_alloc.peak"].value == 4 * 2**20

        @pytest.mark.memcheck(thresholds={"cpu.heap_alloc.peak": {"max_increase": "1%"}})
        def test_marked():
            torch.ones(int(__import__("os").environ.get("BLOCK_MIB", "1")) * 2**18)
    """))
    assert run(project, "--memcheck", "test_blocks.py", "--memcheck-update-baselines").ret == 0
    assert (project.path / "baselines/cpu-x86_64/test_blocks.py-test_marked/python.json").is_file()
    assert run(project, "--memcheck", "test_blocks.py").ret == 0
    project._monkeypatch.setenv("BLOCK_MIB", "2")
    result = run(project, "--memcheck", "test_blocks.py")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*test_blocks.py-test_marked[[]python[]]: regressed: cpu.heap_alloc.peak regressed*"])


def test_two_tests_of_one_name_in_two_files_have_a_baseline_each(project):
    """tests/a/test_x.py::test_step and tests/b/test_y.py::test_step: two items, two baselines, both gated; a block
    named alike on purpose (memcheck(name=...)) whose baseline another test recorded is an error naming both."""
    for folder, size in (("a", 1), ("b", 2)):
        (project.path / folder).mkdir()
        (project.path / folder / f"test_{folder}.py").write_text(dedent(f"""
            import os, torch

            def test_step(memcheck):
                with memcheck(name=os.environ.get("BLOCK_NAME")):
                    torch.ones({size} * 2**18)
        """))
    assert run(project, "--memcheck", "a", "b", "--memcheck-update-baselines").ret == 0
    for name in ("a-test_a.py-test_step", "b-test_b.py-test_step"):
        assert (project.path / "baselines/cpu-x86_64" / name / "python.json").is_file()
    result = run(project, "--memcheck", "a", "b", "--memcheck-report", "r.json")
    assert result.ret == 0
    assert [i["verdict"] for i in json.loads((project.path / "r.json").read_text())["items"]] == ["pass", "pass"]

    project._monkeypatch.setenv("BLOCK_NAME", "step")  # both blocks named alike: one baseline, two owners
    assert run(project, "--memcheck", "a", "--memcheck-update-baselines").ret == 0
    result = run(project, "--memcheck", "b")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*step[[]python[]]: error: the baseline * belongs to the test a/test_a.py::test_step, "
                                 "not b/test_b.py::test_step*"])


def test_rounds_are_forked_and_durations_show_where_the_time_went(project):
    result = run(project, "--memcheck", "--memcheck-report", "r.json", "--memcheck-durations", "0")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*memcheck durations*", "item * startup * build * run * teardown * exit * report * total",
                                 "tiny[[]toy[]] *s *s *s *s *s *s *s", "all 1 items *"])
    item = json.loads((project.path / "r.json").read_text())["items"][0]
    assert set(item["phases"]) == {"startup", "build", "warmup", "run", "teardown", "exit", "memory_round", "report"}
    assert "worker process: forked from a fork server that imported torch and transformers once" in item["notes"]
    result = run(project, "--memcheck", "--memcheck-report", "r.json", "--memcheck-no-fork-server")
    item = json.loads((project.path / "r.json").read_text())["items"][0]
    assert result.ret == 0 and item["verdict"] == "new"
    assert ("worker process: a fresh interpreter (the fork server is switched off (--memcheck-no-fork-server))"
            in item["notes"])


def test_n_measures_items_in_parallel_and_marks_their_times_as_contended(project):
    (project.path / "suites" / "two.yaml").write_text(workload("pair", "toy"))
    result = run(project, "--memcheck", "-n", "2", "--memcheck-report", "r.json", "--memcheck-durations", "0")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*2 items were measured in parallel with others (-n)*"])
    items = {i["id"]: i for i in json.loads((project.path / "r.json").read_text())["items"]}
    assert set(items) == {"tiny[toy]", "pair[toy]"}
    for item in items.values():
        assert "under contention" in item["metrics"]["time.wall"]["detail"]
        assert "under contention" not in item["metrics"]["host.rss.peak"].get("detail", "")


def test_console_script_is_quiet_and_writes_every_report(project):
    result = project.run(MEMCHECK, "run", "--html", "r.html", "--junitxml", "j.xml", "--markdown", "r.md")
    assert result.ret == 0
    out = result.stdout.str()
    assert "test session starts" not in out and "warnings summary" not in out, out
    result.stdout.fnmatch_lines(["*tiny[[]toy[]]*new*", "memcheck: 1 new"])
    assert all((project.path / name).is_file() for name in ("r.html", "j.xml", "r.md"))
    assert "test session starts" in project.run(MEMCHECK, "run", "-v").stdout.str()

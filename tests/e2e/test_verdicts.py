"""Every verdict from real runs of a real tiny workload (no mocked measurement)."""
import json

from conftest import run, workload

BASELINE = "baselines/cpu-x86_64/tiny/toy.json"


def report(pytester, name="r.json"):
    return json.loads((pytester.path / name).read_text())


def test_new_pass_regressed_improved(project, monkeypatch):
    # new: no baseline yet, does not fail; recorded by the same run
    result = run(project, "--memcheck", "--memcheck-report", "r.json", "--memcheck-update-baselines")
    assert result.ret == 0 and (project.path / BASELINE).is_file()
    item = report(project)["items"][0]
    assert item["id"] == "tiny[toy]" and item["verdict"] == "new"
    assert item["metrics"]["cpu.heap_alloc.peak"]["value"] > 0
    result.stdout.fnmatch_lines(["*tiny[[]toy[]]: baseline written to*"])

    # nothing changed: pass
    result = run(project, "--memcheck", "--memcheck-report", "r.json")
    assert result.ret == 0, result.stdout.str()
    assert report(project)["items"][0]["verdict"] == "pass"

    # a real change that keeps 16 MiB more tensors alive: regressed, one paragraph, non-zero exit
    monkeypatch.setenv("TOY_EXTRA_MIB", "16")
    result = run(project, "--memcheck", "--memcheck-report", "r.json")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*tiny[[]toy[]]: regressed: cpu.heap_alloc.peak regressed: baseline *, now *, "
                                 "+16.* MiB (+*%), rule max_increase 2%.*"])
    item = report(project)["items"][0]
    assert item["verdict"] == "regressed" and item["failed"]
    failing = [c for c in item["checks"] if c["status"] == "regressed"]
    assert [c["metric"] for c in failing] == ["cpu.heap_alloc.peak"]

    # accept the bigger run as the baseline, then go back: improved, passes, says refresh
    run(project, "--memcheck", "--memcheck-update-baselines")
    monkeypatch.delenv("TOY_EXTRA_MIB")
    result = run(project, "--memcheck", "--memcheck-report", "r.json")
    assert result.ret == 0
    assert report(project)["items"][0]["verdict"] == "improved"
    result.stdout.fnmatch_lines(["*improved*Refresh the baseline*"])


def test_incomparable_names_the_field(project):
    run(project, "--memcheck", "--memcheck-update-baselines")
    path = project.path / BASELINE
    data = json.loads(path.read_text())
    data["environment"]["workload"] = "0123456789abcdef"  # recorded for another workload definition
    path.write_text(json.dumps(data))
    result = run(project, "--memcheck", "--memcheck-report", "r.json")
    assert result.ret == 0
    item = report(project)["items"][0]
    assert item["verdict"] == "incomparable"
    assert [d for d in item["incomparable_fields"] if d.startswith("workload: 0123456789abcdef -> ")]


def test_crash_and_oom_are_errors_and_the_session_goes_on(project):
    many = "workloads:\n" + "".join(
        "  - " + workload(name).replace("\n", "\n    ").rstrip() + "\n" for name in ("crash-a", "oom-b", "fine-c"))
    (project.path / "suites" / "tiny.yaml").write_text(many)
    result = run(project, "--memcheck", "--memcheck-report", "r.json")
    assert result.ret == 1
    verdicts = {i["id"]: (i["verdict"], i["reason"]) for i in report(project)["items"]}
    assert verdicts["crash-a[toy]"][0] == "error" and "SIGSEGV" in verdicts["crash-a[toy]"][1]
    assert verdicts["oom-b[toy]"][0] == "error" and "out of memory" in verdicts["oom-b[toy]"][1]
    assert verdicts["fine-c[toy]"][0] == "new"


def test_strict_fails_new_items(project):
    result = run(project, "--memcheck", "--memcheck-strict")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*--memcheck-strict fails it*"])


def test_corrupt_baseline_is_an_error_kept_by_a_gate_and_replaced_by_a_refresh(project):
    path = project.path / BASELINE
    path.parent.mkdir(parents=True)
    path.write_text("{garbage")
    result = run(project, "--memcheck")
    assert result.ret == 1
    result.stdout.fnmatch_lines([f"*{BASELINE}: corrupt baseline*refresh the baselines to replace it"])
    assert path.read_text() == "{garbage"
    result = run(project, "--memcheck", "--memcheck-update-baselines")
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"*baseline written to {BASELINE}: replaced an unreadable baseline: corrupt baseline*"])
    assert json.loads(path.read_text())["schema"] == "memcheck.baseline/1"

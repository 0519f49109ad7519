"""docs/adding-a-stack.md is true: its example stack, installed as its entry point says, gates a workload.

The stack's code and its `memcheck.stacks` entry are read out of the page itself, so it cannot drift from what
works."""
import json
import re
import sys

from conftest import ROOT, run, workload

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


def guide_page() -> str:
    return (ROOT / "docs" / "adding-a-stack.md").read_text()


def install_readme_stack(site) -> str:
    section = guide_page()
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    entry = tomllib.loads(re.search(r"```toml\n(.*?)```", section, re.S).group(1))
    (name, target), = entry["project"]["entry-points"]["memcheck.stacks"].items()
    module = target.partition(":")[0]
    (site / f"{module}.py").write_text(code)
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[memcheck.stacks]\n{name} = {target}\n")
    return name


def test_the_readme_example_stack_runs_a_workload_and_is_gated(project):
    name = install_readme_stack(project.path / "site")
    (project.path / "suites" / "tiny.yaml").write_text(workload("tiny", name))
    result = run(project, "--memcheck", "--memcheck-update-baselines", "--memcheck-report", "first.json")
    assert result.ret == 0, result.stdout.str()
    item = json.loads((project.path / "first.json").read_text())["items"][0]
    assert item["id"] == f"tiny[{name}]" and item["error"] is None and item["skipped"] is None
    metrics = item["metrics"]
    # Two requests of 8 prompt + 4 new tokens, hidden size 64, float32: a 12 x 64 cache of 4-byte floats each.
    assert metrics["kv.bytes.peak"]["value"] == 12 * 64 * 4
    assert metrics["tokens_per_s"]["value"] > 0 and metrics["ttft"]["value"] > 0 and metrics["tpot"]["value"] > 0
    assert metrics["kv.live_bytes.peak"] == {"value": None, "reason": f"the {name} stack does not report it"}
    assert item["floors"]["weights"] == 128 * 64 * 4  # vocabulary x hidden, float32
    assert (project.path / "baselines" / "cpu-x86_64" / "tiny" / f"{name}.json").is_file()

    result = run(project, "--memcheck", "--memcheck-report", "second.json")  # judged against that baseline
    assert result.ret == 0, result.stdout.str()
    again = json.loads((project.path / "second.json").read_text())["items"][0]
    assert again["verdict"] == "pass" and again["baseline"] is not None
    assert {c["metric"]: c["status"] for c in again["checks"]}["kv.bytes.peak"] == "pass"

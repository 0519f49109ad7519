"""A workload on a user's config.json (an architecture no preset has) gates like any other: real runs."""
import json
import shutil
from pathlib import Path

from conftest import run

CONFIGS = Path(__file__).parents[1] / "models" / "configs"
WORKLOAD = """\
name: mine
model: {config: models/mistral.json, layers: 1}
requests:
  - count: 2
    prompt_tokens: 8
    max_new_tokens: 4
stacks: [toy]
"""


def test_a_config_json_workload_records_passes_regresses_and_changes_identity(project, monkeypatch):
    models = project.mkdir("suites/models")
    shutil.copy(CONFIGS / "mistral.json", models / "mistral.json")
    (project.path / "suites" / "tiny.yaml").write_text(WORKLOAD)
    assert run(project, "--memcheck", "--memcheck-update-baselines").ret == 0
    baseline = json.loads((project.path / "baselines/cpu-x86_64/mine/toy.json").read_text())
    assert baseline["metrics"]["cpu.heap_alloc.peak"]["value"] > 0

    result = run(project, "--memcheck", "--memcheck-report", "r.json", "--memcheck-markdown", "r.md")
    assert result.ret == 0, result.stdout.str()
    item = json.loads((project.path / "r.json").read_text())["items"][0]
    assert item["verdict"] == "pass" and item["scaled"]
    assert item["model"]["config"] == "models/mistral.json" and item["model"]["model_type"] == "mistral"
    assert "Model from its config.json: `models/mistral.json` (mistral, content digest" in \
        (project.path / "r.md").read_text()

    monkeypatch.setenv("TOY_EXTRA_MIB", "16")
    result = run(project, "--memcheck")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*mine[[]toy[]]: regressed: cpu.heap_alloc.peak regressed: *+16.* MiB*"])

    # Another config is another workload: the baseline is not compared with it.
    monkeypatch.delenv("TOY_EXTRA_MIB")
    data = json.loads((models / "mistral.json").read_text())
    data["intermediate_size"] *= 2
    (models / "mistral.json").write_text(json.dumps(data))
    result = run(project, "--memcheck", "--memcheck-report", "r.json")
    assert result.ret == 0
    item = json.loads((project.path / "r.json").read_text())["items"][0]
    assert item["verdict"] == "incomparable" and item["incomparable_fields"][0].startswith("workload: ")

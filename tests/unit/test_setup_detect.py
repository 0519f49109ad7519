"""scripts/setup's choice between the CPU and the GPU set-up, through `--detect` (which installs nothing): a GPU
runner is a machine whose nvidia-smi lists a GPU, unless --cpu or --gpu says otherwise. nvidia-smi is faked on a
PATH that holds only the tools the detection runs, so the machine's own (if any) cannot answer."""
import shutil
import subprocess
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "setup"
TOOLS = ("bash", "dirname", "timeout", "grep")

H200 = 'echo "GPU 0: NVIDIA H200 (UUID: GPU-5b4c1f0e-8d2a-4f3b-9c1d-2e7a6b0c9d11)"'
TWO_H200 = H200 + '; echo "GPU 1: NVIDIA H200 (UUID: GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d)"'
NO_DRIVER = ('echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver. Make sure that the '
             'latest NVIDIA driver is installed and running."; exit 9')
NO_DEVICE = 'echo "No devices were found"; exit 6'


def setup(tmp_path, *args, nvidia_smi=None):
    path = tmp_path / "bin"
    path.mkdir()
    for tool in TOOLS:
        (path / tool).symlink_to(shutil.which(tool))
    if nvidia_smi is not None:
        fake = path / "nvidia-smi"
        fake.write_text(f'#!{shutil.which("bash")}\n[ "$1" = -L ] || exit 2\n{nvidia_smi}\n')
        fake.chmod(0o755)
    return subprocess.run([shutil.which("bash"), str(SETUP), *args], env={"PATH": str(path)}, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("nvidia_smi, device", [(None, "cpu"), (H200, "gpu"), (TWO_H200, "gpu"), (NO_DRIVER, "cpu"),
                                                (NO_DEVICE, "cpu")],
                         ids=["no nvidia-smi", "one GPU", "two GPUs", "driver not loaded", "no GPU listed"])
def test_detects_a_gpu_runner_by_what_nvidia_smi_lists(tmp_path, nvidia_smi, device):
    result = setup(tmp_path, "--detect", nvidia_smi=nvidia_smi)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{device}\n", "")


@pytest.mark.parametrize("args, nvidia_smi, device", [(["--cpu"], H200, "cpu"), (["--gpu"], None, "gpu"),
                                                      (["--no-vllm", "--gpu"], NO_DRIVER, "gpu")])
def test_an_explicit_choice_wins(tmp_path, args, nvidia_smi, device):
    result = setup(tmp_path, *args, "--detect", nvidia_smi=nvidia_smi)
    assert (result.returncode, result.stdout) == (0, f"{device}\n")


def test_an_unknown_option_is_a_usage_error(tmp_path):
    result = setup(tmp_path, "--cuda")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == "usage: scripts/setup [--no-vllm] [--gpu | --cpu] [--detect]"

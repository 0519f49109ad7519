"""Where the GPU tests can run: an sm_90 GPU (the Gluon kernels are Hopper's)."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the checks are the benchmarks' own


def no_hopper() -> str | None:
    """Why these tests cannot run here, or None on an sm_90 GPU."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        return f"{torch.cuda.get_device_name()} is sm_{major}{minor}, not sm_90 (the Gluon kernels are Hopper's)"
    return None

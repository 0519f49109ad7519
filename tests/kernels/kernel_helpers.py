"""Shared pieces of the kernel tests: scattered paged caches, poisoned outputs, dtype error bounds."""
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# ||out - ref|| / ||ref|| against the float32 reference, by input dtype (fp32 accumulation throughout)
REL_ERR_BOUND = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


class RecordedLaunch:
    """Stands in for a Triton kernel (`kernel[grid](*args, **consts)`): keeps the grid and the constexprs of the last
    launch, and launches `kernel` with them where one is given."""

    def __init__(self, kernel=None):
        self.kernel, self.grid, self.consts = kernel, None, None

    def __getitem__(self, grid):
        def launch(*args, **consts):
            self.grid, self.consts = grid, consts
            if self.kernel is not None:
                self.kernel[grid](*args, **consts)
        return launch


def poisoned(like):
    """An output buffer full of NaN: any element a kernel fails to write shows up."""
    return torch.full_like(like, float("nan"))


def assert_close(out, ref):
    assert not torch.isnan(out).any(), "an output element was never written (still NaN)"
    err = ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()
    bound = REL_ERR_BOUND[out.dtype]
    assert err < bound, f"relative error {err:.2e} over the {out.dtype} bound {bound:.0e}"


def scattered_block_table(lengths, block_size, gen, spare=3):
    """int32 block tables whose blocks lie at random places in a cache of just enough blocks
    (plus `spare`); the padding past each sequence's blocks points at real blocks too."""
    per_seq = [-(-n // block_size) for n in lengths]
    width = max(max(per_seq), 1)
    num_blocks = sum(per_seq) + spare
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.randint(0, num_blocks, (len(lengths), width), generator=gen, dtype=torch.int32)
    at = 0
    for i, n in enumerate(per_seq):
        table[i, :n] = perm[at:at + n].to(torch.int32)
        at += n
    return table, num_blocks


def randn(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def compiled_in_a_child(child, tmp_path):
    """Run a CHILD script (compiled for sm_90, a fresh Triton cache) and read the JSON it prints last."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    code = child.format(root=str(ROOT), scripts=str(ROOT / "scripts"))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])

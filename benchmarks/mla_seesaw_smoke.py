"""The seesaw's first runs (work in progress): one small case a process, so a wrong mbarrier phase (a hang) is
killed by the caller's timeout and the cases before it still report. Prints the case and its error against the
float32 reference.

    timeout 30 python benchmarks/mla_seesaw_smoke.py 64,64 2     # lengths, programs
"""
import sys
import os

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_h200 import bf16, rel_err  # noqa: E402
from mla_hopper_h200 import VARIANTS, scattered  # noqa: E402
from kernels import mla, reference  # noqa: E402

lengths = [int(n) for n in sys.argv[1].split(",")]
programs = int(sys.argv[2])
gen = torch.Generator().manual_seed(0)
table, num_blocks = scattered(lengths, 16, gen)
seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
q_lat, q_pe, cache = bf16(len(lengths), 128, 512), bf16(len(lengths), 128, 64), bf16(num_blocks, 16, 576)
scale = 192 ** -0.5
ref = reference.mla_decode(q_lat.float(), q_pe.float(), cache.float(), table, seq_lens, scale)
out = torch.full_like(q_lat, float("nan"))
mla.mla_decode(q_lat, q_pe, cache, table, seq_lens, scale, out=out, config=VARIANTS["seesaw"], num_programs=programs)
torch.cuda.synchronize()
print(f"seesaw {sys.argv[1]} programs {programs}: nan {out.isnan().any().item()} rel_err {rel_err(out, ref):.2e}",
      flush=True)

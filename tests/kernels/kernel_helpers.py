"""Shared pieces of the kernel tests: scattered paged caches, poisoned outputs, dtype error bounds."""
import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# ||out - ref|| / ||ref|| against the float32 reference, by input dtype (fp32 accumulation throughout)
REL_ERR_BOUND = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


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


# A batch whose split cuts every way (block_n 16 on the CPU: 19 tiles per unit, in 7 ranges): sequences 0 and 5 cut
# over 3 programs, 2 and 3 over 2, ranges 2, 3 and 4 each holding two cut sequences (their first and their last),
# sequences 1 and 6 empty; CUT_HELD: the ranges holding each sequence.
CUT_LENGTHS, CUT_RANGES = [100, 0, 40, 45, 3, 90, 0, 30], 7
CUT_HELD = [[0, 1, 2], [], [2, 3], [3, 4], [4], [4, 5, 6], [], [6]]


def programs_holding(lengths, block_n, ranges):
    """Per sequence, the ranges j of a unit's tile line that hold its tiles: kernels/work_split.py's even split
    (range j = [j*T//R, (j+1)*T//R) of T tiles), redone here so a test can show what its case cuts."""
    tiles = [-(-n // block_n) for n in lengths]
    total = sum(tiles)
    bounds = [j * total // ranges for j in range(ranges + 1)]
    held, start = [], 0
    for t in tiles:
        held.append([j for j in range(ranges) if t and bounds[j] < start + t and bounds[j + 1] > start])
        start += t
    return held


def run_programs_in_reverse(monkeypatch):
    """Make the interpreter run a launch's programs last to first (grid axis 0), as a GPU may finish them: the
    program that merges a cut sequence's partials is then its first, not its last."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    real = builder.set_grid_idx
    monkeypatch.setattr(builder, "set_grid_idx", lambda x, y, z: real(builder.grid_dim[0] - 1 - x, y, z))


def tickets_left(device=torch.device("cpu")):
    """The ticket counters' sum: every launch must leave them at zero (kernels/tickets.py)."""
    from kernels import tickets

    return int(tickets.counters(device, 0, "tests").abs().sum())

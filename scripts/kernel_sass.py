"""What the H200 would run of a kernel's PTX, read on a CPU machine: registers and spills (ptxas -v), and the hot
loop's local-memory traffic (nvdisasm). Triton's bundled ptxas and nvdisasm do the work; no GPU is needed.

Spill bytes alone do not say whether a kernel is slowed: spills in its prologue or epilogue cost little. The hot loop
is the innermost loop that runs tensor-core instructions (HMMA, HGMMA); an LDL or STL there is paid every iteration
(MLA decode's 32-head blocks: 23 LDL and 16 STL an iteration, 11.9M local-memory requests at b256 x 4K under Nsight
Compute)."""
from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import triton

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
ADDRESS = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*)$")
LABEL = re.compile(r"^\s*\.?(L_x_\d+):")
BACKWARD_BRANCH = re.compile(r"\bBRA\b.*?\.?(L_x_\d+)")


def assemble(ptx: str, arch: str = "sm_90a") -> tuple[dict, str]:
    """ptxas, then nvdisasm: ({registers, spill_stores, spill_loads} in registers a thread and bytes), the SASS."""
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        ptxas = subprocess.run([str(BIN / "ptxas"), "-v", "--gpu-name", arch, str(src), "-o", str(cubin)],
                               capture_output=True, text=True, check=True)
        sass = subprocess.run([str(BIN / "nvdisasm"), "-c", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
    return ptxas_info(ptxas.stderr), sass


def ptxas_info(verbose: str) -> dict:
    """The numbers of `ptxas -v`'s report."""
    def number(pattern):
        found = re.search(pattern, verbose)
        return int(found.group(1)) if found else 0
    return {"registers": number(r"Used (\d+) registers"), "spill_stores": number(r"(\d+) bytes spill stores"),
            "spill_loads": number(r"(\d+) bytes spill loads")}


def loops(sass: str) -> list[dict]:
    """Every loop (a backward branch's range): its first and last address, instructions, HMMA/HGMMA, LDL and STL."""
    labels, instructions, pending = {}, [], []
    for line in sass.splitlines():
        label = LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        found = ADDRESS.match(line)
        if found:
            address = int(found.group(1), 16)
            labels.update((name, address) for name in pending)
            pending = []
            instructions.append((address, found.group(2)))
    found_loops = []
    for address, text in instructions:
        branch = BACKWARD_BRANCH.search(text)
        if branch and labels.get(branch.group(1), address + 1) <= address:
            body = [t for a, t in instructions if labels[branch.group(1)] <= a <= address]
            found_loops.append({"first": labels[branch.group(1)], "last": address, "instructions": len(body),
                                "mma": sum(bool(re.search(r"\bH(G)?MMA", t)) for t in body),
                                "LDL": sum(bool(re.search(r"\bLDL\b", t)) for t in body),
                                "STL": sum(bool(re.search(r"\bSTL\b", t)) for t in body)})
    return found_loops


def hot_loop(sass: str, min_mma: int = 1) -> dict | None:
    """The innermost loop with at least min_mma tensor-core instructions (a backward branch's range): its
    instructions, HMMA/HGMMA, LDL and STL; None where no loop runs them."""
    with_mma = [loop for loop in loops(sass) if loop["mma"] >= min_mma]
    return min(with_mma, key=lambda loop: loop["instructions"]) if with_mma else None


def tile_loops(sass: str, min_mma: int = 1) -> list[dict]:
    """The smallest loops with at least min_mma tensor-core instructions that overlap no smaller one: a
    warp-specialized kernel's tile loop in each partition. (An mbarrier wait's retry, placed after the kernel's body,
    branches back into a loop and reads as a larger loop overlapping it.)"""
    taken = []
    for loop in sorted((loop for loop in loops(sass) if loop["mma"] >= min_mma), key=lambda loop: loop["instructions"]):
        if all(loop["last"] < other["first"] or other["last"] < loop["first"] for other in taken):
            taken.append(loop)
    return sorted(taken, key=lambda loop: loop["first"])

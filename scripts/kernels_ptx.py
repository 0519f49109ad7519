"""Compile every paged-attention kernel for the H200 (sm_90) on a CPU machine and print a digest of its PTX.

Usage: python scripts/kernels_ptx.py [--dump DIR] [--sass]

--sass also assembles each kernel (Triton's ptxas and nvdisasm, scripts/kernel_sass.py) and prints its registers, its
spill bytes and the local-memory loads and stores in its hot loop (the innermost loop on the tensor cores).

No GPU is needed: the public wrappers are called on small CPU tensors with the launch intercepted, and
each launch (its argument types and constexprs) is compiled by Triton's NVIDIA backend for sm_90. A
refactor of kernel code that leaves every digest unchanged leaves the code the GPU runs unchanged, so
its measured H200 numbers still stand. Dots are compiled as the GPU's (UPCAST off: bf16 on the tensor cores), the
tiles are the CPU path's (block_n 16), not the tuned GPU ones; arguments
are specialized as the JIT does at launch (alignment, divisibility by 16), so loops are pipelined as on the GPU.
"""
from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import JITFunction, mangle_type

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import kernel_sass  # noqa: E402
from memcheck.kernels import (activation, cache_write, decode, mla, mla_mha, mla_seesaw, moe, norm,  # noqa: E402
                     prefill, prefill_hopper, rotary, router, skinny_gemm, stamps)

H200 = GPUTarget("cuda", 90, 32)
TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32", torch.int64: "i64"}
OPTIONS = ("num_warps", "num_stages", "maxnreg", "enable_fp_fusion")
GPU_MOE_TILES = {k: moe.DEFAULT_CONFIG[k] for k in ("block_n", "block_k")}  # the GPU's tiles, not the CPU's


def arg_type(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -2**31 <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    return mangle_type(value)  # a TMA descriptor: its block, dtype and layout, as the JIT names it


def capture(call) -> list[tuple[JITFunction, dict, dict]]:
    """The launches `call` makes, not run: (kernel, arguments by name, compile options)."""
    launches = []

    def record(self, *args, grid, warmup, **kwargs):
        options = {k: kwargs.pop(k) for k in OPTIONS if k in kwargs}
        launches.append((self, {**dict(zip(self.arg_names, args)), **kwargs}, options))

    real = JITFunction.run
    JITFunction.run = record
    try:
        call()
    finally:
        JITFunction.run = real
    return launches


def divisible_by_16(value) -> bool:
    """What Triton's JIT specializes on at launch: 16-byte aligned pointers and integers divisible by 16. Without
    it the compiler cannot prove wide loads aligned, and pipelines no loop (no cp.async): not the GPU's code."""
    if isinstance(value, torch.Tensor):
        return value.data_ptr() % 16 == 0
    return isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0


def compile_ptx(kernel: JITFunction, values: dict, options: dict) -> str:
    """The kernel's PTX for sm_90, without what moves when code moves (line locations, debug sections)."""
    return stable_ptx(compile_kernel(kernel, values, options).asm["ptx"])


def compile_kernel(kernel: JITFunction, values: dict, options: dict):
    if "UPCAST" in values:  # the launch was made from CPU tensors: bf16 dots widened for the interpreter, not the GPU
        values = {**values, "UPCAST": False}
    constexprs = {kernel.arg_names[i]: values[kernel.arg_names[i]] for i in kernel.constexprs}
    signature = {name: "constexpr" if name in constexprs else arg_type(values[name]) for name in kernel.arg_names}
    fixed = {kernel.arg_names[i] if isinstance(i, int) else i for i in kernel.do_not_specialize}  # never specialized
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
             if name not in constexprs and name not in fixed and divisible_by_16(values[name])}
    source = GluonASTSource if kernel.is_gluon() else ASTSource
    return triton.compile(source(kernel, signature, constexprs, attrs), target=H200, options=options)


def stable_ptx(ptx: str) -> str:
    # Line locations and the debug sections move when code moves; the instructions are what the GPU runs.
    ptx = ptx.split("\t.section\t.debug", 1)[0]
    ptx = re.sub(r"^(\s*\.(loc|file)\b.*|\$L__tmp\d+:)$", "", ptx, flags=re.M)
    return re.sub(r"\n\s*\n+", "\n", ptx)


def launches() -> dict[str, tuple]:
    torch.manual_seed(0)
    bf16 = torch.bfloat16
    seqs, block, blocks = 3, 16, 24
    lens = torch.tensor([40, 17, 70], dtype=torch.int32)
    table = torch.randperm(blocks, dtype=torch.int32)[: seqs * 8].view(seqs, 8)
    k = torch.randn(blocks, block, 2, 128, dtype=bf16)
    v = torch.randn_like(k)
    latent = torch.randn(blocks, block, 576, dtype=bf16)
    gapped = torch.randn(blocks, block + 1, 576, dtype=bf16)[:, :block]
    cu_q = torch.tensor([0, 5, 6, 14], dtype=torch.int32)
    out = {}
    cases = {
        "decode gqa 8/2": lambda: decode.paged_decode(torch.randn(seqs, 8, 128, dtype=bf16), k, v, table, lens,
                                                      0.088, num_programs=4),
        "decode gqa 8/2, time stamps (memcheck/kernels/stamps.py)": lambda: decode.paged_decode(
            torch.randn(seqs, 8, 128, dtype=bf16), k, v, table, lens, 0.088, num_programs=4,
            config={"stamps": torch.zeros(4, stamps.SLOTS, dtype=torch.int64)}),
        "prefill gqa 8/2": lambda: prefill.paged_prefill(torch.randn(14, 8, 128, dtype=bf16), k, v, table, cu_q, lens,
                                                         0.088, max_q_len=8),
        "prefill gqa 8/2, GPU config": lambda: prefill.paged_prefill(
            torch.randn(14, 8, 128, dtype=bf16), k, v, table, cu_q, lens, 0.088, max_q_len=8, config=prefill.CONFIG),
        "prefill gqa 8/2, GPU config, a KV head's group per program": lambda: prefill.paged_prefill(
            torch.randn(14, 8, 128, dtype=bf16), k, v, table, cu_q, lens, 0.088, max_q_len=8,
            config={**prefill.CONFIG, "one_head_per_program": False}),
        "mla 16 heads, rank 512 + rope 64": lambda: mla.mla_decode(
            torch.randn(seqs, 16, 512, dtype=bf16), torch.randn(seqs, 16, 64, dtype=bf16), latent, table, lens,
            0.072, num_programs=4),
        "mla 128 heads, 64-head blocks on 8 warps (the CPU path's 16-token tiles)": lambda: mla.mla_decode(
            torch.randn(seqs, 128, 512, dtype=bf16), torch.randn(seqs, 128, 64, dtype=bf16), latent, table, lens,
            0.072, num_programs=4, config=mla.MANY_HEADS_CONFIG),
        # the public entry point takes 16-token tiles off the GPU: the GPU's 64 put back (GPU_TILES below)
        "mla 128 heads, 64-head blocks on 8 warps, GPU tiles": lambda: mla.mla_decode(
            torch.randn(seqs, 128, 512, dtype=bf16), torch.randn(seqs, 128, 64, dtype=bf16), latent, table, lens,
            0.072, num_programs=4, config=mla.MANY_HEADS_CONFIG),
        # the GPU path only (Gluon: the interpreter cannot run it), called directly with the CPU's tensors
        "mla 128 heads, Hopper seesaw (Gluon, warp-specialized)": lambda: mla_seesaw.mla_decode_seesaw(
            torch.randn(seqs, 128, 512, dtype=bf16), torch.randn(seqs, 128, 64, dtype=bf16), latent, table, lens,
            0.1, torch.empty(seqs, 128, 512, dtype=bf16), min_tiles=2, num_programs=4),
        # blocks TMA cannot copy a box each (a gap after each block: mla_seesaw.tma_loads_fit), copied by cp.async
        "mla 128 heads, Hopper seesaw, cp.async loads": lambda: mla_seesaw.mla_decode_seesaw(
            torch.randn(seqs, 128, 512, dtype=bf16), torch.randn(seqs, 128, 64, dtype=bf16), gapped, table, lens,
            0.1, torch.empty(seqs, 128, 512, dtype=bf16), min_tiles=2, num_programs=4),
        "mla 128 heads, Hopper seesaw, time stamps": lambda: mla_seesaw.mla_decode_seesaw(
            torch.randn(seqs, 128, 512, dtype=bf16), torch.randn(seqs, 128, 64, dtype=bf16), latent, table, lens,
            0.1, torch.empty(seqs, 128, 512, dtype=bf16), min_tiles=2, num_programs=4,
            stamps=torch.zeros(4, stamps.SLOTS, dtype=torch.int64)),
        "prefill gqa 8/2, Hopper (Gluon, warp-specialized)": lambda: prefill_hopper.paged_prefill_hopper(
            torch.randn(14, 8, 128, dtype=bf16), k, v, table, cu_q, lens, 0.1, (1, 8, 3), 0,
            torch.empty(14, 8, 128, dtype=bf16)),
        "prefill gqa 8/2, Hopper, time stamps": lambda: prefill_hopper.paged_prefill_hopper(
            torch.randn(14, 8, 128, dtype=bf16), k, v, table, cu_q, lens, 0.1, (1, 8, 3), 0,
            torch.empty(14, 8, 128, dtype=bf16), stamps=torch.zeros(24, 6, dtype=torch.int64)),
        "mla prefill decompressed, Hopper (Gluon, warp-specialized), the stack's q views": lambda: (
            lambda q: prefill_hopper.mla_prefill_hopper(
                q[..., :128], q[..., 128:], torch.randn(40, 16, 256, dtype=bf16), latent.view(-1, 576)[:40, 512:],
                cu_q, torch.tensor([0, 5, 6, 40]), 0.1, (1, 16, 3), 0, torch.empty(14, 16, 128, dtype=bf16)))(
            torch.randn(14, 16, 192, dtype=bf16)),
        "mla prefill 16 heads, rank 512 + rope 64": lambda: mla.mla_prefill(
            torch.randn(14, 16, 512, dtype=bf16), torch.randn(14, 16, 64, dtype=bf16), latent, table, cu_q, lens,
            0.072, max_q_len=8, config=mla.PREFILL_CONFIG),
        "mla prefill decompressed, 16 heads, nope 128 + rope 64, v 128, GPU tiles": lambda: mla_mha.mla_mha_prefill(
            torch.randn(14, 16, 128, dtype=bf16), torch.randn(14, 16, 64, dtype=bf16), latent, table, cu_q, lens,
            torch.randn(16 * 256, 512, dtype=bf16), 0.072, max_q_len=8, config=mla_mha.CONFIG),
        "mla prefill decompressed in windows of 16 context tokens, GPU tiles": lambda: mla_mha.mla_mha_prefill(
            torch.randn(14, 16, 128, dtype=bf16), torch.randn(14, 16, 64, dtype=bf16), latent, table, cu_q, lens,
            torch.randn(16 * 256, 512, dtype=bf16), 0.072, max_q_len=8, config=mla_mha.CONFIG, window=16),
        "write kv": lambda: cache_write.write_kv(torch.randn(4, 2, 128, dtype=bf16), torch.randn(4, 2, 128, dtype=bf16),
                                                 k, v, torch.arange(4, dtype=torch.int64)),
        "rotate q, k and write k/v, gqa 28/4 x 128": lambda: cache_write.rotate_and_write_kv(
            torch.randn(4, 36 * 128, dtype=bf16), 28, 4, torch.randn(4, 64, dtype=bf16), torch.randn(4, 64, dtype=bf16),
            False, torch.randn(blocks, block, 4, 128, dtype=bf16), torch.randn(blocks, block, 4, 128, dtype=bf16),
            torch.arange(4, dtype=torch.int64)),
        "write latent (normalised, rotated) and rotate q's 16 rope heads": lambda: cache_write.write_latent(
            torch.randn(4, 576, dtype=bf16), torch.randn(512, dtype=bf16), 1e-6, torch.randn(4, 32), torch.randn(4, 32),
            True, latent, torch.arange(4, dtype=torch.int64), q_pe=torch.randn(4, 16, 192, dtype=bf16)[..., 128:]),
        "rms norm + residual 3584": lambda: norm.rms_norm(
            torch.randn(4, 3584, dtype=bf16), torch.randn(3584, dtype=bf16), 1e-6,
            residual=torch.randn(4, 3584, dtype=bf16)),
        "rotary neox 28 x 128": lambda: rotary.rotary(
            torch.randn(4, 28, 128, dtype=bf16), torch.randn(4, 64, dtype=bf16), torch.randn(4, 64, dtype=bf16), False),
        "rotary interleaved 16 x 64": lambda: rotary.rotary(torch.randn(4, 16, 64, dtype=bf16), torch.randn(4, 32),
                                                            torch.randn(4, 32), True),
        "silu * up 18944": lambda: activation.silu_mul_(torch.randn(4, 2 * 18944, dtype=bf16)),
        "linear 8 rows, 3584 -> 4608 + bias, K split 4": lambda: skinny_gemm.linear(
            torch.randn(8, 3584, dtype=bf16), torch.randn(4608, 3584, dtype=bf16), torch.randn(4608, dtype=bf16),
            tiles=skinny_gemm.Tiles(block_n=64, block_k=128, split=4, warps=4, stages=4)),
        "linear 32 rows, 2048 -> 3648, no split": lambda: skinny_gemm.linear(
            torch.randn(32, 2048, dtype=bf16), torch.randn(3648, 2048, dtype=bf16),
            tiles=skinny_gemm.Tiles(block_n=32, block_k=256, split=1, warps=4, stages=4)),
        "moe 8 experts, top 2, 2 shared": lambda: moe.fused_moe(
            torch.randn(5, 256, dtype=bf16), torch.randn(8, 2 * 96, 256, dtype=bf16),
            torch.randn(8, 256, 96, dtype=bf16), torch.rand(5, 2), torch.randint(0, 8, (5, 2)),
            torch.randn(2 * 2 * 96, 256, dtype=bf16), torch.randn(256, 2 * 96, dtype=bf16), config=GPU_MOE_TILES),
        "router greedy 64 experts, top 6": lambda: router.route(
            torch.randn(4, 2048, dtype=bf16), torch.randn(64, 2048, dtype=bf16), None, method="greedy", top_k=6,
            n_group=1, topk_group=1, normalise=False, scaling=1.0),
        "router noaux_tc 256 experts in 8 groups, top 8": lambda: router.route(
            torch.randn(4, 7168, dtype=bf16), torch.randn(256, 7168, dtype=bf16), torch.rand(256), method="noaux_tc",
            top_k=8, n_group=8, topk_group=4, normalise=True, scaling=2.5),
    }
    gpu_tiles = {"mla 128 heads, 64-head blocks on 8 warps, GPU tiles": {"BLOCK_N": mla.MANY_HEADS_CONFIG["block_n"]}}
    for case, call in cases.items():
        for kernel, values, options in capture(call):
            values = {**values, **gpu_tiles.get(case, {})}  # decode and its combine count the same tiles
            out[f"{case}: {kernel.__name__}"] = (kernel, values, options)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dump", type=Path, help="also write each kernel's PTX here")
    parser.add_argument("--sass", action="store_true", help="also registers, spills and the hot loop's LDL/STL")
    args = parser.parse_args()
    rows = []
    for name, (kernel, values, options) in launches().items():
        raw = compile_kernel(kernel, values, options).asm["ptx"]
        ptx = stable_ptx(raw)
        row = [name, hashlib.sha256(ptx.encode()).hexdigest()[:16], str(ptx.count("\n"))]
        if args.sass:
            info, sass = kernel_sass.assemble(raw)
            loop = kernel_sass.hot_loop(sass)
            row += [str(info["registers"]), f"{info['spill_stores']}/{info['spill_loads']}",
                    f"{loop['LDL']}/{loop['STL']} of {loop['instructions']}" if loop else "-"]
        rows.append(row)
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / (re.sub(r"\W+", "_", name).strip("_") + ".ptx")).write_text(ptx)
    header = ["kernel (sm_90)", "ptx sha256", "lines"] + (["regs", "spill B st/ld", "hot loop LDL/STL"] * args.sass)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())

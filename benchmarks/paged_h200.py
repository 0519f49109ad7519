"""The paged stack on the H200, in one device call: memory against the floors and against stock
transformers, first-step logits against stock in bf16, and token equality on the GPU kernels.

    PYTHONUNBUFFERED=1 python benchmarks/paged_h200.py [--out DIR]
    python benchmarks/paged_h200.py --dry-run      # CPU smoke test of this script (scaled-down model)

1. Memory, through the harness (a worker process per item, collectors and all), full R1-Distill-Qwen-7B
   preset in bf16, stacks hf and paged: batch 8 x (2048 prompt + 128 new), and one 32K-context request
   (32640 prompt + 128 new). Peak above weights = gpu.heap_alloc.peak - weights. Bars: paged within
   1.3x of (KV floor + its declared workspace), and at least 2.5x below hf.
2. First-step logits, batch of 16 x 512-token prompts in bf16: hf and paged (same weights) each against
   a float32 evaluation of the same weights, and against each other. Bar: paged's error is within
   bf16 error, i.e. no more than 1.5x stock's own bf16 error, and wherever its top-1 differs from float32's
   the two are a near tie (float32's margin between them within stock's own bf16 error on that row).
3. Greedy tokens, float32, the three families scaled down (tests/paged), hf vs paged on the Triton
   kernels, paged with CUDA graphs and without (engine.cuda_graphs false): the first 16 tokens of every
   request equal.
4. Decode step time (section `decode`), bf16, R1-Distill-Qwen-7B at batch 1, 8, 32 and DeepSeek-V2-Lite at
   batch 8, 32, 512-token prompts, against its floor = (weight bytes the step reads + KV bytes it reads) /
   measured device copy bandwidth. The step as the engine serves (Engine.advance: scheduling, packing and
   launching step n+1 while the GPU runs step n, pending.py): wall time of consecutive steps / steps, the
   first step's host part included. Beside it the median of single steps synced before and after (the
   host's part unhidden), with CUDA graphs and without. Weights read: every parameter but the embedding
   table (its B rows only); for MoE only the experts the step's routing touches (counted per layer on the
   eager steps). Bar: the engine's step with graphs <= 1.5x floor. Beside it stock transformers' decode
   step (generate, static batch, same prompts) and the graph/eager token agreement on the same steps.
5. Suite items (section `suite`), full profile, collectors without the host heap, hf (warmed up) and paged:
   r1-staggered-finish and v2-lite-mixed (--suite-items: others). Bar: paged tokens/s >= 3x hf; peak above
   weights within 1.3x of (KV floor + declared workspace).
6. Kernel sweeps: first the skinny GEMM's tiles on the decode step's products against cuBLAS (section
   `skinny_gemm`: the tiles that win are installed for every later section and written to
   skinny_gemm_tiles.json); before the decode section the decode kernels' least tiles per range (section `decode_split`)
   and the two-launch MoE router against torch's (section `router`).
7. Where a VL item's paged wall goes (section `vl_phases`, --vl-items, the ci profile on a dry run): the paged stack
   built and warmed up in this process as the harness does, run once plainly and once split into the towers,
   prefill-containing steps, graph-replayed and eager decode-only steps and the rest of the engine loop (calls,
   tokens, seconds; benchmarks/engine_phases.py), no collectors; then the hf stack's plain run for the ratio.
Writes paged_h200.json and paged_h200.log to DIR ($OUT on the device machine); prints a short table last.
"""
import argparse
import copy
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "paged")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from memcheck import project as config  # noqa: E402
from memcheck import stacks, workload  # noqa: E402
from memcheck.devices import resolve_device  # noqa: E402

GB = 1e9
LOG: list[str] = []

FULL = {}  # the preset as published
SCALED = dict(layers=2, hidden_size=256, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=2048)  # --dry-run
SCALED_MOE = dict(layers=2, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                  num_attention_heads=4, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                  n_routed_experts=16, num_experts_per_tok=2, vocab_size=2048)


def say(*parts) -> None:
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    LOG.append(line)


def make(directory, name, model, requests, dtype, engine=None):
    doc = {"name": name, "model": {"preset": "r1-distill-qwen-7b", "dtype": dtype, **model},
           "requests": requests, "stacks": ["hf", "paged"], "engine": engine or {"max_num_batched_tokens": 2048}}
    import yaml

    path = Path(directory) / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return workload.load_file(str(path), None, stacks.names(), config.load(ROOT).thresholds)[0]


def measured(wl, stack, device):
    """One harness measurement without the host heap, in a fresh worker process as `pytest --memcheck` measures an
    item (in this process the peaks would count what earlier sections left allocated): (measurement, metric values,
    heap peak, seconds)."""
    from memcheck.runner import Settings, _measure_in_worker

    t = time.perf_counter()
    settings = Settings(device=str(device), rootdir=str(ROOT), python_heap=False, cpu_tensors=device.type == "cpu",
                        fork_server=False)
    m = _measure_in_worker(wl, stack, settings, memory_round=True)  # (the round that takes cpu_tensors as set)
    metric = {k: v.value for k, v in m.metrics.items()}
    peak = metric.get("gpu.heap_alloc.peak") if device.type == "cuda" else metric.get("cpu.heap_alloc.peak")
    return m, metric, peak, round(time.perf_counter() - t, 1)


def memory(wl, device) -> dict:
    rows = {}
    for stack in ("hf", "paged"):
        m, metric, peak, seconds = measured(wl, stack, device)
        weights = m.floors.get("weights")
        rows[stack] = {
            "error": m.error, "seconds": seconds, "peak": peak, "weights": weights,
            "above_weights": None if peak is None or weights is None else peak - weights,
            "kv_floor": m.floors["kv"], "workspace": m.floors.get("workspace"), "metrics": metric,
            "notes": [n for n in m.notes if not n.startswith("Traceback")][:4],
        }
        say(f"  {wl.name}[{stack}]: {rows[stack]['seconds']} s, peak {fmt(peak)}, weights {fmt(weights)}, "
            f"above weights {fmt(rows[stack]['above_weights'])}, kv.bytes.peak {fmt(metric.get('kv.bytes.peak'))}, "
            f"kv.page_footprint {metric.get('kv.page_footprint')}, tokens/s {num(metric.get('tokens_per_s'))}, "
            f"error {m.error and m.error.message[:300]}")
        for note in rows[stack]["notes"]:
            say("    note:", note[:400])
    hf, paged = rows["hf"], rows["paged"]
    if hf["above_weights"] and paged["above_weights"]:
        declared = paged["kv_floor"] + paged["workspace"]
        rows["paged_vs_declared"] = paged["above_weights"] / declared
        rows["hf_over_paged"] = hf["above_weights"] / paged["above_weights"]
        rows["pass"] = rows["paged_vs_declared"] <= 1.3 and rows["hf_over_paged"] >= 2.5
    return rows


def logits_agreement(wl, device) -> dict:
    """hf and paged (sharing the weights) on the same prompts; both against float32 on those weights."""
    from memcheck.models import build_hf_model, prompt_ids, torch_dtype
    from memcheck.stacks.paged.config import EngineConfig, ModelSpec
    from memcheck.stacks.paged.engine import Engine
    from memcheck.stacks.paged.model import CausalLM
    from memcheck.stacks.paged.request import Request

    dtype = torch_dtype(wl, device)
    hf = build_hf_model(wl, device)
    spec = ModelSpec.from_hf(hf.config)
    requests = wl.request_list()
    prompts = prompt_ids(wl, spec.vocab)
    ids = torch.tensor(prompts, device=device)
    with torch.inference_mode():
        hf_logits = hf(input_ids=ids).logits[:, -1].float()
        cfg = EngineConfig.from_workload(wl, requests)
        model = CausalLM.from_hf(hf, spec)
        engine = Engine(model, spec, cfg, dtype, device)
        seqs = [Request(i, p, r.max_new_tokens, 0, cfg.block_size) for i, (r, p) in enumerate(zip(requests, prompts))]
        for s in seqs:
            engine.scheduler.add(s)
        batch = engine.scheduler.schedule()
        assert [n for _, n in batch] == [len(p) for p in prompts], "all prompts in one pass"
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        _, paged_logits = engine.runner.step(batch, return_logits=True)
        one_pass = torch.cuda.max_memory_allocated() - before if device.type == "cuda" else None
        from memcheck.stacks.paged.workspace import declare
        from memcheck.kernels.dispatch import sm_count

        declared = declare(spec, cfg, requests, torch.empty(0, dtype=dtype).element_size(),
                           sm_count(device) if device.type == "cuda" else None)
        del engine, model
        reference = copy.deepcopy(hf).float()
        del hf
        gc.collect()
        ref_logits = reference(input_ids=ids).logits[:, -1].float()
        del reference
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    def top1_misses(logits):
        """Rows whose top-1 differs from float32's, and whether each is a near tie: float32's margin
        between the two picks no larger than stock's own bf16 error on that row."""
        misses = []
        for r in (logits.argmax(-1) != ref_logits.argmax(-1)).nonzero().flatten().tolist():
            margin = float(ref_logits[r].max() - ref_logits[r, logits[r].argmax()])
            noise = float((hf_logits[r] - ref_logits[r]).abs().max())
            misses.append({"row": r, "fp32_margin": margin, "bf16_noise": noise, "near_tie": margin <= noise})
        return misses

    out = {
        "prompts": len(prompts), "prompt_tokens": len(prompts[0]), "dtype": str(dtype),
        "rel_err_hf_vs_fp32": rel(hf_logits, ref_logits), "rel_err_paged_vs_fp32": rel(paged_logits, ref_logits),
        "rel_err_paged_vs_hf": rel(paged_logits, hf_logits),
        "max_abs_paged_vs_hf": float((paged_logits - hf_logits).abs().max()),
        "logit_scale": float(ref_logits.abs().max()),
        "paged_one_pass_transient": one_pass, "declared_workspace": declared.total,
        "declared_parts": declared.parts, "budget_tokens": cfg.max_num_batched_tokens,
        "top1_paged_eq_hf": int((paged_logits.argmax(-1) == hf_logits.argmax(-1)).sum()),
        "top1_paged_misses_vs_fp32": top1_misses(paged_logits), "top1_hf_misses_vs_fp32": top1_misses(hf_logits),
    }
    out["pass"] = (out["rel_err_paged_vs_fp32"] <= 1.5 * max(out["rel_err_hf_vs_fp32"], 1e-6)
                   and all(m["near_tie"] for m in out["top1_paged_misses_vs_fp32"]))
    say("  logits:", json.dumps(out))
    return out


def tiny_tokens(directory, device) -> dict:
    from memcheck.stacks.hf import HFStack
    from memcheck.stacks.paged import PagedStack
    from paged_helpers import ENGINE, FAMILIES, make_workload, run_stack

    out = {}
    for preset in FAMILIES:
        wl = make_workload(Path(directory), preset, name=f"tiny-{preset}")
        eager_wl = make_workload(Path(directory), preset, name=f"tiny-{preset}-eager",
                                 engine={**ENGINE, "cuda_graphs": False})
        hf, _ = run_stack(HFStack, wl, device.type)
        paged, _ = run_stack(PagedStack, wl, device.type)
        eager, _ = run_stack(PagedStack, eager_wl, device.type)
        same = [a[:16] == b[:16] for a, b in zip(hf.outputs, paged.outputs)]
        same_eager = [a[:16] == b[:16] for a, b in zip(hf.outputs, eager.outputs)]
        graphs = [n for n in paged.notes if "CUDA graphs" in n or "eagerly" in n]
        out[preset] = {"requests": len(same), "equal": sum(same), "equal_eager": sum(same_eager),
                       "blocks_unreclaimed": paged.metrics["kv.blocks_unreclaimed"].value,
                       "graphs_note": graphs[0][-160:] if graphs else None}
        say(f"  tokens {preset}: graphs {sum(same)}/{len(same)}, eager {sum(same_eager)}/{len(same)} requests equal "
            f"to hf over 16 tokens, blocks unreclaimed {out[preset]['blocks_unreclaimed']}; "
            f"{out[preset]['graphs_note']}")
    return out


def copy_bandwidth(device) -> float:
    """Device-to-device copy of 2 GiB, bytes read + written per second (median of 10)."""
    src = torch.randn(2**29, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * 2**31 / sorted(times[2:])[len(times[2:]) // 2]


def decode_steps(preset, batches, prompt, device, bandwidth, dry_run) -> dict:
    """Decode step time of the paged engine, graphs on and off, and of stock transformers, per batch."""
    from memcheck.models import build_hf_model, prompt_ids
    from memcheck.stacks.paged.config import EngineConfig, ModelSpec, blocks_needed
    from memcheck.stacks.paged.engine import Engine
    from memcheck.stacks.paged.model import CausalLM
    from memcheck.stacks.paged.moe import MoE
    from memcheck.stacks.paged.request import Request

    steps = 4 if dry_run else 24
    with tempfile.TemporaryDirectory() as tmp:
        model = {"preset": preset, **(SCALED_MOE if dry_run and preset != "r1-distill-qwen-7b" else
                                      SCALED if dry_run else {})}
        wl = make(tmp, f"decode-{preset}", model,
                  [{"count": max(batches), "prompt_tokens": prompt, "max_new_tokens": 4 * steps + 8}],
                  "float32" if dry_run else "bfloat16")
    hf = build_hf_model(wl, device)
    spec = ModelSpec.from_hf(hf.config)
    prompts = prompt_ids(wl, spec.vocab)
    rows = {}
    with torch.inference_mode():
        for b in batches:  # stock transformers: (generate 1 + steps new tokens) - (generate 1), per step
            ids = torch.tensor(prompts[:b], device=device)
            timed = []
            for new in (1, steps + 1, 1, steps + 1):
                sync(device)
                t = time.perf_counter()
                hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
                sync(device)
                timed.append(time.perf_counter() - t)
            rows[b] = {"hf_step_s": (timed[3] - timed[2]) / steps}
    requests = wl.request_list()
    cfg = EngineConfig.from_workload(wl, requests)
    paged = CausalLM.from_hf(hf, spec)
    del hf
    gc.collect()
    paged.fuse_projections()
    engine = Engine(paged, spec, cfg, paged.lm_head.weight.dtype, device,
                    graph_sizes=(max(batches), max(blocks_needed(r, cfg.block_size) for r in requests)))
    if engine.runner.graphs is not None:
        engine.warmup()
    graphs = engine.runner.graphs
    moes = [m for m in paged.modules() if isinstance(m, MoE)]
    touched: list[torch.Tensor] = []  # each MoE layer's expert ids on eager steps (counted after the timing)
    hooks = [m.gate.register_forward_hook(lambda mod, inp, out: touched.append(out[1].clone())) for m in moes]
    params = {id(p): p for p in paged.parameters()}.values()
    all_bytes = sum(p.numel() * p.element_size() for p in params)
    embed = paged.model.embed_tokens.weight
    expert_params = [p for m in moes for p in (m.experts.gate_up_proj, m.experts.down_proj)]
    expert_bytes = sum(p[0].numel() * p.element_size() for p in expert_params) // max(1, len(moes))
    routed_bytes = expert_bytes * spec.n_routed_experts * len(moes)
    dense_bytes = all_bytes - embed.numel() * embed.element_size() - routed_bytes
    kv_token = spec.kv_bytes_per_token(embed.element_size())
    for b in batches:
        seqs = [Request(i, p, 4 * steps + 8, 0, cfg.block_size) for i, p in enumerate(prompts[:b])]
        for s in seqs:
            engine.scheduler.add(s)
        while any(s.num_computed < len(s) - 1 or s.num_computed == 0 for s in seqs):  # prefill
            batch = engine.scheduler.schedule()
            engine.scheduler.finish_step(batch, engine.runner.step(batch), 0.0)
        row = rows[b]
        same = total = 0
        for mode in ("graphs", "eager"):
            engine.runner.graphs = graphs if mode == "graphs" else None
            if mode == "graphs" and graphs is None:
                continue
            touched.clear()
            times, kv_read, host, launch = [], [], [], []
            for _ in range(steps):
                batch = engine.scheduler.schedule()
                kv_read.append(sum(s.num_computed + 1 for s, _ in batch) * kv_token)
                sync(device)
                t = time.perf_counter()
                sampled = engine.runner.step(batch)
                times.append(time.perf_counter() - t)
                if mode == "graphs":  # packing the inputs and launching the graph: the GPU waits through it
                    host.append(graphs.replayed_at - t)
                    launch.append(graphs.replayed_at - graphs.replay_called_at)  # the replay() call alone
                if mode == "graphs":  # the same step eagerly (it rewrites the same cache slots)
                    engine.runner.graphs = None
                    again = engine.runner.step(batch)
                    engine.runner.graphs = graphs
                    same += sum(again[k] == v for k, v in sampled.items())
                    total += len(sampled)
                engine.scheduler.finish_step(batch, sampled, 0.0)
            step = sorted(times)[len(times) // 2]
            row[f"{mode}_step_s"] = step
            if host:
                row["graphs_host_s"] = sorted(host)[len(host) // 2]
                row["graphs_launch_s"] = sorted(launch)[len(launch) // 2]
            if device.type == "cuda":  # the graph's own kernels (its skinny tiles), and the eager step's
                row[f"{mode}_kernels"] = kernel_profile(engine, device)
            if touched:  # eager steps only: the hooks do not run inside a graph replay
                row["experts_touched_per_layer"] = sum(t.unique().numel() for t in touched) / len(touched)
        engine.runner.graphs = graphs  # as the engine serves: step n+1 launched before step n's tokens are read
        sync(device)
        t = time.perf_counter()
        for _ in range(steps):
            engine.advance(engine.scheduler.schedule())
        engine.drain()
        sync(device)
        row["engine_step_s"] = (time.perf_counter() - t) / steps  # (the first step's host part is not hidden)
        experts = row.get("experts_touched_per_layer", 0) * expert_bytes * len(moes)
        row["weight_bytes_read"] = dense_bytes + b * embed.shape[1] * embed.element_size() + experts
        row["kv_bytes_read"] = sum(kv_read) / len(kv_read)
        row["floor_s"] = (row["weight_bytes_read"] + row["kv_bytes_read"]) / bandwidth
        for mode in ("graphs", "eager", "engine"):
            if f"{mode}_step_s" in row:
                row[f"{mode}_over_floor"] = row[f"{mode}_step_s"] / row["floor_s"]
        row["hf_over_graphs"] = row["hf_step_s"] / row.get("graphs_step_s", row["eager_step_s"])
        row["graph_tokens_equal_eager"] = f"{same}/{total}"
        for s in seqs:  # hand the blocks back for the next batch
            if s in engine.scheduler.running:
                engine.scheduler.running.remove(s)
                engine.blocks.free(s)
        say(f"  decode {preset} batch {b}: " + json.dumps({k: (round(v, 6) if isinstance(v, float) else v)
                                                         for k, v in row.items()}))
    for h in hooks:
        h.remove()
    out = {"batches": rows, "weights_bytes": all_bytes, "expert_bytes": expert_bytes, "moe_layers": len(moes),
           "graph_pool_bytes": graphs.pool_bytes if graphs else None, "prompt_tokens": prompt, "steps": steps}
    del engine, paged, graphs
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def kernel_profile(engine, device) -> dict:
    """One more decode step (eager or a graph replay, as the runner is set) under the torch profiler: its GPU
    kernels by name (launches, time), the twelve longest and the sum; the span from the first kernel's start to the
    last one's end, and the step's host time around it. Kernel sum against the span: the gaps between launches;
    span against the step: the host's packing, launch and read-back the GPU waits through."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    batch = engine.scheduler.schedule()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        sync(device)
        t = time.perf_counter()
        sampled = engine.runner.step(batch)
        step_us = (time.perf_counter() - t) * 1e6
        sync(device)
    engine.scheduler.finish_step(batch, sampled, 0.0)
    rows = [(e.key, e.count, getattr(e, "self_device_time_total", None) or e.self_cuda_time_total)
            for e in prof.key_averages() if e.device_type == DeviceType.CUDA]
    rows.sort(key=lambda r: -r[2])
    spans = [e.time_range for e in prof.events() if e.device_type == DeviceType.CUDA]
    return {"kernel_us": round(sum(r[2] for r in rows), 1), "launches": sum(r[1] for r in rows),
            "span_us": round(max(s.end for s in spans) - min(s.start for s in spans), 1) if spans else None,
            "step_us": round(step_us, 1),
            "top": [[name[:70], count, round(us, 1)] for name, count, us in rows[:12]],
            "all": [[name[:70], count, round(us, 1)] for name, count, us in rows]}


def moe_tiles(device) -> dict:
    """The fused MoE kernels on DeepSeek-V2-Lite's shapes (64 experts of 2 x 1408 x 2048, top 6) at 8 and 32
    tokens: each tile configuration's time (triton.testing.do_bench, median) and bandwidth over the experts
    touched; the fastest over both sizes becomes kernels.moe.DEFAULT_CONFIG for the sections after this one."""
    import itertools

    import triton.testing

    from memcheck.kernels import moe

    gen = torch.Generator(device=device).manual_seed(0)
    experts, hidden, inter, top_k = 64, 2048, 1408, 6
    gate_up = torch.randn(experts, 2 * inter, hidden, device=device, dtype=torch.bfloat16, generator=gen) * 0.02
    down = torch.randn(experts, hidden, inter, device=device, dtype=torch.bfloat16, generator=gen) * 0.02
    cases = {}
    for tokens in (8, 32):
        x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16, generator=gen)
        ids = torch.stack([torch.randperm(experts, device=device, generator=gen)[:top_k] for _ in range(tokens)])
        weights = torch.rand(tokens, top_k, device=device, generator=gen)
        touched = int(ids.unique().numel())
        cases[tokens] = (x, ids, weights, touched * 3 * inter * hidden * 2)
    rows = []
    for bn, bk, stages, warps in itertools.product((32, 64, 128), (64, 128, 256), (3, 4), (4,)):
        cfg = {"block_n": bn, "block_k": bk, "num_stages": stages, "num_warps": warps}
        row = {"config": cfg}
        try:
            for tokens, (x, ids, weights, nbytes) in cases.items():
                t = triton.testing.do_bench(lambda: moe.fused_moe(x, gate_up, down, weights, ids, config=cfg),
                                            warmup=25, rep=100, return_mode="median") / 1e3
                row[f"t{tokens}_us"], row[f"t{tokens}_gbps"] = t * 1e6, nbytes / t / GB
        except Exception as e:  # noqa: BLE001 - a tile that does not fit (shared memory) is skipped
            row["error"] = str(e)[:200]
        rows.append(row)
        say("  moe tiles", json.dumps(row))
    ok = [r for r in rows if "error" not in r]
    best = min(ok, key=lambda r: r["t8_us"] + r["t32_us"])
    default = next(r for r in ok if all(r["config"][k] == v for k, v in moe.DEFAULT_CONFIG.items()))
    say(f"  moe tiles: default {json.dumps(default)}; fastest {json.dumps(best)}")
    moe.DEFAULT_CONFIG.update(best["config"])
    return {"rows": rows, "default": default, "best": best}


COLD_BYTES = 160_000_000  # caches cycled through per timing: more than the H200's 50 MB L2
# (name, sequences, context, query heads): MLA's latent 512 + 64; GQA's 4 KV heads of 128
DECODE_SPLIT_SHAPES = [("mla v2-lite b8 x 550", 8, 550, 16), ("mla v2-lite b32 x 550", 32, 550, 16),
                       ("mla v2-lite b8 x 4K", 8, 4096, 16), ("mla v2-lite b1 x 64K", 1, 65536, 16),
                       ("mla v3 b8 x 4K, 128 heads", 8, 4096, 128), ("gqa r1 b1 x 544", 1, 544, 28),
                       ("gqa r1 b8 x 544", 8, 544, 28), ("gqa r1 b32 x 544", 32, 544, 28),
                       ("gqa r1 b1 x 32K", 1, 32768, 28)]


def decode_split(device, bandwidth) -> dict:
    """The decode kernels at min_tiles 1, 2, 4, 8 (the least tiles per range: memcheck/kernels/work_split.py): MLA decode
    over DeepSeek-V2-Lite's latent cache (16 heads, 512 + 64) and V2/V3's 128 heads, dense GQA decode over
    R1-Distill-Qwen-7B's (28 / 4 heads of 128). The time of decode plus the merge of its partials as the engine
    runs them: in a CUDA graph, one call per layer over as many layers' caches as make 160 MB (more than the
    50 MB L2: each layer's cache is read cold, as in a decode step; one small cache looped over reads from L2,
    and timing calls one by one times the host), against the KV-bytes floor. Reported only: the best differs by
    shape (the decode section runs each kernel's DEFAULT_CONFIG)."""
    from memcheck.kernels import decode, mla
    from kernel_bench import bench_graph  # the replay timer of the kernel benchmark (benchmarks/ is on sys.path)

    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    for name, seqs, ctx, heads in DECODE_SPLIT_SHAPES:
        blocks = seqs * -(-ctx // 16)
        table = torch.randperm(blocks, device=device, generator=gen).view(seqs, -1).int()
        lens = torch.full((seqs,), ctx, device=device, dtype=torch.int32)
        bf16 = dict(device=device, dtype=torch.bfloat16, generator=gen)
        if name.startswith("mla"):
            row_bytes = 576 * 2  # one latent row per token
            # [heads, seqs, rank] transposed: the layout of the engine's bmm output
            q_lat, q_pe = torch.randn(heads, seqs, 512, **bf16).transpose(0, 1), torch.randn(seqs, heads, 64, **bf16)

            def make_cache():
                return torch.randn(blocks, 16, 576, **bf16)

            def run(cache, cfg):
                return mla.mla_decode(q_lat, q_pe, cache, table, lens, 0.07, config=cfg)
        else:
            row_bytes = 2 * 4 * 128 * 2  # K and V of 4 KV heads per token
            q = torch.randn(seqs, heads, 128, **bf16)

            def make_cache():
                return torch.randn(blocks, 16, 4, 128, **bf16), torch.randn(blocks, 16, 4, 128, **bf16)

            def run(cache, cfg):
                return decode.paged_decode(q, *cache, table, lens, 0.088, config=cfg)
        layers = max(1, -(-COLD_BYTES // (blocks * 16 * row_bytes)))
        caches = [make_cache() for _ in range(layers)]
        row = {"shape": name, "floor_us": seqs * ctx * row_bytes / bandwidth * 1e6, "layers": layers}
        ref = run(caches[0], {"min_tiles": 1})
        for min_tiles in (1, 2, 4, 8):
            cfg = {"min_tiles": min_tiles}
            row[f"min_tiles_{min_tiles}_max_diff"] = float((run(caches[0], cfg).float() - ref.float()).abs().max())
            row[f"min_tiles_{min_tiles}_us"] = bench_graph(lambda: [run(c, cfg) for c in caches]) / layers * 1e3
        rows.append(row)
        say("  decode split", json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}))
        del caches
    return {"rows": rows, "default_min_tiles": {"mla": mla.DEFAULT_CONFIG["min_tiles"],
                                                "gqa": decode.DEFAULT_CONFIG["min_tiles"]}}


# The decode step's products: (name, N, K, bias, times per step). R1-Distill-Qwen-7B: 28 layers; DeepSeek-V2-Lite:
# 27 layers of MLA (query and latent projections fused), one dense MLP layer (the rest are MoE), the lm_head.
STEP_PRODUCTS = {
    "r1-distill-qwen-7b": [("qkv", 4608, 3584, True, 28), ("o", 3584, 3584, False, 28),
                           ("gate_up", 37888, 3584, False, 28), ("down", 3584, 18944, False, 28),
                           ("lm_head", 152064, 3584, False, 1)],
    "deepseek-v2-lite": [("q_kv_a", 3648, 2048, False, 27), ("o", 2048, 2048, False, 27),
                         ("gate_up", 21888, 2048, False, 1), ("down", 2048, 10944, False, 1),
                         ("lm_head", 102400, 2048, False, 1)],
}


def skinny_candidates(n, k, sms):
    """Tiles worth timing: enough programs to stream the weight from every multiprocessor, not so many slices
    that the partials cost more than they spread."""
    import itertools

    from memcheck.kernels.skinny_gemm import Tiles

    for block_n, block_k, split in itertools.product((32, 64, 128), (128, 256), (1, 2, 4, 8)):
        programs = -(-n // block_n) * split
        if (split == 1 or k // split >= block_k) and sms // 2 <= programs <= 16 * sms:
            yield Tiles(block_n, block_k, split, 4, 4)


def skinny_gemm(device, bandwidth) -> dict:
    """memcheck.kernels.linear's skinny GEMM on the decode step's products (STEP_PRODUCTS at 8 and 32 rows) against cuBLAS
    (F.linear), bf16: in a CUDA graph, one call per copy of the weight over 200+ MB of copies (each read cold, back
    to back as a step's layers run), every tile checked against F.linear first. Where the fastest tile beats cuBLAS
    by 3% or more it becomes this GPU's entry in kernels.skinny_gemm's table (installed for the sections after this
    one, and written as skinny_gemm_tiles.json), else cuBLAS stays. Also: each step's expected saving."""
    import torch.nn.functional as F

    from memcheck.kernels import skinny_gemm
    from memcheck.kernels.dispatch import sm_count
    from kernel_bench import bench_graph  # the replay timer of the kernel benchmark (benchmarks/ is on sys.path)

    gen = torch.Generator(device=device).manual_seed(0)
    gpu, sms = torch.cuda.get_device_name(device), sm_count(device)
    rows, table, saving = [], {}, {}
    for preset, products in STEP_PRODUCTS.items():
        for name, n, k, has_bias, per_step in products:
            w = torch.randn(n, k, device=device, dtype=torch.bfloat16, generator=gen) * k ** -0.5
            bias = torch.randn(n, device=device, dtype=torch.bfloat16, generator=gen) if has_bias else None
            copies = max(2, -(-200_000_000 // (n * k * 2)))
            weights = [w] + [w.clone() for _ in range(copies - 1)]
            for m in (8, 32):
                x = torch.randn(m, k, device=device, dtype=torch.bfloat16, generator=gen)
                ref = F.linear(x, w, bias).float()
                row = {"preset": preset, "product": name, "n": n, "k": k, "rows": m,
                       "floor_us": n * k * 2 / bandwidth * 1e6,
                       "cublas_us": bench_graph(lambda: [F.linear(x, wi, bias) for wi in weights]) / copies * 1e3,
                       "tiles": []}
                for tiles in skinny_candidates(n, k, sms):
                    try:
                        err = float((skinny_gemm.linear(x, w, bias, tiles=tiles).float() - ref).norm() / ref.norm())
                        us = bench_graph(lambda: [skinny_gemm.linear(x, wi, bias, tiles=tiles) for wi in weights])
                        row["tiles"].append([list(tiles), round(us / copies * 1e3, 2), err])
                    except Exception as e:  # noqa: BLE001 - a tile that does not fit is skipped, and said
                        row["tiles"].append([list(tiles), None, str(e)[:120]])
                ok = [t for t in row["tiles"] if t[1] is not None and t[2] < 2e-2]
                row["wrong"] = [t for t in row["tiles"] if t[1] is not None and t[2] >= 2e-2]
                best = min(ok, key=lambda t: t[1]) if ok else None
                row["best"] = best
                if best and best[1] <= 0.97 * row["cublas_us"]:
                    table[skinny_gemm.table_key(m, n, k)] = best[0]
                    row["installed"] = True
                    saving[f"{preset} b{m}"] = saving.get(f"{preset} b{m}", 0) + per_step * (row["cublas_us"] - best[1])
                rows.append(row)
                say("  skinny gemm", json.dumps({key: row[key] for key in ("preset", "product", "rows", "floor_us",
                                                                           "cublas_us", "best", "wrong")}, default=str))
            del weights, w
    skinny_gemm.use_tiles(gpu, table)
    return {"gpu": gpu, "rows": rows, "table": {"gpus": {gpu: {key: skinny_gemm.Tiles(*t)._asdict()
                                                                for key, t in table.items()}}},
            "step_saving_us": saving}


def router(device) -> dict:
    """kernels.route (one Triton launch) against the torch reference (float32 GEMM, softmax/sigmoid, top-k:
    what the paged stack ran before) for DeepSeek-V2-Lite, V2 and V3 routers at decode and prefill batch
    sizes: time inside a CUDA graph, and whether every token gets the same experts."""
    import triton.testing

    from memcheck.kernels import reference
    from memcheck.kernels import router as triton_router

    gen = torch.Generator(device=device).manual_seed(0)
    cases = [("v2-lite greedy", 2048, 64, 6, 1, 1, False, 1.0), ("v2 group_limited", 5120, 160, 6, 8, 3, False, 16.0),
             ("v3 noaux_tc", 7168, 256, 8, 8, 4, True, 2.5)]
    rows = []
    for name, hidden, experts, top_k, n_group, topk_group, normalise, scaling in cases:
        method = {"v2-lite": "greedy", "v2": "group_limited_greedy", "v3": "noaux_tc"}[name.split()[0]]
        weight = torch.randn(experts, hidden, device=device, dtype=torch.bfloat16, generator=gen) / hidden ** 0.5
        bias = torch.rand(experts, device=device, generator=gen) * 0.1 if method == "noaux_tc" else None
        args = dict(method=method, top_k=top_k, n_group=n_group, topk_group=topk_group, normalise=normalise,
                    scaling=scaling)
        for tokens in (8, 32, 2048):
            x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16, generator=gen)
            w, ids = triton_router.route(x, weight, bias, **args)
            ref_w, ref_ids = reference.route(x, weight, bias, **args)
            same = sum(set(a) == set(b) for a, b in zip(ids.tolist(), ref_ids.tolist()))
            row = {"router": name, "tokens": tokens, "same_experts": f"{same}/{tokens}",
                   "weights_max_diff": float((w.sort(-1)[0] - ref_w.sort(-1)[0]).abs().max())}
            for impl, fn in (("triton", triton_router.route), ("torch", reference.route)):
                row[f"{impl}_us"] = triton.testing.do_bench_cudagraph(lambda: fn(x, weight, bias, **args), rep=50) * 1e3
            rows.append(row)
            say("  router", json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
    return {"rows": rows}


def suite_workloads(profile: str) -> dict:
    """Every suites/*.yaml workload by name, under the profile."""
    thresholds = config.load(ROOT).thresholds
    return {w.name: w for path in sorted((ROOT / "suites").glob("*.yaml"))
            for w in workload.load_file(str(path), profile, stacks.names(), thresholds)}


def suite_items(device, names) -> dict:
    """Suite items by name (every suites/*.yaml), full profile, hf and paged, through the harness."""
    out = {}
    found = suite_workloads("full")
    for name in names:
        wl = found[name]
        rows = {}
        for stack in ("hf", "paged"):
            m, metric, peak, seconds = measured(wl, stack, device)
            weights, ws = m.floors.get("weights"), m.floors.get("workspace")
            rows[stack] = {"error": m.error and m.error.message[:300], "wall_s": seconds,
                           "tokens_per_s": metric.get("tokens_per_s"), "tpot": metric.get("tpot"),
                           "ttft": metric.get("ttft"), "peak": peak, "weights": weights, "kv_floor": m.floors["kv"],
                           "workspace": ws, "reserved_peak": metric.get("gpu.reserved.peak"),
                           "notes": [n[:300] for n in m.notes if not n.startswith("Traceback")][:4]}
            if peak is not None and weights and ws is not None:
                rows[stack]["above_over_declared"] = (peak - weights) / (m.floors["kv"] + ws)
            say(f"  {name}[{stack}]: " + json.dumps(rows[stack], default=str)[:1200])
        if rows["hf"]["tokens_per_s"] and rows["paged"]["tokens_per_s"]:
            rows["paged_over_hf"] = rows["paged"]["tokens_per_s"] / rows["hf"]["tokens_per_s"]
        out[name] = rows
    return out


def vl_phases(device, names, dry_run) -> dict:
    """Where the paged stack's wall goes on VL suite items (ci profile on a dry run, else full): per item the paged
    stack built and warmed up in this process as the harness does, run once plainly and once split into phases
    (benchmarks/engine_phases.py), then the hf stack's plain run for the ratio."""
    found = suite_workloads("ci" if dry_run else "full")
    out: dict = {}
    for name in names:
        if name not in found:
            say(f"  {name}: no workload of that name in suites/*.yaml (--vl-items)")
            continue
        section(out, name, vl_item_phases, found[name], device)
    return out


def vl_item_phases(wl, device) -> dict:
    row: dict = {"profile": wl.profile}
    row.update(paged_phases(wl, device))
    section(row, "hf", hf_plain, wl, device)  # paged's numbers are kept if hf fails
    if "hf" in row and row["hf"]["tokens_per_s"] and row["paged_plain"]["tokens_per_s"]:
        row["paged_over_hf"] = row["paged_plain"]["tokens_per_s"] / row["hf"]["tokens_per_s"]
    decode = row["phases"]["decode_graphs"]["calls"], row["phases"]["decode_eager"]["calls"]
    if row["graphs_captured"] and decode[1] and not decode[0]:
        say("  WARNING: graphs were captured but no decode step replayed one: does ModelRunner.step still replay "
            "through DecodeGraphs.launch (benchmarks/engine_phases.py detects replays by wrapping it)?")
    say(f"  {wl.name} ({wl.profile} profile): " + json.dumps(row, default=str))
    return row


def paged_phases(wl, device) -> dict:
    """The paged stack's run once plainly, then once by phase, on one built stack."""
    from engine_phases import EnginePhases

    paged = built("paged", wl, device)
    try:
        plain, phased = EnginePhases(device), EnginePhases(device)
        with plain.patched(paged, timed=False):
            row = {"paged_plain": {**timed_run(paged, device), "generate_s": plain.walls[-1]}}
        with phased.patched(paged):
            row["paged_phased"] = {**timed_run(paged, device), "generate_s": phased.walls[-1]}
        row["phases"] = phased.summary()
        graphs = paged.engine.runner.graphs
        row["graphs_captured"] = graphs is not None and graphs.captured
        return row
    finally:
        paged.close()
        del paged
        release(device)


def hf_plain(wl, device) -> dict:
    """The hf stack's run once, built and warmed up after the paged stack's memory was given back."""
    hf = built("hf", wl, device)
    try:
        return timed_run(hf, device)
    finally:
        hf.close()
        del hf
        release(device)


def built(name: str, wl, device):
    """A stack as the harness builds one before its timed run (memcheck/measure_round.py): check, prepare, warm-up."""
    cls = stacks.load(name)
    cls.check(wl, device)
    stack = cls(wl, device)
    if cls.attentions:
        stack.attention = cls.attentions[0]
    stack.prepare()
    if stack.has_warmup():
        stack.warmup()
    return stack


def timed_run(stack, device) -> dict:
    """stack.run once without collectors: its seconds (device synchronized either side), tokens, tokens_per_s."""
    from memcheck.stacks.hf import _Unobserved

    sync(device)
    t = time.perf_counter()
    result = stack.run(_Unobserved())
    sync(device)
    return {"run_s": time.perf_counter() - t, "tokens": result.generated_tokens,
            "tokens_per_s": result.metrics["tokens_per_s"].value}


def release(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def say_vl_table(items: dict) -> None:
    """vl_phases' table: per item the phased loop's parts (they add up to its wall), then the plain walls."""
    from engine_phases import LABELS

    say("")
    say("| vl item | part | calls | tokens | seconds | of the phased loop | tokens/s |")
    say("|---|---|---|---|---|---|---|")
    for name, r in items.items():
        if not isinstance(r, dict):  # an item's traceback (section's "<name>_error")
            continue
        phases, plain, phased, hf = r["phases"], r["paged_plain"], r["paged_phased"], r.get("hf")
        wall = phases["wall"]
        for key, label in LABELS.items():
            p = phases[key]
            tokens = "-" if p["tokens"] is None else (f"{p['tokens']} ({p['images']} images)" if key == "vision"
                                                      else p["tokens"])
            say(f"| {name} | {label} | {'-' if p['calls'] is None else p['calls']} | {tokens} | "
                f"{p['seconds']:.3f} | {p['seconds'] / wall:.1%} | |")
            forward = p.get("towers_forward_seconds")
            if forward is not None:  # encode less this: drawing the pixels, copying them over, the concatenation
                say(f"| {name} | of which the towers' forward passes | {p['tower_calls']} | | {forward:.3f} | "
                    f"{forward / wall:.1%} | |")
        steps = sum(phases[k]["calls"] for k in ("prefill", "decode_graphs", "decode_eager"))
        say(f"| {name} | paged engine loop, phased (synchronized) | {steps} steps | {phased['tokens']} new | "
            f"{wall:.3f} | 100% | {num(phased['tokens_per_s'])} |")
        say(f"| {name} | paged engine loop, plain | | {plain['tokens']} new | {plain['generate_s']:.3f} | | "
            f"{num(plain['tokens_per_s'])} |")
        say(f"| {name} | paged run(), plain (the loop and what run() does around it) | | | {plain['run_s']:.3f} | | |")
        if hf is None:
            say(f"| {name} | hf run(), plain: failed (see the log) | | | | | |")
            continue
        say(f"| {name} | hf run(), plain | | {hf['tokens']} new | {hf['run_s']:.3f} | | {num(hf['tokens_per_s'])} "
            + (f"(paged / hf {r['paged_over_hf']:.2f}x) |" if "paged_over_hf" in r else "|"))


def section(results: dict, key: str, fn, *args) -> None:
    """results[key] = fn(*args); a failure is logged with its traceback and the next section still runs."""
    try:
        results[key] = fn(*args)
    except Exception:  # noqa: BLE001 - one device call measures every section it can
        import traceback

        say(f"  {key} FAILED:", traceback.format_exc(limit=12))
        results[key + "_error"] = traceback.format_exc(limit=12)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fmt(b) -> str:
    return "-" if b is None else f"{b / GB:.3f} GB"


def ms(x) -> str:
    return "-" if x is None else f"{x * 1e3:.1f} ms"


def num(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", ".out"), help="folder for JSON and log")
    parser.add_argument("--dry-run", action="store_true", help="scaled-down model on the CPU")
    parser.add_argument("--suite-items", default="r1-staggered-finish,v2-lite-mixed",
                        help="comma-separated suite workloads for the suite section")
    parser.add_argument("--vl-items", default="vl-mixed-batch,vl-arrivals",
                        help="comma-separated DeepSeek-VL suite workloads for the vl_phases section")
    parser.add_argument("--skip", default="", help="comma-separated sections to skip: batch8,ctx32k,logits,"
                        "tokens,moe_tiles,skinny_gemm,decode_split,router,decode,suite,vl_phases")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    device = resolve_device("cpu" if args.dry_run else "cuda")
    model, dtype = (SCALED, "float32") if args.dry_run else (FULL, "bfloat16")
    prompt, ctx, logit_len = (256, 1024, 64) if args.dry_run else (2048, 32768, 512)
    say(f"paged stack benchmark on {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M:%S')}")
    results: dict = {"device": device.type, "dry_run": args.dry_run}
    t0 = time.perf_counter()
    bandwidth = copy_bandwidth(device) if device.type == "cuda" else 10 * GB
    results["copy_bandwidth"] = bandwidth
    with tempfile.TemporaryDirectory() as tmp:
        if "skinny_gemm" not in skip and device.type == "cuda":  # first: every later section runs its tiles
            say("skinny GEMM (kernels.linear) vs cuBLAS on the decode step's products, bf16, cold weights, "
                "in a CUDA graph:")
            section(results, "skinny_gemm", skinny_gemm, device, bandwidth)
        if "tokens" not in skip:
            say("greedy tokens, float32, scaled-down families, hf vs paged:")
            section(results, "tokens", tiny_tokens, tmp, device)
        if "batch8" not in skip:
            say(f"memory: batch 8 x ({prompt} prompt + 128 new), {dtype}:")
            wl = make(tmp, "batch8", model, [{"count": 8, "prompt_tokens": prompt, "max_new_tokens": 128}], dtype)
            results["batch8"] = memory(wl, device)
        if "ctx32k" not in skip:
            say(f"memory: one request of {ctx - 128} prompt + 128 new, {dtype}:")
            wl = make(tmp, "ctx32k", model, [{"count": 1, "prompt_tokens": ctx - 128, "max_new_tokens": 128}], dtype)
            results["ctx32k"] = memory(wl, device)
        if "logits" not in skip:
            say(f"first-step logits, 16 x {logit_len}-token prompts, {dtype}:")
            wl = make(tmp, "logits", model, [{"count": 16, "prompt_tokens": logit_len, "max_new_tokens": 1}], dtype,
                      engine={"max_num_batched_tokens": 16 * logit_len})
            results["logits"] = logits_agreement(wl, device)
        if "moe_tiles" not in skip and device.type == "cuda":
            say("fused MoE tiles, DeepSeek-V2-Lite shapes, bf16:")
            section(results, "moe_tiles", moe_tiles, device)
        if "decode_split" not in skip and device.type == "cuda":
            say("decode kernels (MLA, GQA), least tiles per range, bf16, cold cache per layer, in a CUDA graph:")
            section(results, "decode_split", decode_split, device, bandwidth)
        if "router" not in skip and device.type == "cuda":
            say("MoE router, one Triton launch vs torch, bf16, in a CUDA graph:")
            section(results, "router", router, device)
        if "decode" not in skip:
            say(f"decode steps, {dtype}, 512-token prompts; copy bandwidth {bandwidth / GB:.0f} GB/s:")
            results["decode"] = {}
            for preset, batches in (("r1-distill-qwen-7b", (1, 8, 32)), ("deepseek-v2-lite", (8, 32))):
                section(results["decode"], preset, decode_steps, preset, batches, 512, device, bandwidth, args.dry_run)
        if "suite" not in skip and not args.dry_run:
            say("suite items, full profile, collectors without the host heap:")
            section(results, "suite", suite_items, device, args.suite_items.split(","))
        if "vl_phases" not in skip:
            say(f"VL items' paged wall by phase ({'ci' if args.dry_run else 'full'} profile), no collectors; each "
                "tower call and engine step timed between device synchronizes, which make the phased run's wall "
                "longer than the plain one (both printed; they also undo the overlap of a decode step's host work "
                "with the previous step's GPU work):")
            section(results, "vl_phases", vl_phases, device, args.vl_items.split(","), args.dry_run)
    results["seconds"] = round(time.perf_counter() - t0, 1)

    say("")
    say("| check | hf above weights | paged above weights | KV floor | workspace | paged / (KV+ws) (<= 1.3) "
        "| hf / paged (>= 2.5) | pass |")
    say("|---|---|---|---|---|---|---|---|")
    for key in ("batch8", "ctx32k"):  # measured activations = above weights - kv.bytes.peak
        r = results.get(key)
        if r and "paged_vs_declared" in r:
            say(f"| {key} | {fmt(r['hf']['above_weights'])} | {fmt(r['paged']['above_weights'])} | "
                f"{fmt(r['paged']['kv_floor'])} | {fmt(r['paged']['workspace'])} | {r['paged_vs_declared']:.3f} | "
                f"{r['hf_over_paged']:.2f}x | {r['pass']} |")
        elif r:
            say(f"| {key} | error: hf {r['hf']['error']} paged {r['paged']['error']} | | | | | | False |")
    if "logits" in results:
        lg = results["logits"]
        ties = lg["top1_paged_misses_vs_fp32"]
        say(f"| logits {lg['dtype'][6:]} | rel err vs fp32 {lg['rel_err_hf_vs_fp32']:.4f} | {lg['rel_err_paged_vs_fp32']:.4f} | "
            f"paged vs hf {lg['rel_err_paged_vs_hf']:.4f} | top-1 = hf {lg['top1_paged_eq_hf']}/{lg['prompts']}; "
            f"{len(ties)} misses vs fp32, {sum(m['near_tie'] for m in ties)} near ties | | | {lg['pass']} |")
    for preset, r in results.get("tokens", {}).items():
        ok = r["equal"] == r["equal_eager"] == r["requests"]
        say(f"| tokens {preset} | | graphs {r['equal']}/{r['requests']}, eager {r['equal_eager']}/{r['requests']} "
            f"equal to hf | | | | | {ok} |")
    if "skinny_gemm" in results:
        say("")
        say("| product | rows | bytes floor | cuBLAS | skinny GEMM, best tile | tile (n, k, split, warps, stages) | runs |")
        say("|---|---|---|---|---|---|---|")
        for r in results["skinny_gemm"]["rows"]:
            best = r["best"] or [None, None]
            say(f"| {r['preset']} {r['product']} {r['n']}x{r['k']} | {r['rows']} | {r['floor_us']:.1f} us | "
                f"{r['cublas_us']:.1f} us | " + (f"{best[1]:.1f} us" if best[1] else "-") + f" | {best[0]} | "
                + ("skinny" if r.get("installed") else "cuBLAS") + (f", {len(r['wrong'])} tiles WRONG" if r["wrong"] else "")
                + " |")
        say("expected decode step saving (us): " + json.dumps({k: round(v, 1) for k, v in
                                                              results["skinny_gemm"]["step_saving_us"].items()}))
    if "decode_split" in results:
        say("")
        say("| decode + merge | floor | min_tiles 1 | 2 | 4 | 8 |")
        say("|---|---|---|---|---|---|")
        for r in results["decode_split"]["rows"]:
            say(f"| {r['shape']} | {r['floor_us']:.1f} us | " + " | ".join(
                f"{r[f'min_tiles_{m}_us']:.1f} us ({r[f'min_tiles_{m}_us'] / r['floor_us']:.2f}x)"
                for m in (1, 2, 4, 8))
                + " |")
    if "router" in results:
        say("")
        say("| router | tokens | triton | torch | same experts |")
        say("|---|---|---|---|---|")
        for r in results["router"]["rows"]:
            say(f"| {r['router']} | {r['tokens']} | {r['triton_us']:.1f} us | {r['torch_us']:.1f} us | "
                f"{r['same_experts']} |")
    if "decode" in results:
        steps = [(preset, b, r) for preset, d in results["decode"].items() for b, r in d.get("batches", {}).items()]
        say("")
        say("| decode step | batch | floor | engine loop, graphs where captured (x floor, <= 1.5) "
            "| graphs, one synced step | eager (x floor) | hf | hf / graphs | experts touched/layer | graph = eager tokens |")
        say("|---|---|---|---|---|---|---|---|---|---|")
        for preset, b, r in steps:
            g, o = r.get("graphs_step_s"), r.get("engine_step_s")
            say(f"| {preset} | {b} | {r['floor_s'] * 1e3:.2f} ms | "
                + (f"{o * 1e3:.2f} ms ({r['engine_over_floor']:.2f}x) | " if o else "- | ")
                + (f"{g * 1e3:.2f} ms ({r['graphs_over_floor']:.2f}x) | " if g else "- | ")
                + f"{r['eager_step_s'] * 1e3:.2f} ms ({r['eager_over_floor']:.2f}x) | "
                f"{r['hf_step_s'] * 1e3:.2f} ms | "
                f"{r['hf_over_graphs']:.2f}x | {r.get('experts_touched_per_layer', '-')} | "
                f"{r['graph_tokens_equal_eager']} |")
        say("")
        say("| graph step (profiled) | batch | step | GPU span | kernels | launches | host outside the span "
            "| gaps inside it | host before the replay, unprofiled | of which the replay() call |")
        say("|---|---|---|---|---|---|---|---|---|---|")
        for preset, b, r in steps:
            k = r.get("graphs_kernels")
            if k and k["span_us"]:
                say(f"| {preset} | {b} | {k['step_us']:.0f} us | {k['span_us']:.0f} us | {k['kernel_us']:.0f} us "
                    f"| {k['launches']} | {k['step_us'] - k['span_us']:.0f} us | {k['span_us'] - k['kernel_us']:.0f} us "
                    f"| {r['graphs_host_s'] * 1e6:.0f} us | {r['graphs_launch_s'] * 1e6:.0f} us |")
    if "suite" in results:
        say("")
        say("| suite item | hf tokens/s | paged tokens/s | paged / hf (>= 3) | hf tpot | paged tpot "
            "| paged above weights / (KV + ws) (<= 1.3) |")
        say("|---|---|---|---|---|---|---|")
        for name, r in results["suite"].items():
            h, p = r["hf"], r["paged"]
            say(f"| {name} | {num(h['tokens_per_s'])} | {num(p['tokens_per_s'])} | "
                f"{r.get('paged_over_hf', 0):.2f}x | {ms(h['tpot'])} | {ms(p['tpot'])} | "
                f"{p.get('above_over_declared', float('nan')):.3f} |")
    if "vl_phases" in results:
        say_vl_table(results["vl_phases"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "paged_h200.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "paged_h200.log").write_text("\n".join(LOG) + "\n")
    if "skinny_gemm" in results:  # this GPU's tiles: commit as memcheck/kernels/skinny_gemm_tiles.json
        (out / "skinny_gemm_tiles.json").write_text(json.dumps(results["skinny_gemm"]["table"], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

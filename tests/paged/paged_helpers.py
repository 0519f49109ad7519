"""Shared by the paged-stack tests: scaled-down workloads of the three families and a probe."""
import yaml

from memcheck import project, stacks, workload

# Tiny but complete: GQA with q/k/v bias (Qwen2); MLA without q LoRA + greedy softmax routing + 2 shared
# experts (V2-Lite); MLA with q LoRA + noaux_tc sigmoid routing over groups + a dense first layer (V3).
FAMILIES = {
    "r1-distill-qwen-7b": dict(layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                               num_key_value_heads=2, vocab_size=512),
    "deepseek-v2-lite": dict(layers=2, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                             num_attention_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                             v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, vocab_size=512),
    "deepseek-v3": dict(layers=2, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                        num_attention_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                        qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
                        topk_group=1, first_k_dense_replace=1, vocab_size=512),
}

# A mixed batch: different prompt lengths and arrival steps; 70-token prompts exceed the 48-token budget,
# so their prefill is chunked across steps while earlier requests decode.
MIXED = [
    {"count": 2, "prompt_tokens": 37, "max_new_tokens": 16},
    {"count": 2, "prompt_tokens": 70, "max_new_tokens": 16, "arrival_step": 1},
    {"count": 1, "prompt_tokens": 5, "max_new_tokens": 20, "arrival_step": 3},
]
ENGINE = {"block_size": 8, "max_num_batched_tokens": 48}


def make_workload(directory, preset="r1-distill-qwen-7b", overrides=None, requests=None, engine=None,
                  name="paged-test", stack_names=("hf", "paged"), **extra):
    doc = {"name": name, "model": {"preset": preset, "dtype": "float32", **(overrides or FAMILIES[preset])},
           "requests": requests or MIXED, "stacks": list(stack_names), "engine": engine or ENGINE, **extra}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return workload.load_file(str(path), None, stacks.names(), project.load(directory).thresholds)[0]


class Probe:
    """Stands in for the harness collectors: records what the stack reports after each step."""

    def __init__(self):
        self.points = []

    def step(self, n, **values):
        self.points.append((n, values))


def run_stack(stack_cls, wl, device="cpu"):
    import torch

    stack = stack_cls(wl, torch.device(device))
    stack_cls.check(wl, torch.device(device))
    stack.prepare()
    probe = Probe()
    try:
        result = stack.run(probe)
    finally:
        stack.close()
    return result, probe

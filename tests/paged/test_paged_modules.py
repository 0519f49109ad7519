"""Module-level agreement with transformers where the family runs do not reach: V2's
group_limited_greedy routing (the full DeepSeek-V2 preset), and a whole MoE layer."""
import pytest
import torch

from memcheck.stacks.paged.config import ModelSpec
from memcheck.stacks.paged.moe import MoE


def _config(topk_method, **extra):
    from transformers import DeepseekV2Config, DeepseekV3Config

    common = dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=16, n_routed_experts=8,
                  num_experts_per_tok=3, n_shared_experts=2, num_hidden_layers=2, num_attention_heads=2,
                  kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                  vocab_size=64, first_k_dense_replace=1, **extra)
    if topk_method == "noaux_tc":
        return DeepseekV3Config(**common, n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5)
    return DeepseekV2Config(**common, topk_method=topk_method, n_group=4, topk_group=2, routed_scaling_factor=16.0)


def _hf_moe(config):
    if config.model_type == "deepseek_v3":
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE as HFMoE
    else:
        from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Moe as HFMoE
    torch.manual_seed(0)
    moe = HFMoE(config).eval()
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.5)
    if hasattr(moe.gate, "e_score_correction_bias"):
        moe.gate.e_score_correction_bias.normal_(std=0.1)
    return moe


@pytest.mark.parametrize("method", ["greedy", "group_limited_greedy", "noaux_tc"])
def test_router_and_moe_match_transformers(method):
    config = _config(method)
    spec = ModelSpec.from_hf(config)
    assert spec.topk_method == method
    hf = _hf_moe(config)
    with torch.device("meta"):
        ours = MoE(spec)
    ours.load_state_dict(hf.state_dict(), strict=True, assign=True)
    x = torch.randn(40, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, hf_weights, hf_ids = hf.gate(x)
        weights, ids = ours.gate(x)
        order_hf, order = hf_ids.sort(-1), ids.sort(-1)
        assert torch.equal(order_hf.values, order.values)
        torch.testing.assert_close(weights.gather(1, order.indices), hf_weights.gather(1, order_hf.indices))
        torch.testing.assert_close(ours(x), hf(x[None])[0], rtol=1e-5, atol=1e-5)
        ours.shared_experts.fuse()  # the shared experts then run inside kernels.fused_moe
        assert ours.shared_experts.fused_weights() is not None
        torch.testing.assert_close(ours(x), hf(x[None])[0], rtol=1e-5, atol=1e-5)

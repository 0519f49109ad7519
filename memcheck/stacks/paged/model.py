"""The decoder the paged engine runs, for all three families, with the very tensors of the transformers
model the `hf` stack builds for the same preset and seed.

Module names mirror transformers' (model.layers.N.self_attn.q_proj, ...mlp.experts.gate_up_proj, lm_head),
so the transformers state dict loads with assign=True: parameters are taken over, never copied, and
the transformers model can be dropped. Tokens are packed: every tensor is [tokens, ...] for the whole
batch, with no padding."""
from __future__ import annotations

import torch
from torch import nn

from ... import transformers_compat
from .attention import Attention
from .config import ModelSpec
from .context import StepContext
from .layers import GatedMLP, Linear, RMSNorm, Rotary
from .mla import MLAttention
from .moe import MoE


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, i: int, rotary: Rotary):
        super().__init__()
        self.self_attn = (MLAttention(spec, rotary) if spec.mla
                          else Attention(spec, rotary, spec.qkv_bias))
        self.mlp = MoE(spec) if spec.is_moe_layer(i) else GatedMLP(spec.hidden, spec.intermediate, spec.mlp_bias)
        self.input_layernorm = RMSNorm(spec.hidden, spec.eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden, spec.eps)

    def forward(self, stream: list, ctx: StepContext) -> list:
        """stream: [the previous layer's MLP output (the embeddings first), the stream it adds to (None first)].
        Their sum is made inside the input norm's launch, as each sublayer's sum is made in the next norm's (no
        launch of its own). The list is emptied here, so the residual goes once added, not after attention.
        Returns [this layer's MLP output, the stream it adds to]."""
        h, residual = stream
        stream.clear()
        x = self.input_layernorm(h, residual=residual)  # h += residual
        del residual
        a = self.self_attn(x, ctx)
        del x
        m = self.mlp(self.post_attention_layernorm(a, residual=h))  # a += h
        return [m, a]


class Decoder(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: Rotary):
        super().__init__()
        self.rotary = rotary
        self.embed_tokens = nn.Embedding(spec.vocab, spec.hidden)
        self.layers = nn.ModuleList(DecoderLayer(spec, i, rotary) for i in range(spec.layers))
        self.norm = RMSNorm(spec.hidden, spec.eps)

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        if ctx.image_rows is not None:  # image placeholders take their image's features (DeepSeek-VL)
            h[ctx.image_rows] = ctx.image_feats.to(h.dtype)
        ctx.cos, ctx.sin = self.rotary.cos_sin(ctx.positions, h.dtype)
        stream = [h, None]
        del h  # (held by the stream only: each layer drops what it has added)
        for layer in self.layers:
            stream = layer(stream, ctx)
        h, residual = stream
        h += residual  # the last layer's sum: the final norm runs on the sampled rows only
        return h


class CausalLM(nn.Module):
    def __init__(self, spec: ModelSpec, rotary: Rotary):
        super().__init__()
        self.spec = spec
        self.model = Decoder(spec, rotary)
        self.lm_head = Linear(spec.hidden, spec.vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Hidden states [T, hidden] before the final norm."""
        return self.model(input_ids, ctx)

    def fuse_projections(self) -> None:
        """q/k/v into one projection (MLA: the query's first projection and the latent's), gate/up into one
        (dense MLPs, shared experts), layer by layer: one matrix product where there were three (two). The
        concatenated copy of a layer is made while its originals are still held, and on CUDA the originals'
        memory goes back to the driver before the next layer, so the transient is one layer's projections
        (in gpu.reserved too)."""
        for layer in self.model.layers:
            if isinstance(layer.self_attn, (Attention, MLAttention)):
                layer.self_attn.fuse()
            mlp = layer.mlp.shared_experts if isinstance(layer.mlp, MoE) else layer.mlp
            if mlp is not None:
                mlp.fuse()
            if self.lm_head.weight.is_cuda:
                torch.cuda.empty_cache()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits of the given rows only (the last token of each sequence that samples)."""
        return self.lm_head(self.model.norm(hidden)).float()

    @classmethod
    def from_hf(cls, hf_model, spec: ModelSpec) -> "CausalLM":
        """Take over the transformers model's parameters (same storage, no copy)."""
        language, prefix = _language_model(hf_model)
        inv_freq, attention_scaling = transformers_compat.rotary(language)
        rotary = Rotary(inv_freq, attention_scaling, spec.rope_interleave)
        with torch.device("meta"):
            model = cls(spec, rotary)
        state = {}
        for name, tensor in hf_model.state_dict(keep_vars=True).items():
            if name.startswith(prefix):
                state["model." + name[len(prefix):]] = tensor
            elif name.startswith("lm_head."):
                state[name] = tensor
        model.load_state_dict(state, strict=True, assign=True)
        for layer, hf_layer in zip(model.model.layers, language.layers):
            layer.self_attn.scale = transformers_compat.attention_scale(hf_layer.self_attn, spec.head_dim)
        return model.eval().requires_grad_(False)


def _language_model(hf_model):
    """The decoder stack of a causal LM, or the language model of a vision-language model, and the
    state-dict prefix of its tensors."""
    inner = hf_model.model
    if hasattr(inner, "language_model"):  # DeepseekVLHybrid: model.language_model.*, lm_head at the top
        return inner.language_model, "model.language_model."
    return inner, "model."

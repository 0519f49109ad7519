"""Plain torch references for every kernel: the definitions the Triton kernels are tested
against, and the CPU path when the Triton interpreter is off. Math in float32, result in the
input dtype. One Python loop over sequences: clear, not fast."""
import torch


def _gather(cache: torch.Tensor, block_row: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one sequence from a paged cache: [length, *cache.shape[2:]]."""
    block_size = cache.shape[1]
    blocks = block_row[:(length + block_size - 1) // block_size].long()
    return cache[blocks].flatten(0, 1)[:length]


def write_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """k_cache[slot] = key[t] for every token t with slot_mapping[t] >= 0 (same for V)."""
    _write_rows(key, k_cache, slot_mapping)
    _write_rows(value, v_cache, slot_mapping)


def write_latent(kv_a, norm_weight, eps, cos, sin, interleaved, cache, slot_mapping, q_pe=None):
    """MLA: the cache rows of new tokens from kv_a_proj_with_mqa's output [T, rank + rope]: the latent
    normalised (kv_a_layernorm), the rope part rotated, side by side. With q_pe: the query's rope heads rotated."""
    q_out = None if q_pe is None else rotary(q_pe, cos, sin, interleaved)
    rank = kv_a.shape[1] - 2 * cos.shape[-1]
    kv_c, k_pe = kv_a.split([rank, kv_a.shape[1] - rank], dim=-1)
    k_pe = rotary(k_pe.reshape(k_pe.shape[0], 1, -1), cos, sin, interleaved)[:, 0]
    _write_rows(torch.cat((rms_norm(kv_c, norm_weight, eps), k_pe), dim=-1), cache, slot_mapping)
    return q_out


def rotate_and_write_kv(qkv, heads, kv_heads, cos, sin, interleaved, k_cache, v_cache, slot_mapping):
    """The query rotated; the key rotated and the value written to the caches (from the fused [q | k | v] rows)."""
    tokens, dim = qkv.shape[0], k_cache.shape[-1]
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q = rotary(q.view(tokens, heads, dim), cos, sin, interleaved)
    write_kv(rotary(k.view(tokens, kv_heads, dim), cos, sin, interleaved), v.view(tokens, kv_heads, dim), k_cache,
             v_cache, slot_mapping)
    return q


def _write_rows(rows, cache, slot_mapping) -> None:
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = cache.shape[1]
    cache[slots // block_size, slots % block_size] = rows[keep].to(cache.dtype)


def _attend(q, k, v, scale, mask=None):
    """q [Hkv, M, D] (M = queries x group), k/v [Hkv, L, D] -> [Hkv, M, Dv], float32."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1), v.float())


def paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale) -> torch.Tensor:
    """q [S, Hq, D]; caches [blocks, block_size, Hkv, D]; one new token per sequence."""
    num_seqs, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    out = torch.zeros_like(q)
    for i in range(num_seqs):
        length = int(seq_lens[i])
        if length == 0:
            continue
        k = _gather(k_cache, block_table[i], length).transpose(0, 1)  # [Hkv, L, D]
        v = _gather(v_cache, block_table[i], length).transpose(0, 1)
        qi = q[i].reshape(num_kv_heads, group, head_dim)
        out[i] = _attend(qi, k, v, scale).reshape(num_q_heads, -1).to(q.dtype)
    return out


def paged_prefill(q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale) -> torch.Tensor:
    """q [T, Hq, D]: the new tokens of every sequence, packed (sequence i owns rows
    cu_seqlens_q[i]:cu_seqlens_q[i+1]); their K/V are already in the cache. They sit at the end
    of their sequence: causal among themselves, full attention to the cached prefix."""
    num_q_heads, head_dim = q.shape[1:]
    num_kv_heads = k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    out = torch.zeros_like(q)
    for i in range(len(seq_lens)):
        start, end, length = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1]), int(seq_lens[i])
        if end == start:
            continue
        k = _gather(k_cache, block_table[i], length).transpose(0, 1)
        v = _gather(v_cache, block_table[i], length).transpose(0, 1)
        q_pos = torch.arange(length - (end - start), length, device=q.device)
        mask = torch.arange(length, device=q.device)[None, :] <= q_pos[:, None]  # [Q, L]
        qi = q[start:end].reshape(end - start, num_kv_heads, group, head_dim).permute(1, 0, 2, 3)
        mask = mask[None, :, None, :].expand(num_kv_heads, -1, group, -1).reshape(num_kv_heads, -1, length)
        o = _attend(qi.reshape(num_kv_heads, -1, head_dim), k, v, scale, mask)
        o = o.reshape(num_kv_heads, end - start, group, head_dim).permute(1, 0, 2, 3)
        out[start:end] = o.reshape(end - start, num_q_heads, head_dim).to(q.dtype)
    return out


def mla_decode(q_latent, q_pe, latent_cache, block_table, seq_lens, scale) -> torch.Tensor:
    """Absorbed multi-head latent attention, one new token per sequence.
    q_latent [S, H, R] (q_nope already multiplied by W_UK), q_pe [S, H, P];
    latent_cache [blocks, block_size, R + P] holds kv_c (R) then k_pe (P).
    scores = q_latent.kv_c + q_pe.k_pe; out [S, H, R] = softmax(scores) @ kv_c (caller applies W_UV)."""
    rank = q_latent.shape[-1]
    out = torch.zeros_like(q_latent)
    for i in range(q_latent.shape[0]):
        length = int(seq_lens[i])
        if length == 0:
            continue
        kv = _gather(latent_cache, block_table[i], length)  # [L, R + P]
        q = torch.cat([q_latent[i], q_pe[i]], dim=-1)  # [H, R + P]
        out[i] = _attend(q[None], kv[None], kv[None, :, :rank], scale)[0].to(q_latent.dtype)
    return out


def mla_prefill(q_latent, q_pe, latent_cache, block_table, cu_seqlens_q, seq_lens, scale) -> torch.Tensor:
    """Absorbed MLA over packed new tokens (see mla_decode): paged prefill with the latent as the one
    shared K head (kv_c then k_pe) and kv_c as its V; out [T, H, R]."""
    rank = q_latent.shape[-1]
    latent = latent_cache[:, :, None]  # [blocks, block_size, 1, R + P]: one KV head for every query head
    q = torch.cat((q_latent, q_pe), dim=-1)
    # V is the whole latent row here (one cache for both); its last P columns of output are dropped.
    return paged_prefill(q, latent, latent, block_table, cu_seqlens_q, seq_lens, scale)[..., :rank]


def mla_mha_prefill(q_nope, q_pe, latent_cache, block_table, cu_seqlens_q, seq_lens, kv_b_weight, scale):
    """MLA prefill decompressed (memcheck/kernels/mla_mha.py): each sequence's latent rows through kv_b_proj (kv_b_weight
    [H * (nope + v), rank]) into per-head keys (nope part; k_pe shared by the heads) and values, then causal
    multi-head attention with (nope + rope)-wide scores. q_nope [T, H, nope], q_pe [T, H, rope]; out [T, H, v]."""
    num_tokens, heads, nope = q_nope.shape
    rank = kv_b_weight.shape[1]
    v_dim = kv_b_weight.shape[0] // heads - nope
    out = q_nope.new_zeros(num_tokens, heads, v_dim)
    for i in range(len(seq_lens)):
        start, end, length = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1]), int(seq_lens[i])
        if end == start:
            continue
        latent = _gather(latent_cache, block_table[i], length).float()  # [L, rank + rope]
        kv = torch.nn.functional.linear(latent[:, :rank], kv_b_weight.float()).view(length, heads, nope + v_dim)
        k_pe = latent[:, None, rank:].expand(-1, heads, -1)
        k = torch.cat((kv[..., :nope], k_pe), dim=-1).transpose(0, 1)  # [H, L, nope + rope]
        q = torch.cat((q_nope[start:end], q_pe[start:end]), dim=-1).transpose(0, 1)  # [H, Q, nope + rope]
        q_pos = torch.arange(length - (end - start), length, device=q.device)
        mask = torch.arange(length, device=q.device)[None, :] <= q_pos[:, None]  # [Q, L]
        out[start:end] = _attend(q, k, kv[..., nope:].transpose(0, 1), scale, mask).transpose(0, 1).to(out.dtype)
    return out


def route(x, weight, bias, *, method, top_k, n_group, topk_group, normalise, scaling):
    """A MoE router: x [T, hidden], weight [experts, hidden] -> (routing weights [T, top_k] float32,
    scaling included; expert ids [T, top_k]). Logits in float32 as DeepSeek's gates compute them.
    greedy: softmax, top_k. group_limited_greedy: softmax, top_k inside the topk_group groups of best
    expert. noaux_tc: sigmoid (+ bias to rank), groups ranked by their two best, weights normalised."""
    logits = torch.nn.functional.linear(x.float(), weight.float())
    experts = weight.shape[0]
    if method == "noaux_tc":
        scores = logits.sigmoid()
        choice = scores + bias
        group_scores = choice.view(-1, n_group, experts // n_group).topk(2, dim=-1)[0].sum(-1)
        choice = choice.masked_fill(~_best_groups(group_scores, topk_group, experts), float("-inf"))
        ids = choice.topk(top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
    else:
        scores = logits.softmax(-1)
        if method == "group_limited_greedy":
            group_scores = scores.view(-1, n_group, experts // n_group).max(-1).values
            scores = scores.masked_fill(~_best_groups(group_scores, topk_group, experts), 0.0)
        weights, ids = scores.topk(top_k, dim=-1, sorted=False)
    if normalise:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * scaling, ids


def _best_groups(group_scores, topk_group, experts) -> torch.Tensor:
    """[T, experts] bool: the experts of each token's topk_group best groups."""
    keep = torch.zeros_like(group_scores, dtype=torch.bool)
    keep.scatter_(1, group_scores.topk(topk_group, dim=-1, sorted=False)[1], True)
    return keep.repeat_interleave(experts // group_scores.shape[1], dim=1)


def fused_moe(x, gate_up, down, weights, ids, shared_gate_up=None, shared_down=None) -> torch.Tensor:
    """Routed experts: picks grouped by expert (one sort), each expert's rows through its gated MLP,
    weighted and added to their tokens; then the shared experts' gated MLP (fused gate and up rows) added,
    as transformers adds it. x [T, hidden]; gate_up [E, 2 x inter, hidden]; down [E, hidden, inter];
    weights [T, top_k] float32; ids [T, top_k]. One Python loop over experts (a host sync)."""
    import torch.nn.functional as F

    top_k = ids.shape[1]
    flat = ids.flatten()
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=gate_up.shape[0]).tolist()
    token_of = order // top_k
    out = torch.zeros_like(x)
    start = 0
    for expert, n in enumerate(counts):
        if not n:
            continue
        rows, picks = token_of[start:start + n], order[start:start + n]
        gate, up = F.linear(x[rows], gate_up[expert]).chunk(2, dim=-1)
        h = F.linear(F.silu(gate) * up, down[expert])
        out.index_add_(0, rows, (h * weights.flatten()[picks, None]).to(out.dtype))
        start += n
    if shared_gate_up is not None:
        out += F.linear(silu_mul_(F.linear(x, shared_gate_up)), shared_down)
    return out


def rms_norm(x, weight, eps, residual=None) -> torch.Tensor:
    """transformers' RMSNorm (float32 statistics, the weight multiplied in the input dtype); with residual,
    x += residual first, in place."""
    if residual is not None:
        x += residual
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotary(x, cos, sin, interleaved: bool) -> torch.Tensor:
    """x [T, heads, D] rotated by cos/sin [T, D/2]: halves (neox, in x's dtype) or (even, odd) pairs
    (interleaved, in float32, written evens then odds)."""
    cos, sin = cos[:, None, :], sin[:, None, :]
    if interleaved:
        x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    else:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def silu_mul_(gate_up) -> torch.Tensor:
    """gate_up [T, 2 x inter] -> its gate half, overwritten with silu(gate) * up."""
    import torch.nn.functional as F

    h, up = gate_up.chunk(2, dim=-1)
    F.silu(h, inplace=True).mul_(up)
    return h

"""Each rank builds only its shard (seeded_weights + tensor_parallel.shard): the slices hold tensor_parallel 1's
values bit for bit, the full model is never built, and a rank's weights are half of tensor_parallel 1's plus what
every rank holds whole. Runs in one process (rank and world size given), for the three families."""
import pytest
import torch

from memcheck.models import build_hf_model
from memcheck.stacks.paged.config import ModelSpec
from memcheck.stacks.paged.model import CausalLM
from memcheck.stacks.paged.seeded_weights import SeededWeights
from memcheck.stacks.paged.tensor_parallel import shard
from tests.paged.paged_helpers import FAMILIES, make_workload


def nbytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def rank_model(wl, spec, rank, n, device="cpu"):
    weights = SeededWeights(device)
    hf = build_hf_model(wl, device, weights=weights)
    assert all(p.is_meta for p in hf.parameters())  # the full model is never drawn
    model = CausalLM.from_hf(hf, spec)
    local, note = shard(model, spec, weights, rank, n)
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    return model.state_dict(), local, note


def reassembled(name: str, parts: list[torch.Tensor], full: torch.Tensor) -> torch.Tensor:
    """The full tensor from the ranks' slices: whole tensors must be the same on every rank; sliced ones are
    put back along the dimension they were cut (a fused [gate; up] tensor half by half)."""
    if parts[0].shape == full.shape:
        assert all(torch.equal(p, parts[0]) for p in parts), name
        return parts[0]
    dim = next(d for d in range(full.dim()) if parts[0].shape[d] != full.shape[d])
    if name.endswith("experts.gate_up_proj"):
        halves = [p.chunk(2, dim) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim)
    return torch.cat(parts, dim)


@pytest.mark.parametrize("preset,n", [(preset, 2) for preset in FAMILIES] + [("deepseek-v2-lite", 4)])
def test_rank_slices_hold_tensor_parallel_1_weights_and_1_nth_of_the_bytes(tmp_path, preset, n):
    wl = make_workload(tmp_path, preset)
    hf = build_hf_model(wl, "cpu")
    spec = ModelSpec.from_hf(hf.config)
    tp1 = {k: v.clone() for k, v in CausalLM.from_hf(hf, spec).state_dict().items()}
    del hf
    ranks = [rank_model(wl, spec, r, n) for r in range(n)]
    for name, full in tp1.items():
        assert torch.equal(reassembled(name, [state[name] for state, _, _ in ranks], full), full), name
    whole = sum(t.numel() * t.element_size() for name, t in tp1.items()
                if ranks[0][0][name].shape == t.shape)
    for state, local, note in ranks:
        assert state.keys() == tp1.keys()
        assert nbytes(state) == (nbytes(tp1) - whole) // n + whole
        assert nbytes(state) < (1 / n + 0.05) * nbytes(tp1)
        assert local.heads * n == spec.heads
        assert "norm.weight" in note and (not spec.mla or "kv_a_proj_with_mqa" in note)
    print(preset, "TP1", nbytes(tp1), f"bytes; per rank at TP{n}", nbytes(ranks[0][0]), "of which whole", whole)


def test_a_parameter_without_a_recorded_init_is_an_error():
    weights = SeededWeights("cpu")
    with pytest.raises(RuntimeError, match="no seeded init was recorded"):
        weights.materialise(torch.empty(4, 4, device="meta"))


def test_a_transformers_without_its_init_table_cannot_shard_and_says_which(tmp_path, monkeypatch):
    """Each rank's seeded weights are recorded through transformers.initialization (5.0 and newer; 4.x models
    initialise through Tensor methods it cannot see): under 4.x the item no longer runs, the release named, rather
    than a rank crashing on the import."""
    import importlib.util

    from memcheck.errors import SoftwareUnsupported
    from memcheck.stacks.paged import tensor_parallel

    wl = make_workload(tmp_path, "r1-distill-qwen-7b", tensor_parallel=2)
    spec = ModelSpec.from_hf(build_hf_model(wl, "meta").config)
    tensor_parallel.check(wl, spec, torch.device("cpu"))  # this transformers has it
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers.initialization" else find_spec(name, *a))
    monkeypatch.setattr(tensor_parallel.compat, "version", lambda: "4.44.2")
    with pytest.raises(SoftwareUnsupported, match=r"transformers.initialization .*transformers 4.44.2 has none"):
        tensor_parallel.check(wl, spec, torch.device("cpu"))

"""The Gluon kernels' answers on an H200 against the float32 references: the checks of benchmarks/mla_hopper_h200.py
(the MLA seesaw decode) and benchmarks/prefill_hopper_h200.py (the Hopper prefill, dense and MLA decompressed), one test
a check, called as those scripts call them (the same functions, shapes and bound; unheld cache slots NaN). Triton's
interpreter cannot run Gluon: these need a Hopper GPU, where they run on their own (the CPU suite interprets Triton):

    pytest -m gpu tests/gpu

Elsewhere they are collected and skipped with the reason (no CUDA device, or not sm_90)."""
import pytest
import torch

from gpu_helpers import no_hopper

pytestmark = pytest.mark.gpu

REASON = no_hopper()
if REASON is None:  # the scripts import the kernels: only where they can run
    import mla_hopper_h200 as mla_bench
    import prefill_hopper_h200 as prefill_bench

    MLA_CHECKS, PREFILL_CHECKS, MLA_PREFILL_CHECKS = mla_bench.CHECKS, prefill_bench.CHECKS, prefill_bench.MLA_CHECKS
    NARROW_CHECKS = [spec for spec in MLA_CHECKS if spec[0] <= 32]
else:
    MLA_CHECKS = PREFILL_CHECKS = MLA_PREFILL_CHECKS = NARROW_CHECKS = [
        pytest.param(None, marks=pytest.mark.skip(reason=REASON), id="skipped")]


@pytest.fixture
def gen():
    torch.manual_seed(0)
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("spec", MLA_CHECKS, ids=str)
def test_mla_seesaw_decode_matches_the_float32_reference(spec, gen):
    row = mla_bench.check(*spec, gen, ["seesaw"])
    assert row["ok"], row


@pytest.mark.parametrize("spec", NARROW_CHECKS, ids=str)
def test_mla_narrow_decode_matches_the_float32_reference(spec, gen, monkeypatch):
    """memcheck/kernels/mla_narrow.py (32 heads or fewer, the heads as the products' N) on the seesaw's checks."""
    monkeypatch.setitem(mla_bench.VARIANTS, "narrow", mla_bench.NARROW)
    row = mla_bench.check(*spec, gen, ["narrow"])
    assert row["ok"], row


@pytest.mark.parametrize("spec", PREFILL_CHECKS, ids=str)
def test_hopper_prefill_matches_the_float32_reference(spec, gen, monkeypatch):
    monkeypatch.setattr(prefill_bench, "TIMED", {"hopper": prefill_bench.HOPPER})
    row = prefill_bench.check(*spec, gen)
    assert row["ok"], row


@pytest.mark.parametrize("spec", MLA_PREFILL_CHECKS, ids=str)
def test_hopper_mla_prefill_decompressed_matches_the_float32_reference(spec, gen, monkeypatch):
    monkeypatch.setattr(prefill_bench, "TIMED", {"hopper": prefill_bench.HOPPER})
    row = prefill_bench.mla_check(*spec, gen)
    assert row["ok"], row

"""benchmarks/kernels_h200.py --grid: its floor arithmetic and its cell list, on the CPU (nothing timed).
The floors are checked against the ones the quoted table implies (its ms over its x floor) at one matmul rate and the
H200's copy bandwidth: the grid must judge new kernels by the floor that table set."""
import pytest

from benchmarks import kernels_h200 as kg

COPY_BPS, MM_FLOPS = 4.28e12, 7.9e14  # the H200's copy; the rate the quoted dense prefill rows imply


def cell(family, name):
    return next(c for c in kg.all_cells(kg.GRID) if c.family == family and c.name == name)


def floor(c):
    return kg.floor_ms(kg.traffic_bytes(c), kg.attention_flops(c), COPY_BPS, MM_FLOPS)


@pytest.mark.parametrize("family,name,quoted_ms,quoted_x", [
    (kg.MLA_DECODE, "MLA 16h b1 x 64K", 0.48, 27),  # bytes-bound: 64K latent rows of 1152 B
    (kg.PREFILL, "GQA 28/4 1 x 32K causal", 30.5, 3.1),  # FLOP-bound from here on
    (kg.PREFILL, "GQA 28/4 1 x 32K causal", 13.0, 1.3),  # (SDPA's pair of numbers: the same floor)
    (kg.PREFILL, "GQA 28/4 8 x 2K causal", 1.12, 3.7),
    (kg.PREFILL, "GQA 28/4 1 x 2K new on 30K cached", 4.2, 3.6),
])
def test_floor_is_the_quoted_tables(family, name, quoted_ms, quoted_x):
    assert floor(cell(family, name)) == pytest.approx(quoted_ms / quoted_x, rel=0.05)


def test_floor_takes_the_larger_bound():
    mla_128 = cell(kg.MLA_DECODE, "MLA 128h b8 x 4K")  # 128 heads x 1088 FLOPs per 1152-byte row: compute-bound
    moved, flops = kg.traffic_bytes(mla_128), kg.attention_flops(mla_128)
    assert flops / MM_FLOPS > moved / COPY_BPS
    assert floor(mla_128) == pytest.approx(flops / MM_FLOPS * 1e3)
    mla_16 = cell(kg.MLA_DECODE, "MLA 16h b8 x 4K")
    assert floor(mla_16) == pytest.approx(kg.traffic_bytes(mla_16) / COPY_BPS * 1e3)


def test_mla_prefill_floor_counts_the_decompressed_widths():
    """16 heads, q/k 192 and v 128 wide over a causal 4K prompt: 2 x 4096 x 4097 / 2 pairs x 16 x 320."""
    c = cell(kg.MLA_PREFILL, "MLA 16h 1 x 4K causal")
    assert kg.attention_flops(c) == 2 * (4096 * 4097 // 2) * 16 * (192 + 128)


def test_cells_over_the_cap_are_skipped_and_listed():
    cells, skipped = kg.grid_cells(kg.GRID)
    assert all(kg.cache_bytes(c) <= kg.GRID["cap_bytes"] for c in cells)
    assert all(kg.cache_bytes(c) > kg.GRID["cap_bytes"] for c, _ in skipped)
    assert sorted(c.name for c in cells + [c for c, _ in skipped]) == sorted(c.name for c in kg.all_cells(kg.GRID))
    assert {c.name for c, _ in skipped} == {  # K + V of 2 KiB (GQA 28/4) to 16 KiB (MHA 32/32) a token
        "GQA 28/4 b256 x 128K", "GQA 32/8 b128 x 128K", "GQA 32/8 b256 x 128K", "MHA 32/32 b32 x 128K",
        "MHA 32/32 b128 x 128K", "MHA 32/32 b256 x 128K", "MHA 32/32 b128 x 32K", "MHA 32/32 b256 x 32K"}
    assert any(c.family == kg.MLA_DECODE and c.batch == 256 and c.context == 131072 for c in cells)  # 38.7 GB


def test_quoted_rows_run_first_and_every_quote_has_cells():
    cells, _ = kg.grid_cells(kg.GRID)
    ranks = [kg.quoted_rank(c, kg.GRID) for c in cells]
    assert ranks == sorted(ranks)
    quoted = [c for c in cells if any(q["match"](c, kg.GRID) for q in kg.VLLM_QUOTED)]
    assert cells[:len(quoted)] == quoted
    for quote in kg.VLLM_QUOTED:
        assert any(quote["match"](c, kg.GRID) for c in cells), quote["case"]
    assert cell(kg.DECODE, "GQA 28/4 b1 x 128K") in quoted and cell(kg.DECODE, "MHA 32/32 b1 x 128K") not in quoted


def test_the_full_grid_fits_one_device_call():
    cells, _ = kg.grid_cells(kg.GRID)
    assert kg.estimate_seconds(cells, kg.GRID) <= 6 * 60


def test_config_sweep_table_ranks_by_the_worst_cell_and_a_wrong_output_last(monkeypatch):
    lines = []
    monkeypatch.setattr(kg, "log", lambda *parts: lines.append(" ".join(str(p) for p in parts)))
    base = {**kg.prefill.CONFIG, "rows": 64, "num_warps": 4, "num_stages": 2, "split_causal": False,
            "one_head_per_program": False}  # every field of the default, as a sweep's configs have
    fast_wrong = {**base, "block_n": 128, "x_floor": 1.1, "rel_err_vs_default": 0.5}  # fastest, but not the answer
    steady = {**base, "block_n": 64, "x_floor": 1.6, "rel_err_vs_default": 0.0}
    uneven = {**base, "block_n": 32}  # best on one cell, worst on the other
    swept = [{"name": "one", "sweep": [fast_wrong, steady, {**uneven, "x_floor": 1.2, "rel_err_vs_default": 0.0}]},
             {"name": "two", "sweep": [fast_wrong, steady, {"error": "out of resources", **uneven}]}]
    kg.config_sweep_table(swept, "prefill")
    ranked = [line.split()[1] for line in lines[2:]]  # each row starts with rows, block_n
    assert ranked[0] == "64" and sorted(ranked[1:]) == ["128", "32"]  # steady (1.6) first; the other two: err
    assert [line.split()[-1] for line in lines[2:]] == ["1.60", "err", "err"]


def test_every_swept_config_names_the_same_fields_as_its_default():
    """The sweep table keys a config by its default's fields: a field the default lacks would merge two configs
    into one row, and a missing one would fall back to the default silently."""
    for key, (title, default, configs) in kg.SWEEPS.items():
        assert configs, key
        for cfg in configs:
            assert set(cfg) == set(default), (key, cfg)
        assert len({tuple(cfg[f] for f in default) for cfg in configs}) == len(configs), f"{title}: a config twice"


def test_sweep_of_picks_the_prefill_cells_and_the_named_decode_cells():
    picked = {c.name: kg.sweep_of(c, kg.GRID) for c in kg.all_cells(kg.GRID) if kg.sweep_of(c, kg.GRID)}
    assert picked["MLA 128h b256 x 4K"] == "mla-decode-128" and picked["MLA 16h b1 x 64K"] == "mla-decode-16"
    assert picked["MLA 128h b1 x 128K"] == "mla-decode-128"
    assert picked["MLA 128h b8 x 1K"] == "mla-decode-128" and picked["MLA 16h b32 x 4K"] == "mla-decode-16"
    assert "MLA 128h b128 x 4K" not in picked and "MLA 128h b8 x 32K" not in picked
    assert "GQA 28/4 b1 x 128K" not in picked and "MLA 16h b1 x 128K" not in picked
    prefills = [c for c in kg.all_cells(kg.GRID) if c.family in kg.PREFILLS]
    assert all(kg.sweep_of(c, kg.GRID) in kg.SWEEPS for c in prefills)


def test_mla_attention_table_splits_the_attention_kernel_from_the_decompression(monkeypatch):
    lines = []
    monkeypatch.setattr(kg, "log", lambda *parts: lines.append(" ".join(str(p) for p in parts)))
    row = {"family": kg.MLA_MHA_PREFILL, "name": "MLA 16h 1 x 4K causal", "status": "ok", "floor_ms": 0.1,
           "ms": 0.23, "x_floor": 2.3, "floor_bound": "FLOPs", "sdpa": {"ms": 0.18, "x_floor": 1.8},
           "kernel_us": {"_prefill_hopper": 150.0, "nvjet_gemm": 50.0, "_gather_latent": 20.0}}
    kg.mla_attention_table([row, {**row, "family": kg.DECODE}])
    assert len(lines) == 3  # the title, the header, the one decompressed cell
    fields = lines[2].split()
    at = fields.index("causal") + 1  # floor, whole, x, attention alone, its x, SDPA
    assert fields[at:at + 6] == ["0.100", "0.230", "2.30*", "0.150", "1.50", "0.180"]
    assert lines[2].endswith("nvjet_gemm 0.050, _gather_latent 0.020")

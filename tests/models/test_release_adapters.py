"""The adapters between transformers releases (memcheck/transformers_compat.py), checked on the shapes each
release gives them, whichever release this venv has."""
import pytest
import torch

from memcheck import transformers_compat as compat
from memcheck.presets import PRESETS


@pytest.fixture
def release(monkeypatch):
    """Pretend to be another transformers release."""
    def set_version(major_minor):
        monkeypatch.setattr(compat, "version_tuple", lambda: major_minor)
    return set_version


def test_rope_parameters_become_4x_fields_before_5(release):
    r1 = PRESETS["r1-distill-qwen-7b"].config
    release((5, 0))
    assert compat.config_fields(r1) is r1
    release((4, 57))
    fields = compat.config_fields(r1)
    assert "rope_parameters" not in fields
    assert fields["rope_theta"] == 10000.0 and fields["rope_scaling"] is None

    v3 = compat.config_fields(PRESETS["deepseek-v3"].config)
    assert v3["rope_theta"] == 10000.0
    assert v3["rope_scaling"] == {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                                  "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}
    # A vision-language preset's text config is converted too.
    vl = compat.config_fields(PRESETS["deepseek-vl-7b"].config)
    assert vl["text_config"]["rope_theta"] == 10000.0 and "rope_parameters" not in vl["text_config"]


def test_per_layer_type_rope_parameters_become_gemma3s_4x_fields(release):
    release((4, 57))
    gemma3 = {"model_type": "gemma3_text", "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
    fields = compat.config_fields(gemma3)
    assert fields["rope_theta"] == 1000000.0 and fields["rope_local_base_freq"] == 10000.0
    assert fields["rope_scaling"] == {"rope_type": "linear", "factor": 8.0}


def test_dtype_keyword_follows_the_release(release):
    release((4, 55))
    assert compat.dtype_kwargs(torch.float32) == {"torch_dtype": torch.float32}
    release((4, 56))
    assert compat.dtype_kwargs(torch.float32) == {"dtype": torch.float32}


class _Layer:
    def __init__(self, keys, values):
        self.keys, self.values, self.is_initialized = keys, values, True


class _LayeredCache:  # 4.56+ / 5.x
    def __init__(self, layers):
        self.layers = layers

    def get_seq_length(self):
        return self.layers[0].keys.shape[-2]


class _ListCache:  # 4.4x DynamicCache / HybridCache
    def __init__(self, keys, values, length):
        self.key_cache, self.value_cache, self.length = keys, values, length

    def get_seq_length(self):
        return self.length


def test_cache_tensors_in_every_release_layout():
    k, v = torch.zeros(2, 1, 5, 4), torch.ones(2, 1, 5, 4)
    empty = torch.zeros(0)
    assert len(compat.cache_tensors(_LayeredCache([_Layer(k, v), _Layer(k, v)]))) == 4
    assert len(compat.cache_tensors(_ListCache([k, k, empty], [v, v, empty], 5))) == 4
    assert len(compat.cache_tensors(((k, v), (k, v)))) == 4  # legacy tuples
    assert compat.cache_tensors(None) == []


def test_cache_length_where_the_cache_does_not_count_it():
    k = torch.zeros(1, 1, 64, 4)  # a static cache: 64 slots
    assert compat.cache_seq_length(_ListCache([k], [k], 7)) == 7
    hybrid = _ListCache([k], [k], None)  # 4.4x HybridCache.get_seq_length() is None
    assert compat.cache_seq_length(hybrid, torch.tensor([11])) == 12
    assert compat.cache_seq_length(((torch.zeros(1, 1, 9, 4), torch.zeros(1, 1, 9, 4)),)) == 9


def test_the_forward_cache_under_either_name():
    cache = object()
    assert compat.forward_cache({"cache": cache}, {}) is cache  # 5.25
    assert compat.forward_cache({"past_key_values": cache}, {}) is cache
    assert compat.forward_cache({}, {"past_key_values": cache}) is cache
    assert compat.forward_cache({}, {}) is None


def test_missing_model_types_name_what_this_release_lacks(monkeypatch):
    monkeypatch.setattr(compat, "known_model_types", lambda: {"llama", "qwen2"})
    assert compat.missing_model_types({"llama", "deepseek_v3", "deepseek_v2"}) == ["deepseek_v2", "deepseek_v3"]

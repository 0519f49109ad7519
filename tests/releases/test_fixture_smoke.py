"""The `memcheck` fixture in the canary's environments: a block of user code measured, gated and baselined under
whichever transformers is installed."""


def test_generate_of_a_tiny_llama(memcheck):
    import torch
    import transformers

    config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    prompt = torch.randint(16, 256, (2, 32))
    # host.rss.peak is the whole test process's resident peak (an xdist worker's, after other tests): not this block's
    rules = {"cpu.heap_alloc.peak": {"max_increase": "25%"}, "host.rss.peak": "off"}
    with memcheck(thresholds=rules), torch.inference_mode():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, min_new_tokens=8,
                             do_sample=False, pad_token_id=0)
    assert out.shape == (2, 40)

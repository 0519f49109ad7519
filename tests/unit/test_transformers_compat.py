"""Our top-level packages `kernels` and `harness` share PyPI names with other projects; transformers
probes for Hugging Face's `kernels`. Installing memcheck must not make transformers use ours."""
import subprocess
import sys

SCRIPT = """
import torch
import transformers
from memcheck import kernels
from transformers.utils import import_utils
assert "memcheck" in kernels.__doc__ or "paged" in kernels.__doc__.lower(), kernels.__file__
assert not import_utils.is_kernels_available(), "transformers mistook our kernels package for Hugging Face's"
config = transformers.Qwen2Config(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                  num_key_value_heads=1, vocab_size=64)
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(config)
out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0)
assert out.shape == (1, 6)
print("ok")
"""


def test_transformers_works_beside_our_kernels_package():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")

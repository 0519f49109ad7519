"""Our import names are ours alone. transformers 5.25+ requires Hugging Face's `kernels` distribution and imports
it as `kernels` (`from kernels import CUDAProperties`); a clone of memcheck run from its root puts the checkout
first on sys.path. Both must resolve in one process: theirs as `kernels`, ours as `memcheck.kernels`."""
import importlib.metadata
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import importlib.util, sys
import transformers
from memcheck import kernels as ours
assert sys.path[0] in ("", {root!r}), sys.path[:2]  # started in the checkout: it is first on sys.path
assert ours.__file__.startswith({root!r}), ours.__file__
if {theirs}:
    import kernels
    assert kernels.__file__ != ours.__file__ and "site-packages" in kernels.__file__, kernels.__file__
    from kernels import LayerRepository  # noqa: F401 - Hugging Face's API, not a namespace of ours
else:
    assert importlib.util.find_spec("kernels") is None
if importlib.util.find_spec("transformers.integrations.hub_kernels"):  # transformers 4.52 and newer
    from transformers.integrations import hub_kernels
    from transformers.utils.import_utils import is_kernels_available
    print("hub integration:", is_kernels_available(), getattr(hub_kernels, "_kernels_available", "n/a"))
import torch
q = torch.randn(2, 4, 8)
k = torch.randn(3, 4, 1, 8)
out = ours.paged_decode(q, k, k.clone(), torch.tensor([[0, 2], [1, 0]], dtype=torch.int32),
                        torch.tensor([6, 3], dtype=torch.int32), 0.3)
assert out.shape == q.shape
print("ok", transformers.__version__)
"""


def hf_kernels_version() -> str | None:
    try:
        return importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        return None


def transformers_requires_kernels() -> bool:
    """Whether the installed transformers requires Hugging Face's kernels (5.25 and newer do)."""
    return any(r.split(";")[0].replace(" ", "").startswith(("kernels>", "kernels=", "kernels<", "kernels~"))
               or r.split(";")[0].strip() == "kernels"
               for r in importlib.metadata.requires("transformers") or [] if "extra ==" not in r)


def test_hugging_faces_kernels_and_ours_in_one_process_from_the_repository_root():
    """Where transformers requires Hugging Face's kernels it must be installed, and both import; where neither
    is installed (transformers 4.x environments), ours still imports from the root and nothing named kernels
    exists to shadow."""
    theirs = hf_kernels_version() is not None
    assert theirs or not transformers_requires_kernels(), "transformers requires kernels, which is not installed"
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(root=str(ROOT), theirs=theirs)], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("ok"), proc.stdout


def test_pytest_from_the_repository_root_loads_the_plugin():
    """`python -m pytest` in a clone: the checkout's memcheck is the plugin, whatever else is installed."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--memcheck", "--collect-only", "-q",
                           "tests/releases/canary.yaml"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "canary-llama[hf]" in proc.stdout

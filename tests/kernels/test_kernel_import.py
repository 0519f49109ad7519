"""kernels imports cheaply and never passes for Hugging Face's `kernels` package; on the CPU
without the interpreter it runs the torch reference without importing Triton."""
import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(code):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=True, env=env, cwd=ROOT)


def test_import_is_cheap_and_defines_no_version():
    run("""
        import sys
        from memcheck import kernels
        assert "torch" not in sys.modules and "triton" not in sys.modules, "kernels imported torch or triton"
        assert not hasattr(kernels, "__version__")
        for name in kernels.__all__:
            assert callable(getattr(kernels, name)), name
    """)


def test_cpu_path_without_the_interpreter_needs_no_triton():
    run("""
        import sys
        import torch
        from memcheck import kernels
        q = torch.randn(2, 4, 8)
        k = torch.randn(3, 4, 1, 8)
        out = kernels.paged_decode(q, k, k.clone(), torch.tensor([[0, 2], [1, 0]], dtype=torch.int32),
                                   torch.tensor([6, 3], dtype=torch.int32), 0.3)
        assert out.shape == q.shape and not out.isnan().any()
        assert "triton" not in sys.modules, "the CPU reference path imported triton"
    """)

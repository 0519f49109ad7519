"""The paged stack's note on Triton compiles inside the timed run (memcheck/stacks/paged/compile_watch.py).
Triton calls the two hooks around each compile (triton.runtime.jit.JITFunction._do_compile); without a GPU no kernel
compiles here, so the test calls them as Triton does, by keyword."""
import json
from types import SimpleNamespace

import pytest

knobs = pytest.importorskip("triton").knobs
from memcheck.stacks.paged.compile_watch import CompileWatch  # noqa: E402


def compile_of(name):
    fn = SimpleNamespace(name=name)
    spec = {"signature": {"num_seqs": "i32"}, "constants": {("BLOCK_N",): 64}, "configs": [{}]}
    assert knobs.runtime.jit_cache_hook(key="k", repr=name, fn=fn, compile=spec, is_manual_warmup=False,
                                        already_compiled=False) is False  # False: Triton goes on and compiles
    knobs.runtime.jit_post_compile_hook(key="k", repr=name, fn=fn, compile=spec, is_manual_warmup=False,
                                        already_compiled=False)


def test_counts_each_kernel_compiled_in_the_block_and_puts_the_hooks_back(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMCHECK_TRITON_COMPILES", str(tmp_path / "compiles.log"))
    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: seen.append(kw["fn"].name))
    before = knobs.runtime.jit_post_compile_hook
    with CompileWatch() as watch:
        assert watch.note() is None
        compile_of("_decode")
        compile_of("_prefill")
        compile_of("_decode")
    assert knobs.runtime.jit_post_compile_hook is before and knobs.runtime.jit_cache_hook is None
    assert seen == ["_decode", "_prefill", "_decode"]  # a hook installed before still runs
    assert watch.kernels == {"_decode": 2, "_prefill": 1} and watch.seconds >= 0
    note = watch.note()
    assert note.startswith("Triton compiled 3 kernel variants inside the timed run (") and note.endswith(
        "the warm-up missed them): _decode x2, _prefill")
    knobs.runtime.jit_post_compile_hook(fn=SimpleNamespace(name="_rms_norm"))  # after the block: not counted
    assert sum(watch.kernels.values()) == 3
    logged = [json.loads(line) for line in (tmp_path / "compiles.log").read_text().splitlines()]
    assert [entry["kernel"] for entry in logged] == ["_decode", "_prefill", "_decode"]
    assert logged[0]["signature"] == "{'num_seqs': 'i32'}" and logged[0]["constants"] == "{('BLOCK_N',): 64}"


def test_a_compile_log_that_cannot_be_written_is_a_one_line_error_naming_it(monkeypatch, tmp_path):
    from memcheck.errors import UsageError

    monkeypatch.setenv("MEMCHECK_TRITON_COMPILES", str(tmp_path / "missing" / "compiles.log"))
    before = (knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook)
    with pytest.raises(UsageError) as e, CompileWatch():
        pass
    assert str(e.value) == f"{tmp_path}/missing/compiles.log: MEMCHECK_TRITON_COMPILES: cannot append to it: " \
                           "No such file or directory"
    assert (knobs.runtime.jit_cache_hook, knobs.runtime.jit_post_compile_hook) == before  # no hook left behind

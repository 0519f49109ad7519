"""benchmarks/results_md.py: RESULTS.md's section per script, from the newest log of each in a run's folder."""
import os
from pathlib import Path

from benchmarks import results_md

SCRIPTS = {"kernels_h200", "mla_hopper_h200", "paged_h200"}
LOG = """{"cell": "raw result, left out"}
checks: 3 of 3 ok

cell         floor us   ours us
MLA 16h b1      35.2      52.9
MLA 64h b2      35.2      59.2
total 30 s
"""


def test_the_last_table_of_the_newest_log_replaces_its_scripts_section_and_the_others_stay(tmp_path):
    (tmp_path / "kernels_h200.log").write_text("old\ntable\nrows\n")
    (tmp_path / "kernels_h200_rerun.log").write_text(LOG)
    os.utime(tmp_path / "kernels_h200.log", (1, 1))
    (tmp_path / "notes.log").write_text("no script of that name\n")
    current = results_md.HEADER + "\n## benchmarks/paged_h200.py\n\nkept as it was\n\n## benchmarks/kernels_h200.py\n\nstale\n"
    md = results_md.render(tmp_path, current, SCRIPTS)
    sections = results_md.sections(md)
    assert list(sections) == [("kernels_h200", ""), ("paged_h200", "")]
    assert sections[("paged_h200", "")] == "kept as it was"
    assert "kernels_h200_rerun.log" in sections[("kernels_h200", "")]
    assert "MLA 64h b2      35.2      59.2\ntotal 30 s\n```" in sections[("kernels_h200", "")]
    assert "raw result" not in md and "checks: 3 of 3" not in md


def test_a_scripts_name_is_the_longest_one_before_a_label():
    assert results_md.script_of(Path("mla_hopper_h200_nvidia-h200_wide.log"), SCRIPTS) == "mla_hopper_h200"
    assert results_md.script_of(Path("mla_hopper_h200.log"), SCRIPTS) == "mla_hopper_h200"
    assert results_md.script_of(Path("mla_bandwidth.log"), SCRIPTS) is None


def test_a_table_from_another_chip_sits_beside_the_h200s_and_replaces_only_its_own(tmp_path):
    (tmp_path / "paged_h200_nvidia-h100_rerun.log").write_text(LOG)
    (tmp_path / "kernels_h200_2026-12-01_nvidia-h200-x2_tp.log").write_text(LOG)  # an H200's, of two: the H200's
    current = (results_md.HEADER + "\n## benchmarks/paged_h200.py\n\nthe H200's\n"
               "\n## benchmarks/paged_h200.py on nvidia-h100\n\nstale\n")
    md = results_md.render(tmp_path, current, SCRIPTS)
    sections = results_md.sections(md)
    assert list(sections) == [("kernels_h200", ""), ("paged_h200", ""), ("paged_h200", "nvidia-h100")]
    assert sections[("paged_h200", "")] == "the H200's"
    assert "paged_h200_nvidia-h100_rerun.log" in sections[("paged_h200", "nvidia-h100")]
    assert "\n## benchmarks/paged_h200.py on nvidia-h100\n" in md

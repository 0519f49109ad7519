"""memcheck in a user's own repository: one that has its own `harness/` and `kernels/` packages (common in ML
teams) and puts its root first on sys.path (`pythonpath = ["."]`, `python -m pytest`), and the wheel that installs
there: every import name of ours is under `memcheck`, so neither side shadows the other."""
import subprocess
import sys
import zipfile

from conftest import ROOT, dedent, workload


def test_a_repository_with_its_own_harness_and_kernels_runs_the_gate(project):
    for package in ("harness", "kernels"):
        project.mkpydir(package)
        (project.path / package / "__init__.py").write_text(f'WHO = "the team\'s own {package}"\n')
    project.makefile(".toml", pyproject=dedent("""
        [tool.pytest.ini_options]
        pythonpath = ["."]

        [tool.memcheck]
    """))
    (project.path / "suites" / "tiny.yaml").write_text(workload(stacks="hf, paged"))
    project.makepyfile(test_own=dedent("""
        import harness, kernels

        def test_the_teams_packages_are_theirs():
            assert harness.WHO == "the team's own harness" and kernels.WHO == "the team's own kernels"
    """))
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--memcheck", "suites",
                             "test_own.py", "--memcheck-update-baselines"], cwd=project.path, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "3 passed" in result.stdout, result.stdout[-2000:]
    for stack in ("hf", "paged"):
        assert (project.path / f"baselines/cpu-x86_64/tiny/{stack}.json").is_file()


def test_the_wheel_holds_one_top_level_package_and_its_data(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(ROOT)], check=True, capture_output=True)
    (wheel,) = tmp_path.glob("memcheck-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"memcheck"}
    for data in ("memcheck/defaults.toml", "memcheck/workload.schema.json", "memcheck/reports/templates/report.md.j2",
                 "memcheck/kernels/skinny_gemm_tiles.json"):
        assert data in names, data

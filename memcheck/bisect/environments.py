"""One environment per probed release: a virtual environment holding that release (and whatever it needs that this
environment lacks), layered over this environment's packages, so everything else is as here.

A `.pth` line puts this environment's site-packages (its own `.pth` files too: editable installs) after the probe's
own: the release installed there wins, the rest is shared, and each probe costs one package's download. Cached
under the folder given, by package, version and this environment."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

READY = "memcheck-ready"


class InstallFailed(Exception):
    pass


def probe_environment(package: str, version: str, cache: Path) -> Path:
    """The Python of an environment with package==version over this one's packages; InstallFailed if pip
    cannot install it (a release without a wheel for this Python, say)."""
    base = sysconfig.get_paths()["purelib"]
    tag = hashlib.sha256(base.encode()).hexdigest()[:8]
    root = cache / f"{package}-{version}-{tag}"
    python = root / "bin" / "python"
    if (root / READY).exists():
        return python
    shutil.rmtree(root, ignore_errors=True)
    try:
        subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(root)],
                       check=True, capture_output=True, text=True)
        purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True).stdout.strip()
    except subprocess.CalledProcessError as e:
        raise InstallFailed(f"cannot make a virtual environment in {root}: {(e.stderr or '').strip()[-300:]}") from None
    Path(purelib, "_memcheck_bisect_base.pth").write_text(f"import site; site.addsitedir({base!r})\n")
    done = subprocess.run(_installer(python, f"{package}=={version}"), capture_output=True, text=True)
    if done.returncode:
        shutil.rmtree(root, ignore_errors=True)
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise InstallFailed(last[-1] if last else f"exit {done.returncode}")
    (root / READY).write_text(f"{package}=={version}\n")
    return python


def _installer(python: Path, requirement: str) -> list[str]:
    # pip, not uv: pip resolves against every package the probe imports (the layered ones count as installed, so it
    # adds only what the release needs in another version); uv reads the probe's own site-packages only and would
    # install a fresh copy of every dependency, which would then shadow this environment's versions.
    return [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", requirement]

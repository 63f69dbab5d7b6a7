"""What `pip install .` installs -- the README's first command -- holds every module and asset of
the repository's package folders.  The test suite runs an editable install, which maps whole
folders: a subpackage missing from pyproject's ``packages`` (``torchscope.doctor.rules``, QA 36c)
left a wheel without the doctor, and every run's Doctor tab said "No pitfall found"."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import REPO

# the package folders (pyproject's package-dir) and the import name each installs as
FOLDERS = {"capture": "torchscope", "server": "torchscope/server", "doctor": "torchscope/doctor",
           "frontend": "torchscope/frontend"}
SHIPPED = {".py", ".js", ".css", ".html", ".svg", ".cpp", ".h"}


def test_the_wheel_holds_every_module_and_asset(tmp_path: Path) -> None:
    # built from a copy: setuptools reuses the build/ folder of a checkout, where an earlier
    # build's files would hide what this pyproject leaves out
    src = tmp_path / "src"
    for name in ("pyproject.toml", "README.md", *FOLDERS):
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy(path, src / name)
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path), str(src)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    (wheel,) = tmp_path.glob("torchscope-*.whl")
    inside = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for folder, name in FOLDERS.items():
        for f in (REPO / folder).rglob("*"):
            rel = f.relative_to(REPO / folder)
            # (another package folder inside this one is checked as itself; caches are no source)
            if f.is_file() and f.suffix in SHIPPED and "__pycache__" not in rel.parts and not (
                    folder == "capture" and rel.parts[0] in ("server", "doctor", "frontend")):
                expected.add(f"{name}/{rel.as_posix()}")
    missing = sorted(expected - inside)
    assert not missing, missing
    assert "torchscope/doctor/rules/nonfinite.py" in inside  # (the one that was missing)

"""`pip install .` into a fresh venv gives a working `kit` with containers/ and templates inside."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import PRODUCT_VERBS

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_installs_and_carries_its_package_data(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=True,
        timeout=600,
    )
    wheel = next(tmp_path.glob("kit-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "kit/_containers/cpu/Dockerfile",
        "kit/_containers/vllm/Dockerfile",
        "kit/_containers/base/build-debian-base.sh",
        "kit/templates/node_ray_head.sh.j2",
        "kit/templates/sbatch.sh.j2",
        "kit/verify/probe.py",
    ):
        assert needed in names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], check=True, timeout=600)
    out = subprocess.run(
        [str(venv / "bin" / "kit"), "--help"], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout
    for verb in PRODUCT_VERBS:
        assert f"\n  {verb} " in out
    dry = subprocess.run(
        [str(venv / "bin" / "kit"), "build", "cpu", "--dry-run", "--json"], capture_output=True, text=True, cwd=tmp_path
    )
    assert dry.returncode == 0, dry.stderr
    assert "_containers/cpu/Dockerfile" in dry.stdout  # found inside the installed package

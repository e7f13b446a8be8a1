"""Fixtures of the unit tests that several modules use (beside tests/conftest.py)."""

import pytest

from tests.unit.fake_stream import fake_server

__all__ = ["fake_server"]


@pytest.fixture(autouse=True)
def _own_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every unit test keeps kit's state (clusters.json: kit.cluster.record, written by every
    Cluster.up) in a folder of its own, never in the user's ~/.local/state/kit (issue 25). A
    test that sets KIT_STATE_DIR itself still wins (monkeypatch.setenv after this)."""
    monkeypatch.setenv("KIT_STATE_DIR", str(tmp_path_factory.mktemp("kit-state")))

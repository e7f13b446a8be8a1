"""Fixtures of the unit tests that several modules use (beside tests/conftest.py)."""

from collections.abc import Iterator

import pytest

from tests.unit.fake_stream import fake_server

__all__ = ["fake_server"]


@pytest.fixture(autouse=True)
def _own_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every unit test keeps kit's state (clusters.json: kit.cluster.record, written by every
    Cluster.up) in a folder of its own, never in the user's ~/.local/state/kit (issue 25). A
    test that sets KIT_STATE_DIR itself still wins (monkeypatch.setenv after this)."""
    monkeypatch.setenv("KIT_STATE_DIR", str(tmp_path_factory.mktemp("kit-state")))


@pytest.fixture(autouse=True)
def no_host_containers(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[None]:
    """The unit tier never asks this host's container engine what runs on it: a plan's check
    against other clusters' running nodes (kit.cluster.host_share) would otherwise depend on
    whatever another test or user started here. Tests of that check give their own runtime
    (tests/unit/test_one_host_plan.py, FakeRuntime), or mark themselves `host_nodes` to run an
    adapter's own against a recording fake (tests/unit/test_apptainer.py)."""
    from kit.runtime.apptainer import ApptainerRuntime
    from kit.runtime.docker import DockerRuntime

    if request.node.get_closest_marker("host_nodes") is None:
        for adapter in (DockerRuntime, ApptainerRuntime):
            monkeypatch.setattr(adapter, "host_nodes", lambda self: [])
    yield

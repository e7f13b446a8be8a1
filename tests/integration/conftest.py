"""Shared fixtures for tests against a real Docker engine.

- Every test here is marked `integration`.
- No engine: the tests skip with the reason, unless KIT_REQUIRE_DOCKER=1 (CI), where they fail.
- Each session has a run id; each test gets a unique cluster name. Everything a test creates
  carries the label kit.test-run=<run id>, and the session removes all of it at the end.
- kit runs as a subprocess (`kit_cli`), the way users run it, with its state in a temp dir.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.clusters import IMAGE, Cli

TEST_RUN_LABEL = "kit.test-run"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


def _require_docker() -> bool:
    return os.environ.get("KIT_REQUIRE_DOCKER", "") not in ("", "0", "false", "no")


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A docker-py client to a live engine; skips (or fails with KIT_REQUIRE_DOCKER=1) without one."""
    try:
        import docker

        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        reason = f"no Docker engine reachable ({type(exc).__name__}: {str(exc).strip()[:200]})"
        if _require_docker():
            pytest.fail(f"KIT_REQUIRE_DOCKER=1 but {reason}", pytrace=False)
        pytest.skip(f"{reason}; start dockerd (tests/infra/docker-engine.sh) or set KIT_REQUIRE_DOCKER=1 to fail")
    yield client
    client.close()


@pytest.fixture(scope="session")
def run_id(docker_client: Any) -> Iterator[str]:
    """This session's id; at the end every container, network and image labelled with it goes."""
    rid = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield rid
    cleanup_by_label(docker_client, f"{TEST_RUN_LABEL}={rid}")


def cleanup_by_label(client: Any, label: str) -> None:
    import docker

    for container in client.containers.list(all=True, filters={"label": label}):
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)
    for network in client.networks.list(filters={"label": label}):
        with contextlib.suppress(docker.errors.NotFound):
            network.remove()
    for image in client.images.list(filters={"label": label}):
        for tag in image.tags:
            with contextlib.suppress(docker.errors.ImageNotFound):
                client.images.remove(tag, force=True)


@pytest.fixture
def cluster_name(run_id: str, request: pytest.FixtureRequest) -> str:
    """A cluster name unique to this test (container and network names derive from it)."""
    base = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:24].strip("-")
    return f"kt-{base}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def test_labels(run_id: str, cluster_name: str) -> dict[str, str]:
    """Labels for anything a test creates by hand, so the session cleanup finds it."""
    return {TEST_RUN_LABEL: run_id, "kit.test-cluster": cluster_name}


@pytest.fixture
def kit_state(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    return state


@pytest.fixture
def kit_cli(kit_state: Path) -> Cli:
    """Run `python -m kit ARGS` with KIT_STATE_DIR in a temp dir; returns the finished process."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, "KIT_STATE_DIR": str(kit_state), **(env or {})}
        return subprocess.run(
            [sys.executable, "-m", "kit", *args],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=timeout,
            check=False,
        )

    return run


@pytest.fixture
def cluster(docker_client: Any, kit_cli: Cli, cluster_env: dict[str, str]) -> Iterator[tuple[dict[str, str], Cli]]:
    """A two-node cluster's KIT_* environment (the module's own `cluster_env` fixture) and the
    CLI to drive it; `kit down` at the end, whatever the test left running."""
    if not docker_client.images.list(name=IMAGE):
        pytest.fail(f"test image {IMAGE} is missing: build it with `kit build cpu --tag {IMAGE}`")
    yield cluster_env, kit_cli
    kit_cli("down", env=cluster_env)

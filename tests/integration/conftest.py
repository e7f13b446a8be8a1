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

from tests.integration.clusters import FACTS_SEED, IMAGE, RAY_IMAGE, Cli

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


@pytest.fixture(scope="session", autouse=True)
def facts_seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kit's record of the test images' facts (issue 24), probed once per session: every test's
    own state starts with it, so `kit up` does not probe the same image again in every test
    (tests/integration/test_image_facts.py probes at first use on purpose, without it)."""
    import time

    seed = tmp_path_factory.mktemp("facts-seed")
    try:
        import docker

        client = docker.from_env(timeout=120)
        client.ping()
    except Exception:
        return seed  # no engine: the tests skip or fail on their own
    from kit.cluster.image_facts import probe
    from kit.runtime.docker import DockerRuntime

    before = os.environ.get("KIT_STATE_DIR")
    os.environ["KIT_STATE_DIR"] = str(seed)
    try:
        for ref in (IMAGE, RAY_IMAGE):
            if tagged(client, ref):
                started = time.monotonic()
                probe(DockerRuntime(client=client), ref)
                print(f"image facts of {ref}: {time.monotonic() - started:.1f} s")
    finally:
        if before is None:
            del os.environ["KIT_STATE_DIR"]
        else:
            os.environ["KIT_STATE_DIR"] = before
    FACTS_SEED[:] = [seed]
    return seed


@pytest.fixture
def kit_state(tmp_path: Path, facts_seed: Path) -> Path:
    import shutil

    state = tmp_path / "state"
    shutil.copytree(facts_seed, state)
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
def cluster(
    docker_client: Any, kit_cli: Cli, cluster_env: dict[str, str], request: pytest.FixtureRequest
) -> Iterator[tuple[dict[str, str], Cli]]:
    """A two-node cluster's KIT_* environment (the module's own `cluster_env` fixture) and the
    CLI to drive it; `kit down` at the end, whatever the test left running."""
    if not docker_client.images.list(name=IMAGE):
        pytest.fail(f"test image {IMAGE} is missing: build it with `kit build cpu --tag {IMAGE}`")
    if cluster_env.get("KIT_IMAGE") == RAY_IMAGE:
        request.getfixturevalue("ray_image")
    yield cluster_env, kit_cli
    kit_cli("down", env=cluster_env)


def tagged(client: Any, ref: str) -> bool:
    import docker

    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


@pytest.fixture(scope="session")
def ray_image(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The CPU image with Ray, layered by kit's own `kit build ray` (issue 24): built once and
    cached by tag (tests/run.sh builds it first; this builds it when a Ray test runs without)."""
    import time

    if not tagged(docker_client, RAY_IMAGE):
        state = tmp_path_factory.mktemp("ray-image-state")
        started = time.monotonic()
        build = subprocess.run(
            [sys.executable, "-m", "kit", "build", "ray", "--base-image", IMAGE, "--tag", RAY_IMAGE],
            capture_output=True,
            text=True,
            env={**os.environ, "KIT_STATE_DIR": str(state)},
            timeout=1800,
            check=False,
        )
        assert build.returncode == 0, build.stdout + build.stderr
        print(f"kit build ray --base-image {IMAGE}: {time.monotonic() - started:.0f} s")
    return RAY_IMAGE

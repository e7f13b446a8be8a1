"""The Docker adapter against the real engine where the engine's own answers matter (seconds).

A node container that stops between kit's exec creation and its start: the engine drops the exec
and answers 404 to the start. The CI run of 2026-11-28 lost `kit serve --supervise`'s follower to
that answer (a traceback, exit 1, while the head container restarted); kit must see a node that is
not running (StartError), which the follower waits out.
"""

from __future__ import annotations

from typing import Any

import pytest

from kit.errors import StartError
from kit.runtime.base import NodeHandle
from kit.runtime.docker import DockerRuntime

BASE_IMAGE = "kit/debian-base:bookworm"  # tests/infra builds it (containers/base)


def test_a_node_that_stops_before_an_exec_starts_is_not_running(
    docker_client: Any, test_labels: dict[str, str], cluster_name: str
) -> None:
    container = docker_client.containers.run(
        BASE_IMAGE, ["sleep", "120"], detach=True, name=f"{cluster_name}-head", labels=test_labels
    )
    runtime = DockerRuntime(docker_client)
    node = NodeHandle(name=container.name, cluster=cluster_name, role="head", rank=0, state="running")
    assert runtime.exec(node, ["true"]).returncode == 0  # the engine answers while it runs
    real_start = docker_client.api.exec_start

    def stop_then_start(exec_id: str, **kwargs: Any) -> Any:
        container.kill()  # the race, made certain: the node stops after the exec was created
        container.wait(timeout=30)
        return real_start(exec_id, **kwargs)

    docker_client.api.exec_start = stop_then_start
    try:
        with pytest.raises(StartError, match="is not running"):
            runtime.exec(node, ["true"])
    finally:
        docker_client.api.exec_start = real_start
        container.remove(force=True)

"""A real two-node Ray cluster: two containers of the CPU engine image (real Ray) with distinct
IPs on a private Docker network, brought up, checked, broken and torn down through the kit CLI."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.clusters import Cli, listening, two_node_ray_env


@pytest.fixture
def cluster_env(cluster_name: str, tmp_path: Path) -> dict[str, str]:
    """The environment of conftest's `cluster` fixture here."""
    return two_node_ray_env(cluster_name, tmp_path / "hf", second_octet=213)


def status(kit: Cli, env: dict[str, str]) -> dict[str, Any]:
    result = kit("status", "--json", env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)["result"]
    return doc


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(1)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def alive_ray_nodes(kit: Cli, env: dict[str, str]) -> int:
    ray = status(kit, env).get("ray") or []
    return sum(1 for n in ray if not n["lost"])


def test_two_node_cluster_lifecycle(cluster: tuple[dict[str, str], Cli], docker_client: Any, kit_state: Path) -> None:
    env, kit = cluster
    name = env["KIT_CLUSTER"]
    # The worker starts first: it must keep retrying until the head exists.
    worker = kit("up", "--worker", "--no-wait", env=env)
    assert worker.returncode == 0, worker.stderr
    worker_logs = docker_client.containers.get(f"kit-{name}-worker-1").logs
    wait_for(lambda: b"not reachable yet; retrying in 5 s" in worker_logs(), 90, "the worker to retry joining")
    head = kit("up", "--head", "--json", env=env)
    assert head.returncode == 0, head.stderr
    assert json.loads(head.stdout)["result"]["state"] == "ready"

    doc = status(kit, env)
    assert [(c["role"], c["state"]) for c in doc["containers"]] == [("head", "running"), ("worker", "running")]
    prefix = env["KIT_NETWORK_SUBNET"].rsplit(".", 1)[0]
    assert [c["node_ip"] for c in doc["containers"]] == [f"{prefix}.10", f"{prefix}.11"]
    alive = [n for n in doc["ray"] if n["alive"] and not n["lost"]]
    assert len(alive) == 2
    assert sorted(n["ip"] for n in alive) == [f"{prefix}.10", f"{prefix}.11"]
    assert all(n["ip_matches"] for n in alive), alive
    assert all(c["image_digest"] for c in doc["containers"])

    # A second `up` reports the running node instead of starting another.
    again = kit("up", "--head", env=env)
    assert again.returncode == 0 and "already running" in again.stderr

    # Worker killed: status sees it lost within 10 s; `up --worker` rejoins.
    docker_client.containers.get(f"kit-{name}-worker-1").kill()
    took = wait_for(lambda: alive_ray_nodes(kit, env) == 1, 10, "Ray to mark the killed worker lost")
    print(f"worker loss seen by kit status after {took:.1f} s")
    states = {c["role"]: c["state"] for c in status(kit, env)["containers"]}
    assert states["worker"] == "exited"
    rejoin = kit("up", "--worker", env=env)
    assert rejoin.returncode == 0, rejoin.stderr
    wait_for(lambda: alive_ray_nodes(kit, env) == 2, 30, "the worker to rejoin")

    # (A restarted head, which the worker notices and rejoins by itself, is test_supervise_ray's
    # test_a_restarted_ray_head_...: it serves again only once the worker rejoined. Measured here
    # too it took 68 s of CI time for nothing new, issue 26.)

    # Issue 25: Ray hangs in the head (its GCS stopped: connections are accepted, never answered).
    # kit status answers within its 10 s and names it; an interrupted status leaves nothing behind.
    status_on_a_hung_ray(kit, env, docker_client, name, kit_state)

    # Down removes every container and the network; a second down is harmless.
    down = kit("down", "--json", env=env)
    assert down.returncode == 0
    removed = json.loads(down.stdout)["result"]
    assert sorted(removed["containers"]) == [f"kit-{name}-head", f"kit-{name}-worker-1"]
    assert removed["networks"] == [env["KIT_NETWORK"]]
    assert docker_client.containers.list(all=True, filters={"label": f"kit.cluster={name}"}) == []
    assert kit("down", env=env).returncode == 0


def marked(container: Any) -> list[str]:
    """The processes in `container` that a kit exec started (their environment holds its mark)."""
    out = container.exec_run(["bash", "-c", "grep -las KIT_EXEC_ID= /proc/[0-9]*/environ || true"]).output
    return out.decode().split()


def status_on_a_hung_ray(kit: Cli, env: dict[str, str], docker_client: Any, name: str, state: Path) -> None:
    head = docker_client.containers.get(f"kit-{name}-head")
    nodes = [head, docker_client.containers.get(f"kit-{name}-worker-1")]
    started = time.monotonic()
    healthy = kit("status", "--json", env=env, timeout=60)
    print(f"kit status on a healthy Ray cluster: {time.monotonic() - started:.1f} s")
    assert healthy.returncode == 0 and json.loads(healthy.stdout)["result"]["unreached"] == [], healthy.stdout
    gcs = head.exec_run(["bash", "-c", "grep -las '[g]cs_server' /proc/[0-9]*/cmdline | cut -d/ -f3"]).output.split()
    assert gcs, "no gcs_server process in the head"
    head.exec_run(["kill", "-STOP", *[p.decode() for p in gcs]])
    try:
        started = time.monotonic()
        result = kit("status", "--json", env=env, timeout=60)
        took = time.monotonic() - started
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)["result"]
        assert doc["ray"] is None and "did not answer within" in doc["ray_error"], doc
        assert any(line.startswith(f"Ray in kit-{name}-head") for line in doc["unreached"]), doc["unreached"]
        assert [c["state"] for c in doc["containers"]] == ["running", "running"]  # the rest is shown
        assert took < 12, f"kit status took {took:.1f} s on a hung Ray"  # 10 s + starting Python
        print(f"kit status on a hung Ray: {took:.1f} s")
        assert all(marked(c) == [] for c in nodes)  # the bounded look ended inside the head too

        # Ctrl-C while the Ray view hangs: nothing of it stays in any container.
        proc = subprocess.Popen(
            [sys.executable, "-m", "kit", "status"],
            env={**os.environ, "KIT_STATE_DIR": str(state), **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: bool(marked(head)), 20, "kit status's Ray view to run in the head")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130 and "Traceback" not in err, err
        assert all(marked(c) == [] for c in nodes), [marked(c) for c in nodes]
    finally:
        head.exec_run(["kill", "-CONT", *[p.decode() for p in gcs]])


def test_interrupted_up_leaves_no_orphan(
    cluster: tuple[dict[str, str], Cli], docker_client: Any, kit_state: Path
) -> None:
    env, _ = cluster
    name = env["KIT_CLUSTER"]
    # The head waits for a worker that never comes; Ctrl-C must remove what `up` created.
    proc = subprocess.Popen(
        [sys.executable, "-m", "kit", "up", "--head"],
        env={**os.environ, "KIT_STATE_DIR": str(kit_state), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(
        lambda: bool(docker_client.containers.list(filters={"label": f"kit.cluster={name}"})),
        60,
        "the head container to start",
    )
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert docker_client.containers.list(all=True, filters={"label": f"kit.cluster={name}"}) == []


def test_ray_token_auth_from_a_file(cluster: tuple[dict[str, str], Cli], docker_client: Any, tmp_path: Path) -> None:
    """Closed by default (issue 16) with the real Ray of the image (2.60): with ray_token_file the
    two nodes form the cluster with RAY_AUTH_MODE=token, a client holding another token is
    refused, and the token is in no container's configuration. (Ray 2.60 binds its GCS and raylet
    gRPC servers to 0.0.0.0 whatever --node-ip-address says, and has no option to change it:
    measured here with listening(); the token is what closes Ray.)"""
    env, kit = cluster
    name = env["KIT_CLUSTER"]
    token = tmp_path / "ray_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {**env, "KIT_RAY_TOKEN_FILE": str(token)}
    worker = kit("up", "--worker", "--no-wait", env=env)
    assert worker.returncode == 0, worker.stderr
    head = kit("up", "--head", "--json", env=env)
    assert head.returncode == 0, head.stderr
    result = json.loads(head.stdout)["result"]
    # What the cluster leaves open: the API without a key, not Ray (the model-cache and image
    # version lines are about other things: this image's tag is `test`, the model is not fetched).
    exposure = [w.split(":")[0] for w in result["warnings"] if "hf_cache" not in w and "vLLM version" not in w]
    assert result["state"] == "ready" and exposure == ["no api_key_file"], result["warnings"]
    assert alive_ray_nodes(kit, env) == 2  # kit status asks Ray inside the head: the token works

    head_container = docker_client.containers.get(f"kit-{name}-head")
    for container in (head_container, docker_client.containers.get(f"kit-{name}-worker-1")):
        assert token.read_text() not in json.dumps(container.attrs)
        config_env = container.attrs["Config"]["Env"]
        assert "RAY_AUTH_MODE=token" in config_env and "RAY_AUTH_TOKEN_PATH=/run/kit/secrets/ray_token" in config_env
    ip = result["node_ip"]
    wrong = head_container.exec_run(
        ["bash", "-c", "echo wrong-token > /tmp/wrong && RAY_AUTH_TOKEN_PATH=/tmp/wrong python3 -c "
         f"'import ray; ray.init(address=\"{ip}:6379\", logging_level=\"ERROR\")'"],
    )  # fmt: skip
    assert wrong.exit_code != 0 and b"AuthenticationError" in wrong.output, wrong.output[-2000:]
    print(f"Ray GCS (6379) listens on {sorted(listening(head_container, 6379))}")

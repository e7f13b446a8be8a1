"""What issue 18 saw an operator get wrong, on the real 2-node CPU cluster, fixed: every path that
fails or is interrupted leaves nothing running that it started, and `kit status` says whether the
model is served, not only whether containers run.

- SIGTERM, or Ctrl-C, of `kit up --head` while it waits for its workers: exit 130 with a message,
  and neither its container nor the network it created is left;
- Ctrl-C of `kit serve` during its health wait, and `kit serve --timeout` expiring: no `vllm
  serve` (nor any vLLM process) left on either node;
- Ctrl-C of `kit serve --supervise` while it starts: no agent, coordinator or vLLM process left;
- the mp head container restarted under a running server: `kit status` reports the server down,
  and `kit serve` (no --replace) starts again instead of refusing with "already running".

    flock /tmp/kit-heavy.lock pytest tests/integration/test_supervise_interrupts.py -x -q
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.integration import supervise_support as sup
from tests.integration.clusters import make_kit, two_node_mp_env, two_node_ray_env

SECOND_OCTET = 233


def popen_kit(root: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kit", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KIT_STATE_DIR": str(root / "state"), **env},
    )


def wait_for_line(process: subprocess.Popen[str], text: str, timeout: float) -> list[str]:
    """Read the process's stderr until a line holds `text` (kit's progress lines go there)."""
    assert process.stderr is not None
    seen: list[str] = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = process.stderr.readline()
        if not line and process.poll() is not None:
            break
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"no line with {text!r}: {seen[-20:]}")


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupted_kit_up_leaves_neither_container_nor_network(
    how: signal.Signals, docker_client: Any, tmp_path: Path
) -> None:
    name = f"ksupup{how.value}{os.getpid() % 1000}"
    env = two_node_ray_env(name, tmp_path / "hf", second_octet=SECOND_OCTET)
    up = popen_kit(tmp_path, env, "up", "--head")  # a Ray head waits for its worker, which never comes
    try:
        wait_for_line(up, "1/2 nodes", 120)
        assert docker_client.containers.list(filters={"label": f"kit.cluster={name}"})
        up.send_signal(how)
        _, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
        make_kit(tmp_path / "state", env)("down")
    assert up.returncode == 130, err
    assert "kit: interrupted" in err
    label = {"label": f"kit.cluster={name}"}
    assert docker_client.containers.list(all=True, filters=label) == []
    assert docker_client.networks.list(filters=label) == [], "the network it created was left behind"


@pytest.fixture(scope="module")
def mp(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("sup-int")
    env: dict[str, str] = {}
    kit = make_kit(root / "state", env)
    prep = kit("demo", "--prepare-only", "--json")
    assert prep.returncode == 0, prep.stderr
    name = f"ksupint{os.getpid() % 10000}"
    env.update(two_node_mp_env(name, json.loads(prep.stdout)["result"]["hf_cache"], None, second_octet=SECOND_OCTET))
    try:
        for role in ("--worker", "--head"):
            up = kit("up", role)
            assert up.returncode == 0, up.stderr
        c = {"kit": kit, "env": env, "root": root, "name": name, "docker": docker_client}
        yield c
    finally:
        kit("down")


def nodes(c: dict[str, Any]) -> list[Any]:
    return [c["docker"].containers.get(f"kit-{c['name']}-{n}") for n in ("head", "worker-1")]


def assert_nothing_serves(c: dict[str, Any], within: float = 30) -> None:
    end = time.monotonic() + within
    while True:
        left = {x.name: sup.serving_processes(x) for x in nodes(c)}
        if all(not any(v.values()) for v in left.values()) or time.monotonic() > end:
            break
        time.sleep(1)
    assert all(not any(v.values()) for v in left.values()), left


def test_ctrl_c_of_kit_serve_in_its_health_wait_stops_vllm_on_every_node(mp: dict[str, Any]) -> None:
    serve = popen_kit(mp["root"], mp["env"], "serve")
    wait_for_line(serve, "waiting for", 120)
    assert any(sup.serving_processes(x)["serve"] for x in nodes(mp)), "vllm serve should be starting"
    serve.send_signal(signal.SIGINT)
    _, err = serve.communicate(timeout=120)
    assert serve.returncode == 130, err
    assert_nothing_serves(mp)


def test_kit_serve_timeout_stops_vllm_on_every_node(mp: dict[str, Any]) -> None:
    done = mp["kit"]("serve", "--timeout", "20")  # long enough for vLLM to log, too short to be ready
    assert done.returncode == 6, done.stderr
    assert "not healthy after 20 s" in done.stderr and "  | " in done.stderr, done.stderr
    assert_nothing_serves(mp)


def test_ctrl_c_of_kit_serve_supervise_while_starting_leaves_nothing(mp: dict[str, Any]) -> None:
    serve = popen_kit(mp["root"], mp["env"], "serve", "--supervise")
    wait_for_line(serve, "supervisor: started", 120)
    time.sleep(3)
    serve.send_signal(signal.SIGINT)
    _, err = serve.communicate(timeout=180)
    assert serve.returncode == 130, err
    assert_nothing_serves(mp)
    events = sup.read_events(nodes(mp)[0])
    assert events[-1].kind == "stopped" and "interrupted" in events[-1].reason, events[-1]


def test_a_restarted_mp_head_is_reported_down_and_kit_serve_starts_again(mp: dict[str, Any]) -> None:
    kit = mp["kit"]
    served = kit("serve", "--json")
    assert served.returncode == 0, served.stderr
    url = json.loads(served.stdout)["result"]["url"]
    nodes(mp)[0].restart(timeout=5)
    time.sleep(3)
    status = kit("status", "--json")
    assert status.returncode == 0, status.stderr
    server = json.loads(status.stdout)["result"]["server"]
    assert server["serving"] is False and server["state"] == "api-down", server
    assert "server: NOT SERVING" in kit("status").stdout
    assert sup.serving_processes(nodes(mp)[1])["serve"], "the worker's rank runs on alone"
    again = kit("serve")  # no --replace: nothing answers, so nothing is "already running"
    assert again.returncode == 0, again.stderr
    assert "stopping a stale vllm serve" in again.stderr
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert requests.post(f"{url}/v1/chat/completions", json=body, timeout=120).status_code == 200
    assert json.loads(kit("status", "--json").stdout)["result"]["server"]["serving"] is True

"""Supervision of the Ray backend on a real 2-node Ray cluster (issue 18). vLLM's Ray executor does
not run on its CPU build ("current platform cpu does not support ray"), so the serve step is a
stand-in: a process that, like vLLM's Ray executor, needs every Ray node alive before it serves
(it waits for them, and exits when one is lost), and that answers /health, /metrics (one engine)
and /v1/completions. Everything else is real: the Ray cluster, kit's node entrypoints, the
coordinator and the head's agent (started through kit's own host-side code, as `kit serve
--supervise` starts them; the CLI refuses Ray on CPU before that).

1. the stand-in killed: kit restarts the serve step;
2. the Ray head's container restarted: `kit status` names the worker missing from the new Ray
   cluster, the worker rejoins by itself, the coordinator resumes and restarts the serve step;
3. the worker's container killed: the serve step exits (a lost node), the coordinator waits for
   the Ray cluster to be whole again (the test starts the worker), then restarts the serve step.

    flock /tmp/kit-heavy.lock pytest tests/integration/test_supervise_ray.py -x -q
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from kit.cluster import supervision as host
from kit.config import load_config
from kit.plan.layout import plan_layout
from kit.runtime.docker import DockerRuntime
from tests.integration import supervise_support as sup
from tests.integration.clusters import make_kit, two_node_ray_env

SECOND_OCTET = 233
METRICS = (
    'vllm:num_requests_running{engine="0",model_name="tiny"} 0\n'
    'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0\n'
    'vllm:generation_tokens_total{engine="0",model_name="tiny"} N\n'
)
# The stand-in `vllm serve`: argv: nodes, API port, GCS port, then a word naming it (kit's stop
# path recognises a serve process by "vllm" in its command line).
STANDIN = r"""
import http.server, json, os, sys, threading, time
import ray
nodes, port, gcs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
host = os.environ["VLLM_HOST_IP"]
ray.init(address=f"{host}:{gcs}", logging_level="ERROR", log_to_driver=False)
def alive():
    return sum(1 for n in ray.nodes() if n.get("Alive"))
while alive() < nodes:  # vLLM's placement group waits for its nodes too
    time.sleep(1)
print(f"stand-in: {nodes} Ray nodes alive; serving", flush=True)
served = [0]
METRICS = sys.argv[5]
class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def send(self, code, body, kind="application/json"):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        if self.path == "/health":
            self.send(200, "")
        elif self.path == "/metrics":
            self.send(200, METRICS.replace("N", str(served[0])), "text/plain")
        else:
            self.send(404, "{}")
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        served[0] += 1
        self.send(200, json.dumps({"choices": [{"index": 0, "text": "ok", "finish_reason": "length"}]}))
def watch():
    while True:
        time.sleep(2)
        try:
            whole = alive() >= nodes
        except Exception:
            whole = False
        if not whole:  # as vLLM's Ray executor does when a node of its placement group is lost
            print("stand-in: a Ray node is lost; exiting", flush=True)
            os._exit(1)
threading.Thread(target=watch, daemon=True).start()
http.server.ThreadingHTTPServer((host, port), Handler).serve_forever()
"""


def standin_script() -> str:
    words = ["python3", "-c", STANDIN, "2", "8000", "6379", "vllm-standin", METRICS]
    return "#!/usr/bin/env bash\nset -euo pipefail\nexec " + " ".join(shlex.quote(w) for w in words) + "\n"


@pytest.fixture(scope="module")
def ray_cluster(
    docker_client: Any, ray_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("sup-ray")
    name = f"ksupray{os.getpid() % 10000}"
    env = two_node_ray_env(name, root / "hf", second_octet=SECOND_OCTET)
    env.update(
        {
            "KIT_MODEL_SERVED_NAME": "tiny",
            "KIT_TIMEOUTS_LIVENESS": "10",
            "KIT_TIMEOUTS_JOIN": "240",
            "KIT_SUPERVISE_MAX_RESTARTS": "3",
            "KIT_SUPERVISE_BACKOFF": "2",
            "KIT_SUPERVISE_STABLE": "8",
        }
    )
    kit = make_kit(root / "state", env)
    try:
        assert kit("up", "--worker", "--no-wait").returncode == 0
        up = kit("up", "--head")
        assert up.returncode == 0, up.stderr
        loaded = load_config(environ=env, cwd=Path("/nonexistent")).config
        config = loaded.replace(planned=plan_layout(loaded, None))  # config no longer plans (issue 26)
        runtime = DockerRuntime()
        head = next(n for n in runtime.find_nodes(name) if n.role == "head")
        url = f"http://{head.ip}:{config.ports.api}"
        host.start(config, runtime, [head], {head.name: standin_script()}, url)
        c = {"kit": kit, "name": name, "url": url, "docker": docker_client, "config": config, "runtime": runtime}
        sup.wait_event(lambda: head_of(c), "ready", after=0, timeout=180)
        yield c
    finally:
        kit("down")


def head_of(c: dict[str, Any]) -> Any:
    return c["docker"].containers.get(f"kit-{c['name']}-head")


def worker_of(c: dict[str, Any]) -> Any:
    return c["docker"].containers.get(f"kit-{c['name']}-worker-1")


def answers(url: str) -> bool:
    try:
        body = {"model": "tiny", "prompt": "hi", "max_tokens": 1}
        return requests.post(f"{url}/v1/completions", json=body, timeout=5).status_code == 200
    except requests.RequestException:
        return False


def test_the_serve_step_runs_supervised_and_answers(ray_cluster: dict[str, Any]) -> None:
    assert answers(ray_cluster["url"])
    state = sup.read_state(head_of(ray_cluster))
    assert state["phase"] == "serving" and state["nodes"] == ["head"], state
    assert not sup.serving_processes(worker_of(ray_cluster))["agent"], "Ray workers are Ray nodes: no agent"


def test_a_killed_serve_step_is_restarted(ray_cluster: dict[str, Any]) -> None:
    [standin] = [p for p in sup.processes(head_of(ray_cluster)) if "vllm-standin" in p["cmd"]]
    fault_at = time.time()
    head_of(ray_cluster).exec_run(["kill", "-9", str(standin["pid"])])
    detected = sup.wait_event(lambda: head_of(ray_cluster), "detected", after=fault_at, timeout=60)
    assert "vllm serve exited on node head" in detected.reason
    ready = sup.wait_event(lambda: head_of(ray_cluster), "ready", after=detected.ts, timeout=120)
    assert ready.generation == 2 and answers(ray_cluster["url"])


def test_a_restarted_ray_head_is_named_missing_then_rejoined_and_served_again(ray_cluster: dict[str, Any]) -> None:
    kit = ray_cluster["kit"]
    time.sleep(9)  # supervise.stable: the next failure is a first one again
    fault_at = time.time()
    head_of(ray_cluster).restart(timeout=5)
    named = None
    end = time.monotonic() + 90
    while named is None and time.monotonic() < end:
        status = kit("status", "--json")
        if status.returncode == 0:
            result = json.loads(status.stdout)["result"]
            missing = result.get("ray_missing") or []
            if any(f"kit-{ray_cluster['name']}-worker-1" in m for m in missing):
                named = result
        time.sleep(1)
    assert named is not None, "kit status never named the worker missing from the restarted head's Ray cluster"
    assert named["ray_missing"][0].startswith(f"kit-{ray_cluster['name']}-worker-1 (")
    resumed = sup.wait_event(lambda: head_of(ray_cluster), "supervising", after=fault_at, timeout=120)
    assert "resumed" in resumed.reason
    ready = sup.wait_event(lambda: head_of(ray_cluster), "ready", after=fault_at, timeout=240)
    print(f"\nRay head restart: ready again {ready.ts - fault_at:.0f} s after the restart; {ready.reason}")
    assert answers(ray_cluster["url"])
    kinds = [e.kind for e in sup.read_events(head_of(ray_cluster)) if e.ts >= fault_at]
    assert "detected" in kinds and kinds[-1] == "ready", kinds


def test_a_lost_worker_is_waited_for_in_the_ray_cluster_then_the_serve_step_restarts(
    ray_cluster: dict[str, Any],
) -> None:
    time.sleep(9)  # supervise.stable
    fault_at = time.time()
    worker_of(ray_cluster).kill()
    detected = sup.wait_event(lambda: head_of(ray_cluster), "detected", after=fault_at, timeout=90)
    waiting = sup.wait_event(lambda: head_of(ray_cluster), "waiting", after=fault_at, timeout=90)
    assert "Ray cluster" in waiting.reason, waiting.reason
    time.sleep(5)
    assert sup.read_state(head_of(ray_cluster))["phase"] == "waiting" and not answers(ray_cluster["url"])
    worker_of(ray_cluster).start()
    ready = sup.wait_event(lambda: head_of(ray_cluster), "ready", after=detected.ts, timeout=240)
    print(f"\nRay worker lost: detected {detected.ts - fault_at:.0f} s, ready {ready.ts - fault_at:.0f} s after")
    assert answers(ray_cluster["url"])

"""Replicas behind one router under a REAL SLURM (model.dp_lb router, issue 29): `kit slurm
--submit` sends an array of two supervised replicas (TP=1 each, CPU engine, both on this one node
on their own ports) and vLLM's router as a job of its own; a request through the router answers;
kill -9 of one replica's engine is restarted in place by that replica's supervisor while the
endpoint answers from the other; the cancelled task of one replica leaves the endpoint answering
from the other; `kit down --slurm` of the router's job leaves no job and no container.

Needs what tests/slurm/test_slurm_real.py needs, the router image (`kit build router`), and a
node with room for three jobs at once (tests/infra/slurm.sh declares at least 4 CPUs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kit.supervise import events
from tests.conftest import fake_secret
from tests.slurm.test_slurm_real import IMAGE, REQUIRED, kit, slurm_up, wait_for, write_config
from tests.slurm.test_slurm_supervise import KILL_ENGINE

pytestmark = pytest.mark.slurm
__all__ = ["slurm_up"]  # the module's autouse fixture: SLURM started, the image present

ROUTER_IMAGE = os.environ.get("KIT_ROUTER_IMAGE", "kit/vllm-router:0.1.17")
MODEL = "kit/tiny-llama"


@pytest.fixture(scope="module", autouse=True)
def room_for_three_jobs(slurm_up: None) -> None:
    cpus = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True).stdout.split()
    missing = []
    if not cpus or int(cpus[0].rstrip("+")) < 3:
        missing.append(f"a node with 3 CPUs for SLURM (sinfo says {cpus}; tests/infra/slurm.sh declares 4)")
    if subprocess.run(["docker", "image", "inspect", ROUTER_IMAGE], capture_output=True).returncode:
        missing.append(f"the router image {ROUTER_IMAGE} (`kit build router`)")
    if missing:
        if REQUIRED:
            pytest.fail(f"KIT_REQUIRE_SLURM=1 but {'; '.join(missing)} missing")
        pytest.skip(f"{'; '.join(missing)} missing")


def ask(url: str, key: str | None) -> tuple[int, dict[str, object]]:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url + "/v1/chat/completions", data=body.encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def wait_lines(path: Path, pattern: str, count: int, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        text = path.read_text(errors="replace") if path.exists() else ""
        if len(re.findall(pattern, text)) >= count:
            return
        time.sleep(1)
    raise AssertionError(f"fewer than {count} {pattern!r} in {path}:\n{text[-3000:]}")


def wait_event(container: str, kind: str, *, generation: int, timeout: float) -> str:
    """The supervisor's event of `kind` and `generation` in the container (its run directory)."""
    end = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < end:
        read = ["docker", "exec", container, "cat", "/tmp/kit/supervise/events.jsonl"]
        lines = subprocess.run(read, capture_output=True, text=True).stdout.splitlines()
        for event in events.parse_lines(lines):
            if event.kind == kind and event.generation == generation:
                return f"{event.kind} (generation {event.generation}): {event.reason}"
        time.sleep(1)
    raise AssertionError(f"no {kind} of generation {generation} within {timeout} s: {lines[-10:]}")


def queued(job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%i %T"], capture_output=True, text=True).stdout.strip()


def containers(label: str) -> str:
    done = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True)
    return done.stdout.strip()


def test_two_replicas_behind_the_router_survive_one_cancelled_task_and_down_clears_all(tmp_path: Path) -> None:
    t0 = time.monotonic()
    hf = tmp_path / "hf"
    hf.mkdir()
    make = ["docker", "run", "--rm", "-v", f"{hf}:/out", IMAGE, "python3", "/opt/kit/make_tiny_model.py"]
    subprocess.run([*make, "--out", "/out/hub"], check=True, capture_output=True, timeout=120)
    key = fake_secret("sk-", "slurm-router-key")
    key_file = tmp_path / "api_key"
    key_file.write_text(key)
    key_file.chmod(0o600)
    config = write_config(
        tmp_path,
        backend="mp",
        gpus_per_node=2,  # CPU ranks: two TP=1 replicas fill the planned "node"; SLURM places each task
        api_key_file=str(key_file),
        env={"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
        model={"id": MODEL, "tp": 1, "pp": 1, "dp": 2, "dp_lb": "router", "extra_args": ["--enforce-eager"]},
        router={"image": ROUTER_IMAGE},
        # off kit's defaults: other clusters (and their routers) may share this host
        ports={"api": 18400, "replica": 18410, "mp_master": 18420, "supervisor": 18430, "router_metrics": 18490},
        # each replica supervised in its own task: a dead engine restarts that replica in place
        supervise={"enabled": True, "max_restarts": 2, "backoff": 1, "stable": 5},
        timeouts={"liveness": 10},
    )
    result = kit("slurm", "--config", str(config), "--submit", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    done = json.loads(result.stdout)["result"]
    router, replicas = str(done["job_id"]), str(done["replicas_job"])
    try:
        for path in (tmp_path / done["path"], tmp_path / done["router_launcher"]):
            assert key not in path.read_text()
        out = tmp_path / f"job-{router}.out"
        line, _ = wait_for(out, "KIT_SERVER_READY", 130, router)
        wait_lines(out, r"kit: replica http://\S+: routed", 2, 30)  # both replicas in the router
        print(f"jobs {replicas} (replicas) and {router} (router): both routed {time.monotonic() - t0:.0f} s in")
        url = re.search(r"url=(\S+)", line)
        assert url, line
        endpoint = url.group(1)
        assert ask(endpoint, None)[0] == 401  # closed: the router checks the key against the replicas
        code, reply = ask(endpoint, key)
        assert code == 200 and reply["choices"][0]["message"]["role"] == "assistant"  # type: ignore[index]

        tasks = queued(replicas).splitlines()
        assert len(tasks) == 2 and all(t.endswith("RUNNING") for t in tasks), tasks

        # kill -9 of replica 1's engine: its supervisor restarts it inside its task (no requeue),
        # while the endpoint answers from replica 0.
        labels = ["--filter", f"label=kit.slurm-job={replicas}", "--filter", "label=kit.replica=1"]
        node = subprocess.run(["docker", "ps", "-q", *labels], capture_output=True, text=True).stdout.split()
        assert len(node) == 1, node
        time.sleep(6)  # supervise.stable: a first failure
        subprocess.run(["docker", "exec", node[0], "bash", "-c", KILL_ENGINE], check=True)
        answered = [ask(endpoint, key)[0] for _ in range(6)]
        assert answered.count(200) >= 5, answered  # what was in flight on replica 1 may fail once
        ready = wait_event(node[0], "ready", generation=2, timeout=240)
        print(f"replica 1 restarted in place: {ready}, {time.monotonic() - t0:.0f} s in")
        assert queued(replicas).splitlines() == tasks  # both tasks still running: nothing requeued
        assert ask(endpoint, key)[0] == 200

        first = tasks[0].split()[0]
        assert re.fullmatch(rf"{replicas}_\d", first)
        subprocess.run(["scancel", first], check=True)
        for _ in range(4):  # the router retries on the other replica, and stops sending to this one
            assert ask(endpoint, key)[0] == 200
        wait_lines(out, r"its task is no longer running; taken out of the router \(HTTP 200\)", 1, 20)
        # the other task checks keys too (every running task does): the router was not restarted
        assert "restarting the router" not in out.read_text()
        assert ask(endpoint, key)[0] == 200
        assert [t for t in queued(replicas).splitlines() if t.endswith("RUNNING")] == [tasks[1]]

        status = kit("status", "--slurm", router, "--json", cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)["result"]["slurm"]
        assert doc["replicas_job"] == replicas
        assert [r["task"] for r in doc["replicas"] if r["state"] == "RUNNING"] == [tasks[1].split()[0]], doc
        assert doc["server_ready"]

        down = kit("down", "--slurm", router, "--json", cwd=tmp_path)
        assert down.returncode == 0, down.stderr
        gone = json.loads(down.stdout)["result"]["slurm"]
        assert gone["gone"] and gone["replicas"]["gone"], gone
        assert queued(router) == "" and queued(replicas) == ""
        for job in (router, replicas):
            assert containers(f"kit.slurm-job={job}") == "", f"containers of job {job} are left"
        assert key not in out.read_text()
        print(f"down: nothing left, {time.monotonic() - t0:.0f} s after the start")
    finally:
        subprocess.run(["scancel", router, replicas], capture_output=True)
        for job in (router, replicas):
            left = containers(f"kit.slurm-job={job}").split()
            if left:
                subprocess.run(["docker", "rm", "-f", *left], capture_output=True)

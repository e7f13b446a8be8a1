"""Supervision with group restart on the real 2-node CPU cluster (issue 18): vLLM's CPU build, the
tiny model, mp backend, TP=2 across the nodes and DP=2 (one engine per node), each under a steady
request load through kit's bench client. `kit serve --supervise` follows the coordinator's events
in the background the whole time. Each fault is injected for real and the supervisor must detect
it, restart the whole group (every rank on every node: new pids everywhere) and serve again:

1. kill -9 of the engine process inside the head container;
2. (DP) kill -STOP of an engine on the worker (a hang /health does not see);
3. docker kill of the worker node's container: `docker kill` is a manual stop that Docker's
   restart policy leaves down, so `kit serve --supervise`, which follows, starts it again (issue
   25: nobody has to); the container's entrypoint resumes the agent;
4. (TP) docker restart of the head container: the coordinator resumes from its state file;
5. (TP, last) the model removed, then a crash: every restart fails, supervision gives up at the
   limit, `kit serve --supervise` exits 6 with the last log lines, nothing is left running.

After each recovery: the event record (detected, why, stopping, restarting, started, ready), the
requests that failed during the outage, and no orphan: one `vllm serve`, one agent per node, every
engine in the current serve group, only the two node containers.

Heavy: run alone, one layout at a time, under the shared lock:
    flock /tmp/kit-heavy.lock pytest tests/integration/test_supervise_cluster.py -k tp2 -x -q
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration import supervise_support as sup
from tests.integration.clusters import make_kit, two_node_mp_env

SECOND_OCTET = 233  # this task's subnets
LAYOUTS = {
    "tp2": {"KIT_MODEL_TP": "2", "KIT_MODEL_DP": "1"},
    "dp2": {"KIT_MODEL_TP": "1", "KIT_MODEL_DP": "2"},
}
# Fast on purpose: hangs count after 10 s, restarts in a row count from 0 after 15 s of serving.
SUPERVISE_ENV = {
    "KIT_TIMEOUTS_LIVENESS": "10",
    "KIT_TIMEOUTS_JOIN": "240",
    "KIT_SUPERVISE_MAX_RESTARTS": "2",
    "KIT_SUPERVISE_BACKOFF": "2",
    "KIT_SUPERVISE_STABLE": "15",
}
MODEL_DIR = "models--kit--tiny-llama"  # kit demo --prepare-only's model in the HF cache
DETECT_S = 15  # issue 18's goal for detection, checked here with slack for a loaded 2-CPU host
RECOVER_S = 300
# A fault whose detection and restart do not depend on the layout runs on TP=2 only (CI time, issue
# 26): a dead process or container stops the whole group the same way for both; DP=2 keeps the
# serving check and the hang, whose detection watches a different engine (EngineCore_DP1).
# benchmarks/recovery.py still measures every fault on both layouts.
ONCE = "once is enough: the TP layout covers it"
# The hang runs on DP=2 only: one engine of two stopped while the other serves is the case only
# the per-engine judgement (pinned probes) catches; a stopped TP worker stalls the one engine,
# which the same judgement sees as well (benchmarks/recovery.py measures both).
HANG_ONCE = "once is enough: the DP layout covers it (one engine of two hung)"


@pytest.fixture(scope="module", params=list(LAYOUTS))
def cluster(
    request: pytest.FixtureRequest, docker_client: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    layout = request.param
    root = tmp_path_factory.mktemp(f"sup-{layout}")
    base_env: dict[str, str] = {}
    kit = make_kit(root / "state", base_env)
    prep = kit("demo", "--prepare-only", "--json")
    assert prep.returncode == 0, prep.stderr
    hf_cache = json.loads(prep.stdout)["result"]["hf_cache"]
    name = f"ksup{layout}{os.getpid() % 10000}"
    base_env.update(two_node_mp_env(name, hf_cache, None, second_octet=SECOND_OCTET))
    base_env.update({**LAYOUTS[layout], **SUPERVISE_ENV})
    follower = None
    try:
        for role in ("--worker", "--head"):
            up = kit("up", role)
            assert up.returncode == 0, up.stderr
        log = (root / "follow.out").open("w")
        err = (root / "follow.err").open("w")
        env = {**os.environ, "KIT_STATE_DIR": str(root / "state"), **base_env}
        follower = subprocess.Popen(
            [sys.executable, "-m", "kit", "serve", "--supervise"], stdout=log, stderr=err, env=env, text=True
        )
        deadline = time.monotonic() + RECOVER_S
        while "under supervision" not in (root / "follow.out").read_text():
            assert follower.poll() is None, (root / "follow.err").read_text()
            assert time.monotonic() < deadline, (root / "follow.err").read_text()
            time.sleep(1)
        head = docker_client.containers.get(f"kit-{name}-head")
        url = f"http://{head.labels['kit.node-ip']}:8000"
        yield {
            "kit": kit,
            "name": name,
            "layout": layout,
            "url": url,
            "root": root,
            "follower": follower,
            "docker": docker_client,
            "hf_cache": hf_cache,
        }
    finally:
        if follower is not None and follower.poll() is None:
            follower.send_signal(signal.SIGINT)
            try:
                follower.wait(30)
            except subprocess.TimeoutExpired:  # never skip `kit down` below
                follower.kill()
        kit("down")
        moved = Path(hf_cache) / "kit-moved-away"
        if moved.exists():  # the give-up test's model, back where it was
            shutil.move(str(moved / MODEL_DIR), str(Path(hf_cache) / "hub" / MODEL_DIR))


def head(c: dict[str, Any]) -> Any:
    return c["docker"].containers.get(f"kit-{c['name']}-head")


def worker(c: dict[str, Any]) -> Any:
    return c["docker"].containers.get(f"kit-{c['name']}-worker-1")


def follower_err(c: dict[str, Any]) -> str:
    return str((c["root"] / "follow.err").read_text()[-3000:])


def wait_stable(c: dict[str, Any]) -> None:
    """Serving, and served long enough that the next failure is a first one (supervise.stable);
    `kit serve --supervise` still following."""
    assert c["follower"].poll() is None, f"kit serve --supervise exited {c['follower'].returncode}: {follower_err(c)}"
    end = time.monotonic() + 60
    while time.monotonic() < end:
        state = sup.read_state(head(c))
        if state.get("phase") == "serving" and state.get("attempts") == 0:
            return
        time.sleep(1)
    raise AssertionError(f"not stably serving: {sup.read_state(head(c))}")


def assert_clean_group(c: dict[str, Any]) -> None:
    """One `vllm serve`, one agent per node, every vLLM process in the current serve group, the
    coordinator on the head only, and no container but the two nodes."""
    for node, container in (("head", head(c)), ("worker-1", worker(c))):
        found = sup.serving_processes(container)
        assert len(found["serve"]) == 1, (node, found)
        assert len(found["agent"]) == 1, (node, found)
        assert len(found["coordinator"]) == (1 if node == "head" else 0), (node, found)
        group = found["serve"][0]["pgid"]
        assert found["engines"] and all(e["pgid"] == group for e in found["engines"]), (node, found)
        assert not [e for e in found["engines"] if e["state"] == "T"], "a stopped engine was left behind"
    names = sorted(x.name for x in c["docker"].containers.list(all=True, filters={"label": f"kit.cluster={c['name']}"}))
    assert names == [f"kit-{c['name']}-head", f"kit-{c['name']}-worker-1"]


def pids(c: dict[str, Any]) -> dict[str, int]:
    return {n: sup.serving_processes(x)["serve"][0]["pid"] for n, x in (("head", head(c)), ("w", worker(c)))}


def recover(c: dict[str, Any], fault_at: float, load: sup.Load) -> dict[str, Any]:
    """Wait for the supervisor's cycle after a fault injected at wall time fault_at; the events,
    detection and recovery times, and the load's failures."""
    try:
        detected = sup.wait_event(lambda: head(c), "detected", after=fault_at - 1, timeout=120)
    except AssertionError as exc:  # what the coordinator saw, to tell why
        # The run directory's listing and every log's tail (a run on d0871a4's parent came back with
        # an empty coordinator.log tail and nothing else to go on).
        log = sup.exec_out(head(c), ["bash", "-c", 'ls -la "$1"; tail -n 40 "$1"/*.log 2>&1', "kit-test", sup.RUN_DIR])
        raise AssertionError(f"{exc}; state {sup.read_state(head(c))}; coordinator.log:\n{log}") from None
    ready = sup.wait_event(lambda: head(c), "ready", after=detected.ts, timeout=RECOVER_S)
    answered = None
    end = time.monotonic() + 60
    while answered is None and time.monotonic() < end:
        answered = load.first_ok_after(ready.ts)
        time.sleep(0.5)
    cycle = [e for e in sup.read_events(head(c)) if detected.ts <= e.ts <= ready.ts]
    return {
        "detected": detected,
        "ready": ready,
        "kinds": [e.kind for e in cycle],
        "detect_s": detected.ts - fault_at,
        "answered_s": None if answered is None else answered - fault_at,
        "failed": load.failed_between(fault_at, ready.ts + 5),
        "cut_off": load.cut_off(fault_at),
    }


def report(c: dict[str, Any], what: str, r: dict[str, Any]) -> None:
    answered = "never" if r["answered_s"] is None else f"{r['answered_s']:.1f} s"
    print(
        f"\n[{c['layout']}] {what}: detected in {r['detect_s']:.1f} s ({r['detected'].reason}); answered again "
        f"{answered} after the fault; {r['cut_off']} request(s) in flight cut off, {r['failed']} failed tries "
        f"during the outage (one a second per load thread); {r['kinds']}"
    )


def test_serving_under_supervision_and_status_says_so(cluster: dict[str, Any]) -> None:
    kinds = [e.kind for e in sup.read_events(head(cluster))]
    assert kinds[:4] == ["supervising", "waiting", "started", "ready"] or kinds[:3] == [
        "supervising",
        "started",
        "ready",
    ], kinds
    status = cluster["kit"]("status", "--json")
    assert status.returncode == 0, status.stderr
    result = json.loads(status.stdout)["result"]
    assert result["server"]["serving"] is True, result["server"]
    assert result["supervise"]["active"] and result["supervise"]["phase"] == "serving"
    text = cluster["kit"]("status").stdout
    assert "server: idle, answering" in text or "server: serving" in text
    assert "supervisor: active, serving, generation 1, 0 restart(s)" in text
    assert_clean_group(cluster)


def test_kill_9_of_the_engine_in_the_head_restarts_the_group(cluster: dict[str, Any]) -> None:
    if cluster["layout"] != "tp2":
        pytest.skip(ONCE)
    wait_stable(cluster)
    before = pids(cluster)
    load = sup.Load(cluster["url"]).start()
    time.sleep(5)
    title = "VLLM::EngineCore"  # TP: the one engine core, on the head; DP: rank 0's
    fault_at = time.time()
    assert sup.signal_title(head(cluster), "KILL", title) >= 1
    r = recover(cluster, fault_at, load)
    load.stop()
    report(cluster, "kill -9 engine on head", r)
    assert r["kinds"] == ["detected", "stopping", "restarting", "started", "ready"], r["kinds"]
    assert r["detect_s"] < DETECT_S
    assert r["answered_s"] is not None, "no request succeeded after the restart"
    assert load.ok_between(0, fault_at) > 0
    after = pids(cluster)
    assert all(after[n] != before[n] for n in before), "every node's rank restarted"
    assert_clean_group(cluster)


def test_a_stopped_engine_is_a_hang_and_restarts_the_group(cluster: dict[str, Any]) -> None:
    if cluster["layout"] != "dp2":
        pytest.skip(HANG_ONCE)
    wait_stable(cluster)
    load = sup.Load(cluster["url"]).start()
    time.sleep(5)
    title = "VLLM::EngineCore_DP1"
    fault_at = time.time()
    assert sup.signal_title(worker(cluster), "STOP", title) >= 1
    health = subprocess.run(
        ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"{cluster['url']}/health"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    r = recover(cluster, fault_at, load)
    load.stop()
    report(cluster, "kill -STOP engine on worker", r)
    assert health.stdout == "200", "the hang is one /health does not see"
    assert "hung" in r["detected"].reason or "API server is down" in r["detected"].reason, r["detected"].reason
    assert r["detect_s"] < DETECT_S + 10  # liveness 10 s of no progress, then a confirming look
    assert r["kinds"][-3:] == ["restarting", "started", "ready"]
    assert_clean_group(cluster)


def test_a_killed_worker_container_is_started_again_and_the_group_restarts(cluster: dict[str, Any]) -> None:
    if cluster["layout"] != "tp2":
        pytest.skip(ONCE)
    wait_stable(cluster)
    load = sup.Load(cluster["url"]).start()
    time.sleep(5)
    fault_at = time.time()
    worker(cluster).kill()
    # Nobody starts it but kit: the follower sees it exited and starts it (issue 25).
    r = recover(cluster, fault_at, load)
    assert f"kit started kit-{cluster['name']}-worker-1 again" in (cluster["root"] / "follow.err").read_text()
    load.stop()
    report(cluster, "docker kill worker", r)
    assert r["detect_s"] < DETECT_S
    # The worker may be back before the group has stopped (no `waiting` then): either way a restart.
    assert r["kinds"][:2] == ["detected", "stopping"] and r["kinds"][-3:] == ["restarting", "started", "ready"]
    assert_clean_group(cluster)


def test_a_restarted_head_container_resumes_supervision(cluster: dict[str, Any]) -> None:
    if cluster["layout"] != "tp2":
        pytest.skip(ONCE)
    wait_stable(cluster)
    fault_at = time.time()
    head(cluster).restart(timeout=5)
    resumed = sup.wait_event(lambda: head(cluster), "supervising", after=fault_at, timeout=60)
    assert "resumed" in resumed.reason
    detected = sup.wait_event(lambda: head(cluster), "detected", after=fault_at, timeout=60)
    assert "node head" in detected.reason  # its new agent: the container restarted
    sup.wait_event(lambda: head(cluster), "ready", after=detected.ts, timeout=RECOVER_S)
    assert_clean_group(cluster)
    state = json.loads(cluster["kit"]("status", "--json").stdout)["result"]
    assert state["server"]["serving"] and state["supervise"]["restarts"] >= 3


def test_a_restart_loop_that_never_succeeds_gives_up_with_exit_6_and_nothing_left(cluster: dict[str, Any]) -> None:
    if cluster["layout"] != "tp2":
        pytest.skip(ONCE)
    wait_stable(cluster)
    moved = Path(cluster["hf_cache"]) / "kit-moved-away"
    moved.mkdir(exist_ok=True)
    shutil.move(str(Path(cluster["hf_cache"]) / "hub" / MODEL_DIR), str(moved / MODEL_DIR))  # the model is gone
    fault_at = time.time()
    assert sup.signal_title(head(cluster), "KILL", "VLLM::EngineCore") >= 1
    given_up = sup.wait_event(lambda: head(cluster), "given-up", after=fault_at, timeout=RECOVER_S)
    follower = cluster["follower"]
    assert follower.wait(60) == 6, follower_err(cluster)
    err = follower_err(cluster)
    assert "kit: error: supervision gave up" in err and "  | " in err, err
    assert given_up.restarts >= 2 and given_up.details, given_up
    kinds = [e.kind for e in sup.read_events(head(cluster)) if e.ts >= fault_at]
    assert kinds.count("restarting") == 2 and kinds[-1] == "given-up", kinds
    time.sleep(2)
    for container in (head(cluster), worker(cluster)):
        found = sup.serving_processes(container)
        assert found == {"serve": [], "engines": [], "agent": [], "coordinator": []}, found
    status = json.loads(cluster["kit"]("status", "--json").stdout)["result"]
    assert status["server"]["serving"] is False
    assert status["supervise"]["phase"] == "given-up" and not status["supervise"]["active"]
    events_text = cluster["kit"]("logs", "--events").stdout
    assert "given-up" in events_text and "detected" in events_text

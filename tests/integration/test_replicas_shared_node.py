"""Two replicas that share one node (issue 29, partial-node layouts), supervised, on the real CPU
engine: one container-node of two "GPUs" (gpus_per_node 2, model.dp_lb router, TP=1 × DP=2), so
both replicas' `vllm serve` run side by side in the same container, each on its own port (8100,
8101), behind vLLM's router (kit's router image), with an API key, under `kit serve --supervise`.

Each replica is its own supervised group there: its own serve script, run directory, coordinator
port and agent. kill -9 of replica 1's engine under a steady load through the endpoint: replica
1's coordinator drains it, restarts it alone and readmits it; replica 0's processes in the same
container are never touched, the endpoint keeps answering from it, and replica 1's record is
read back with `kit logs --events --slot 1`. `kit down` leaves nothing.

(tests/integration/test_replicas_cluster.py has one replica per container-node, its node killed.)

Heavy: run alone, under the shared lock:
    flock /tmp/kit-docker.lock pytest tests/integration/test_replicas_shared_node.py -x -q -s
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from tests.conftest import write_secret
from tests.integration import replicas_support as rep
from tests.integration import supervise_support as sup
from tests.integration.clusters import make_kit, two_node_mp_env

SECOND_OCTET = 237  # this module's subnets
KEY = "kit-shared-node-test-key"
RECOVER_S = 300
SHARED_ENV = {
    "KIT_NODES": "1",
    "KIT_GPUS_PER_NODE": "2",  # two TP=1 replicas on the one node
    "KIT_MODEL_TP": "1",
    "KIT_MODEL_DP": "2",
    "KIT_MODEL_DP_LB": "router",
    "KIT_TIMEOUTS_LIVENESS": "20",  # as test_replicas_cluster.py: a fresh CPU engine's first answer is slow
    "KIT_TIMEOUTS_JOIN": "240",
    "KIT_SUPERVISE_MAX_RESTARTS": "3",
    "KIT_SUPERVISE_BACKOFF": "2",
    "KIT_SUPERVISE_STABLE": "15",
}


def test_two_replicas_on_one_node_recover_apart(docker_client: Any, tmp_path: Any) -> None:
    key_file = write_secret(tmp_path / "api_key", KEY + "\n")
    base_env: dict[str, str] = {}
    kit = make_kit(tmp_path / "state", base_env)
    prep = kit("demo", "--prepare-only", "--json")
    assert prep.returncode == 0, prep.stderr
    hf_cache = json.loads(prep.stdout)["result"]["hf_cache"]
    rep.ensure_router_image(docker_client, kit, tmp_path)
    name = f"kshr{os.getpid() % 10000}"
    base_env.update(two_node_mp_env(name, hf_cache, key_file, second_octet=SECOND_OCTET))
    base_env.update(SHARED_ENV)
    started = time.monotonic()
    try:
        up = kit("up", "--head")
        assert up.returncode == 0, up.stderr
        served = kit("serve", "--supervise", "--detach", "--json", timeout=RECOVER_S + 300)
        assert served.returncode == 0, served.stderr[-3000:]
        url = json.loads(served.stdout)["result"]["url"]
        print(f"\n[shared] two replicas on one node ready behind {url} in {time.monotonic() - started:.0f} s")
        box = docker_client.containers.get(f"kit-{name}-head")
        before = rep.replica_processes(box)
        assert before[8100]["pgid"] != before[8101]["pgid"], before  # two groups, not one
        assert all(before[p]["engines"] for p in (8100, 8101)), before
        coordinators = sup.serving_processes(box)["coordinator"]
        assert len(coordinators) == 2 and len(sup.serving_processes(box)["agent"]) == 2

        load = rep.Load(url, KEY, rate=0.5, concurrency=2, seconds=RECOVER_S).start()
        time.sleep(6)
        fault_at = time.time()
        rep.kill_replica_engines(box, 8101)
        found = rep.wait_kinds(lambda: box, ["detected", "readmitted"], after=fault_at - 1, timeout=RECOVER_S, slot=1)
        detected, readmitted = found["detected"], found["readmitted"]
        time.sleep(4)
        load.stop()
        during = load.summary(fault_at, readmitted.ts)
        kinds = [e.kind for e in rep.replica_events(box, 1) if fault_at - 1 <= e.ts <= readmitted.ts]
        after = rep.replica_processes(box)
        print(
            f"[shared] detected in {detected.ts - fault_at:.1f} s, readmitted in {readmitted.ts - fault_at:.1f} s; "
            f"{kinds}; load {during}"
        )
        assert kinds[:2] == ["detected", "stopping"] and "drained" in kinds and kinds[-2:] == ["ready", "readmitted"]
        assert after[8100] == before[8100], "replica 0, beside it on the node, was touched"
        assert after[8101]["serve"] != before[8101]["serve"], "replica 1 was not restarted"
        assert [e.kind for e in rep.replica_events(box, 0) if e.ts >= fault_at - 1] == [], (
            "replica 0's coordinator acted"
        )
        assert during["answered"] > 0 and during["failed"] <= 4, during  # bounded by what was in flight on it

        record = kit("logs", "--events", "--slot", "1", "--tail", "all")
        assert record.returncode == 0 and "readmitted" in record.stdout, record.stderr
        status = kit("status", "--json")
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)["result"]
        assert doc["server"]["replicas_serving"] == 2
        # each replica's own supervisor: replica 1 restarted once (its generation 2), replica 0 never
        rows = {r["replica"]: r["supervise"] for r in doc["router"]["replicas"]}
        assert [(rows[k]["generation"], rows[k]["phase"], rows[k]["active"]) for k in (0, 1)] == [
            (1, "serving", True),
            (2, "serving", True),
        ], rows
    finally:
        down = kit("down")
    assert down.returncode == 0, down.stderr
    assert not docker_client.containers.list(all=True, filters={"label": f"kit.cluster={name}"})

"""Replicas behind one endpoint vs today's whole-group restart (issue 29), side by side on one
2-node CPU cluster in one run, and what vLLM's router adds to TTFT.

Topology: two container "nodes" on a private Docker network, vLLM's CPU build, mp backend, the
tiny random-weight Llama (`kit demo --prepare-only`), `--enforce-eager`, an API key, and
`kit serve --supervise` (timeouts.liveness 20 s, supervise.backoff 2 s). The load: kit's bench
runner with --keep-going (every failure counted and timed), `--rate` requests a second, at most
4 in flight, streaming 16 tokens each.

  replicas  model.dp_lb router, TP=1 × DP=2: one replica per node behind kit's router (its
            endpoint at .9); kill -9 of replica 1's engine (on the worker): its coordinator
            drains it, restarts it alone, readmits it.
  group     model.dp_lb internal, DP=2 (today's DP group: one API server on the head over both
            engines); kill -9 of the worker's engine: the coordinator restarts the whole group.
  outage    from the fault to the replica's `readmitted` (replicas) / the group's `ready` (group):
            requests sent, answered (whole answers), availability = answered / sent; goal with two
            replicas: availability >= 0.9.
  --layout shared  the same on ONE container-node of two slots (gpus_per_node 2): the two
            replicas share the node (each its own supervised group: kill -9 of replica 1's engine
            leaves replica 0 beside it alone), and the group is DP=2 on that one node.
  overhead  TTFT at concurrency 1 through the router (round robin over both replicas) vs straight
            at the replicas in the same order (rounds alternate), a pause between requests
            (--overhead-pause, 1.2 s): p50 added by the router; goal <= 2 ms. Without the pause
            this cluster measures its engines, not the router: both replicas share 2 cores, and
            vLLM's idle worker busy-waits for 1 s after every step, so the replica asked next
            answered ~1 s late with or without a router (benchmarks/_overhead.py has the figures).

    python benchmarks/failover.py [--rate 2] [--overhead-requests 20] [--rounds 2] [--overhead-pause 1.2]
        [--no-api-key] [--layout nodes|shared]
        [--only all|overhead] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._overhead import router_vs_direct  # noqa: E402
from tests.integration import replicas_support as rep  # noqa: E402
from tests.integration import supervise_support as sup  # noqa: E402
from tests.integration.clusters import two_node_mp_env  # noqa: E402

KEY = "kit-failover-benchmark-key"
SUPERVISE = {
    "KIT_TIMEOUTS_LIVENESS": "20",  # the first request of a fresh CPU engine took > 5 s under load
    "KIT_TIMEOUTS_JOIN": "240",
    "KIT_SUPERVISE_MAX_RESTARTS": "3",
    "KIT_SUPERVISE_BACKOFF": "2",
    "KIT_SUPERVISE_STABLE": "15",
    "KIT_MODEL_TP": "1",
    "KIT_MODEL_DP": "2",
}


def kit(args: list[str], env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "kit", *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"kit {' '.join(args)} failed: {done.stderr[-2000:]}")
    return done


def outage(
    client: Any, url: str, key: str | None, rate: float, fault: Callable[[], Any], events_in: Any, until: str, slot: int
) -> dict[str, Any]:
    """Load, `fault()`, wait for `until` in the coordinator of the group in `slot` of the node
    events_in() gives."""
    load = rep.Load(url, key, rate=rate, concurrency=4, seconds=400).start()
    time.sleep(8)
    fault_at = time.time()
    fault()
    found = rep.wait_kinds(events_in, ["detected", until], after=fault_at - 1, timeout=400, slot=slot)
    time.sleep(3)
    load.stop()
    summary = load.summary(fault_at, found[until].ts)
    return {
        "detect_s": round(found["detected"].ts - fault_at, 1),
        "back_s": round(found[until].ts - fault_at, 1),
        **summary,
    }


def wait_routed(router: str, key: str | None, count: int, timeout: float = 300) -> None:
    """Every replica in the router and healthy (were one to fail after its readmission, its
    coordinator restarts and readmits it)."""
    from kit.net import router as router_api

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = router_api.replicas(router, key)
        if len(got) == count and all(w.healthy for w in got):
            return
        time.sleep(2)
    raise RuntimeError(f"not every replica routed and healthy within {timeout} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--overhead-requests", type=int, default=20)
    parser.add_argument("--overhead-pause", type=float, default=1.2, help="seconds between requests")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--subnet-octet", type=int, default=231)
    parser.add_argument(
        "--no-api-key", action="store_true", help="serve without api_key_file (the router then checks no key)"
    )
    parser.add_argument("--only", choices=("all", "overhead"), default="all", help="overhead: skip both outages")
    parser.add_argument(
        "--layout", choices=("nodes", "shared"), default="nodes", help="shared: both replicas on one node"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    key = None if args.no_api_key else KEY
    client = docker.from_env()
    root = Path(tempfile.mkdtemp(prefix="kit-failover-"))
    key_file = root / "api_key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    env = {**os.environ, "KIT_STATE_DIR": str(root / "state")}
    hf = json.loads(kit(["demo", "--prepare-only", "--json"], env).stdout)["result"]["hf_cache"]
    name = f"kfail{os.getpid() % 10000}"
    env.update(two_node_mp_env(name, hf, None if key is None else key_file, second_octet=args.subnet_octet))
    env.update(SUPERVISE)
    shared = args.layout == "shared"
    if shared:
        env.update({"KIT_NODES": "1", "KIT_GPUS_PER_NODE": "2"})
    roles = ("--head",) if shared else ("--worker", "--head")
    routed = {**env, "KIT_MODEL_DP_LB": "router"}
    out: dict[str, Any] = {"layout": args.layout}
    try:
        rep.ensure_router_image(client, lambda *a: kit(list(a), env), root)
        for role in roles:
            kit(["up", role], routed)
        served = json.loads(kit(["serve", "--supervise", "--detach", "--json"], routed, 900).stdout)["result"]
        url = served["url"]
        head_ip = client.containers.get(f"kit-{name}-head").labels["kit.node-ip"]
        wait_routed(url, key, 2)
        if shared:  # ports.replica + each replica's slot on the one node
            replicas = [f"http://{head_ip}:{port}" for port in (8100, 8101)]
        else:  # ports.replica, one replica per node
            worker_ip = client.containers.get(f"kit-{name}-worker-1").labels["kit.node-ip"]
            replicas = [f"http://{ip}:8100" for ip in (head_ip, worker_ip)]
        out["overhead"] = {
            "api_key": key is not None,
            **router_vs_direct(url, replicas, args.overhead_requests, args.rounds, key, pause_s=args.overhead_pause),
        }
        if args.only == "overhead":
            return report(out, args.json)
        wait_routed(url, key, 2)
        # replica 1: the worker's (slot 0 there), or slot 1 of the one node
        where = f"kit-{name}-head" if shared else f"kit-{name}-worker-1"
        out["replicas"] = outage(
            client,
            url,
            key,
            args.rate,
            lambda: rep.kill_replica_engines(client.containers.get(where), 8101 if shared else 8100),
            lambda: client.containers.get(where),
            "readmitted",
            slot=1 if shared else 0,
        )
        kit(["down"], routed)  # today's whole-group restart on fresh nodes of the same shape
        for role in roles:
            kit(["up", role], env)
        kit(["serve", "--supervise", "--detach"], env, 900)
        group_where = f"kit-{name}-head" if shared else f"kit-{name}-worker-1"
        out["group"] = outage(
            client,
            f"http://{head_ip}:8000",
            key,
            args.rate,
            lambda: sup.signal_title(client.containers.get(group_where), "KILL", "VLLM::EngineCore_DP1"),
            lambda: client.containers.get(f"kit-{name}-head"),
            "ready",
            slot=0,
        )
    finally:
        subprocess.run([sys.executable, "-m", "kit", "down"], env=env, capture_output=True, check=False)
    return report(out, args.json)


def report(out: dict[str, Any], as_json: bool) -> int:
    if as_json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"layout {out['layout']}: outage after kill -9 of one engine under load (fault -> back in service)")
    print(f"{'':10} {'detect s':>9} {'back s':>7} {'sent':>5} {'answered':>9} {'availability':>13}")
    for what in ("replicas", "group"):
        if what not in out:
            continue
        r = out[what]
        cells = f"{r['detect_s']:>9} {r['back_s']:>7} {r['sent']:>5} {r['answered']:>9} {r['availability']:>13}"
        print(f"{what:10} {cells}")
    o = out["overhead"]
    print(
        f"router overhead: TTFT p50 {o['ttft_p50_router_ms']} ms via the router vs {o['ttft_p50_direct_ms']} ms "
        f"direct: +{o['added_p50_ms']} ms ({o['requests'][0]} / {o['requests'][1]} requests)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Bring-up to a Ray-ready 2-node cluster: `kit up` vs a hand-written run_cluster-style script
(issue 3: target median ratio kit/baseline <= 1.10).

Both sides start two containers of the same image on a private Docker network with fixed IPs
(a random 10.214.X.0/24), on this one host, and stop the clock when the orchestrator *knows*
that 2 Ray nodes (and >= 2 CPUs) are alive:

  kit       `kit up --worker --no-wait` then `kit up --head` (the head's barrier waits for every
            node and CPU; the command returns once it has seen the KIT_READY line). The clock
            includes creating the network and both CLI processes.
  baseline  `docker network create`, then `docker run -d --network NET --ip IP IMAGE bash -c
            "ray start --head --node-ip-address IP --port 6379 --block"`, the same for the worker
            with `--address HEAD:6379`, then one `docker exec head python3 -c ...` that polls
            `ray.nodes()` every 0.5 s until 2 nodes are alive.

Rounds alternate (kit first in even rounds, baseline first in odd ones) and each run is torn down
before the next. Per kit run the script also reads the containers' timestamped logs to show where
the time went (worker join retries, the head barrier, kit's own log polling). Not a timed test:
run it and read the table.

    python benchmarks/bringup.py [--rounds 3] [--image IMAGE (default: the demo's)] [--json] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _images import default_image, require_image

TARGET = 1.10
ROOT = Path(__file__).resolve().parents[1]

# The baseline's readiness probe: one exec that polls until 2 nodes and >= 2 CPUs are alive.
BASELINE_PROBE = """
import sys, time
import ray
address, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
while True:
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        break
    except Exception:
        if time.monotonic() > deadline:
            sys.exit("the head did not come up")
        time.sleep(0.5)
while True:
    alive = [n for n in ray.nodes() if n.get("Alive")]
    if len(alive) >= 2 and sum(n.get("Resources", {}).get("CPU", 0) for n in alive) >= 2:
        print("READY", len(alive), flush=True)
        break
    if time.monotonic() > deadline:
        sys.exit(f"only {len(alive)} nodes alive")
    time.sleep(0.5)
"""


def sh(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 300, check: bool = True) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return proc.stdout


def log_times(container: str) -> list[tuple[float, str]]:
    """(unix time, line) for every line of a container's log (docker logs --timestamps)."""
    out = subprocess.run(["docker", "logs", "--timestamps", container], capture_output=True, text=True, check=False)
    rows = []
    for line in (out.stdout + out.stderr).splitlines():
        stamp, _, text = line.partition(" ")
        try:
            # RFC 3339 with nanoseconds: keep microseconds for fromisoformat
            base, _, frac = stamp.rstrip("Z").partition(".")
            when = dt.datetime.fromisoformat(f"{base}.{(frac + '000000')[:6]}+00:00").timestamp()
        except ValueError:
            continue
        rows.append((when, text))
    return sorted(rows)


def first(rows: list[tuple[float, str]], needle: str) -> float | None:
    return next((t for t, text in rows if needle in text), None)


def container_started(name: str) -> float | None:
    raw = sh(["docker", "inspect", "--format", "{{.State.StartedAt}}", name], check=False).strip()
    if not raw:
        return None
    base, _, frac = raw.rstrip("Z").partition(".")
    return dt.datetime.fromisoformat(f"{base}.{(frac + '000000')[:6]}+00:00").timestamp()


# ---- kit ------------------------------------------------------------------------------------
def kit_env(cluster: str, subnet: str, image: str, work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KIT_")}
    (work / "hf").mkdir(exist_ok=True)
    env.update(
        {
            "KIT_STATE_DIR": str(work / "state"),
            "KIT_CLUSTER": cluster,
            "KIT_IMAGE": image,
            "KIT_ACCELERATOR": "cpu",
            "KIT_BACKEND": "ray",
            "KIT_NODES": "2",
            "KIT_GPUS_PER_NODE": "1",
            "KIT_NETWORK": f"{cluster}-net",
            "KIT_NETWORK_SUBNET": subnet,
            "KIT_IPC_HOST": "false",
            "KIT_SHM_SIZE": "1g",
            "KIT_HF_CACHE": str(work / "hf"),
            "KIT_TIMEOUTS_JOIN": "180",
        }
    )
    return env


def run_kit(cluster: str, subnet: str, image: str, python: str, work: Path) -> dict[str, Any]:
    env = kit_env(cluster, subnet, image, work)
    kit = [python, "-m", "kit"]
    try:
        t0 = time.time()
        sh([*kit, "up", "--worker", "--no-wait"], env=env)
        t_worker_cmd = time.time()
        sh([*kit, "up", "--head"], env=env)
        t1 = time.time()
        head, worker = f"kit-{cluster}-head", f"kit-{cluster}-worker-1"
        hlog, wlog = log_times(head), log_times(worker)
        ready = first(hlog, "KIT_READY")
        joined = first(wlog, "Ray runtime started")  # the worker's `ray start` returned
        gcs_up = first(hlog, "Ray runtime started")
        barrier = first(hlog, "nodes and")  # the head barrier's first ray.nodes() answer
        head_started = container_started(head)
        retries = sum(1 for _, text in wlog if "not reachable yet" in text)

        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - t0, 2)

        return {
            "seconds": round(t1 - t0, 2),
            "worker_cmd_s": round(t_worker_cmd - t0, 2),
            "timeline": {
                "head_container_started": rel(head_started),
                "head_ray_started": rel(gcs_up),
                "barrier_first_poll": rel(barrier),
                "worker_joined": rel(joined),
                "head_ready_mark": rel(ready),
                "kit_returned": rel(t1),
            },
            "worker_join_retries": retries,
            "mark_to_return_s": None if ready is None else round(t1 - ready, 2),
            "barrier_to_mark_s": None if (ready is None or barrier is None) else round(ready - barrier, 2),
            "ray_started_to_joined_s": None if (gcs_up is None or joined is None) else round(joined - gcs_up, 2),
        }
    finally:
        sh([*kit, "down"], env=env, check=False)


# ---- baseline -------------------------------------------------------------------------------
def run_baseline(tag: str, subnet: str, image: str) -> dict[str, Any]:
    prefix = subnet.rsplit(".", 1)[0]
    net, head_ip, worker_ip = f"{tag}-net", f"{prefix}.10", f"{prefix}.11"
    head, worker = f"{tag}-head", f"{tag}-worker"
    label = ["--label", f"kit.bench={tag}"]
    common = [*label, "--network", net, "--shm-size", "1g"]
    try:
        t0 = time.time()
        sh(["docker", "network", "create", "--subnet", subnet, *label, net])
        sh(
            ["docker", "run", "-d", "--name", head, "--ip", head_ip, *common, image, "bash", "-c",
             f"ray start --head --node-ip-address {head_ip} --port 6379 --block"]
        )  # fmt: skip
        sh(
            ["docker", "run", "-d", "--name", worker, "--ip", worker_ip, *common, image, "bash", "-c",
             f"ray start --address {head_ip}:6379 --node-ip-address {worker_ip} --block"]
        )  # fmt: skip
        sh(["docker", "exec", head, "python3", "-c", BASELINE_PROBE, f"{head_ip}:6379", "180"], timeout=240)
        t1 = time.time()
        head_up, worker_up = (
            first(log_times(head), "Ray runtime started"),
            first(log_times(worker), "Ray runtime started"),
        )
        return {
            "seconds": round(t1 - t0, 2),
            "timeline": {
                "head_ray_started": None if head_up is None else round(head_up - t0, 2),
                "worker_ray_started": None if worker_up is None else round(worker_up - t0, 2),
                "probe_returned": round(t1 - t0, 2),
            },
        }
    finally:
        sh(["docker", "rm", "-f", head, worker], check=False)
        sh(["docker", "network", "rm", net], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--image", default=default_image())
    parser.add_argument("--subnet-prefix", default="10.214", help="networks are PREFIX.X.0/24 and PREFIX.X+1.0/24")
    parser.add_argument("--python", default=sys.executable, help="the interpreter with kit installed")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the JSON result to this file")
    args = parser.parse_args()
    require_image(args.image)

    run_id = f"{random.randrange(16**6):06x}"
    third = random.randrange(2, 250)
    kit_subnet, base_subnet = f"{args.subnet_prefix}.{third}.0/24", f"{args.subnet_prefix}.{third + 1}.0/24"
    load_before = os.getloadavg()
    kit_runs: list[dict[str, Any]] = []
    base_runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kit-bench-bringup-") as tmp:
        work = Path(tmp)
        for i in range(args.rounds):
            order = ("kit", "baseline") if i % 2 == 0 else ("baseline", "kit")
            for side in order:
                if side == "kit":
                    r = run_kit(f"bb{run_id}k{i}", kit_subnet, args.image, args.python, work)
                    kit_runs.append(r)
                else:
                    r = run_baseline(f"bb{run_id}b{i}", base_subnet, args.image)
                    base_runs.append(r)
                print(f"round {i + 1} {side:8s} {r['seconds']:6.2f} s", file=sys.stderr, flush=True)

    kit_s = [r["seconds"] for r in kit_runs]
    base_s = [r["seconds"] for r in base_runs]
    ratio = statistics.median(kit_s) / statistics.median(base_s)
    result = {
        "rounds": args.rounds,
        "image": args.image,
        "kit_s": kit_s,
        "baseline_s": base_s,
        "kit_median_s": round(statistics.median(kit_s), 2),
        "baseline_median_s": round(statistics.median(base_s), 2),
        "ratio": round(ratio, 3),
        "target": TARGET,
        "ok": ratio <= TARGET,
        "kit_runs": kit_runs,
        "baseline_runs": base_runs,
        "loadavg_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print("\nbring-up to a Ray-ready 2-node cluster (seconds, wall clock on this host)")
    print(f"{'round':>5}  {'kit up':>8}  {'baseline':>8}  {'ratio':>6}")
    for i, (k, b) in enumerate(zip(kit_s, base_s, strict=True)):
        print(f"{i + 1:>5}  {k:8.2f}  {b:8.2f}  {k / b:6.2f}")
    print(f"{'median':>5}  {result['kit_median_s']:8.2f}  {result['baseline_median_s']:8.2f}  {ratio:6.2f}")
    verdict = "meets" if result["ok"] else "MISSES"
    print(f"\nmedian ratio kit/baseline = {ratio:.2f}x ({verdict} the target <= {TARGET:.2f}x)")
    print("\nwhere kit's time went (seconds since `kit up --worker` was called):")
    heads = ("head ctr", "head ray", "barrier", "worker ray", "READY", "returned", "retries")
    print(f"{'round':>5}  " + "  ".join(f"{h:>10}" for h in heads))
    for i, r in enumerate(kit_runs):
        t = r["timeline"]
        cells = [
            t["head_container_started"],
            t["head_ray_started"],
            t["barrier_first_poll"],
            t["worker_joined"],
            t["head_ready_mark"],
            t["kit_returned"],
        ]
        shown = ["-" if c is None else f"{c:.2f}" for c in cells] + [str(r["worker_join_retries"])]
        print(f"{i + 1:>5}  " + "  ".join(f"{c:>10}" for c in shown))
    print(
        "  (head ctr: head container started; head/worker ray: their `ray start` printed 'Ray runtime started';\n"
        "   barrier: the head barrier's first ray.nodes() answer; READY: the barrier's KIT_READY line)"
    )
    print("\nbaseline for comparison (head ray / worker ray / probe returned):")
    for i, r in enumerate(base_runs):
        t = r["timeline"]
        shown = [
            "-" if t[k] is None else f"{t[k]:.2f}" for k in ("head_ray_started", "worker_ray_started", "probe_returned")
        ]
        print(f"{i + 1:>5}  " + "  ".join(f"{c:>10}" for c in shown))
    for key, what in (
        ("ray_started_to_joined_s", "head ray started -> worker ray started"),
        ("barrier_to_mark_s", "head barrier first poll -> KIT_READY (worker join + 0.5 s polls)"),
        ("mark_to_return_s", "head KIT_READY -> `kit up --head` returned (log poll + exit)"),
    ):
        vals = [r[key] for r in kit_runs if r[key] is not None]
        if vals:
            print(f"  median {what}: {statistics.median(vals):.2f} s")
    print(f"load average (1 min) before/after: {result['loadavg_before_after']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

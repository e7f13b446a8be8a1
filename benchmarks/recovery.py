"""Recovery under supervision (issue 18): per fault and layout, the time the supervisor takes to
detect the fault and the time until a request succeeds again, next to a cold `kit serve` on the
same cluster in the same run; the ratio recovery / cold start.

Topology: two container "nodes" on a private Docker network, vLLM's CPU build, mp backend, the
tiny random-weight Llama (`kit demo --prepare-only`), `--enforce-eager`; layouts TP=2 (one engine
over both nodes) and DP=2 (one engine per node). Supervision: timeouts.liveness 10 s (a hang is
10 s without token progress), supervise.backoff 2 s (the first restart in a row is immediate).

Per layout, on one fresh cluster:
  cold    `kit serve` (plain) from its start until the first one-token request succeeds; then the
          same for `kit serve --supervise --detach --replace` (cold, supervised);
  faults  under a light load (2 threads of streaming chat requests through kit's bench client):
          kill9   kill -9 of the engine core in the head container
          stop    kill -STOP of an engine on the worker (TP: its worker rank; DP: its engine)
          node    docker kill of the worker's container, started again as soon as the
                  supervisor reports it waits for it (the node's own downtime is not kit's)
  detect   = the supervisor's `detected` event - the fault;
  recovery = the first request that started after the fault and succeeded - the fault;
  ratio    = recovery / cold (plain `kit serve`).
Goals: detect <= 15 s, ratio <= 1.2. Not a test: run it and read the table.

    python benchmarks/recovery.py [--layouts tp2,dp2] [--faults kill9,stop,node] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import docker
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _images import default_image, require_image  # noqa: E402

from tests.integration import supervise_support as sup  # noqa: E402

LAYOUTS = {"tp2": {"KIT_MODEL_TP": "2", "KIT_MODEL_DP": "1"}, "dp2": {"KIT_MODEL_TP": "1", "KIT_MODEL_DP": "2"}}
FAULTS = ("kill9", "stop", "node")


def kit(args: list[str], env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kit", *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def first_answer(url: str, since: float, timeout: float = 600) -> float:
    """Wall time of the first one-token request, started at or after `since`, that succeeds."""
    body = {"model": "tiny", "prompt": "ping", "max_tokens": 1}
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        start = time.time()
        if start >= since:
            try:
                if requests.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200:
                    return time.time()
            except requests.RequestException:
                pass
        time.sleep(0.25)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def base_env(state: Path, image: str) -> dict[str, str]:
    return {
        **os.environ,
        "KIT_STATE_DIR": str(state),
        "KIT_IMAGE": image,
        "KIT_BACKEND": "mp",
        "KIT_ACCELERATOR": "cpu",
        "KIT_NODES": "2",
        "KIT_GPUS_PER_NODE": "1",
        "KIT_MODEL_PP": "1",
        "KIT_MODEL_ID": "kit/tiny-llama",
        "KIT_MODEL_SERVED_NAME": "tiny",
        "KIT_MODEL_MAX_MODEL_LEN": "2048",
        "KIT_MODEL_EXTRA_ARGS": "[--enforce-eager]",
        "KIT_IPC_HOST": "false",
        "KIT_SHM_SIZE": "2g",
        "KIT_ENV": "{HF_HUB_OFFLINE: '1', VLLM_CPU_KVCACHE_SPACE: '1'}",
        "KIT_TIMEOUTS_READY": "900",
        "KIT_TIMEOUTS_JOIN": "300",
        "KIT_TIMEOUTS_LIVENESS": "10",
        "KIT_SUPERVISE_BACKOFF": "2",
        "KIT_SUPERVISE_STABLE": "15",
        "KIT_SUPERVISE_MAX_RESTARTS": "3",
    }


def inject(fault: str, layout: str, head: Any, worker: Any) -> None:
    if fault == "kill9":
        sup.signal_title(head, "KILL", "VLLM::EngineCore")
    elif fault == "stop":
        sup.signal_title(worker, "STOP", "VLLM::Worker_TP1" if layout == "tp2" else "VLLM::EngineCore_DP1")
    else:
        worker.kill()


def one_layout(layout: str, args: argparse.Namespace, env: dict[str, str], client: Any) -> list[dict[str, Any]]:
    name = f"brec{layout}{random.randrange(10**5):05d}"
    subnet = f"{args.subnet_prefix}.{random.randrange(2, 250)}.0/24"
    env = {**env, **LAYOUTS[layout], "KIT_CLUSTER": name, "KIT_NETWORK": f"{name}-net", "KIT_NETWORK_SUBNET": subnet}
    rows: list[dict[str, Any]] = []
    try:
        for role in ("--worker", "--head"):
            up = kit(["up", role], env)
            if up.returncode != 0:
                raise RuntimeError(f"kit up {role}: {up.stderr[-2000:]}")
        head = client.containers.get(f"kit-{name}-head")
        url = f"http://{head.labels['kit.node-ip']}:8000"
        start = time.time()
        served = kit(["serve"], env)
        if served.returncode != 0:
            raise RuntimeError(f"kit serve: {served.stderr[-2000:]}")
        cold = first_answer(url, start) - start
        start = time.time()
        supervised = kit(["serve", "--supervise", "--detach", "--replace"], env)
        if supervised.returncode != 0:
            raise RuntimeError(f"kit serve --supervise: {supervised.stderr[-2000:]}")
        cold_supervised = first_answer(url, start) - start
        print(f"[{layout}] cold kit serve {cold:.1f} s, supervised {cold_supervised:.1f} s", file=sys.stderr)
        for fault in args.faults:
            state_end = time.monotonic() + 90
            while sup.read_state(head).get("attempts") != 0 and time.monotonic() < state_end:
                time.sleep(1)
            load = sup.Load(url, concurrency=2).start()
            time.sleep(5)
            worker = client.containers.get(f"kit-{name}-worker-1")
            fault_at = time.time()
            inject(fault, layout, head, worker)
            detected = sup.wait_event(lambda: head, "detected", after=fault_at - 1, timeout=180)
            node_back = None
            if fault == "node":
                sup.wait_event(lambda: head, "waiting", after=fault_at, timeout=120)
                worker.start()
                node_back = time.time()
            ready = sup.wait_event(lambda: head, "ready", after=detected.ts, timeout=900)
            answered = first_answer(url, fault_at)
            load.stop()
            recovery = answered - fault_at
            row = {
                "layout": layout,
                "fault": fault,
                "detect_s": round(detected.ts - fault_at, 1),
                "reason": detected.reason,
                "ready_s": round(ready.ts - fault_at, 1),
                "recovery_s": round(recovery, 1),
                "cold_s": round(cold, 1),
                "cold_supervised_s": round(cold_supervised, 1),
                "ratio": round(recovery / cold, 2),
                "restart_start_s": ready.data.get("start_s"),
                "node_back_s": None if node_back is None else round(node_back - fault_at, 1),
                "cut_off": load.cut_off(fault_at),
            }
            rows.append(row)
            print(
                f"[{layout}] {fault}: detect {row['detect_s']} s, recovery {row['recovery_s']} s, "
                f"ratio {row['ratio']} ({detected.reason})",
                file=sys.stderr,
            )
        events = sup.read_events(head)
        rows.append({"layout": layout, "events": [e.to_dict() for e in events]})
    finally:
        kit(["down"], env, timeout=300)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", default="tp2,dp2")
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--image", default=default_image())
    parser.add_argument("--subnet-prefix", default="10.233")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--events", help="write the event record of each layout to this JSON file")
    args = parser.parse_args()
    require_image(args.image)
    args.faults = [f for f in args.faults.split(",") if f]
    state = Path(tempfile.mkdtemp(prefix="kit-bench-recovery-"))
    env = base_env(state, args.image)
    prep = kit(["demo", "--prepare-only", "--json"], env)
    if prep.returncode != 0:
        print(prep.stderr, file=sys.stderr)
        return 1
    env["KIT_HF_CACHE"] = json.loads(prep.stdout)["result"]["hf_cache"]
    client = docker.from_env()
    rows: list[dict[str, Any]] = []
    for layout in args.layouts.split(","):
        rows += one_layout(layout, args, env, client)
    records = [r for r in rows if "events" in r]
    rows = [r for r in rows if "events" not in r]
    if args.events:
        Path(args.events).write_text(json.dumps(records, indent=1))
    if args.json:
        print(json.dumps({"rows": rows, "image": args.image}, indent=2))
        return 0
    head = (
        f"{'layout':<7}{'fault':<7}{'detect s':>9}{'recovery s':>11}{'cold s':>8}{'ratio':>7}{'restart s':>10}  reason"
    )
    print(head)
    for r in rows:
        print(
            f"{r['layout']:<7}{r['fault']:<7}{r['detect_s']:>9}{r['recovery_s']:>11}{r['cold_s']:>8}{r['ratio']:>7}"
            f"{r['restart_start_s'] or '-':>10}  {r['reason']}"
        )
    print("detect: fault -> `detected` event; recovery: fault -> first successful request; ratio = recovery / cold")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Time from `kit serve` to ready: DP=2 (one engine per node, issue 10) vs TP=2 (one engine across
both nodes, `--nnodes 2`), on the 2-node CPU cluster, side by side.

Topology, both layouts: two container "nodes" on a private Docker network (kit's simulation
network), vLLM's mp backend, accelerator cpu, 1 rank per node, the tiny random-weight Llama made
offline (`kit demo --prepare-only`), `--enforce-eager`, HF_HUB_OFFLINE=1, VLLM_CPU_KVCACHE_SPACE=1.
  - DP: model.tp 1, model.pp 1, model.dp 2 -> head `--data-parallel-size 2 --data-parallel-size-local 1
        --data-parallel-address HEAD --data-parallel-rpc-port 29550`, worker `--headless
        --data-parallel-start-rank 1`.
  - TP: model.tp 2, model.pp 1, model.dp 1 -> `--tensor-parallel-size 2 --nnodes 2 --node-rank K
        --master-addr HEAD`, worker `--headless`.
What is timed: from just before `kit serve` starts until it returns (it returns when the head's
/health answers 200; kit polls every 0.5 s), measured here around the subprocess; kit's own
`seconds` figure is shown too. Not timed: `kit up` of both nodes (identical for both layouts)
and `kit down`. One chat request checks each server after the clock stops.

Side by side: each round runs both layouts one after the other on fresh clusters, the order
alternating (DP, TP, TP, DP, DP, TP, ...) so drift from outside load hits both alike; each round
gives one DP/TP ratio, the headline is the median ratio. Not a test: run it.

    python benchmarks/dp_vs_tp_ready.py [--rounds 3] [--image IMAGE] [--subnet-prefix 10.227] [--json]
"""

from __future__ import annotations

import argparse
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

import requests
from _images import default_image, require_image

LAYOUTS = {
    "DP=2": {"KIT_MODEL_TP": "1", "KIT_MODEL_PP": "1", "KIT_MODEL_DP": "2"},
    "TP=2": {"KIT_MODEL_TP": "2", "KIT_MODEL_PP": "1", "KIT_MODEL_DP": "1"},
}


def kit(args: list[str], env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kit", *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def base_env(args: argparse.Namespace, state: Path) -> dict[str, str]:
    return {
        **os.environ,
        "KIT_STATE_DIR": str(state),
        "KIT_IMAGE": args.image,
        "KIT_BACKEND": "mp",
        "KIT_ACCELERATOR": "cpu",
        "KIT_NODES": "2",
        "KIT_GPUS_PER_NODE": "1",
        "KIT_MODEL_ID": "kit/tiny-llama",
        "KIT_MODEL_SERVED_NAME": "tiny",
        "KIT_MODEL_MAX_MODEL_LEN": "2048",
        "KIT_MODEL_EXTRA_ARGS": "[--enforce-eager]",
        "KIT_IPC_HOST": "false",
        "KIT_SHM_SIZE": "2g",
        "KIT_ENV": "{HF_HUB_OFFLINE: '1', VLLM_CPU_KVCACHE_SPACE: '1'}",
        "KIT_TIMEOUTS_READY": "900",
    }


def one_run(layout: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    name = f"bdp{random.randrange(10**6):06d}"
    env = {
        **env,
        **LAYOUTS[layout],
        "KIT_CLUSTER": name,
        "KIT_NETWORK": f"{name}-net",
        "KIT_NETWORK_SUBNET": f"{args.subnet_prefix}.{random.randrange(2, 250)}.0/24",
    }
    try:
        for role in ("--worker", "--head"):
            up = kit(["up", role], env)
            if up.returncode != 0:
                raise RuntimeError(f"kit up {role} failed: {up.stderr.strip()[-2000:]}")
        start = time.perf_counter()
        serve = kit(["serve", "--json"], env)
        wall = time.perf_counter() - start
        if serve.returncode != 0:
            raise RuntimeError(f"kit serve ({layout}) failed: {serve.stderr.strip()[-2000:]}")
        result = json.loads(serve.stdout)["result"]
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
        answer = requests.post(f"{result['url']}/v1/chat/completions", json=body, timeout=120)
        answer.raise_for_status()
        return {"layout": layout, "ready_s": round(wall, 2), "kit_seconds": result["seconds"]}
    finally:
        kit(["down"], env, timeout=300)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--image", default=default_image())
    parser.add_argument("--subnet-prefix", default="10.227")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    require_image(args.image)

    state = Path(tempfile.mkdtemp(prefix="kit-bench-dp-"))
    env = base_env(args, state)
    prep = kit(["demo", "--prepare-only", "--json"], env)
    if prep.returncode != 0:
        print(prep.stderr, file=sys.stderr)
        return 1
    env["KIT_HF_CACHE"] = json.loads(prep.stdout)["result"]["hf_cache"]

    runs: list[dict[str, Any]] = []
    order = ["DP=2", "TP=2"]
    for r in range(args.rounds):
        pair = order if r % 2 == 0 else order[::-1]
        for layout in pair:
            run = {"round": r + 1, **one_run(layout, args, env)}
            runs.append(run)
            if not args.json:
                print(f"round {run['round']}  {layout}: ready after {run['ready_s']:.1f} s", file=sys.stderr)

    by = {lay: [x["ready_s"] for x in runs if x["layout"] == lay] for lay in LAYOUTS}
    ratios = [
        next(x["ready_s"] for x in runs if x["round"] == r and x["layout"] == "DP=2")
        / next(x["ready_s"] for x in runs if x["round"] == r and x["layout"] == "TP=2")
        for r in range(1, args.rounds + 1)
    ]
    summary = {
        "runs": runs,
        "median_ready_s": {lay: statistics.median(v) for lay, v in by.items()},
        "ratios_dp_over_tp": [round(x, 3) for x in ratios],
        "median_ratio_dp_over_tp": round(statistics.median(ratios), 3),
        "image": args.image,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{'round':>5}  {'DP=2 ready s':>12}  {'TP=2 ready s':>12}  {'DP/TP':>6}")
    for r, ratio in enumerate(ratios, 1):
        dp = next(x["ready_s"] for x in runs if x["round"] == r and x["layout"] == "DP=2")
        tp = next(x["ready_s"] for x in runs if x["round"] == r and x["layout"] == "TP=2")
        print(f"{r:>5}  {dp:>12.1f}  {tp:>12.1f}  {ratio:>6.3f}")
    med = summary["median_ready_s"]
    print(f"median  {med['DP=2']:>11.1f}  {med['TP=2']:>12.1f}  {summary['median_ratio_dp_over_tp']:>6.3f}")
    print("time from `kit serve` to /health 200 on 2 CPU container nodes (mp backend, tiny model)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

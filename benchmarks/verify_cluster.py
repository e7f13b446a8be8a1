"""Wall time of a whole `kit verify` on the two-node CPU container cluster (issue 5).

Target: <= 20 s per `kit verify` (node probes, the head's Ray view, the Gloo all-reduce across
both nodes, the policy). Brings up the same cluster as tests/integration/test_cluster_ray.py
(CPU engine image, real Ray, private Docker network, fixed IPs), times `kit verify` over
--runs runs, prints each run, the median and its ratio to the target, then removes the cluster.
With --cluster NAME it times an existing cluster instead and leaves it alone (pass its config
the usual way: kit.yaml, KIT_CONFIG or KIT_* variables).

    python benchmarks/verify_cluster.py [--image IMAGE (default: the demo's)] [--runs 3] [--cluster NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path

from _images import default_image, require_image

TARGET_S = 20.0
ROOT = Path(__file__).resolve().parents[1]


def kit(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kit", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=timeout,
        check=False,
        cwd=ROOT,
    )


def cluster_env(name: str, image: str, hf: Path, state: Path) -> dict[str, str]:
    octet = zlib.crc32(name.encode()) % 250 + 2
    return {
        "KIT_CLUSTER": name,
        "KIT_IMAGE": image,
        "KIT_ACCELERATOR": "cpu",
        "KIT_BACKEND": "ray",
        "KIT_NODES": "2",
        "KIT_GPUS_PER_NODE": "1",
        "KIT_NETWORK": f"{name}-net",
        "KIT_NETWORK_SUBNET": f"10.215.{octet}.0/24",
        "KIT_IPC_HOST": "false",
        "KIT_SHM_SIZE": "1g",
        "KIT_HF_CACHE": str(hf),
        "KIT_TIMEOUTS_JOIN": "180",
        "KIT_STATE_DIR": str(state),
    }


def bring_up(env: dict[str, str]) -> float:
    start = time.monotonic()
    for args in (["up", "--worker", "--no-wait"], ["up", "--head"]):
        proc = kit(args, env)
        if proc.returncode != 0:
            raise SystemExit(f"kit {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return time.monotonic() - start


def time_verify(env: dict[str, str], runs: int) -> list[float]:
    times = []
    for i in range(runs):
        start = time.monotonic()
        proc = kit(["verify", "--json"], env, timeout=300)
        took = time.monotonic() - start
        try:
            doc = json.loads(proc.stdout)
        except ValueError:
            raise SystemExit(f"kit verify printed no JSON (exit {proc.returncode}):\n{proc.stderr[-2000:]}") from None
        result = doc.get("result") or (doc.get("error") or {}).get("result") or {}
        status = result.get("status", f"error: {(doc.get('error') or {}).get('message')}")
        print(f"  run {i + 1}: {took:5.1f} s  (verify's own wall_s {result.get('wall_s', '?')}, {status})")
        times.append(took)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--image", default=default_image())
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cluster", help="time this running cluster (its config from kit.yaml / KIT_*)")
    args = parser.parse_args()
    require_image(args.image)

    with tempfile.TemporaryDirectory(prefix="kit-bench-verify-") as tmp:
        if args.cluster:
            env = {"KIT_CLUSTER": args.cluster}
            owned = False
        else:
            name = f"kb-verify-{uuid.uuid4().hex[:6]}"
            (Path(tmp) / "hf").mkdir()
            (Path(tmp) / "state").mkdir()
            env = cluster_env(name, args.image, Path(tmp) / "hf", Path(tmp) / "state")
            owned = True
        try:
            if owned:
                print(f"bringing up 2-node CPU cluster {env['KIT_CLUSTER']} from {args.image} ...")
                print(f"  up: {bring_up(env):.1f} s")
            print(f"timing `kit verify` on cluster {env['KIT_CLUSTER']}, {args.runs} runs")
            times = time_verify(env, args.runs)
        finally:
            if owned:
                kit(["down"], env)
    median = statistics.median(times)
    print(
        f"kit verify wall time: median {median:.1f} s over {len(times)} runs "
        f"(min {min(times):.1f}, max {max(times):.1f}); target {TARGET_S:g} s; "
        f"ratio {median / TARGET_S:.2f} ({'meets' if median <= TARGET_S else 'MISSES'} the target)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

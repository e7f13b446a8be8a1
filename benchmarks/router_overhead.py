"""What vLLM's router adds to TTFT by itself (issue 29; goal <= 2 ms p50), away from engines.

benchmarks/failover.py measures the router inside the 2-node CPU simulation, where both replicas'
engines share 2 cores; there the router seemed to add +22 to +504 ms p50 until the cause was found
(2026-11-28): the replicas, not the router (vLLM's idle worker busy-waits 1 s after each step, and
round robin asks the other replica meanwhile; benchmarks/_overhead.py). This isolates the router:
kit's router image (`kit build router`) on host networking in front of one upstream that streams
like vLLM's API server (FastAPI + uvicorn with uvloop, from the engine image: the same server
stack, no engine), which sends an empty role chunk at once, then a token every --token-ms. kit's
bench runner asks, at concurrency 1, the router and the upstream directly, rounds alternating;
TTFT is kit's (the first streamed chunk).

    python benchmarks/router_overhead.py [--requests 40] [--rounds 3] [--token-ms 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._images import default_image, require_image  # noqa: E402
from benchmarks._overhead import router_vs_direct  # noqa: E402
from kit.plan.router import LAUNCHER  # noqa: E402
from tests.integration.replicas_support import ROUTER_IMAGE  # noqa: E402

UPSTREAM = Path(__file__).with_name("router_upstream.py")  # mounted into the engine image


def wait_up(url: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer /health within {timeout} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--token-ms", type=float, default=20.0)
    parser.add_argument("--upstream-port", type=int, default=18999)
    parser.add_argument("--router-port", type=int, default=18998)
    parser.add_argument("--image", default=default_image())
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    require_image(args.image)
    require_image(ROUTER_IMAGE)
    client = docker.from_env()
    upstream = f"http://127.0.0.1:{args.upstream_port}"
    router = f"http://127.0.0.1:{args.router_port}"
    started = []
    try:
        started.append(
            client.containers.run(
                args.image,
                ["-m", "uvicorn", "router_upstream:app", "--host", "127.0.0.1", "--port", str(args.upstream_port)],
                entrypoint="python3",
                working_dir="/bench",
                volumes={str(UPSTREAM.parent): {"bind": "/bench", "mode": "ro"}},
                environment={"TOKEN_MS": str(args.token_ms)},
                network_mode="host",
                detach=True,
                labels={"kit.benchmark": "router-overhead"},
            )
        )
        wait_up(upstream)
        router_argv = ["--host", "127.0.0.1", "--port", str(args.router_port), "--policy", "round_robin"]
        started.append(
            client.containers.run(
                ROUTER_IMAGE,
                [LAUNCHER, *router_argv, "--worker-urls", upstream, "--log-level", "warning"],
                entrypoint="python3",
                network_mode="host",
                detach=True,
                labels={"kit.benchmark": "router-overhead"},
            )
        )
        wait_up(router)
        out = router_vs_direct(router, [upstream], args.requests, args.rounds)
    finally:
        for container in started:
            container.remove(force=True)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"router alone: TTFT p50 {out['ttft_p50_router_ms']} ms via the router vs {out['ttft_p50_direct_ms']} ms "
            f"direct: +{out['added_p50_ms']} ms (goal <= 2 ms; {out['requests'][0]} / {out['requests'][1]} requests)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

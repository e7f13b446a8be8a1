"""The router's TTFT overhead, measured the same way by failover.py (in the simulated cluster) and
router_overhead.py (the router alone): rounds alternating between the router and the direct path,
p50 of each side."""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from kit.bench.dataset import Prompt
from kit.bench.runner import Runner, Target
from kit.bench.schedule import LoadPoint


def ttfts(url: str, n: int, key: str | None = None, timeout_s: float = 60, pause_s: float = 0.0) -> list[float]:
    """The TTFT of n one-at-a-time chat requests (4 words in, 8 tokens out) that were answered,
    `pause_s` between one's end and the next."""
    out = []
    for i in range(n if pause_s else 1):
        ask = 1 if pause_s else n
        prompts = [Prompt(({"role": "user", "content": f"overhead {i}.{k}"},), 4, 8) for k in range(ask)]
        run = Runner(Target(url, "tiny", api_key=key, timeout_s=timeout_s)).run(prompts, LoadPoint(math.inf, 1))
        out += [r.ttft for r in run.records if r.success]
        time.sleep(pause_s)
    return out


def router_vs_direct(
    router: str, direct: list[str], n: int, rounds: int, key: str | None = None, *, pause_s: float = 0.0
) -> dict[str, Any]:
    """n requests a side per round, the sides alternating first. The router's round robin sends
    request k to replica k mod N, so the direct side asks the replicas in that same order: the
    two sides then differ by the router alone. Both paths are warmed first.

    `pause_s` between requests: on a host where the replicas' engines share the cores (the 2-core
    simulated cluster), vLLM's idle worker busy-waits on its shared-memory queue for 1 s after
    every step (vLLM 0.32 shm_broadcast.SpinCondition, busy_loop_s=1), and the other replica's
    engine, asked next, runs on what is left: 2026-11-28, kit's 2-node CPU cluster, no router in
    the path, requests alternating between the two replicas took ~1050 ms on one of them against
    ~50 ms when sent to one replica in a row. A pause past that second measures the router, not
    the engines' contention."""
    via: list[float] = []
    straight: list[float] = []
    ttfts(router, 10, key)
    for url in direct:
        ttfts(url, max(1, 10 // len(direct)), key)
    for i in range(rounds):
        for side in ("router", "direct") if i % 2 == 0 else ("direct", "router"):
            if side == "router":
                via.extend(ttfts(router, n, key, pause_s=pause_s))
            else:
                for k in range(n):
                    straight.extend(ttfts(direct[k % len(direct)], 1, key, pause_s=pause_s))
    if not via or not straight:
        raise RuntimeError(f"no answered request to time ({len(via)} via the router, {len(straight)} direct)")
    p50_via, p50_direct = statistics.median(via), statistics.median(straight)
    return {
        "requests": [len(via), len(straight)],
        "pause_s": pause_s,
        "ttft_p50_router_ms": round(p50_via * 1000, 2),
        "ttft_p50_direct_ms": round(p50_direct * 1000, 2),
        "added_p50_ms": round((p50_via - p50_direct) * 1000, 2),
    }

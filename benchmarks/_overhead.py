"""The router's TTFT overhead, measured the same way by failover.py (in the simulated cluster) and
router_overhead.py (the router alone): rounds alternating between the router and the direct path,
p50 of each side."""

from __future__ import annotations

import math
import statistics
from typing import Any

from kit.bench.dataset import Prompt
from kit.bench.runner import Runner, Target
from kit.bench.schedule import LoadPoint


def ttfts(url: str, n: int, key: str | None = None, timeout_s: float = 60) -> list[float]:
    """The TTFT of n one-at-a-time chat requests (4 words in, 8 tokens out) that were answered."""
    prompts = [Prompt(({"role": "user", "content": f"overhead {i}"},), 4, 8) for i in range(n)]
    run = Runner(Target(url, "tiny", api_key=key, timeout_s=timeout_s)).run(prompts, LoadPoint(math.inf, 1))
    return [r.ttft for r in run.records if r.success]


def router_vs_direct(router: str, direct: list[str], n: int, rounds: int, key: str | None = None) -> dict[str, Any]:
    """n requests a side per round, the sides alternating first. The router's round robin spreads
    requests over every replica, so the direct side asks each upstream in turn for its share: the
    two sides then differ by the router alone. Both paths are warmed first."""
    via: list[float] = []
    straight: list[float] = []
    ttfts(router, 10, key)
    for url in direct:
        ttfts(url, max(1, 10 // len(direct)), key)
    for i in range(rounds):
        for side in ("router", "direct") if i % 2 == 0 else ("direct", "router"):
            if side == "router":
                via.extend(ttfts(router, n, key))
            else:
                for k, url in enumerate(direct):
                    straight.extend(ttfts(url, n // len(direct) + (k < n % len(direct)), key))
    if not via or not straight:
        raise RuntimeError(f"no answered request to time ({len(via)} via the router, {len(straight)} direct)")
    p50_via, p50_direct = statistics.median(via), statistics.median(straight)
    return {
        "requests": [len(via), len(straight)],
        "ttft_p50_router_ms": round(p50_via * 1000, 2),
        "ttft_p50_direct_ms": round(p50_direct * 1000, 2),
        "added_p50_ms": round((p50_via - p50_direct) * 1000, 2),
    }

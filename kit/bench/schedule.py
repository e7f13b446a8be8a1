"""When each request is sent, and the sweep of load points.

Arrivals as `vllm bench serve` draws them: request rate `inf` sends everything at once (the
concurrency limit then paces it); a finite rate draws gaps from a gamma distribution with
shape `burstiness` (1 = Poisson arrivals) and rescales them so the last arrival is at
N / rate, which keeps throughput comparable across seeds (vllm/benchmarks/serve.py get_request).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from kit.errors import ConfigError


@dataclass(frozen=True)
class LoadPoint:
    """One measured load: a request rate (inf = all at once) and a concurrency cap (None = none)."""

    rate: float
    concurrency: int | None

    @property
    def label(self) -> str:
        rate = "inf" if math.isinf(self.rate) else f"{self.rate:g}"
        return f"rate={rate} conc={self.concurrency if self.concurrency else 'max'}"

    def to_dict(self) -> dict[str, object]:
        return {"rate": None if math.isinf(self.rate) else self.rate, "concurrency": self.concurrency}


MAX_POINTS = 64  # load points of one sweep (--rate × --concurrency)


def arrivals(num: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send offsets in seconds from the start, one per request, non-decreasing. kit bench
    refuses a bad burstiness or rate before any request (the checks here guard other callers:
    a NaN here would sleep forever)."""
    if not burstiness > 0 or math.isinf(burstiness):
        raise ConfigError(
            f"burstiness {burstiness} must be a finite number > 0", key="--burstiness", hint="1 is Poisson"
        )
    if not rate > 0:
        raise ConfigError(f"rate {rate} must be > 0", key="--rate", hint="e.g. --rate 1,2,inf")
    if num <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * num
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)
    times: list[float] = []
    total = 0.0
    for _ in range(num):
        total += rng.gammavariate(burstiness, theta)
        times.append(total)
    scale = (num / rate) / times[-1] if times[-1] > 0 else 1.0
    return [t * scale for t in times]


def _numbers(text: str, key: str, *, integer: bool) -> list[float]:
    """A comma list of numbers > 0; `inf` (or `max`) is the only infinite one: NaN, 1e999 and
    the like are refused (a NaN rate never sends; a NaN gap never ends)."""
    out: list[float] = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = float("inf") if part in ("inf", "max") else (int(part) if integer else float(part))
        except ValueError:
            raise ConfigError(f"{part[:20]!r} is not a number", key=key, hint=f"e.g. {key} 1,2,4 (or inf)") from None
        if not math.isfinite(value) and part not in ("inf", "max"):
            raise ConfigError(f"{part[:20]} is not a finite number", key=key, hint=f"e.g. {key} 1,2,4 (or inf)")
        if value <= 0:
            raise ConfigError(f"{part[:20]} must be > 0", key=key, hint=f"e.g. {key} 1,2,4")
        out.append(value)
    return out


def sweep(rates: str | None, concurrencies: str | None) -> list[LoadPoint]:
    """`--rate 1,2,inf` and/or `--concurrency 1,2,4`: one point per value (the product when both
    list several), at most MAX_POINTS. Default: one point, everything at once with concurrency 1."""
    rate_list = _numbers(rates, "--rate", integer=False) if rates is not None else [float("inf")]
    conc_list: list[int | None] = (
        [None if math.isinf(c) else int(c) for c in _numbers(concurrencies, "--concurrency", integer=True)]
        if concurrencies is not None
        else [None if rates else 1]
    )
    if len(rate_list) * len(conc_list) > MAX_POINTS:
        raise ConfigError(
            f"{len(rate_list)} rates x {len(conc_list)} concurrencies make {len(rate_list) * len(conc_list)} "
            f"load points; kit bench runs at most {MAX_POINTS}",
            key="--rate",
            hint="sweep fewer values",
        )
    return [LoadPoint(r, c) for r in rate_list for c in conc_list]

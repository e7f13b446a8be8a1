"""Per-request timelines -> the metrics `vllm bench serve` reports, computed the same way.

vLLM 0.32 (vllm/benchmarks/serve.py `calculate_metrics`, lib/endpoint_request_func.py):
- a request succeeds when at least one chunk with `choices` arrived (HTTP 200);
- TTFT = first chunk with `choices` - send time; ITL = gap between consecutive `choices` chunks
  (per chunk, not per token); E2E latency = last `choices` chunk - send time (the trailing usage
  chunk does not count);
- output tokens = `usage.completion_tokens` of the final chunk (`stream_options.include_usage`);
  input tokens = `usage.prompt_tokens`;
- TPOT = (latency - TTFT) / (output tokens - 1), only for requests with more than one token;
- throughputs divide by the benchmark's wall time (first send to last answer);
- mean/median/std (population) and percentiles with linear interpolation (numpy's default).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PERCENTILES = (50.0, 90.0, 99.0)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass
class RequestRecord:
    """What one request did. Times are seconds; `start` is on the runner's monotonic clock."""

    index: int
    success: bool = False
    start: float = 0.0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    expected_output_tokens: int = 0
    chunks: int = 0
    queue_time: float = 0.0
    error: str = ""
    status: int | None = None
    failed_after: float = 0.0  # a failed request: seconds from its start to its failure

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


def percentile(values: Sequence[float], p: float) -> float:
    """numpy.percentile(values, p) with the default linear method; 0 for no values (as vLLM)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def std(values: Sequence[float]) -> float:
    """Population standard deviation (numpy.std's default)."""
    if not values:
        return 0.0
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def output_tokens(record: RequestRecord) -> int:
    """usage.completion_tokens; without usage, the number of content chunks (kit has no
    tokenizer; vLLM's server always sends usage when asked, so this is a fallback only)."""
    if record.output_tokens:
        return record.output_tokens
    return max(record.chunks, 1)


def summarize(values_s: Sequence[float], name: str, percentiles: Sequence[float] = PERCENTILES) -> dict[str, float]:
    out = {
        f"mean_{name}_ms": mean(values_s) * 1000,
        f"median_{name}_ms": percentile(values_s, 50) * 1000,
        f"std_{name}_ms": std(values_s) * 1000,
    }
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = percentile(values_s, p) * 1000
    return out


def compute(
    records: Sequence[RequestRecord], duration_s: float, percentiles: Sequence[float] = PERCENTILES
) -> dict[str, Any]:
    """The metrics of one load point, named as `vllm bench serve --save-result` names them."""
    ttfts: list[float] = []
    tpots: list[float] = []
    itls: list[float] = []
    e2els: list[float] = []
    total_in = total_out = completed = 0
    for r in records:
        if not r.success:
            continue
        n_out = output_tokens(r)
        total_out += n_out
        total_in += r.prompt_tokens or 0
        if n_out > 1:
            tpots.append((r.latency - r.ttft) / (n_out - 1))
        itls.extend(r.itl)
        ttfts.append(r.ttft)
        e2els.append(r.latency)
        completed += 1
    failed = len(records) - completed
    dur = duration_s if duration_s > 0 else float("nan")
    out: dict[str, Any] = {
        "duration": duration_s,
        "num_requests": len(records),
        "completed": completed,
        "failed": failed,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": completed / dur,
        "output_throughput": total_out / dur,
        "total_token_throughput": (total_in + total_out) / dur,
    }
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        out.update(summarize(values, name, percentiles))
    errors: dict[str, int] = {}
    for r in records:
        if not r.success:
            errors[r.error or "unknown error"] = errors.get(r.error or "unknown error", 0) + 1
    out["errors"] = errors
    out["failures"] = failure_times(records)
    return out


def failure_times(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """When the failed requests were sent (seconds after the first request of the run) and how
    long each took to fail: the outage a failover measurement reads (issue 29)."""
    started = [r.start for r in records if r.start > 0]
    failed = [r for r in records if not r.success and r.start > 0 and r.error != "stopped"]
    if not started or not failed:
        return {"count": len(failed)}
    t0 = min(started)
    sent = sorted(r.start - t0 for r in failed)
    return {
        "count": len(failed),
        "first_s": round(sent[0], 3),
        "last_s": round(sent[-1], 3),
        "max_time_to_fail_s": round(max(r.failed_after for r in failed), 3),
    }

"""The HTTP side of metrics and liveness: /metrics with a deadline and a size cap, /health, and
the one-token probe. Thin: everything it learns is judged by kit/health/prometheus.py and kit/health/liveness.py.

vLLM serves /metrics and /health without the API key (its key only guards /v1); the probe needs
it, and reads it from the file at call time (the key is never logged nor put in an error)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kit.errors import ServerError
from kit.health import prometheus as metrics
from kit.health.liveness import EngineSample, Observation, Probe
from kit.net import http
from kit.net.openai import read_key
from kit.safe import text as safetext

PROBE_BODY_BYTES = 1024 * 1024  # a one-token answer is < 1 KiB; this only bounds a broken server
HEALTH_BODY_BYTES = 64 * 1024
# vLLM routes a request to this DP rank (vllm/entrypoints/generate/base/serving.py,
# `_get_data_parallel_rank`): the probe can ask one engine, not the least loaded one.
DP_RANK_HEADER = "X-data-parallel-rank"
HINT = "is the server up? see `kit status`"


def fetch(url: str, *, deadline_s: float, max_bytes: int, **kwargs: Any) -> tuple[int, bytes]:
    """Status and body through kit's bounded HTTP layer (http.status_and_body), its errors
    hinting at `kit status`; ServerError (one line) when it cannot be had."""
    return http.status_and_body(url, deadline_s=deadline_s, max_bytes=max_bytes, hint=HINT, **kwargs)


def scrape(base_url: str, *, deadline_s: float = 10.0, max_bytes: int = metrics.MAX_SCRAPE_BYTES) -> metrics.Scrape:
    """GET /metrics and parse it (ServerError when unreachable, not 200, too big or not the format)."""
    url = f"{base_url}/metrics"
    status, body = fetch(url, deadline_s=deadline_s, max_bytes=max_bytes)
    if status != 200:
        raise ServerError(f"{url} answered {status}")
    return metrics.parse(body.decode("utf-8", errors="replace"), max_bytes=max_bytes, source=url)


def health_error(base_url: str, *, deadline_s: float = 5.0) -> str | None:
    """None when /health answers 200, else why not (one line)."""
    try:
        status, _ = fetch(f"{base_url}/health", deadline_s=deadline_s, max_bytes=HEALTH_BODY_BYTES)
    except ServerError as err:
        return err.message
    return None if status == 200 else f"{base_url}/health answered {status}"


def observe(
    base_url: str, *, deadline_s: float = 10.0, clock: Callable[[], float] = time.monotonic
) -> tuple[Observation, metrics.Scrape | None]:
    """One look at the server: /health and /metrics; the observation is stamped when both are in."""
    problem = health_error(base_url, deadline_s=deadline_s)
    try:
        scraped: metrics.Scrape | None = scrape(base_url, deadline_s=deadline_s)
        metrics_error = None
    except ServerError as err:
        scraped, metrics_error = None, err.message
    engines = {} if scraped is None else metrics.engines(scraped)
    samples = {name: EngineSample.from_stats(stats) for name, stats in engines.items()}
    return Observation(t=clock(), engines=samples, health_error=problem, metrics_error=metrics_error), scraped


def probe(
    base_url: str,
    model: str,
    *,
    engine: str | None = None,
    api_key_file: str | None = None,
    deadline_s: float = 10.0,
    clock: Callable[[], float] = time.monotonic,
) -> Probe:
    """POST /v1/completions for one token (pinned to `engine` when given) and time it. A timeout,
    a refused connection or a 5xx is a failed probe; a 4xx means the probe itself is wrong (key,
    model name) and raises ServerError, so a bad setting never passes for a hung engine."""
    key = read_key(api_key_file)  # at call time: a rotated key is picked up, and it is never stored
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if engine is not None:
        headers[DP_RANK_HEADER] = engine
    body = {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0}
    url = f"{base_url}/v1/completions"
    started = clock()
    try:
        status, answer = fetch(
            url, deadline_s=deadline_s, max_bytes=PROBE_BODY_BYTES, method="POST", headers=headers, body=body
        )
    except ServerError as err:
        return Probe(t=started, engine=engine, error=err.message)
    took = clock() - started
    if 400 <= status < 500:
        raise ServerError(
            f"the one-token probe of {url} answered {status}: {_snippet(answer)}",
            hint="check api_key_file and the served model name",
        )
    if status != 200:
        return Probe(t=started, engine=engine, error=f"{url} answered {status}: {_snippet(answer)}", latency_s=took)
    if not _has_choice(answer):
        return Probe(t=started, engine=engine, error=f"{url} answered 200 without a completion", latency_s=took)
    return Probe(t=started, engine=engine, error=None, latency_s=took)


def _has_choice(answer: bytes) -> bool:
    try:
        doc = http.decode_json(answer, "probe")
    except http.HttpError:
        return False
    return isinstance(doc, dict) and isinstance(doc.get("choices"), list) and bool(doc["choices"])


def _snippet(body: bytes) -> str:
    return safetext.one_line(body[:800].decode("utf-8", errors="replace"), 200)

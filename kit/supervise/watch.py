"""The coordinator's view of the server, through kit's bounded HTTP layer (kit/net/http.py,
standard library only: it runs in the head container, where kit and `requests` may be missing):
/health, /metrics parsed by kit/health/prometheus.py, and the one-token probe pinned to one
engine. The same questions kit/health/observe.py asks from the host; the answers are the same
kit/health/liveness.py types, judged the same way.

Proxies from the environment are ignored: the server is on this node's own IP.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kit import safeload
from kit.errors import ConfigError, ServerError
from kit.health import prometheus as metrics
from kit.health.liveness import EngineSample, Observation, Probe
from kit.net import http
from kit.safe import text as safetext

DP_RANK_HEADER = "X-data-parallel-rank"  # as kit/health/observe.py: vLLM routes the request to that rank


def fetch(url: str, *, deadline_s: float, max_bytes: int, **kwargs: Any) -> tuple[int, bytes]:
    """Status and body through kit's bounded HTTP layer (http.status_and_body), proxies ignored;
    ServerError (one line) when it cannot be had."""
    return http.status_and_body(url, deadline_s=deadline_s, max_bytes=max_bytes, proxies=False, **kwargs)


def observe(base_url: str, *, deadline_s: float = 3.0, clock: Callable[[], float] = time.monotonic) -> Observation:
    """/health and /metrics now, as one Observation."""
    health_error = None
    try:
        status, _ = fetch(f"{base_url}/health", deadline_s=deadline_s, max_bytes=64 * 1024)
        if status != 200:
            health_error = f"{base_url}/health answered {status}"
    except ServerError as err:
        health_error = err.message
    samples: dict[str, EngineSample] = {}
    metrics_error = None
    try:
        status, body = fetch(f"{base_url}/metrics", deadline_s=deadline_s, max_bytes=metrics.MAX_SCRAPE_BYTES)
        if status != 200:
            raise ServerError(f"{base_url}/metrics answered {status}")
        scraped = metrics.parse(body.decode("utf-8", errors="replace"), source=f"{base_url}/metrics")
        samples = {name: EngineSample.from_stats(s) for name, s in metrics.engines(scraped).items()}
    except ServerError as err:
        metrics_error = err.message
    return Observation(t=clock(), engines=samples, health_error=health_error, metrics_error=metrics_error)


def probe(
    base_url: str,
    model: str,
    *,
    engine: str | None,
    api_key_path: str | None,
    deadline_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> Probe:
    """One token from /v1/completions, pinned to `engine`; any failure is a failed probe (the
    coordinator cannot fix a wrong key: a 401 is reported as the failure it is)."""
    headers = {}
    key = _read_key(api_key_path)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if engine is not None:
        headers[DP_RANK_HEADER] = engine
    body = {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0}
    url = f"{base_url}/v1/completions"
    started = clock()
    try:
        status, answer = fetch(
            url, deadline_s=deadline_s, max_bytes=1024 * 1024, method="POST", headers=headers, body=body
        )
    except ServerError as err:
        return Probe(t=started, engine=engine, error=err.message)
    took = clock() - started
    if status != 200:
        snippet = safetext.one_line(answer[:640].decode("utf-8", errors="replace"), 160)
        return Probe(t=started, engine=engine, error=f"{url} answered {status}: {snippet}", latency_s=took)
    try:
        doc = http.decode_json(answer, url)
        ok = isinstance(doc, dict) and isinstance(doc.get("choices"), list) and bool(doc["choices"])
    except ServerError:
        ok = False
    return Probe(
        t=started, engine=engine, error=None if ok else f"{url} answered 200 without a completion", latency_s=took
    )


def route(router: str, action: str, replica: str, *, api_key_path: str | None, deadline_s: float) -> str | None:
    """Take this replica out of vLLM's router ("remove") or put it back ("add"; the router checks
    its /health first): None when done, else why not (model.dp_lb router, issue 29)."""
    from urllib.parse import quote

    key = _read_key(api_key_path)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = f"{router}/{action}_worker?url={quote(replica, safe='')}"
    try:
        status, answer = fetch(url, deadline_s=deadline_s, max_bytes=64 * 1024, method="POST", headers=headers)
    except ServerError as err:
        return err.message
    text = answer.decode("utf-8", errors="replace").strip().replace("\n", " ")[:160]
    if status == 200 or (action == "add" and status == 400 and "already exists" in text):
        return None
    return f"the router answered {status}: {text}"


def _read_key(path: str | None) -> str | None:
    """The key, read at each probe (a rotated key is picked up) through the bounded loader (a
    FIFO is not waited on); registered for redaction, so an answer echoing it is not logged."""
    if not path:
        return None
    try:
        text = safeload.read_text(path, max_bytes=64 * 1024, what="api key file").strip()
    except ConfigError:
        return None
    safetext.register_secret(text)
    return text or None

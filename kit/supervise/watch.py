"""The coordinator's view of the server, over urllib (standard library: it runs in the head
container, where kit and `requests` may be missing): /health, /metrics parsed by kit/health/prometheus.py,
and the one-token probe pinned to one engine. The same questions kit/health/observe.py asks from the
host; the answers are the same kit/health/liveness.py types, judged the same way.

Proxies from the environment are ignored: the server is on this node's own IP.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from kit.errors import ServerError
from kit.health import prometheus as metrics
from kit.health.liveness import EngineSample, Observation, Probe

DP_RANK_HEADER = "X-data-parallel-rank"  # as kit/health/observe.py: vLLM routes the request to that rank
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(
    url: str,
    *,
    deadline_s: float,
    max_bytes: int,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    body: Any = None,
) -> tuple[int, bytes]:
    """Status and body, bounded in time and size; ServerError (one line) when it cannot be had."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    if data is not None:
        request.add_header("Content-Type", "application/json")
    end = time.monotonic() + deadline_s
    try:
        with _OPENER.open(request, timeout=deadline_s) as resp:
            return resp.status, _read(resp, url, end, deadline_s, max_bytes)
    except urllib.error.HTTPError as err:
        return err.code, _read(err, url, end, deadline_s, max_bytes)
    except (TimeoutError, urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError) or "timed out" in str(reason):
            raise ServerError(f"{url} did not answer within {deadline_s:g} s") from None
        raise ServerError(f"cannot reach {url}: {_why(reason)}") from None


def _read(resp: Any, url: str, end: float, deadline_s: float, max_bytes: int) -> bytes:
    chunks, size = [], 0
    try:
        while piece := resp.read1(65536):
            size += len(piece)
            if size > max_bytes:
                raise ServerError(f"{url} sent more than {max_bytes} bytes")
            if time.monotonic() > end:
                raise ServerError(f"{url} did not finish answering within {deadline_s:g} s")
            chunks.append(piece)
    except (TimeoutError, OSError):
        raise ServerError(f"{url} did not finish answering within {deadline_s:g} s") from None
    return b"".join(chunks)


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
        snippet = answer.decode("utf-8", errors="replace").strip().replace("\n", " ")[:160]
        return Probe(t=started, engine=engine, error=f"{url} answered {status}: {snippet}", latency_s=took)
    try:
        doc = json.loads(answer)
        ok = isinstance(doc, dict) and isinstance(doc.get("choices"), list) and bool(doc["choices"])
    except ValueError:
        ok = False
    return Probe(
        t=started, engine=engine, error=None if ok else f"{url} answered 200 without a completion", latency_s=took
    )


def _read_key(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:  # read at each probe: a rotated key is picked up
            return handle.read(64 * 1024).strip() or None
    except OSError:
        return None


def _why(reason: object) -> str:
    text = str(reason)
    for word in ("Connection refused", "No route to host", "Name or service not known", "reset by peer"):
        if word in text:
            return word.lower()
    return type(reason).__name__

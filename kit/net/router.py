"""vLLM's router, from the host (model.dp_lb router, issue 29): the replicas it routes to, and
adding or removing one. Every call is bounded (a few seconds) and every answer distrusted: only
the fields kit reads are taken, with their types checked. The key goes in the Authorization
header (the router checks it against the replicas: kit.plan.router)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from kit.errors import ServerError
from kit.net import http
from kit.safe import text as safetext

TIMEOUT_S = 5.0
ADD_TIMEOUT_S = 40.0  # the router checks a replica's /health before it adds it (kit.plan.router)
MAX_BODY = 1 << 20


@dataclass(frozen=True)
class RoutedReplica:
    url: str
    healthy: bool
    load: int | None


def _call(method: str, url: str, key: str | None, timeout: float) -> tuple[int, str]:
    """One bounded exchange (kit.net.http): its status and its body as one safe line."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    limits = http.DEFAULT.but(total_s=timeout, connect_s=min(timeout, 5.0), body_bytes=MAX_BODY)
    answer = http.request(method, url, headers=headers, limits=limits, proxies=False)
    return answer.status, answer.body.decode("utf-8", "replace")


def answers(router: str) -> bool:
    """Does the router answer HTTP at all (any status: with keys checked, /health asks for one)?"""
    try:
        _call("GET", f"{router}/health", None, TIMEOUT_S)
        return True
    except ServerError:
        return False


def replicas(router: str, key: str | None) -> list[RoutedReplica]:
    """The replicas the router routes to, with its health view of each."""
    code, body = _call("GET", f"{router}/workers", key, TIMEOUT_S)
    if code != 200:
        raise ServerError(f"the router at {router} answered {code} to /workers: {safetext.one_line(body, 200)}")
    doc: Any = http.decode_json(body.encode(), f"{router}/workers")
    out = []
    for item in doc.get("workers", []) if isinstance(doc, dict) else []:
        if isinstance(item, dict) and isinstance(item.get("url"), str):
            load = item.get("load")
            out.append(
                RoutedReplica(item["url"], item.get("is_healthy") is True, load if isinstance(load, int) else None)
            )
    return out


def add(router: str, replica: str, key: str | None) -> str:
    """Put a (healthy) replica into the router; 'added', or 'present' when it already was."""
    code, body = _call("POST", f"{router}/add_worker?url={quote(replica, safe='')}", key, ADD_TIMEOUT_S)
    if code == 200:
        return "added"
    if code == 400 and "already exists" in body:
        return "present"
    raise ServerError(f"the router at {router} did not add {replica}: {code} {safetext.one_line(body, 200)}")


def remove(router: str, replica: str, key: str | None) -> None:
    """Take a replica out of the router (one it does not have is fine)."""
    code, body = _call("POST", f"{router}/remove_worker?url={quote(replica, safe='')}", key, TIMEOUT_S)
    if code != 200:
        raise ServerError(f"the router at {router} did not remove {replica}: {code} {safetext.one_line(body, 200)}")

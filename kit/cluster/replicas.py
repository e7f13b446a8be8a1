"""Replicas behind one endpoint (model.dp_lb router, issue 29), unsupervised: start every local
node's replicas, vLLM's router on the head's host, wait for each replica's /health and put it
into the router, then wait for the endpoint. (Supervised: kit.cluster.supervised, where each
replica is its own supervised group and its coordinator drains and readmits it.)

On several hosts each `kit serve` starts its own nodes' replicas and adds them to the router at
head_address (the head's `kit serve` starts the router).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kit.cluster import serving as _serving
from kit.config import KitConfig
from kit.errors import KitError, StartError
from kit.net import openai as client
from kit.net import router as router_api
from kit.plan.replicas import Replica, plan_replicas
from kit.plan.router import plan_router, replica_url, router_name, router_url
from kit.runtime.base import NodeHandle, Runtime


@dataclass(frozen=True)
class LocalReplica:
    replica: Replica
    url: str
    nodes: tuple[NodeHandle, ...]  # its nodes on this host (all of them, or it is not local)


def endpoint(config: KitConfig, nodes: Sequence[NodeHandle]) -> str:
    """The router's URL: beside this host's head container, else at head_address."""
    head = next((n for n in nodes if n.role == "head" and n.ip), None)
    return router_url(config, (head.ip if head else None) or config.head_address or "127.0.0.1")


def local_replicas(config: KitConfig, nodes: Sequence[NodeHandle]) -> list[LocalReplica]:
    """The replicas whose every node runs on this host (with the URL of each one's API server)."""
    by_rank = {n.rank: n for n in nodes if n.state == "running" and n.ip}
    out = []
    for replica in plan_replicas(config):
        if all(rank in by_rank for rank in replica.nodes):
            mine = tuple(by_rank[rank] for rank in replica.nodes)
            out.append(LocalReplica(replica, replica_url(replica, by_rank[replica.head].ip or ""), mine))
    return out


def ensure_router(
    config: KitConfig, runtime: Runtime, head_ip: str, urls: list[str], *, on_progress: Callable[[str], None]
) -> str:
    """(Re)start the router in front of no replica yet (each is added once healthy), checking keys
    against `urls`; its URL."""
    spec = plan_router(config, head_ip, urls)
    runtime.remove(spec.name)
    runtime.start(spec)
    url = router_url(config, head_ip)
    on_progress(f"{spec.name}: vLLM's router on {url} ({config.router.policy})")
    end = time.monotonic() + 30
    while not router_api.answers(url):  # within a second or two
        if runtime.state(spec.name) != "running" or time.monotonic() > end:
            raise StartError(
                f"vLLM's router did not start on {url}",
                details=runtime.logs(spec.name, tail=20).splitlines()[-20:],
                hint=f"is {config.router.image} built (`kit build router`)? see `docker logs {spec.name}`",
            )
        time.sleep(0.5)
    return url


def admit(config: KitConfig, router: str, replica: str, on_progress: Callable[[str], None]) -> None:
    """Put a healthy replica into the router, once it has answered one request: /health answers
    from the API server alone, and an engine that cannot compute (seen with vLLM's CPU build in an
    image that had not asked the kernel for AMX tile permission: SIGILL on the first request, fixed
    by containers/cpu/kit_amx.py) must not take the endpoint's traffic."""
    from kit.health import observe

    answer = observe.probe(replica, config.served_name, api_key_file=config.api_key_file, deadline_s=60)
    if answer.error is not None:
        raise StartError(
            f"replica {replica} answers /health but not a one-token request: {answer.error}",
            hint="see `kit logs --serve` on its node; fix, then `kit serve --replace`",
        )
    done = router_api.add(router, replica, client.read_key(config.api_key_file))
    on_progress(f"router: {replica} {'added' if done == 'added' else 'already routed'}")


def serve_replicas(
    config: KitConfig,
    runtime: Runtime,
    *,
    replace: bool,
    deadline: float | None,
    on_progress: Callable[[str], None],
    env: Mapping[str, str] | None,
) -> _serving.ServeResult:
    nodes = runtime.find_nodes(config.cluster)
    targets = _serving.serving_nodes(config, nodes)
    url = endpoint(config, nodes)
    for node in targets:
        if _serving.alive(runtime, node):
            if not replace:
                raise StartError(
                    f"a server is already running in {node.name}",
                    hint="`kit serve --replace` restarts it; `kit logs --serve` shows it",
                )
            _serving.stop(runtime, [node])
    mine = local_replicas(config, targets)
    head = next((n for n in targets if n.role == "head"), None)
    started = time.monotonic()
    try:
        _serving.launch(config, runtime, targets, env=env, on_progress=on_progress)
        if head is not None:
            url = ensure_router(config, runtime, head.ip or "", [r.url for r in mine], on_progress=on_progress)
        for local in mine:
            _serving.wait_healthy(
                config,
                runtime,
                list(local.nodes),
                local.url,
                started=started,
                deadline=deadline,
                on_progress=_prefixed(on_progress, local.replica.name),
            )
            admit(config, url, local.url, on_progress)
    except (KeyboardInterrupt, KitError):
        _serving.stop(runtime, targets)
        if head is not None:
            runtime.remove(router_name(config.cluster))
        raise
    return _serving.ServeResult(
        url, config.served_name, [n.name for n in targets], round(time.monotonic() - started, 1)
    )


def _prefixed(on_progress: Callable[[str], None], name: str) -> Callable[[str], None]:
    return lambda line: on_progress(f"{name}: {line}")


def router_view(config: KitConfig, runtime: Runtime, nodes: Sequence[NodeHandle]) -> dict[str, Any]:
    """`kit status`'s view of the endpoint: the router's container and the replicas it routes to
    (each planned replica with its URL where this host knows it, and the router's health of it)."""
    name = router_name(config.cluster)
    url = endpoint(config, nodes)
    out: dict[str, Any] = {"url": url, "container": name, "state": runtime.state(name), "policy": config.router.policy}
    routed: dict[str, router_api.RoutedReplica] = {}
    try:
        routed = {r.url: r for r in router_api.replicas(url, client.read_key(config.api_key_file))}
        out["answers"] = True
    except KitError as exc:
        out["answers"], out["error"] = False, exc.message
    known = {r.replica.index: r.url for r in local_replicas(config, nodes)}
    rows = []
    for replica in plan_replicas(config):
        rurl = known.get(replica.index)
        seen = routed.get(rurl) if rurl else None
        rows.append(
            {
                "replica": replica.index,
                "nodes": list(replica.nodes),
                "port": replica.port,
                "url": rurl,
                "routed": seen is not None,
                "healthy": None if seen is None else seen.healthy,
            }
        )
    out["replicas"] = rows
    out["others"] = sorted(set(routed) - set(known.values()))  # routed replicas of other hosts
    return out

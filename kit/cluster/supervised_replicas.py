"""`kit serve --supervise` with replicas behind vLLM's router (model.dp_lb router, issue 29):
replica-level recovery. Each replica is its own supervised group: its agents on its nodes, its
coordinator on its first node (kit.plan.supervise.plan_replica_supervise), which takes the
replica out of the router when it fails, restarts it alone (the policy's whole-group restart, for
a group that is one replica) and puts it back once ready. The other replicas keep serving through
the router the whole time. A cluster of one replica is the whole-group restart as before.

A node's container that dies takes that replica's coordinator with it: the router's own health
check (router.health_interval) stops routing to it within seconds, and when the container
starts again its entrypoint resumes the coordinator, which restarts the replica and readmits it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping, Sequence

from kit.cluster import replicas as _replicas
from kit.cluster import supervision as host
from kit.cluster.serving import ServeResult, alive, serving_nodes
from kit.config import KitConfig
from kit.errors import ConfigError, KitError, StartError
from kit.plan.replicas import replica_of_head, replicas_per_node
from kit.plan.roles import Role
from kit.plan.scripts import serve_script
from kit.plan.supervise import supervise_json
from kit.runtime.base import NodeHandle, Runtime
from kit.supervise import events

Show = Callable[[events.Event], None]


def replica_heads(config: KitConfig, nodes: Sequence[NodeHandle]) -> list[NodeHandle]:
    """The local nodes that run a replica's coordinator (its first node)."""
    return [n for n in nodes if replica_of_head(config, n.rank)]


def serve_replicas_supervised(
    config: KitConfig,
    runtime: Runtime,
    *,
    replace: bool = False,
    on_progress: Callable[[str], None] = lambda _: None,
    on_event: Show | None = None,
    serve_env: Mapping[str, str] | None = None,
) -> ServeResult:
    if replicas_per_node(config) > 1:
        raise ConfigError(
            "supervised router replicas need whole nodes: replicas that share a node are one serve group "
            "there, and a failure of one would restart its neighbours",
            key="model.tp",
            hint="serve them unsupervised, or give each replica whole nodes (tp × pp ≥ gpus_per_node)",
        )
    nodes = runtime.find_nodes(config.cluster)
    targets = serving_nodes(config, nodes)
    heads = replica_heads(config, targets)
    if replace:
        if host.stop(runtime, targets, "replaced by kit serve --supervise --replace")["nodes"]:
            on_progress("stopped the previous replicas and their supervisors")
    else:
        busy = [n for n in targets if alive(runtime, n) or (n in heads and host.is_active(runtime, n))]
        if busy:
            raise StartError(
                f"a server is already running in {busy[0].name}",
                hint="`kit serve --supervise --replace` restarts it under supervision",
            )
    url = _replicas.endpoint(config, nodes)
    head = next((n for n in targets if n.role == "head"), None)
    started = time.monotonic()
    try:
        if head is not None:
            local = [r.url for r in _replicas.local_replicas(config, targets)]
            url = _replicas.ensure_router(config, runtime, head.ip or "", local, on_progress=on_progress)
        token = secrets.token_hex(16)
        for node in targets:
            settings = supervise_json(config, node=node.rank, router_url=url)
            script = serve_script(config, Role(node.role, node.rank), env=serve_env)
            host.install(runtime, node, serve_script=script, settings=settings, token=token)
        for node in sorted(targets, key=lambda n: n not in heads):  # coordinators first
            launched = host.launch(runtime, node)
            what = ", ".join(f"{k} (pid {v})" for k, v in sorted(launched.items()))
            on_progress(f"{node.name}: started the supervisor's {what}")
        show = on_event or (lambda e: on_progress(f"supervisor: {e.kind}: {e.reason}"))
        until_admitted(runtime, heads, show)
    except BaseException:
        host.stop(runtime, targets, "kit serve --supervise was interrupted while starting")
        raise
    return ServeResult(
        url,
        config.served_name,
        [n.name for n in targets],
        round(time.monotonic() - started, 1),
        supervised=True,
        head=head.name if head else None,
        generation=1,
    )


def until_admitted(runtime: Runtime, heads: Sequence[NodeHandle], show: Show, *, poll_s: float = 1.0) -> None:
    """Follow every local replica's coordinator until each has put its replica into the router
    (its first `readmitted`); StartError when one gives up, or when the router refuses a replica
    that answers. A replica that does not answer its readmission request (`route-failed`, not
    refused by the router) is its coordinator's to restart and readmit: waited for."""
    seen = {n.name: 0 for n in heads}
    waiting = {n.name for n in heads}
    while waiting:
        for node in heads:
            new = host.read_events(runtime, node, start=seen[node.name])
            seen[node.name] += len(new)
            for event in new:
                show(tagged(node, event))
                if event.kind == "readmitted":
                    waiting.discard(node.name)
                elif event.kind in ("given-up", "stopped") or (
                    event.kind == "route-failed" and event.data.get("router_refused") is True
                ):
                    raise StartError(
                        f"supervision of the replica on {node.name} {event.kind}: {event.reason}",
                        details=list(event.details),
                        hint="see `kit logs --events` and `kit logs --serve`; then `kit serve --supervise --replace`",
                    )
        if waiting:
            time.sleep(poll_s)


def tagged(node: NodeHandle, event: events.Event) -> events.Event:
    """The event with the node whose coordinator recorded it (one replica's group each)."""
    import dataclasses

    return event if event.node else dataclasses.replace(event, node=node.name)


def follow_replicas(config: KitConfig, runtime: Runtime, *, on_event: Show) -> events.Event:
    """After every replica is ready: their events, merged, until every local replica's
    supervision has ended; StartError (exit 6) when every one of them gave up."""
    heads = replica_heads(config, serving_nodes(config, runtime.find_nodes(config.cluster)))
    if not heads:
        raise StartError(f"no replica of cluster {config.cluster} has its first node on this host")
    seen = {n.name: len(host.read_events(runtime, n)) for n in heads}
    ended: dict[str, events.Event] = {}
    while len(ended) < len(heads):
        for node in runtime.find_nodes(config.cluster):
            if node.name not in seen or node.name in ended:
                continue
            try:
                new = host.read_events(runtime, node, start=seen[node.name])
            except KitError:  # its container is restarting: its coordinator resumes with it
                continue
            seen[node.name] += len(new)
            for event in new:
                on_event(tagged(node, event))
                if event.kind in ("given-up", "stopped"):
                    ended[node.name] = event
        time.sleep(1.0)
    last = list(ended.values())
    if all(e.kind == "given-up" for e in last):
        raise StartError(
            f"supervision gave up on every replica: {last[-1].reason}",
            details=list(last[-1].details),
            hint="see `kit logs --events` and `kit logs --serve`; fix, then `kit serve --supervise --replace`",
        )
    return last[-1]

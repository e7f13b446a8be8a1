"""`kit serve --supervise` with replicas behind vLLM's router (model.dp_lb router, issue 29):
replica-level recovery. Each replica is its own supervised group: its agents on its nodes, its
coordinator on its first node (kit.plan.supervise.plan_replica_supervise), which takes the
replica out of the router when it fails, restarts it alone (the policy's whole-group restart, for
a group that is one replica) and puts it back once ready. The other replicas keep serving through
the router the whole time. A cluster of one replica is the whole-group restart as before.

Replicas that share a node (partial-node layouts) are separate groups there too: each has its own
serve script, run directory and coordinator port (kit.plan.supervise.run_files of its slot), and
its agent counts only its own group's engines, so a failure of one never stops its neighbours.

A node's container that dies takes that replica's coordinator with it: the router's own health
check (router.health_interval) stops routing to it within seconds, and when the container
starts again its entrypoint resumes the coordinator, which restarts the replica and readmits it.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kit.cluster import replicas as _replicas
from kit.cluster import supervision as host
from kit.cluster.serving import ServeResult, alive, plan_serve, serving_nodes
from kit.config import KitConfig
from kit.errors import KitError, StartError
from kit.plan.replicas import Replica, replica_of_head, replicas_on, replicas_per_node
from kit.plan.supervise import run_files, supervise_json
from kit.runtime.base import NodeHandle, Runtime
from kit.supervise import events

Show = Callable[[events.Event], None]


@dataclass(frozen=True)
class Group:
    """One replica's supervised group on a local node: its node, the replica and the group's run
    directory there; `name` is what its events are tagged with (the node, and the replica where
    several share the node)."""

    node: NodeHandle
    replica: Replica
    name: str

    @property
    def run_dir(self) -> str:
        return run_files(self.replica.slot).run_dir


def groups_on(config: KitConfig, nodes: Sequence[NodeHandle], *, coordinators: bool = False) -> list[Group]:
    """Every replica's group on these nodes, or (`coordinators`) only those whose coordinator is
    here (the replica's first node)."""
    shared = replicas_per_node(config) > 1
    out = []
    for node in nodes:
        replicas = replica_of_head(config, node.rank) if coordinators else replicas_on(config, node.rank)
        for replica in replicas:
            out.append(Group(node, replica, f"{node.name} ({replica.name})" if shared else node.name))
    return out


def serve_replicas_supervised(
    config: KitConfig,
    runtime: Runtime,
    *,
    replace: bool = False,
    on_progress: Callable[[str], None] = lambda _: None,
    on_event: Show | None = None,
    serve_env: Mapping[str, str] | None = None,
) -> ServeResult:
    nodes = runtime.find_nodes(config.cluster)
    targets = serving_nodes(config, nodes)
    heads = groups_on(config, targets, coordinators=True)
    if replace:
        if host.stop(runtime, targets, "replaced by kit serve --supervise --replace")["nodes"]:
            on_progress("stopped the previous replicas and their supervisors")
    else:
        busy = [n.name for n in targets if alive(runtime, n)]
        busy += [g.name for g in heads if host.is_active(runtime, g.node, g.run_dir)]
        if busy:
            raise StartError(
                f"a server is already running in {busy[0]}",
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
        groups = groups_on(config, targets)
        # The scripts `kit serve --supervise --dry-run` prints: one per replica slot where they share a node.
        planned = plan_serve(config, env=serve_env, supervised=True).nodes
        scripts = {(n.role.rank, n.slot or 0): n.script for n in planned}
        for group in groups:
            node, slot = group.node, group.replica.slot
            settings = supervise_json(config, node=node.rank, router_url=url, slot=slot)
            script = scripts[(node.rank, slot)]
            host.install(runtime, node, serve_script=script, settings=settings, token=token, where=run_files(slot))
        for group in sorted(groups, key=lambda g: g not in heads):  # coordinators first
            launched = host.launch(runtime, group.node, group.run_dir)
            what = ", ".join(f"{k} (pid {v})" for k, v in sorted(launched.items()))
            on_progress(f"{group.name}: started the supervisor's {what}")
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


def until_admitted(runtime: Runtime, heads: Sequence[Group], show: Show, *, poll_s: float = 1.0) -> None:
    """Follow every local replica's coordinator until each has put its replica into the router
    (its first `readmitted`); StartError when one gives up, or when the router refuses a replica
    that answers. A replica that does not answer its readmission request (`route-failed`, not
    refused by the router) is its coordinator's to restart and readmit: waited for."""
    seen = {g.name: 0 for g in heads}
    waiting = {g.name for g in heads}
    while waiting:
        for group in heads:
            new = host.read_events(runtime, group.node, start=seen[group.name], run_dir=group.run_dir)
            seen[group.name] += len(new)
            for event in new:
                show(tagged(group, event))
                if event.kind == "readmitted":
                    waiting.discard(group.name)
                elif event.kind in ("given-up", "stopped") or (
                    event.kind == "route-failed" and event.data.get("router_refused") is True
                ):
                    raise StartError(
                        f"supervision of the replica on {group.name} {event.kind}: {event.reason}",
                        details=list(event.details),
                        hint="see `kit logs --events` and `kit logs --serve`; then `kit serve --supervise --replace`",
                    )
        if waiting:
            time.sleep(poll_s)


def tagged(group: Group, event: events.Event) -> events.Event:
    """The event with the group whose coordinator recorded it (one replica's group each)."""
    return event if event.node else dataclasses.replace(event, node=group.name)


def follow_replicas(config: KitConfig, runtime: Runtime, *, on_event: Show) -> events.Event:
    """After every replica is ready: their events, merged, until every local replica's
    supervision has ended; StartError (exit 6) when every one of them gave up."""
    heads = groups_on(config, serving_nodes(config, runtime.find_nodes(config.cluster)), coordinators=True)
    if not heads:
        raise StartError(f"no replica of cluster {config.cluster} has its first node on this host")
    seen = {g.name: len(host.read_events(runtime, g.node, run_dir=g.run_dir)) for g in heads}
    ended: dict[str, events.Event] = {}
    while len(ended) < len(heads):
        now = {n.name: n for n in runtime.find_nodes(config.cluster)}
        for group in heads:
            node = now.get(group.node.name)
            if node is None or group.name in ended:
                continue
            try:
                new = host.read_events(runtime, node, start=seen[group.name], run_dir=group.run_dir)
            except KitError:  # its container is restarting: its coordinator resumes with it
                continue
            seen[group.name] += len(new)
            for event in new:
                on_event(tagged(group, event))
                if event.kind in ("given-up", "stopped"):
                    ended[group.name] = event
        time.sleep(1.0)
    last = list(ended.values())
    if all(e.kind == "given-up" for e in last):
        raise StartError(
            f"supervision gave up on every replica: {last[-1].reason}",
            details=list(last[-1].details),
            hint="see `kit logs --events` and `kit logs --serve`; fix, then `kit serve --supervise --replace`",
        )
    return last[-1]

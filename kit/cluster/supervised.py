"""`kit serve --supervise`: start the serving group under supervision, wait until it is ready,
then (unless --detach) follow the coordinator's events until it gives up (exit 6, with the last
log lines) or kit is interrupted (the supervision goes on in the head container).

An interrupted or failed first start stops everything it started, on every node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from kit.cluster import supervision as host
from kit.cluster.serving import ServeResult, alive, head_url, serving_nodes
from kit.config import KitConfig
from kit.errors import KitError, StartError
from kit.plan.roles import Role
from kit.plan.scripts import serve_script
from kit.runtime.base import NodeHandle, Runtime
from kit.supervise import events


def serve_supervised(
    config: KitConfig,
    runtime: Runtime,
    *,
    replace: bool = False,
    on_progress: Callable[[str], None] = lambda _: None,
    on_event: Callable[[events.Event], None] | None = None,
    serve_env: Mapping[str, str] | None = None,
) -> ServeResult:
    """Start supervised serving on this host's serving nodes and wait for the first `ready`.
    Without the head on this host only the agents start (the head's coordinator drives them).
    `serve_env`: what the serve scripts export (the offline decision, kit.cluster.model)."""
    nodes = runtime.find_nodes(config.cluster)
    targets = serving_nodes(config, nodes)
    url = head_url(config, nodes)
    head = next((n for n in targets if n.role == "head"), None)
    if head is not None and host.is_active(runtime, head) and not replace:
        raise StartError(
            f"{head.name} is already supervised",
            hint="`kit status` shows it; `kit serve --supervise --replace` starts it afresh",
        )
    busy = [n for n in targets if alive(runtime, n)]
    if busy and not replace:
        raise StartError(
            f"a server is already running in {busy[0].name}",
            hint="`kit serve --supervise --replace` restarts it under supervision",
        )
    if replace:
        stopped = host.stop(runtime, targets, "replaced by kit serve --supervise --replace")
        if stopped["nodes"]:
            on_progress("stopped the previous server and its supervisor")
    scripts = {n.name: serve_script(config, Role(n.role, n.rank), env=serve_env) for n in targets}
    started = time.monotonic()
    run = host.start(config, runtime, targets, scripts, url, on_progress=on_progress)
    if run.head is None:
        return ServeResult(
            url,
            config.served_name,
            [n.name for n in targets],
            None,
            supervised=True,
            ready=False,
            coordinator=f"{config.head_address}:{config.ports.supervisor}",
        )
    show = on_event or (lambda e: on_progress(f"supervisor: {e.kind}: {e.reason}"))
    try:
        event = host.follow(runtime, run.head, on_event=show, until=("ready",))
    except BaseException:
        # Ctrl-C (or SIGTERM), or the coordinator died while starting: nothing it started stays.
        host.stop(runtime, targets, "kit serve --supervise was interrupted while starting")
        raise
    if event.kind != "ready":
        raise StartError(
            f"supervision {event.kind}: {event.reason}",
            details=list(event.details),
            hint="see `kit logs --events` and `kit logs --serve`; fix, then `kit serve --supervise --replace`",
        )
    return ServeResult(
        url,
        config.served_name,
        [n.name for n in targets],
        round(time.monotonic() - started, 1),
        supervised=True,
        head=run.head.name,
        generation=event.generation,
    )


def follow_supervised(config: KitConfig, runtime: Runtime, *, on_event: Callable[[events.Event], None]) -> events.Event:
    """Follow the events after ready; StartError (exit 6) with the last log lines when the
    coordinator gives up. A head container that restarts resumes its coordinator (the entrypoint's
    resume hook): the coordinator may be silent for up to timeouts.join before that is an error."""

    def head() -> NodeHandle | None:
        nodes = runtime.find_nodes(config.cluster)
        _revive(runtime, nodes, on_event)
        return next((n for n in nodes if n.role == "head"), None)

    first = head()
    if first is None or not serving_nodes(config, [first]):
        raise StartError(f"no head node of cluster {config.cluster} on this host")
    seen = len(host.read_events(runtime, first))  # the events up to the first ready are shown
    silent_since: float | None = None
    while True:
        node = head()
        try:
            new = host.read_events(runtime, node, start=seen) if node is not None else []
            state = host.read_state(runtime, node) if node is not None else None
        except KitError:  # the head container is restarting (or gone): judged by the silence below
            new, state = [], None
        seen += len(new)
        for event in new:
            on_event(event)
            if event.kind == "given-up":
                raise StartError(
                    f"supervision gave up: {event.reason}",
                    details=list(event.details),
                    hint="see `kit logs --events` and `kit logs --serve`; fix, then `kit serve --supervise --replace`",
                )
            if event.kind == "stopped":
                return event
        if state is not None and state["alive"]:
            silent_since = None
        elif state is not None and state.get("phase") in ("given-up", "stopped"):
            pass  # its last event is on the way
        else:
            silent_since = silent_since or time.monotonic()
            if time.monotonic() - silent_since > max(60, config.timeouts.join):
                raise StartError(
                    "the supervisor on the head is gone",
                    hint="was the head container removed? `kit status`, `kit logs --events`",
                )
        time.sleep(1.0)


def _revive(runtime: Runtime, nodes: list[NodeHandle], on_event: Callable[[events.Event], None]) -> None:
    """While kit follows the supervision, a node container of the group that exited (`docker
    kill`, `docker stop`: what Docker's restart policy leaves down) is started again, so the group
    recovers instead of waiting for someone to start it (issue 25). Its entrypoint resumes its
    agent; the coordinator restarts the group."""
    for node in nodes:
        if node.state in ("exited", "created") and runtime.revive(node.name):
            on_event(
                events.Event(
                    time.time(), "node-started", f"kit started {node.name} again (it had exited)", 0, 0, node=None
                )
            )

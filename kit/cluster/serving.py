"""`vllm serve` inside the node containers: which nodes run it, how it is launched (the rendered
script travels as data, never interpolated), and the wait for /health with the log tail as
evidence when it fails."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kit.config import KitConfig
from kit.errors import ConfigError, KitError, StartError
from kit.plan.replicas import replicas_on, replicas_per_node, router_mode
from kit.plan.roles import Role
from kit.plan.router import router_url
from kit.plan.scripts import SERVE_LOG, serve_script
from kit.runtime.base import NodeHandle, Runtime
from kit.supervise.cause import first_error
from kit.supervise.procs import previous_log

SERVE_DIR = "/tmp/kit"
PID_FILE = f"{SERVE_DIR}/serve.pid"
SERVE_SCRIPT = f"{SERVE_DIR}/serve.sh"  # the script `kit serve` runs (kept for a person to read)
# Writes the rendered serve script into the container and starts it in the background, its
# output in SERVE_LOG. The script arrives as $1: nothing is interpolated into this command.
# Each run's log is its own (issue 25): the previous run's is kept as serve.prev.log.
LAUNCH = (
    f'mkdir -p {SERVE_DIR} && printf "%s" "$1" > {SERVE_SCRIPT} && '
    f"{{ ! test -f {SERVE_LOG} || mv -f {SERVE_LOG} {previous_log(SERVE_LOG)}; }} && "
    f"(nohup bash {SERVE_SCRIPT} > {SERVE_LOG} 2>&1 & echo $! > {PID_FILE})"
)
# The pid must also still be a serve process: a pid file kept by a restarted container names a
# pid of the old one, which the new one may have given to anything (issue 18).
ALIVE = (
    f'test -s {PID_FILE} && kill -0 "$(cat {PID_FILE})" 2>/dev/null '
    f'&& grep -qsaE "vllm|serve.sh" "/proc/$(cat {PID_FILE})/cmdline"'
)
# Stops the serve process's whole process group (its engines and workers too, measured: vLLM
# keeps them in the group), never the container init's; SIGKILL what is left after 10 s (issue 18).
STOP = (
    f'if test -s {PID_FILE}; then pid="$(cat {PID_FILE})"; '
    'if grep -qsaE "vllm|serve.sh" "/proc/${pid}/cmdline"; then '
    'st="$(cat "/proc/${pid}/stat")"; read -r -a f <<<"${st##*) }"; pg="${f[2]}"; '
    'st="$(cat /proc/1/stat)"; read -r -a f <<<"${st##*) }"; '
    'if [ "${pg}" -gt 1 ] && [ "${pg}" != "${f[2]}" ]; then tgt="-${pg}"; else tgt="${pid}"; fi; '
    'kill -CONT -- "${tgt}" 2>/dev/null; kill -TERM -- "${tgt}" 2>/dev/null; '
    'for _ in $(seq 50); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.2; done; '
    'kill -KILL -- "${tgt}" 2>/dev/null; fi; '
    f"rm -f {PID_FILE}; fi"
)


@dataclass(frozen=True)
class ServeResult:
    """What `kit serve` started. Supervised (issue 18): `ready` is False when this host has no
    head (only the agents started: the head's `coordinator` drives them), `head` and
    `generation` name the supervised group once ready."""

    url: str
    model: str
    nodes: list[str]
    seconds: float | None
    supervised: bool = False
    ready: bool = True
    head: str | None = None
    generation: int | None = None
    coordinator: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"url": self.url, "model": self.model, "nodes": list(self.nodes), "seconds": self.seconds}
        if self.supervised:
            out.update(supervised=True, ready=self.ready, head=self.head, generation=self.generation)
            if self.coordinator is not None:
                out["coordinator"] = self.coordinator
        return out


@dataclass(frozen=True)
class NodeServe:
    role: Role
    script: str
    slot: int | None = None  # supervised router replicas sharing the node: the replica's slot


@dataclass(frozen=True)
class ServePlan:
    """What `kit serve` would run on each node of the planned cluster (its --dry-run); with router
    replicas (issue 29) also the router's `docker run` (kit.plan.router)."""

    cluster: str
    backend: str
    nodes: list[NodeServe]
    router: list[str] | None = None


def plan_serve(config: KitConfig, *, env: Mapping[str, str] | None = None, supervised: bool = False) -> ServePlan:
    """The serve script of every node that runs `vllm serve`: the head (Ray), every node (mp),
    exporting `env` (the offline decision, kit.cluster.model). Supervised router replicas that
    share a node have one script each (kit.cluster.supervised_replicas installs these). Pure."""
    roles = [Role("head", 0)]
    if config.backend == "mp":
        roles += [Role("worker", rank) for rank in range(1, config.nodes)]
    if supervised and router_mode(config) and replicas_per_node(config) > 1:
        scripts = [
            NodeServe(r, serve_script(config, r, env=env, slot=replica.slot), replica.slot)
            for r in roles
            for replica in replicas_on(config, r.rank)
        ]
    else:
        scripts = [NodeServe(r, serve_script(config, r, env=env)) for r in roles]
    return ServePlan(config.cluster, config.backend, scripts, planned_router(config) if router_mode(config) else None)


def planned_ips(config: KitConfig) -> dict[int, str]:
    """The node IPs as the plan knows them: the simulation network's, else the head's
    (head_address; the placeholder HEAD_IP where this host cannot know it)."""
    if config.network:
        base = ipaddress.IPv4Network(config.network_subnet).network_address
        return {rank: str(base + 10 + rank) for rank in range(config.nodes)}
    return {0: config.head_address or "HEAD_IP"}


def planned_router(config: KitConfig) -> list[str]:
    """The router's `docker run` as `kit serve` would start it: the node IPs of the simulation
    network, else the head's (head_address; HEAD_IP where this host cannot know it)."""
    from kit.plan.container_args import to_docker_argv
    from kit.plan.router import known_workers, plan_router

    ips = planned_ips(config)
    return to_docker_argv(plan_router(config, ips[0], known_workers(config, ips)))


def head_url(config: KitConfig, nodes: Sequence[NodeHandle]) -> str:
    """The server's URL: the local head container's node IP, else head_address, else loopback."""
    head = next((n for n in nodes if n.role == "head" and n.ip), None)
    host = (head.ip if head else None) or config.head_address or "127.0.0.1"
    if router_mode(config):  # the endpoint is vLLM's router in front of the replicas (issue 29)
        return router_url(config, host)
    return f"http://{host}:{config.ports.api}"


def serving_nodes(config: KitConfig, nodes: Sequence[NodeHandle]) -> list[NodeHandle]:
    """Which local nodes run `vllm serve`: the head (Ray), or every node (mp), workers first."""
    running = [n for n in nodes if n.state == "running"]
    if not running:
        raise StartError(
            f"no running node of cluster {config.cluster} on this host",
            hint="start the nodes first: `kit up --head` (and `kit up --worker` on the others)",
        )
    if config.backend == "ray":
        if config.accelerator == "cpu":
            raise ConfigError(
                "vLLM's Ray executor does not run on CPU", key="backend", hint="use backend: mp with accelerator: cpu"
            )
        heads = [n for n in running if n.role == "head"]
        if not heads:
            raise StartError(
                "with the Ray backend `kit serve` runs on the head node",
                hint="run it on the head's host (workers only join the Ray cluster)",
            )
        return heads
    return sorted(running, key=lambda n: (n.role == "head", n.rank))


def log_tail(runtime: Runtime, node: NodeHandle, lines: int = 25) -> list[str]:
    out = runtime.exec(node, ["tail", "-n", str(lines), SERVE_LOG], timeout=30).stdout
    return [ln for ln in out.splitlines() if ln.strip()]


def failure_cause(runtime: Runtime, node: NodeHandle) -> str:
    """'; first error: ...' from this run's serve log (kit.supervise.cause), or ''."""
    try:
        found = first_error(runtime.exec(node, ["head", "-n", "5000", SERVE_LOG], timeout=30).stdout.splitlines())
    except KitError:
        return ""
    return f"; first error: {found}" if found else ""


def alive(runtime: Runtime, node: NodeHandle) -> bool:
    """Is `vllm serve` (started by kit serve) running in the node's container?"""
    return runtime.exec(node, ["bash", "-c", ALIVE], timeout=30).returncode == 0


def stop(runtime: Runtime, targets: Sequence[NodeHandle]) -> None:
    """Stop the serve process group on every target (nothing there: nothing happens)."""
    for node in targets:
        runtime.exec(node, ["bash", "-c", STOP], timeout=60)


def stop_running(
    runtime: Runtime,
    targets: Sequence[NodeHandle],
    *,
    replace: bool,
    url: str,
    on_progress: Callable[[str], None],
) -> None:
    """A server already running on a target is an error, or (`replace`) stopped first, with any
    supervisor that would restart it (issue 18). Ranks left running by a head that went away
    answer nothing: stale, not a running server, and stopped here."""
    from kit.cluster import supervision as host

    if replace:
        host.stop(runtime, targets, "replaced by kit serve --replace")
    stale = stale_ranks(runtime, targets, url, lambda node: alive(runtime, node))
    for node in targets:
        if alive(runtime, node):
            if not replace and not stale:
                raise StartError(
                    f"a server is already running in {node.name}",
                    hint="`kit serve --replace` restarts it; `kit logs --serve` shows it",
                )
            if stale:
                on_progress(f"{node.name}: stopping a stale vllm serve (its head is gone, nothing answers)")
            runtime.exec(node, ["bash", "-c", STOP], timeout=60)


def launch(
    config: KitConfig,
    runtime: Runtime,
    targets: Sequence[NodeHandle],
    *,
    on_progress: Callable[[str], None],
    env: Mapping[str, str] | None = None,
) -> None:
    """Start each target's serve script (kit.plan.scripts.serve_script, exporting `env`) in the
    background."""
    for node in targets:
        script = serve_script(config, Role(node.role, node.rank), env=env)
        runtime.exec_detached(node, ["bash", "-c", LAUNCH, "kit-serve", script])
        on_progress(f"{node.name}: started vllm serve ({node.role}, rank {node.rank})")


def wait_healthy(
    config: KitConfig,
    runtime: Runtime,
    targets: Sequence[NodeHandle],
    url: str,
    *,
    started: float,
    deadline: float | None,
    on_progress: Callable[[str], None],
) -> None:
    """Wait for `url`/health, at most timeouts.ready s after `started` and never past `deadline`
    (time.monotonic(); kit tune's budget). A server process that exits ends the wait at once,
    with its log tail."""
    from kit.net import openai as client

    give_up = (
        started + config.timeouts.ready_s if deadline is None else min(started + config.timeouts.ready_s, deadline)
    )
    last = ""
    next_check = 0.0
    while not client.health(url, timeout=1):
        now = time.monotonic()
        if now >= next_check:  # the processes and the log every 2 s; /health every 0.5 s
            next_check = now + 2
            for node in targets:
                if runtime.exec(node, ["bash", "-c", ALIVE], timeout=30).returncode != 0:
                    raise StartError(
                        f"vllm serve exited in {node.name} before the server became healthy"
                        + failure_cause(runtime, node),
                        details=log_tail(runtime, node),
                        hint="see `kit logs --serve` and `kit diagnose`; fix, then `kit serve --replace`",
                    )
            tail = log_tail(runtime, targets[-1], 1)
            if tail and tail[-1] != last:
                last = tail[-1]
                on_progress(f"waiting for {url}/health ({now - started:.0f} s): {last[:160]}")
        if now > give_up:
            raise StartError(
                f"the server was not healthy after {config.timeouts.ready_s} s"
                if give_up != deadline
                else f"the time budget ran out {now - started:.0f} s into waiting for {url}/health",
                details=log_tail(runtime, targets[-1]),
                hint="raise timeouts.ready (big models load slowly) or check `kit logs --serve`",
            )
        time.sleep(0.5)


def stale_ranks(runtime: Runtime, targets: Sequence[NodeHandle], url: str, alive: Callable[[NodeHandle], bool]) -> bool:
    """Some nodes still run `vllm serve` but the head does not and nothing answers: what is left
    of a group whose head went away (e.g. its container restarted). Not a running server."""
    from kit.net import openai as client

    head = next((n for n in targets if n.role == "head"), None)
    if head is None or alive(head) or client.health(url, timeout=3):
        return False
    return any(alive(n) for n in targets if n is not head)

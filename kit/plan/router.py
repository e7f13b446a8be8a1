"""vLLM's router in front of the replicas (model.dp_lb router, issue 29): its container and its
argv. Pure: the cluster layer starts the spec (kit.cluster.replicas), the adapter runs it unchanged.

The router is vLLM's own (`vllm-router` on PyPI: a Rust binary with health checks, retries on
another replica, circuit breakers and several balancing policies), in its own small image
(containers/router/, `kit build router`). It listens where the API would be without it: the head's
node IP at ports.api (host networking), or its own address on the simulation network (.9, beside
the nodes' .10+k, so that killing the head's container leaves the endpoint up).

Closed by default (issue 16): with an api_key_file the router asks every request for a key and
checks it against the replicas' /v1/models (vLLM's own check of the same key; the router's
`api_key_validation_urls`), before it serves anything, its admin endpoints (add and remove a
replica) included; it forwards the caller's Authorization header, so each replica checks the key
again. The key itself never reaches the router: not in its argv, its environment or a file of it.
Its Prometheus metrics stay on loopback inside the container's network namespace.
"""

from __future__ import annotations

import ipaddress

from kit import __version__, labels
from kit.config import KitConfig
from kit.plan.node import ContainerSpec
from kit.plan.replicas import Replica, plan_replicas
from kit.plan.roles import Role

ROUTER_ROLE = Role("router", 0)
LAUNCHER = "/opt/kit/kit_router.py"  # containers/router/kit_router.py, baked into the image
# The router waits at most this long for a replica it is told to add (only healthy ones are added).
ADD_TIMEOUT_S = 30


def router_name(cluster: str) -> str:
    return f"kit-{cluster}-router"


def router_ip(config: KitConfig, head_ip: str) -> str:
    """Where the router listens: its own address on the simulation network, else the head's IP."""
    if config.network:
        return str(ipaddress.IPv4Network(config.network_subnet).network_address + 9)
    return head_ip


def router_url(config: KitConfig, head_ip: str) -> str:
    return f"http://{router_ip(config, head_ip)}:{config.ports.api}"


def replica_url(replica: Replica, node_ip: str) -> str:
    """A replica's API server: its first node's IP, its port."""
    return f"http://{node_ip}:{replica.port}"


def router_argv(config: KitConfig, host: str, replicas: list[str], *, workers: bool = False) -> list[str]:
    """The launcher's arguments: vllm-router's own flags (its --help), plus kit's
    --api-key-validation-url (one per replica in `replicas`; the launcher passes them to the
    router). The replicas are routed to only once added (each when healthy: the router would
    otherwise wait for all of them before it serves), unless `workers` (a job script that
    starts the router after them)."""
    argv = [
        "--host",
        host,
        "--port",
        str(config.ports.api),
        "--policy",
        config.router.policy,
        # A replica that stops answering /health is out within one interval; back after one success.
        "--health-check-interval-secs",
        str(config.router.health_interval),
        "--health-failure-threshold",
        "1",
        "--health-success-threshold",
        "1",
        "--health-check-timeout-secs",
        str(max(1, config.router.health_interval)),
        "--worker-startup-timeout-secs",
        str(ADD_TIMEOUT_S),
        "--worker-startup-check-interval",
        "1",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(config.ports.router_metrics),
        "--request-timeout-secs",
        str(max(60, config.timeouts.ready_s)),
        "--log-level",
        "warning",
    ]
    if workers and replicas:
        argv += ["--worker-urls", *replicas]
    if config.api_key_file:
        for url in validation_urls(config, replicas):
            argv += ["--api-key-validation-url", url]
    return argv


def validation_urls(config: KitConfig, workers: list[str]) -> list[str]:
    """Where the router checks a caller's key: every replica's /v1/models (vLLM answers 200 only
    with the right key). With no replica known yet, none: the launcher then refuses every request
    until `kit serve` restarts it with them."""
    return [f"{w}/v1/models" for w in workers]


def plan_router(config: KitConfig, head_ip: str, replicas: list[str]) -> ContainerSpec:
    """The router's container: vLLM's router on the endpoint's address, for `replicas` (their
    URLs: keys are checked against them; kit adds each to the router once it is healthy)."""
    host = router_ip(config, head_ip)
    return ContainerSpec(
        name=router_name(config.cluster),
        image=config.router.image,
        role=ROUTER_ROLE,
        labels={
            labels.MANAGED: labels.MANAGED_TRUE,
            labels.CLUSTER: config.cluster,
            labels.ROLE: ROUTER_ROLE.kind,
            labels.RANK: "0",
            labels.NODE_IP: host,
            labels.IMAGE: config.router.image,
            labels.VERSION: __version__,
            labels.ROUTER: "true",
        },
        env={"KIT_CLUSTER": config.cluster},
        mounts=(),
        script=f'exec python3 {LAUNCHER} "$@"',
        network=config.network or "host",
        ip=host if config.network else None,
        ipc_host=False,
        shm_size=None,
        gpus=None,
        script_args=tuple(router_argv(config, host, replicas)),
    )


def known_workers(config: KitConfig, node_ips: dict[int, str]) -> list[str]:
    """The replica URLs kit can name from the nodes it knows (rank -> IP): on one host, all."""
    return [replica_url(r, node_ips[r.head]) for r in plan_replicas(config) if r.head in node_ips]

"""`kit status`: the cluster's containers on this host and the Ray view of every node."""

from __future__ import annotations

from typing import Any

import click

from kit.cluster import Cluster
from kit.cluster.status import render
from kit.commands._options import cluster_overrides, config_options, json_option
from kit.commands._params import KitCommand, Number
from kit.commands._signals import sigterm_as_interrupt
from kit.output import emit, warn


@click.command(name="status", cls=KitCommand)
@click.option("--no-ray", is_flag=True, help="Only list containers; do not ask Ray.")
@click.option(
    "--timeout",
    type=Number(1, 3600),
    default=10,
    show_default=True,
    help="Seconds for the whole status: what cannot be reached in time is named, the rest shown.",
)
@click.option("--slurm", "slurm_job", metavar="JOB", help="Show a `kit slurm` job instead: queue state, ready line.")
@config_options
@json_option
def command(
    no_ray: bool,
    timeout: float,
    slurm_job: str | None,
    config_path: str | None,
    cluster: str | None,
    set_values: tuple[str, ...],
    as_json: bool,
) -> None:
    """Every kit container of the cluster on this host (role, state, image digest, uptime), and the
    Ray view: alive nodes, their IPs, CPUs/GPUs, and whether each node registered the same IP as
    its VLLM_HOST_IP. With model.dp > 1: the DP ranks each node should run and which have a live
    engine process. With --slurm JOB: the job's squeue state and its KIT_* lines (URL, tunnel).

    It reads the cluster that runs: its backend, model, ports and API key file come from its
    nodes' labels and kit's record of it, so no kit.yaml is needed (`kit status --cluster demo`);
    a configured value that disagrees is reported as drift. It answers within --timeout (10 s)
    whatever state the cluster is in, naming what it could not reach, and an interrupted status
    leaves nothing running in the containers.

    \b
    Examples:
      kit status
      kit status --cluster demo --json
      kit status --timeout 30 --no-ray"""
    if slurm_job is not None:
        from kit.cluster.serving_status import slurm_summary
        from kit.runtime import get_job_control

        job = get_job_control().status(slurm_job)
        doc = {**job.to_dict(), "supervise": slurm_summary(job.output)}  # issue 18: restarts inside the job
        emit("status", {"slurm": doc}, as_json=as_json, text=lambda: job.render() + render_slurm(doc))
        return
    found = Cluster.find(config_path, cluster_overrides(cluster, set_values))
    with sigterm_as_interrupt():  # a killed status ends what it runs in the containers, as Ctrl-C does
        result = found.status(ray=not no_ray, timeout=timeout)
    doc = result.to_dict()
    warn([_drift_line(d, result.cluster) for d in doc["drift"]], as_json=as_json)
    emit("status", doc, as_json=as_json, text=lambda: "\n".join([render(result), *render_status(doc)]))


def _drift_line(drift: dict[str, Any], cluster: str) -> str:
    from kit.cluster.running import Drift

    return Drift(**drift).line(cluster)


def render_status(result: dict[str, Any]) -> list[str]:
    """The lines `kit status` adds: the server's liveness, supervision, missing Ray nodes."""
    out = []
    server = result.get("server")
    router = result.get("router")
    if router is not None:
        out.extend(render_router(router))
    if server is not None and router is not None:
        if server["serving"]:
            out.append(f"endpoint: serving at {server['url']} ({server['replicas_serving']} replica(s) serving here)")
        else:
            out.append(f"endpoint: NOT SERVING at {server['url']}: {server['reason']}")
    elif server is not None:
        if server["serving"]:
            word = "serving" if server["state"] == "serving" else "idle, answering"
            out.append(f"server: {word} at {server['url']} ({len(server['engines'])} engine(s))")
        else:
            out.append(f"server: NOT SERVING at {server['url'] or 'the head'}: {server['reason']}")
    sup = result.get("supervise")
    if sup is not None:
        line = (
            f"supervisor: {'active' if sup['active'] else 'not running'}, {sup['phase']}, "
            f"generation {sup['generation']}, {sup['restarts']} restart(s)"
        )
        if sup.get("last_failure"):
            line += f"; last failure {sup.get('last_failure_time') or ''}: {sup['last_failure']}"
        out.append(line)
    if result.get("ray_missing"):
        out.append("Ray: missing " + ", ".join(result["ray_missing"]))
    if result.get("containers") and result.get("api_key_file"):
        out.append(f"API key: in {result['api_key_file']} (`kit query --cluster {result['cluster']}` finds it)")
    if result.get("started_from"):
        out.append(f"started from: {result['started_from']}")
    for line in result.get("unreached") or []:
        out.append(f"not reached: {line}")
    return out


def render_router(router: dict[str, Any]) -> list[str]:
    """The router (issue 29): its container, and each replica: where, routed, healthy, serving."""
    state = router["state"] or "absent"
    out = [f"router: {router['container']} {state} at {router['url']} ({router['policy']})"]
    for row in router["replicas"]:
        server = row.get("server") or {}
        where = "on another host" if row["url"] is None else row["url"]
        routed = "routed" if row["routed"] else "NOT ROUTED"
        health = {True: "healthy", False: "UNHEALTHY", None: "-"}[row["healthy"]]
        serving = "serving" if server.get("serving") else (server.get("reason") or "-") if server else "-"
        out.append(f"  replica {row['replica']} (nodes {row['nodes']}): {where}: {routed}, {health}, {serving}")
    for other in router["others"]:
        out.append(f"  routed from another host: {other}")
    if router.get("recovery"):
        out.append(f"  {router['recovery']}")
    return out


def render_slurm(job: dict[str, Any]) -> str:
    sup = job.get("supervise")
    if not sup:
        return ""
    line = f"\n  supervisor: {sup['restarts']} restart(s), last event {sup['last_event']} at {sup['last_event_time']}"
    if sup.get("last_failure"):
        line += f"; last failure {sup['last_failure_time']}: {sup['last_failure']}"
    if sup.get("given_up"):
        line += "; GAVE UP"
    return line

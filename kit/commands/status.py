"""`kit status`: the cluster's containers on this host and the Ray view of every node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from kit.cluster import Cluster
from kit.commands._options import cluster_overrides, config_options, json_option
from kit.commands._params import KitCommand, Number
from kit.commands._signals import sigterm_as_interrupt
from kit.output import emit, warn
from kit.runtime.slurm import JobStatus


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
        emit(SlurmStatus(job, slurm_summary(job.output)), as_json=as_json)  # issue 18: restarts inside the job
        return
    found = Cluster.find(config_path, cluster_overrides(cluster, set_values))
    with sigterm_as_interrupt():  # a killed status ends what it runs in the containers, as Ctrl-C does
        result = found.status(ray=not no_ray, timeout=timeout)
    warn([_drift_line(d, result.cluster) for d in result.to_dict()["drift"]], as_json=as_json)
    emit(result, as_json=as_json)


@dataclass(frozen=True)
class SlurmStatus:
    """`kit status --slurm JOB`: the job's queue state and the supervisor's summary of its
    output, under the key `slurm`."""

    job: JobStatus
    supervise: dict[str, Any] | None
    command = "status"

    def to_dict(self) -> dict[str, Any]:
        return {"slurm": {**self.job.to_dict(), "supervise": self.supervise}}

    def text(self) -> str:
        return self.job.render() + render_slurm({"supervise": self.supervise})


def _drift_line(drift: dict[str, Any], cluster: str) -> str:
    from kit.cluster.running import Drift

    return Drift(**drift).line(cluster)


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

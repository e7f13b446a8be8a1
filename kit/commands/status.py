"""`kit status`: the cluster's containers on this host and the Ray view of every node."""

from __future__ import annotations

import click

from kit.cluster import Cluster
from kit.cluster.status import render
from kit.commands._options import cluster_overrides, config_options, json_option
from kit.commands._params import KitCommand
from kit.output import emit


@click.command(name="status", cls=KitCommand)
@click.option("--no-ray", is_flag=True, help="Only list containers; do not ask Ray.")
@click.option("--slurm", "slurm_job", metavar="JOB", help="Show a `kit slurm` job instead: queue state, ready line.")
@config_options
@json_option
def command(
    no_ray: bool,
    slurm_job: str | None,
    config_path: str | None,
    cluster: str | None,
    set_values: tuple[str, ...],
    as_json: bool,
) -> None:
    """Every kit container of the cluster on this host (role, state, image digest, uptime), and the
    Ray view: alive nodes, their IPs, CPUs/GPUs, and whether each node registered the same IP as
    its VLLM_HOST_IP. With model.dp > 1: the DP ranks each node should run and which have a live
    engine process. With --slurm JOB: the job's squeue state and its KIT_* lines (URL, tunnel)."""
    if slurm_job is not None:
        from kit.runtime import get_job_control
        from kit.supervise.hooks import render_slurm, slurm_summary

        job = get_job_control().status(slurm_job)
        doc = {**job.to_dict(), "supervise": slurm_summary(job.output)}  # issue 18: restarts inside the job
        emit("status", {"slurm": doc}, as_json=as_json, text=lambda: job.render() + render_slurm(doc))
        return
    from kit.supervise.hooks import render_status, status_extras

    found = Cluster.load(config_path, cluster_overrides(cluster, set_values))
    result = found.status(ray=not no_ray)
    # Issue 18: whether the model is served (not only whether containers run), supervision, and
    # the Ray nodes that are missing, by name.
    extras = status_extras(found.config, found.runtime, found.nodes(), result.ray)
    doc = {**result.to_dict(), **extras}
    emit("status", doc, as_json=as_json, text=lambda: "\n".join([render(result), *render_status(doc)]))

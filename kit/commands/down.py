"""`kit down`: remove every container and network of the cluster (by label). Idempotent."""

from __future__ import annotations

import click

from kit.cluster import Cluster
from kit.commands._options import cluster_overrides, config_options, json_option
from kit.commands._params import KitCommand
from kit.output import emit


@click.command(name="down", cls=KitCommand)
@click.option(
    "--slurm", "slurm_job", metavar="JOB", help="Cancel a `kit slurm` job (scancel) and wait until it is gone."
)
@config_options
@json_option
def command(
    slurm_job: str | None, config_path: str | None, cluster: str | None, set_values: tuple[str, ...], as_json: bool
) -> None:
    """Remove every kit container and network of the cluster on this host (found by label).

    Running it again is harmless. On a real cluster, run it on every node. With --slurm JOB:
    scancel the job, wait until it has left the queue, and remove its containers on this host.
    """
    if slurm_job is not None:
        from kit.output import progress
        from kit.runtime import get_job_control

        done = get_job_control().cancel(slurm_job, on_progress=lambda line: progress(line, as_json=as_json))
        emit("down", {"slurm": done.to_dict()}, as_json=as_json, text=done.render)
        return
    # Only the name (and the runtime kit recorded): nothing is planned, so a model kit cannot size
    # never stops a teardown (issue 25).
    down = Cluster.find(config_path, cluster_overrides(cluster, set_values)).down()
    emit(
        "down",
        down.to_dict(),
        as_json=as_json,
        text=lambda: (
            f"cluster {down.cluster}: removed {len(down.containers)} container(s)"
            + (f" ({', '.join(down.containers)})" if down.containers else "")
            + (f" and {len(down.networks)} network(s)" if down.networks else "")
        ),
    )

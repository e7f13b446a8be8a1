"""`kit down`: remove every container and network of the cluster (by label). Idempotent."""

from __future__ import annotations

import click

from kit.commands._common import config_options, json_option, resolve_cluster
from kit.commands._params import KitCommand
from kit.output import emit
from kit.runtime import get_runtime


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
    resolved = resolve_cluster(config_path, cluster, set_values)
    name = resolved.config.cluster
    removed = get_runtime(resolved.config).remove_cluster(name)
    emit(
        "down",
        {"cluster": name, **removed},
        as_json=as_json,
        text=lambda: (
            f"cluster {name}: removed {len(removed['containers'])} container(s)"
            + (f" ({', '.join(removed['containers'])})" if removed["containers"] else "")
            + (f" and {len(removed['networks'])} network(s)" if removed.get("networks") else "")
        ),
    )

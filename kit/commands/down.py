"""`kit down`: remove every container and network of the cluster (by label). Idempotent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from kit.cluster import Cluster
from kit.commands._options import cluster_overrides, config_options, json_option
from kit.commands._params import KitCommand
from kit.output import emit
from kit.runtime.slurm import CancelResult


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
        emit(CancelledJob(done), as_json=as_json)
        return
    # Only the name (and the runtime kit recorded): nothing is planned, so a model kit cannot size
    # never stops a teardown (issue 25).
    down = Cluster.find(config_path, cluster_overrides(cluster, set_values)).down()
    emit(down, as_json=as_json)


@dataclass(frozen=True)
class CancelledJob:
    """`kit down --slurm JOB`: the job's cancellation, under the key `slurm`."""

    job: CancelResult
    command = "down"

    def to_dict(self) -> dict[str, Any]:
        return {"slurm": self.job.to_dict()}

    def text(self) -> str:
        return self.job.render()

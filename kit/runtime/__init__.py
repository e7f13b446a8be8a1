"""Container runtime adapters. Only kit/runtime/docker.py imports docker; only
kit/runtime/apptainer.py imports spython. Both take the pure plan (kit.plan) unchanged."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kit.config import KitConfig
    from kit.runtime.base import Runtime


SLURM_ONLY = ("pyxis", "edf", "enroot")


def check_local(config: KitConfig) -> None:
    """Refuse the runtimes kit cannot drive on this host: under pyxis and the CSCS EDF srun starts
    the containers (issue 20); enroot is kit pull's."""
    if config.runtime in SLURM_ONLY:
        from kit.errors import ConfigError

        raise ConfigError(
            f"{config.runtime} runs containers only inside a SLURM job",
            key="runtime",
            hint="use `kit slurm --runtime pyxis` (or edf) and `kit status/down --slurm JOBID`; "
            "kit pull --runtime enroot imports the image",
        )


def get_runtime(config: KitConfig) -> Runtime:
    check_local(config)
    if config.runtime == "apptainer":
        from kit.runtime.apptainer import ApptainerRuntime

        return ApptainerRuntime(config)
    from kit.runtime.docker import DockerRuntime

    return DockerRuntime()

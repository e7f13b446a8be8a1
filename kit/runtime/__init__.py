"""Container runtime adapters. Only kit/runtime/docker.py imports docker; only
kit/runtime/apptainer.py imports spython. Both take the pure plan (kit.plan) unchanged."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kit.config import KitConfig
    from kit.runtime.base import Runtime


def get_runtime(config: KitConfig) -> Runtime:
    if config.runtime in ("pyxis", "edf", "enroot"):
        from kit.errors import ConfigError

        # srun starts these containers (issue 20): there is no runtime to drive from here.
        raise ConfigError(
            f"runtime {config.runtime} runs containers only inside a SLURM job",
            key="runtime",
            hint="use `kit slurm --runtime pyxis` (or edf) and `kit status/down --slurm JOBID`; "
            "kit pull --runtime enroot imports the image",
        )
    if config.runtime == "apptainer":
        from kit.runtime.apptainer import ApptainerRuntime

        return ApptainerRuntime(config)
    from kit.runtime.docker import DockerRuntime

    return DockerRuntime()

"""Runtime adapters, behind the interfaces of kit/runtime/base.py. Only kit/runtime/docker.py
imports docker (or runs the docker CLI); only kit/runtime/apptainer.py imports spython or runs
apptainer; kit/runtime/enroot.py runs enroot (images only: under pyxis and the EDF srun starts
the containers); kit/runtime/slurm.py runs sbatch/squeue/scontrol/scancel. Adapters take the pure
plan (kit.plan) unchanged, and settings, never a KitConfig: this module is where a config
becomes an adapter. Commands get adapters only from here.

Adding a runtime: implement ContainerRuntime and/or ImageStore (base.py; the conformance test
in tests/unit/test_runtime_protocols.py lists what each must implement) and add a branch below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kit.config import KitConfig
    from kit.runtime.apptainer import ApptainerSettings
    from kit.runtime.base import ContainerRuntime, ImageStore
    from kit.runtime.slurm import JobControl


def apptainer_settings(config: KitConfig) -> ApptainerSettings:
    from kit.runtime.apptainer import ApptainerSettings

    section = config.apptainer
    return ApptainerSettings(image_dir=section.image_dir, cache_dir=section.cache_dir, tmp_dir=section.tmp_dir)


# Runtimes whose containers srun starts inside a SLURM job (kit slurm); kit drives their images only.
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


def get_runtime(config: KitConfig) -> ContainerRuntime:
    """The container runtime config.runtime names. Docker's engine (Apptainer's binary) is
    reached on first use, not here."""
    check_local(config)
    if config.runtime == "apptainer":
        from kit.runtime.apptainer import ApptainerRuntime

        return ApptainerRuntime(apptainer_settings(config))
    from kit.runtime.docker import DockerRuntime

    return DockerRuntime()


def get_image_store(config: KitConfig) -> ImageStore:
    """The image store of config.runtime (`kit pull`, `kit build`). Planning a pull or a build
    needs neither the engine nor the binary, so --dry-run works without them."""
    if config.runtime in SLURM_ONLY:
        from kit.runtime.enroot import EnrootImages

        return EnrootImages(config.enroot.image_dir)
    if config.runtime == "apptainer":
        from kit.runtime.apptainer import ApptainerRuntime

        return ApptainerRuntime(apptainer_settings(config))
    from kit.runtime.docker import DockerRuntime

    return DockerRuntime()


def get_job_control() -> JobControl:
    """The batch scheduler kit submits launchers to (`kit slurm --submit`, `--slurm JOB`)."""
    from kit.runtime.slurm import Slurm

    return Slurm()

"""Container runtime adapters. Only kit/runtime/docker.py imports docker; only
kit/runtime/apptainer.py imports spython. Both take the pure plan (kit.plan) unchanged."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kit.config import KitConfig
    from kit.runtime.base import Runtime


def get_runtime(config: KitConfig) -> Runtime:
    if config.runtime == "apptainer":
        from kit.runtime.apptainer import ApptainerRuntime

        return ApptainerRuntime(config)
    from kit.runtime.docker import DockerRuntime

    return DockerRuntime()

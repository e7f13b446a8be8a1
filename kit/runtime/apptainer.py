"""The Apptainer adapter (issue 6 fills it in)."""

from __future__ import annotations

from kit.config import KitConfig
from kit.errors import RuntimeUnavailable
from kit.runtime.base import Runtime


def ApptainerRuntime(config: KitConfig) -> Runtime:
    raise RuntimeUnavailable("the Apptainer runtime is not implemented yet", hint="use runtime: docker")

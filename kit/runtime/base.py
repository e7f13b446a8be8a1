"""The small interface every container runtime adapter implements."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeHandle:
    """A running (or stopped) kit node container found by its labels."""

    name: str  # container / instance name
    cluster: str
    role: str  # "head" | "worker"
    rank: int
    state: str  # "running", "exited", …
    ip: str | None = None  # the node IP kit planned (VLLM_HOST_IP)
    image: str = ""  # reference it was started from
    image_digest: str | None = None  # repo digest or image id
    started_at: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ExecResult:
    returncode: int
    stdout: str
    stderr: str


class Runtime(abc.ABC):
    name: str

    @abc.abstractmethod
    def find_nodes(self, cluster: str) -> list[NodeHandle]:
        """Every kit node of `cluster` on this host, head first then by rank."""

    @abc.abstractmethod
    def exec(
        self,
        node: NodeHandle,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        """Run argv inside the node's container and wait for it."""

"""The small interface every container runtime adapter implements."""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kit.plan.node import ContainerSpec


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

    @abc.abstractmethod
    def exec_detached(self, node: NodeHandle, argv: Sequence[str]) -> None:
        """Start argv inside the node's container and return at once."""

    @abc.abstractmethod
    def state(self, name: str) -> str | None:
        """'running', 'exited', … or None when there is no such container."""

    @abc.abstractmethod
    def start(self, spec: ContainerSpec) -> Any:
        """Create and start the planned container (detached)."""

    @abc.abstractmethod
    def remove(self, name: str) -> bool:
        """Remove the container if it exists; True if something was removed."""

    @abc.abstractmethod
    def logs(self, name: str, *, tail: int | str = "all") -> str:
        """The container's output so far."""

    @abc.abstractmethod
    def wait_for_mark(
        self, name: str, marks: Sequence[str], *, timeout: float, on_progress: Callable[[str], None], what: str
    ) -> str:
        """Wait until a log line contains one of marks; raise StartError (with the log tail) on exit/timeout."""

    @abc.abstractmethod
    def remove_cluster(self, cluster: str) -> dict[str, list[str]]:
        """Remove every container (and network) of the cluster."""

    def ensure_network(self, name: str, subnet: str, cluster: str) -> None:
        """Docker only: the private network for local multi-node simulation."""
        raise NotImplementedError

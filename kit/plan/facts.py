"""Facts about the host that planning needs, gathered by the command layer (kit.netinfo) and
passed in, so every planner stays pure and testable."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class HostFacts:
    interfaces: Mapping[str, str] = field(default_factory=dict)  # name -> IPv4
    default_interface: str | None = None
    route_to_head: str | None = None  # local source IP of the route to the head, if known
    has_infiniband: bool = False


@dataclass(frozen=True)
class Role:
    kind: str  # "head" | "worker"
    rank: int = 0

    @property
    def is_head(self) -> bool:
        return self.kind == "head"

    @property
    def label(self) -> str:
        return "head" if self.is_head else f"worker-{self.rank}"


HEAD = Role("head", 0)


@dataclass(frozen=True)
class NodeNet:
    ip: str
    interface: str
    head_address: str

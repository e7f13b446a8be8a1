"""A node's role in the cluster: the head (rank 0) or a worker (rank 1..nodes-1)."""

from __future__ import annotations

from dataclasses import dataclass


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

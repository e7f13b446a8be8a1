"""The verification checks: small pure functions from typed facts (kit.verify.facts) to Checks.

- node.py: one node (GPUs, CUDA, /dev/shm, memlock, RDMA, node IP, Ray registration, HF cache)
- cluster.py: across nodes (node count, Ray's view, GPU models, versions, HF snapshots, exposure)
- transport.py: the collective (correctness, intra-/inter-node transport against --expect, bandwidth)

kit.verify.policy reads the probes' JSON into facts and runs them all. Every check has a one-line
reason and, unless it passed, a fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PASS, WARN, FAIL = "pass", "warn", "fail"
_RANK = {PASS: 0, WARN: 1, FAIL: 2}


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass | warn | fail
    reason: str
    fix: str | None = None
    node: str | None = None  # None: about the whole cluster

    def to_dict(self) -> dict[str, str | None]:
        return {
            "name": self.name,
            "node": self.node,
            "status": self.status,
            "reason": self.reason,
            "fix": self.fix,
        }


def overall(checks: Sequence[Check]) -> str:
    return max((c.status for c in checks), key=_RANK.__getitem__, default=PASS)


IB_FIX = (
    "start containers with /dev/infiniband, IPC_LOCK and memlock=unlimited "
    "(--device /dev/infiniband --cap-add IPC_LOCK --ulimit memlock=-1) and RDMA userland "
    "(libibverbs, libmlx5) in the image"
)

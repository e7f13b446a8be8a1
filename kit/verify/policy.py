"""The verification gate: node facts + collective results -> checks that pass, warn or fail.

The boundary between the probes' JSON (kit.verify.probe, kit.verify.collective, the head's Ray
view) and the checks: it reads the JSON into typed facts (kit.verify.facts) once and runs the
small checks of kit.verify.checks (node, cluster, transport) over them. The NCCL transport
summary comes from kit.verify.nccl. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kit.verify.checks import FAIL, IB_FIX, PASS, WARN, Check, overall
from kit.verify.checks import cluster as _cluster
from kit.verify.checks import node as _node
from kit.verify.checks import transport as _transport
from kit.verify.checks.cluster import VERSION_KEYS, check_exposure
from kit.verify.checks.node import SHM_MIN_BYTES
from kit.verify.checks.transport import EXPECTS, FLOORS_GBPS
from kit.verify.container_checks import check_container
from kit.verify.facts import CollectiveFacts, NodeFacts, RayNode, nodes_from_probe
from kit.verify.nccl import TransportSummary

__all__ = [
    "EXPECTS",
    "FAIL",
    "FLOORS_GBPS",
    "IB_FIX",
    "PASS",
    "SHM_MIN_BYTES",
    "VERSION_KEYS",
    "WARN",
    "Check",
    "check_cluster",
    "check_collective",
    "check_exposure",
    "check_node",
    "check_versions",
    "evaluate",
    "ib_ports",
    "nvlinked",
    "overall",
    "package_differences",
    "version_table",
]

# What a probe printed (kit.verify.probe / kit.verify.collective), as JSON.
ProbeJson = Mapping[str, Any]


def evaluate(
    nodes: Mapping[str, ProbeJson],
    collective: ProbeJson | None,
    summary: TransportSummary | None,
    *,
    expect: str = "auto",
    expected_nodes: int | None = None,
    expected_gpus_per_node: int | None = None,
    planned_ips: Mapping[str, str | None] | None = None,
    accelerator: str = "gpu",
    ray: Sequence[ProbeJson] | None = None,
    ray_error: str | None = None,
) -> list[Check]:
    """All checks, per node first, then across nodes, then the collective."""
    facts = nodes_from_probe(nodes)
    checks: list[Check] = []
    for name, node_facts in facts.items():
        checks.extend(
            _node.check_node(
                name,
                node_facts,
                expected_gpus=expected_gpus_per_node,
                planned_ip=(planned_ips or {}).get(name),
                accelerator=accelerator,
            )
        )
        checks.extend(_container_checks(name, nodes[name]))
    rows = [RayNode.from_view(r) for r in ray] if ray is not None else None
    checks.extend(_cluster.check_cluster(facts, expected_nodes=expected_nodes, ray=rows, ray_error=ray_error))
    if collective is not None:
        coll = CollectiveFacts.from_probe(collective)
        checks.extend(_transport.check_collective(coll, summary, expect=expect, nodes=facts))
    return checks


# --- the checks over JSON, one group at a time ---------------------------------------------------


def check_node(
    node: str,
    facts: ProbeJson,
    *,
    expected_gpus: int | None = None,
    planned_ip: str | None = None,
    accelerator: str = "gpu",
) -> list[Check]:
    checks = _node.check_node(
        node, NodeFacts.from_probe(facts), expected_gpus=expected_gpus, planned_ip=planned_ip, accelerator=accelerator
    )
    return checks + _container_checks(node, facts)


def _container_checks(node: str, facts: ProbeJson) -> list[Check]:
    """What enroot's hooks gave a pyxis/EDF container (none for other runtimes)."""
    return check_container(node, facts)


def check_cluster(
    nodes: Mapping[str, ProbeJson],
    *,
    expected_nodes: int | None = None,
    ray: Sequence[ProbeJson] | None = None,
    ray_error: str | None = None,
) -> list[Check]:
    rows = [RayNode.from_view(r) for r in ray] if ray is not None else None
    return _cluster.check_cluster(nodes_from_probe(nodes), expected_nodes=expected_nodes, ray=rows, ray_error=ray_error)


def check_versions(nodes: Mapping[str, ProbeJson]) -> list[Check]:
    return _cluster.check_versions(nodes_from_probe(nodes))


def check_collective(
    collective: ProbeJson,
    summary: TransportSummary | None,
    *,
    expect: str,
    nodes: Mapping[str, ProbeJson],
) -> list[Check]:
    coll = CollectiveFacts.from_probe(collective)
    return _transport.check_collective(coll, summary, expect=expect, nodes=nodes_from_probe(nodes))


def version_table(nodes: Mapping[str, ProbeJson]) -> dict[str, dict[str, str | None]]:
    """key -> node -> value, for VERSION_KEYS plus the GPU driver."""
    return _cluster.version_table(nodes_from_probe(nodes))


def package_differences(nodes: Mapping[str, ProbeJson], limit: int = 5) -> list[str]:
    """`six (a 1.17.0, b 1.16.0)` for each installed package whose version differs across nodes."""
    return _cluster.package_differences(nodes_from_probe(nodes), limit)


def ib_ports(facts: ProbeJson) -> list[str]:
    """Active InfiniBand/RoCE ports of a node, as `mlx5_0:1/IB`."""
    return NodeFacts.from_probe(facts).infiniband.active_ports


def nvlinked(facts: ProbeJson) -> bool | None:
    """True when every GPU pair is NVLinked, False when some is not, None when unknown."""
    return NodeFacts.from_probe(facts).all_nvlink

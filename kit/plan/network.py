"""This node's network: its IP, the interface NCCL and Gloo use, and the head's address
(FIELD_NOTES §1 rows 1-3). The host facts are gathered by the cluster layer (kit.net.interfaces) and
passed in, so the planner stays pure and testable."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field

from kit.config import KitConfig
from kit.errors import ConfigError
from kit.plan.replicas import nodes_per_replica, router_mode
from kit.plan.roles import Role


@dataclass(frozen=True)
class HostFacts:
    interfaces: Mapping[str, str] = field(default_factory=dict)  # name -> IPv4
    default_interface: str | None = None
    route_to_head: str | None = None  # local source IP of the route to the head, if known
    has_infiniband: bool = False


@dataclass(frozen=True)
class NodeNet:
    ip: str
    interface: str
    head_address: str
    # model.dp_lb router, a replica over several nodes: its first node's IP (--master-addr).
    replica_head: str | None = None


def _src(sources: Mapping[str, str], key: str) -> str:
    return sources.get(key, "default")


def plan_node_net(config: KitConfig, sources: Mapping[str, str], role: Role, host: HostFacts) -> NodeNet:
    """This node's IP and NCCL/Gloo interface, and the head's address (FIELD_NOTES §1 rows 1-3)."""
    if role.rank >= config.nodes or role.rank < 0:
        raise ConfigError(
            f"node rank {role.rank} is outside 0..{config.nodes - 1}",
            key="nodes",
            source=_src(sources, "nodes"),
            hint="use --node-rank between 1 and nodes-1 for workers",
        )
    if not role.is_head and role.rank == 0:
        raise ConfigError(
            "a worker cannot have node rank 0 (that is the head)",
            key="nodes",
            hint="pass --node-rank K with 1 ≤ K < nodes",
        )
    if config.network:  # local simulation: fixed IPs on a private Docker network
        try:
            subnet = ipaddress.IPv4Network(config.network_subnet)
        except ValueError:
            raise ConfigError(
                f"{config.network_subnet!r} is not an IPv4 subnet",
                key="network_subnet",
                source=_src(sources, "network_subnet"),
                hint="write it like 172.30.77.0/24",
            ) from None
        base = subnet.network_address
        sim_ip = config.node_ip if config.node_ip != "auto" else str(base + 10 + role.rank)
        head = str(base + 10) if role.is_head or not config.head_address else config.head_address
        if ipaddress.IPv4Address(sim_ip) not in subnet:
            raise ConfigError(
                f"{sim_ip} is not in the simulation subnet {subnet}",
                key="node_ip",
                source=_src(sources, "node_ip"),
                hint="pick an address inside network_subnet, or auto",
            )
        replica_head = None
        if (first := _replica_head_rank(config, role)) is not None:
            replica_head = str(base + 10 + first) if config.node_ip == "auto" or first != role.rank else sim_ip
        return NodeNet(
            ip=sim_ip,
            interface="eth0" if config.interface == "auto" else config.interface,
            head_address=head,
            replica_head=replica_head,
        )

    if not role.is_head and not config.head_address:
        raise ConfigError(
            "a worker needs the head's address",
            key="head_address",
            source=_src(sources, "head_address"),
            hint="pass --head-address HEAD_IP (or set head_address in kit.yaml / KIT_HEAD_ADDRESS)",
        )
    if config.head_address:
        _numeric_ipv4(
            config.head_address,
            "head_address",
            sources,
            "use the head's IP, not a hostname (Ray must register numeric IPs)",
        )

    iface: str | None = None if config.interface == "auto" else config.interface
    if iface is not None and iface not in host.interfaces:
        raise ConfigError(
            f"interface {iface!r} has no IPv4 address on this host",
            key="interface",
            source=_src(sources, "interface"),
            hint=f"use one of: {', '.join(sorted(host.interfaces)) or 'none found'}, or auto",
        )
    if config.node_ip != "auto":
        _numeric_ipv4(config.node_ip, "node_ip", sources, "use this node's IP, or auto")
        owners = [n for n, a in host.interfaces.items() if a == config.node_ip]
        if not owners:
            raise ConfigError(
                f"{config.node_ip} is not an address of this host",
                key="node_ip",
                source=_src(sources, "node_ip"),
                hint="use one of: " + ", ".join(f"{a} ({n})" for n, a in sorted(host.interfaces.items())),
            )
        ip = config.node_ip
        iface = iface or owners[0]
    elif iface is not None:
        ip = host.interfaces[iface]
    else:
        found = None
        if not role.is_head and host.route_to_head:
            found = host.route_to_head
        elif host.default_interface and host.default_interface in host.interfaces:
            found = host.interfaces[host.default_interface]
        if found is None:
            raise ConfigError(
                "cannot find this node's IP (no route to the head and no default route)",
                key="node_ip",
                hint="pass --node-ip or --interface",
            )
        ip = found
        owners = [n for n, a in host.interfaces.items() if a == ip]
        iface = owners[0] if owners else (host.default_interface or "")
    if ip.startswith("127.") and config.nodes > 1:
        raise ConfigError(
            f"node IP {ip} is a loopback address; other nodes cannot reach it",
            key="node_ip",
            source=_src(sources, "node_ip"),
            hint="pass --node-ip or --interface for the cluster network",
        )
    head = ip if role.is_head else str(config.head_address)
    replica_head = _replica_head(config, sources, role, ip, head)
    return NodeNet(ip=ip, interface=iface, head_address=head, replica_head=replica_head)


def _replica_head_rank(config: KitConfig, role: Role) -> int | None:
    """The rank of the first node of this node's replica, when it spans nodes (model.dp_lb router)."""
    span = nodes_per_replica(config) if router_mode(config) else 1
    return None if span <= 1 else role.rank - role.rank % span


def _replica_head(config: KitConfig, sources: Mapping[str, str], role: Role, ip: str, head: str) -> str | None:
    """A replica over several nodes meets at its first node: this node, the cluster's head, or
    (host networking, nothing kit can derive) the address in replica_head."""
    first = _replica_head_rank(config, role)
    if first is None:
        return None
    if first == role.rank:
        return ip
    if first == 0:
        return head
    if not config.replica_head:
        raise ConfigError(
            f"node {role.rank} is part of the replica whose first node is node {first}, whose address kit cannot know",
            key="replica_head",
            source=_src(sources, "replica_head"),
            hint=f"pass --set replica_head=IP (node {first}'s IP) on this node",
        )
    _numeric_ipv4(config.replica_head, "replica_head", sources, "use the IP of the replica's first node")
    return config.replica_head


def _numeric_ipv4(value: str, key: str, sources: Mapping[str, str], hint: str) -> None:
    """ConfigError (one line naming `key`) unless `value` is a numeric IPv4 address."""
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        raise ConfigError(
            f"{value!r} is not a numeric IPv4 address", key=key, source=_src(sources, key), hint=hint
        ) from None

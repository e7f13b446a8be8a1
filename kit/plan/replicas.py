"""Replicas behind one endpoint (model.dp_lb router, issue 29): where each replica runs. Pure.

A replica is one independent `vllm serve` of TP×PP GPUs with its own API server; DP of them share
the cluster, and vLLM's router (kit.plan.router) spreads requests over them. The layout decides
the shape, the hardware the placement:

- TP×PP ≥ gpus_per_node: a replica spans TP×PP / gpus_per_node whole nodes (vLLM's own multi-node
  backend, `--nnodes` over the replica's nodes, its first node the replica's master), one replica
  after the other: TP16 × DP2 over 4 × 8 GPUs is replicas {0,1} and {2,3}.
- TP×PP < gpus_per_node: gpus_per_node / (TP×PP) replicas share each node (partial-node layouts:
  two TP4 replicas on one 8-GPU node), each on its own GPUs (CUDA_VISIBLE_DEVICES) and ports
  (ports.replica + its slot on the node; the replica's torch rendezvous ports.mp_master + slot).

kit.plan.checks refuses a layout that fits neither shape exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from kit.config import KitConfig


@dataclass(frozen=True)
class Replica:
    """One replica: its index, the node ranks it runs on (first: its master and API server), its
    slot on those nodes (0 unless several replicas share a node) and the GPU indices it uses on
    each of them (indices into the node's GPUs: those of the `gpus` selection, numbered from 0)."""

    index: int
    nodes: tuple[int, ...]
    slot: int
    gpus: tuple[int, ...]
    port: int  # its API server, on its first node's IP
    master_port: int  # its torch rendezvous (--master-port), used when it spans nodes

    @property
    def head(self) -> int:
        return self.nodes[0]

    @property
    def spans_nodes(self) -> bool:
        return len(self.nodes) > 1

    def rank_in(self, node: int) -> int:
        """The node's rank inside this replica (vLLM's --node-rank)."""
        return self.nodes.index(node)

    @property
    def name(self) -> str:
        return f"replica-{self.index}"


def router_mode(config: KitConfig) -> bool:
    """Independent replicas behind kit's router (model.dp_lb router)."""
    return config.model.dp_lb == "router"


def replica_gpus(config: KitConfig) -> int:
    return config.tp * config.pp


def nodes_per_replica(config: KitConfig) -> int:
    return max(1, replica_gpus(config) // config.gpus_per_node)


def replicas_per_node(config: KitConfig) -> int:
    return max(1, config.gpus_per_node // replica_gpus(config))


def plan_replicas(config: KitConfig) -> tuple[Replica, ...]:
    """Every replica's place, in order (replica k: the k-th block of TP×PP GPUs, node after node)."""
    span, per_node, size = nodes_per_replica(config), replicas_per_node(config), replica_gpus(config)
    out = []
    for index in range(config.dp):
        if span > 1 or per_node == 1:
            first = index * span
            nodes, slot, gpus = tuple(range(first, first + span)), 0, tuple(range(min(size, config.gpus_per_node)))
        else:
            node, slot = divmod(index, per_node)
            nodes, gpus = (node,), tuple(range(slot * size, (slot + 1) * size))
        out.append(Replica(index, nodes, slot, gpus, config.ports.replica + slot, config.ports.mp_master + slot))
    return tuple(out)


def replicas_on(config: KitConfig, node: int) -> tuple[Replica, ...]:
    """The replicas with a part on node `node` (every one of its slots)."""
    return tuple(r for r in plan_replicas(config) if node in r.nodes)


def replica_of_head(config: KitConfig, node: int) -> tuple[Replica, ...]:
    """The replicas whose API server (first node) is node `node`."""
    return tuple(r for r in plan_replicas(config) if r.head == node)


def describe(config: KitConfig) -> str:
    """`2 replicas of TP=2 PP=1, each over 2 nodes` / `4 replicas of TP=2, 2 on each node`: kit's
    own words and numbers (printed in --dry-run comments)."""
    span, per_node = nodes_per_replica(config), replicas_per_node(config)
    shape = f"{config.dp} replica(s) of TP={config.tp} PP={config.pp}"
    if span > 1:
        return f"{shape}, each over {span} nodes"
    if per_node > 1:
        return f"{shape}, {per_node} on each node (its own GPUs and port)"
    return f"{shape}, one on each node"

"""Several kit clusters on one host (issue 28, FIELD_NOTES §8 "several models on one machine"):
what a node holds there, recorded in its labels, and the overlaps refused before anything starts.

With host networking every port a node's processes bind is the host's, and a GPU given to two
containers serves neither well. A node's labels say which ports (kit.host-ports) and GPUs
(kit.gpus) it holds; a node about to start is checked against the running nodes of every other
cluster on the host (kit.cluster.host_share). `kit serve MODEL` (one host, no kit.yaml) places
the ports it needs besides its API port where no other such server has them: derived_ports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kit.config import KitConfig
from kit.plan.replicas import replicas_on, router_mode
from kit.plan.roles import Role
from kit.plan.vllm import serves_api

Span = tuple[int, int]  # an inclusive port range (a single port: (p, p))

_RAY_FIXED = (
    "ray_gcs",
    "ray_client",
    "ray_node_manager",
    "ray_object_manager",
    "ray_metrics_export",
    "ray_dashboard_agent_grpc",
    "ray_dashboard_agent_http",
    "ray_runtime_env_agent",
)


def host_ports(config: KitConfig, role: Role) -> dict[str, Span]:
    """The host ports a node of `role` binds while it serves ({} on a simulation network: its
    own IP). Keyed by config key (ports.*). kit verify's rendezvous port is bound only while it
    runs, so it is not held."""
    if config.network:
        return {}
    if router_mode(config):
        return _replica_ports(config, role)
    p = config.ports
    held: dict[str, Span] = {}
    if serves_api(config, role):
        held["ports.api"] = (p.api, p.api)
    if role.is_head and config.supervise.enabled:
        held["ports.supervisor"] = (p.supervisor, p.supervisor)
    if config.backend == "mp" and config.nodes > 1 and role.is_head:
        held["ports.mp_master"] = (p.mp_master, p.mp_master)
        if config.dp > 1:
            held["ports.dp_rpc"] = (p.dp_rpc, p.dp_rpc)
    if config.backend == "ray":
        for name in _RAY_FIXED:
            if role.is_head or name not in ("ray_gcs", "ray_client"):
                held[f"ports.{name}"] = (getattr(p, name), getattr(p, name))
        if role.is_head and config.ray.dashboard:
            held["ports.ray_dashboard"] = (p.ray_dashboard, p.ray_dashboard)
        held["ports.ray_min_worker"] = (p.ray_min_worker, p.ray_max_worker)
    return held


def _replica_ports(config: KitConfig, role: Role) -> dict[str, Span]:
    """model.dp_lb router (issue 29): each replica whose API server is on this node holds its port
    (ports.replica + its slot), its rendezvous when it spans nodes and, supervised, its
    coordinator's port (ports.supervisor + its slot); the head also holds the router's
    (ports.api, its metrics on loopback)."""
    p = config.ports
    held: dict[str, Span] = {}
    mine = [r for r in replicas_on(config, role.rank) if r.head == role.rank]
    if mine:
        held["ports.replica"] = (min(r.port for r in mine), max(r.port for r in mine))
        if any(r.spans_nodes for r in mine):
            held["ports.mp_master"] = (p.mp_master, p.mp_master)
        if config.supervise.enabled:
            slots = [r.slot for r in mine]
            held["ports.supervisor"] = (p.supervisor + min(slots), p.supervisor + max(slots))
    if role.is_head:
        held["ports.api"] = (p.api, p.api)
        held["ports.router_metrics"] = (p.router_metrics, p.router_metrics)
    return held


def held_gpus(config: KitConfig) -> str | None:
    """The GPUs a node holds on its host ("all" or physical ids "2,3"); None without GPUs."""
    if config.accelerator != "gpu":
        return None
    return "all" if config.gpus == "all" else ",".join(g.strip() for g in config.gpus.split(","))


def ports_label(held: Mapping[str, Span]) -> str:
    """kit.host-ports: "8000 29570 11000-11999" (sorted; blanks, so that the label stays one
    quoted word wherever it is written into shell)."""
    return " ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in sorted(held.values()))


def parse_ports_label(text: str) -> list[Span]:
    """The spans of a kit.host-ports label; a malformed part (not kit's) is skipped."""
    spans = []
    for part in text.split():
        low, _, high = part.partition("-")
        if low.isdigit() and (high.isdigit() or not high):
            spans.append((int(low), int(high or low)))
    return spans


def gpu_overlap(mine: str | None, theirs: str | None) -> set[str] | None:
    """The GPUs two nodes would share (None: none shared). "all" shares every GPU."""
    if mine is None or theirs is None:
        return None
    if "all" in (mine, theirs):
        return {"all"}
    shared = set(mine.split(",")) & set(theirs.split(","))
    return shared or None


@dataclass(frozen=True)
class Clash:
    """What a planned node would share with a running node of another cluster."""

    what: str  # "port 8000 (ports.api)", "GPUs 2,3"
    key: str  # the config key that would move it
    cluster: str  # the other cluster
    node: str  # its container


def clashes(
    held: Mapping[str, Span], gpus: str | None, others: list[tuple[str, str, Mapping[str, str]]]
) -> list[Clash]:
    """Every overlap of this node's ports and GPUs with `others` ((cluster, node, labels) of
    running nodes of other clusters on this host)."""
    from kit import labels as keys

    found = []
    for cluster, node, labels in others:
        for span in parse_ports_label(labels.get(keys.HOST_PORTS, "")):
            for key, (low, high) in held.items():
                if low <= span[1] and span[0] <= high:
                    port = max(low, span[0])
                    found.append(Clash(f"port {port} ({key})", key, cluster, node))
        shared = gpu_overlap(gpus, labels.get(keys.GPUS))
        if shared:
            what = "every GPU" if shared == {"all"} else "GPU " + ",".join(sorted(shared, key=int))
            found.append(Clash(what, "gpus", cluster, node))
    return found


# ---- kit serve MODEL: one host, no kit.yaml ------------------------------------------------

# Offsets from the API port of the ports a one-host server may bind besides it: with the API on
# 8000 they are kit's defaults, and two servers on different API ports get different ones.
_OFFSETS = {"ports.mp_master": 21500, "ports.verify": 21512, "ports.dp_rpc": 21550, "ports.supervisor": 21570}
# Ray (only when asked for: one node needs none) gets a block of 100 ports from the API port.
_RAY_BLOCK = {f"ports.{name}": i for i, name in enumerate((*_RAY_FIXED, "ray_dashboard"))}


def derived_ports(api: int, backend: str) -> dict[str, int]:
    """The ports `kit serve MODEL --port API` uses besides API, for every key the user left unset
    (kit.cluster.host_share.one_host_overrides). A derived port past 65535 keeps its default;
    the overlap check still refuses what two servers would share."""
    out = {key: api + off for key, off in _OFFSETS.items() if api + off <= 65535}
    if backend == "ray":
        base = 12000 + (api % 180) * 100  # 12000-29999, below the kernel's ephemeral ports
        out.update({key: base + i for key, i in _RAY_BLOCK.items()})
        out["ports.ray_min_worker"], out["ports.ray_max_worker"] = base + 20, base + 99
    return out


def one_host_name(model: str, port: int) -> str:
    """The cluster name of `kit serve MODEL --port PORT`: the model's last path part and the
    port ("qwen2.5-7b-instruct-8001"), a valid container-name part (kit.config.schema's pattern)."""
    base = model.rstrip("/").rsplit("/", 1)[-1].lower()
    slug = "".join(c if c.isalnum() or c in "._-" else "-" for c in base).strip("-._") or "model"
    return f"{slug[:50].rstrip('-._')}-{port}"

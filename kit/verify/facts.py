"""Typed views of what the probes print (kit.verify.probe, kit.verify.collective) and of the
head's Ray view: the JSON is read here once, at the boundary, and the checks
(kit.verify.checks) see dataclasses instead of nested dictionaries.

Lenient on purpose: a probe of another kit version (or an image's own Python) may leave a key
out, and a missing key is a finding for the checks to report, never a crash here. Values are
taken as the probe printed them (a number stays an int or a float) so every message and the
JSON output read exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# --- JSON helpers -----------------------------------------------------------------------------


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _seq(value: object) -> Sequence[Any]:
    return value if isinstance(value, (list, tuple)) else ()


def _str(value: object) -> str | None:
    """A string as printed; anything else that is not None in its text form."""
    return value if isinstance(value, str) or value is None else str(value)


def _num(value: object) -> int | float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --- one node --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_mib: int | None
    driver: str | None

    @classmethod
    def from_probe(cls, d: Mapping[str, Any]) -> Gpu:
        return cls(str(d.get("name")), _int(d.get("memory_mib")), _str(d.get("driver")))


@dataclass(frozen=True)
class TorchFacts:
    """torch as the node's Python sees it (probe.torch_facts)."""

    importable: bool
    version: str | None = None
    cuda: str | None = None
    cuda_available: bool = False
    device_count: int | None = None
    error: str | None = None

    @classmethod
    def from_probe(cls, d: Mapping[str, Any]) -> TorchFacts:
        return cls(
            importable=bool(d.get("importable")),
            version=_str(d.get("version")),
            cuda=_str(d.get("cuda")),
            cuda_available=bool(d.get("cuda_available")),
            device_count=_int(d.get("device_count")),
            error=_str(d.get("error")),
        )


@dataclass(frozen=True)
class IbPort:
    device: str
    port: int | str
    state: str  # "ACTIVE", "DOWN", …
    link_layer: str | None  # "InfiniBand" | "Ethernet" (RoCE)

    @property
    def active(self) -> bool:
        return self.state.upper() == "ACTIVE"

    @property
    def name(self) -> str:
        """`mlx5_0:1/IB`, or `/RoCE` for an Ethernet link layer."""
        layer = "RoCE" if self.link_layer == "Ethernet" else "IB"
        return f"{self.device}:{self.port}/{layer}"

    @classmethod
    def from_probe(cls, d: Mapping[str, Any]) -> IbPort:
        port = d.get("port")
        return cls(
            device=str(d.get("device")),
            port=port if isinstance(port, (int, str)) else str(port),
            state=str(d.get("state", "")),
            link_layer=_str(d.get("link_layer")),
        )


@dataclass(frozen=True)
class InfinibandFacts:
    ports: tuple[IbPort, ...] = ()
    uverbs: tuple[str, ...] = ()  # /dev/infiniband/uverbs*: what the container can open
    gdr_module: bool = False  # nvidia_peermem (GPUDirect RDMA) loaded on the host

    @property
    def active_ports(self) -> list[str]:
        """Active InfiniBand/RoCE ports, as `mlx5_0:1/IB`."""
        return [p.name for p in self.ports if p.active]

    @classmethod
    def from_probe(cls, d: Mapping[str, Any]) -> InfinibandFacts:
        return cls(
            ports=tuple(IbPort.from_probe(p) for p in _seq(d.get("devices")) if isinstance(p, Mapping)),
            uverbs=tuple(str(u) for u in _seq(d.get("dev_infiniband"))),
            gdr_module=bool(d.get("gdr_module")),
        )


@dataclass(frozen=True)
class Memlock:
    soft: int | None  # bytes; None when unlimited (or unknown)
    unlimited: bool

    @classmethod
    def from_probe(cls, d: Mapping[str, Any]) -> Memlock:
        return cls(_int(d.get("soft")), bool(d.get("unlimited")))


@dataclass(frozen=True)
class NetworkFacts:
    node_ip: str | None = None  # VLLM_HOST_IP, else the routed IP
    interface: str | None = None  # the interface that carries node_ip
    interfaces: Mapping[str, str] = field(default_factory=dict)  # name -> IPv4
    ray_node_ip: str | None = None  # what this node's Ray session file says it registered
    nccl_socket_ifname: str | None = None
    gloo_socket_ifname: str | None = None

    @classmethod
    def from_probe(cls, d: Mapping[str, Any]) -> NetworkFacts:
        return cls(
            node_ip=_str(d.get("node_ip")),
            interface=_str(d.get("interface")),
            interfaces={str(k): str(v) for k, v in _map(d.get("interfaces")).items()},
            ray_node_ip=_str(d.get("ray_node_ip")),
            nccl_socket_ifname=_str(d.get("nccl_socket_ifname")),
            gloo_socket_ifname=_str(d.get("gloo_socket_ifname")),
        )


@dataclass(frozen=True)
class Mismatch:
    path: str
    expected: int
    actual: int


@dataclass(frozen=True)
class HfCacheFacts:
    location: str | None = None  # HF_HOME, else the hub directory
    present: bool = False
    model: str | None = None  # the model asked for; None: the cache does not matter
    fingerprint: str | None = None  # of the model's snapshot; None: not in the cache
    # Issue 19 (probe 3): the snapshot's commit, its files and their sizes, and its completeness
    # against kit fetch's manifest (sizes) or the weights index (shards present).
    revision: str | None = None
    files: int = 0
    total_bytes: int | None = None  # None: an older probe
    sizes: Mapping[str, int] = field(default_factory=dict)
    manifest: bool = False
    complete: bool | None = None  # None: an older probe, or no snapshot
    missing: tuple[str, ...] = ()
    mismatched: tuple[Mismatch, ...] = ()

    @classmethod
    def from_probe(cls, d: Mapping[str, Any]) -> HfCacheFacts:
        sizes = {str(k): v for k, v in _map(d.get("sizes")).items() if isinstance(v, int)}
        mismatched = tuple(
            Mismatch(str(m.get("path")), int(m.get("expected") or 0), int(m.get("actual") or 0))
            for m in _seq(d.get("mismatched"))
            if isinstance(m, Mapping)
        )
        complete = d.get("complete")
        return cls(
            location=_str(d.get("home") or d.get("hub")),
            present=bool(d.get("present")),
            model=_str(d.get("model")) or None,
            fingerprint=_str(d.get("fingerprint")) or None,
            revision=_str(d.get("revision")) or None,
            files=_int(d.get("files")) or 0,
            total_bytes=_int(d.get("total_bytes")),
            sizes=sizes,
            manifest=bool(d.get("manifest")),
            complete=complete if isinstance(complete, bool) else None,
            missing=tuple(str(m) for m in _seq(d.get("missing"))),
            mismatched=mismatched,
        )

    def to_dict(self) -> dict[str, Any]:
        """The model-files row's per-node fields in `kit verify --json` (`model_files`)."""
        return {
            "revision": self.revision,
            "files": self.files,
            "total_bytes": self.total_bytes,
            "complete": self.complete,
            "sizes_checked": self.manifest,
            "missing": list(self.missing),
            "mismatched": [{"path": m.path, "expected": m.expected, "actual": m.actual} for m in self.mismatched],
            "fingerprint": self.fingerprint,
        }


@dataclass(frozen=True)
class RayNode:
    """One row of the head's Ray view (kit.commands.status ray_view/merge_views)."""

    ip: str | None
    vllm_host_ip: str | None = None  # what its raylet sees; None: could not be read
    alive: bool = True
    lost: bool = False

    @classmethod
    def from_view(cls, d: Mapping[str, Any]) -> RayNode:
        return cls(_str(d.get("ip")), _str(d.get("vllm_host_ip")), bool(d.get("alive", True)), bool(d.get("lost")))


@dataclass(frozen=True)
class NodeFacts:
    """One node's probe output, typed."""

    gpus: tuple[Gpu, ...] = ()
    all_nvlink: bool | None = None  # every GPU pair NVLinked; None: unknown (one GPU, no topo)
    torch: TorchFacts | None = None  # None: the probe ran with --no-torch
    shm_bytes: int | None = None  # size of /dev/shm; None: not found
    memlock: Memlock = Memlock(None, False)
    infiniband: InfinibandFacts = InfinibandFacts()
    network: NetworkFacts = NetworkFacts()
    hf_cache: HfCacheFacts = HfCacheFacts()
    versions: Mapping[str, str | None] = field(default_factory=dict)
    packages: Mapping[str, str | None] = field(default_factory=dict)  # distribution -> version
    # Cluster mode with the Ray backend: this node's row of the head's view (None: not in Ray).
    # It supersedes the node's own session file (network.ray_node_ip).
    in_ray_view: bool = False
    ray: RayNode | None = None

    @classmethod
    def from_probe(cls, d: Mapping[str, Any]) -> NodeFacts:
        gpu = _map(d.get("gpu"))
        torch = _map(d.get("torch"))
        nvlink = _map(gpu.get("topology")).get("all_nvlink")
        ray = d.get("ray")
        return cls(
            gpus=tuple(Gpu.from_probe(g) for g in _seq(gpu.get("gpus")) if isinstance(g, Mapping)),
            all_nvlink=nvlink if isinstance(nvlink, bool) else None,
            torch=TorchFacts.from_probe(torch) if torch else None,
            shm_bytes=_int(_map(d.get("shm")).get("size_bytes")),
            memlock=Memlock.from_probe(_map(d.get("memlock"))),
            infiniband=InfinibandFacts.from_probe(_map(d.get("infiniband"))),
            network=NetworkFacts.from_probe(_map(d.get("network"))),
            hf_cache=HfCacheFacts.from_probe(_map(d.get("hf_cache"))),
            versions={str(k): _str(v) for k, v in _map(d.get("versions")).items()},
            packages={str(k): _str(v) for k, v in _map(d.get("packages")).items()},
            in_ray_view="ray" in d,
            ray=RayNode.from_view(ray) if isinstance(ray, Mapping) else None,
        )


def nodes_from_probe(nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, NodeFacts]:
    return {name: NodeFacts.from_probe(facts) for name, facts in nodes.items()}


# --- the collective --------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """One message size of a collective (kit.verify.collective timed())."""

    bytes: int
    busbw_gbps: float

    @classmethod
    def from_probe(cls, d: Mapping[str, Any]) -> Measurement:
        busbw = _num(d.get("busbw_gbps"))
        return cls(_int(d.get("bytes")) or 0, busbw if busbw is not None else 0.0)


@dataclass(frozen=True)
class CollectiveRun:
    """One collective (all-reduce or all-to-all) across every rank."""

    name: str
    correct: bool
    results: tuple[Measurement, ...] = ()
    method: str | None = None  # all-to-all: all_to_all_single or the send/recv fallback
    fallback_reason: str | None = None
    latency_method: str | None = None  # all-reduce: how decode latency was timed (issue 30)
    latency_correct: bool | None = None  # None: not measured

    @classmethod
    def from_probe(cls, name: str, d: Mapping[str, Any]) -> CollectiveRun:
        latency = _map(d.get("latency"))
        correct = latency.get("correct")
        return cls(
            name=name,
            correct=bool(d.get("correct")),
            results=tuple(Measurement.from_probe(r) for r in _seq(d.get("results")) if isinstance(r, Mapping)),
            method=_str(d.get("method")) or None,
            fallback_reason=_str(d.get("fallback_reason")) or None,
            latency_method=_str(latency.get("method")) or None,
            latency_correct=correct if isinstance(correct, bool) else None,
        )


@dataclass(frozen=True)
class CollectiveFacts:
    """The collective probe's result, merged across nodes (kit.verify.runner.merge_collective)."""

    ok: bool
    error: str | None
    backend: str | None  # "nccl" | "gloo"
    world_size: int | None
    nnodes: int
    runs: tuple[CollectiveRun, ...]
    nccl_env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_probe(cls, d: Mapping[str, Any]) -> CollectiveFacts:
        # Probes before the all-to-all (issue 10) printed one all-reduce at the top level.
        per = _map(d.get("collectives")) or {"all-reduce": {"correct": d.get("correct"), "results": d.get("results")}}
        return cls(
            ok=bool(d.get("ok")),
            error=_str(d.get("error")),
            backend=_str(d.get("backend")),
            world_size=_int(d.get("world_size")),
            nnodes=int(d.get("nnodes") or 1),
            runs=tuple(CollectiveRun.from_probe(str(name), _map(c)) for name, c in per.items()),
            nccl_env={str(k): str(v) for k, v in _map(d.get("nccl_env")).items() if v is not None},
        )

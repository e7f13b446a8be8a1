"""Which transport NCCL used, read from `NCCL_DEBUG=INFO` output (FIELD_NOTES section 5).

Pure functions over text lines. Lines may carry any prefix (Ray/vLLM process tags such as
`(RayWorkerWrapper pid=123, ip=10.0.0.2)`), so nothing here anchors at the start of a line.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum


class Transport(str, Enum):
    """A connection's transport, best first within each scope."""

    P2P = "p2p"  # NVLink or PCIe peer to peer (P2P/CUMEM, P2P/IPC, P2P/direct pointer)
    SHM = "shm"  # same node through host memory
    IB_GDR = "ib-gdr"  # InfiniBand/RoCE with GPUDirect RDMA
    IB = "ib"  # InfiniBand/RoCE staged through host memory
    PLUGIN = "plugin"  # a net plugin (IBext, AWS Libfabric, OFI …)
    SOCKET = "socket"  # TCP sockets: the slow fallback
    OTHER = "other"


# `Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA`; NCCL <= 2.17 put bus ids in the
# brackets (`0[1b000] -> 1[1c000]`) and older releases printed no `/0` after the channel.
_CHANNEL = re.compile(
    r"Channel\s+(?P<channel>\d+)(?:/\d+)?\s*:\s*"
    r"(?P<src>\d+)\[(?P<src_dev>[0-9a-fA-Fx]+)\]\s*->\s*(?P<dst>\d+)\[(?P<dst_dev>[0-9a-fA-Fx]+)\]"
    r"(?:\s*\[(?P<dir>send|receive)\])?\s+via\s+"
    r"(?P<via>(?:P2P/direct pointer|NET/AWS Libfabric)\S*|\S+)"
)
# NCCL's own prefix `host:pid:tid [dev] NCCL INFO`; anything may stand before it.
_PREFIX = re.compile(r"(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[[^\]]*\]\s+NCCL\s+(?:INFO|WARN)")
_VERSION = re.compile(r"NCCL version (?P<version>\d+\.\d+\.\d+)(?:\+cuda(?P<cuda>[\d.]+))?")
# `NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB ib0:10.0.0.1<0>`; `[RO]` is a flag,
# not a device, and follows `NET/IB : No device found.` when there is no card at all.
_IB_USING = re.compile(r"NET/IB\s*:\s*Using\s+(?P<rest>.*)")
_IB_DEVICE = re.compile(r"\[\d+\](?P<dev>[\w.\-]+):(?P<port>\d+)/(?P<layer>IB|RoCE)")
_NETWORK = re.compile(r"Using network (?P<net>\S.*?)\s*$")
_INIT_RANK = re.compile(
    r"ncclCommInitRank\w*\s*(?:comm\s+\S+\s+)?rank\s+(?P<rank>\d+)\s+nranks\s+(?P<nranks>\d+)"
    r".*?commId\s+(?P<comm>0x[0-9a-fA-F]+)"
)
_NNODES = re.compile(r"nRanks\s+(?P<nranks>\d+)\s+nNodes\s+(?P<nnodes>\d+)")


def classify_via(via: str) -> Transport:
    """The transport of `via` text: `P2P/CUMEM/read` -> P2P, `NET/IB/0/GDRDMA` -> IB_GDR."""
    v = via.strip()
    if v.startswith("P2P"):
        return Transport.P2P
    if v.startswith("SHM"):
        return Transport.SHM
    if v.startswith("NET/"):
        parts = v.split("/")
        net = parts[1] if len(parts) > 1 else ""
        if net == "Socket":
            return Transport.SOCKET
        if net == "IB":
            return Transport.IB_GDR if "GDRDMA" in v else Transport.IB
        return Transport.PLUGIN  # IBext_v8, AWS Libfabric, OFI, …
    if v.startswith("CollNet") or v.startswith("NVLS"):
        return Transport.OTHER
    return Transport.OTHER


@dataclass(frozen=True)
class Connection:
    """One `Channel … via …` line."""

    host: str | None  # NCCL's host prefix of the line, if present
    pid: int | None
    channel: int
    src: int
    dst: int
    direction: str  # "send", "receive" or "" (intra-node lines carry no direction)
    via: str  # raw transport text, e.g. "P2P/CUMEM/read"
    transport: Transport
    comm: str | None = None  # commId of the communicator the process initialised last


@dataclass
class NcclLog:
    """What one or more NCCL logs say: version, IB devices and every connection."""

    versions: set[str] = field(default_factory=set)
    ib_devices: dict[str, str] = field(default_factory=dict)  # "mlx5_0:1" -> "IB" | "RoCE"
    networks: set[str] = field(default_factory=set)  # "Socket", "IB", …
    connections: list[Connection] = field(default_factory=list)
    # commId -> rank -> host, from `ncclCommInitRank… rank R nranks N … commId C` lines.
    rank_hosts: dict[str, dict[int, str]] = field(default_factory=dict)
    nnodes: int | None = None  # largest `nNodes` any communicator reported
    warnings: list[str] = field(default_factory=list)  # NCCL WARN lines


def parse_log(lines: Iterable[str]) -> NcclLog:
    """Parse NCCL_DEBUG=INFO output (any prefix, several processes interleaved)."""
    log = NcclLog()
    last_comm: dict[tuple[str, int], str] = {}
    for raw in lines:
        line = raw.rstrip("\n")
        if "NCCL" not in line and "via" not in line:
            continue
        prefix = _PREFIX.search(line)
        host = prefix.group("host") if prefix else None
        pid = int(prefix.group("pid")) if prefix else None
        if "NCCL WARN" in line:
            log.warnings.append(line.strip())
        if m := _CHANNEL.search(line):
            via = m.group("via")
            comm = last_comm.get((host, pid)) if host is not None and pid is not None else None
            log.connections.append(
                Connection(
                    host=host,
                    pid=pid,
                    channel=int(m.group("channel")),
                    src=int(m.group("src")),
                    dst=int(m.group("dst")),
                    direction=m.group("dir") or "",
                    via=via,
                    transport=classify_via(via),
                    comm=comm,
                )
            )
            continue
        if m := _VERSION.search(line):
            log.versions.add(m.group("version"))
        elif m := _IB_USING.search(line):
            for dev in _IB_DEVICE.finditer(m.group("rest")):
                log.ib_devices[f"{dev.group('dev')}:{dev.group('port')}"] = dev.group("layer")
        elif m := _NETWORK.search(line):
            log.networks.add(m.group("net"))
        elif m := _INIT_RANK.search(line):
            comm = m.group("comm")
            if host is not None:
                log.rank_hosts.setdefault(comm, {})[int(m.group("rank"))] = host
                if pid is not None:
                    last_comm[(host, pid)] = comm
        elif m := _NNODES.search(line):
            log.nnodes = max(log.nnodes or 0, int(m.group("nnodes")))
    return log


def scope_of(conn: Connection, log: NcclLog) -> str:
    """ "intra" or "inter" node.

    Decided from the hosts of both ranks when the log names them (a NET/Socket connection between
    two GPUs of one host is intra-node: that is what NCCL_P2P_DISABLE + NCCL_SHM_DISABLE give);
    otherwise from the transport, since P2P and SHM exist only within a node.
    """
    hosts = log.rank_hosts.get(conn.comm or "", {})
    src_host, dst_host = hosts.get(conn.src), hosts.get(conn.dst)
    if src_host is not None and dst_host is not None:
        return "intra" if src_host == dst_host else "inter"
    if conn.transport in (Transport.P2P, Transport.SHM):
        return "intra"
    if log.nnodes == 1:
        return "intra"
    return "inter"


@dataclass(frozen=True)
class TransportSummary:
    """Connection counts per transport, separately for intra- and inter-node links."""

    intra: dict[str, int]
    inter: dict[str, int]
    version: str | None
    ib_devices: dict[str, str]
    networks: list[str]
    warnings: list[str]
    vias: dict[str, int] = field(default_factory=dict)  # raw `via` text -> count
    backend: str = "nccl"  # "gloo": no NCCL lines; every link is TCP (see gloo_summary)

    @property
    def intra_worst(self) -> Transport | None:
        return _worst(self.intra)

    @property
    def inter_worst(self) -> Transport | None:
        return _worst(self.inter)

    def to_dict(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "intra": self.intra,
            "inter": self.inter,
            "intra_worst": _value(self.intra_worst),
            "inter_worst": _value(self.inter_worst),
            "nccl_version": self.version,
            "ib_devices": self.ib_devices,
            "networks": self.networks,
            "warnings": self.warnings,
            "vias": self.vias,
        }


_ORDER = [
    Transport.P2P,
    Transport.SHM,
    Transport.IB_GDR,
    Transport.PLUGIN,
    Transport.IB,
    Transport.SOCKET,
    Transport.OTHER,
]


def _worst(counts: dict[str, int]) -> Transport | None:
    present = [t for t in _ORDER if counts.get(t.value)]
    # OTHER (CollNet/NVLS) says nothing bad about the link: ignore it when anything else is known.
    known = [t for t in present if t is not Transport.OTHER]
    if known:
        return known[-1]
    return present[-1] if present else None


def _value(t: Transport | None) -> str | None:
    return t.value if t is not None else None


def summarize(log: NcclLog) -> TransportSummary:
    intra: Counter[str] = Counter()
    inter: Counter[str] = Counter()
    for conn in log.connections:
        (intra if scope_of(conn, log) == "intra" else inter)[conn.transport.value] += 1
    return TransportSummary(
        intra=dict(intra),
        inter=dict(inter),
        version=max(log.versions, key=_version_key) if log.versions else None,
        ib_devices=dict(log.ib_devices),
        networks=sorted(log.networks),
        warnings=list(log.warnings),
        vias=dict(Counter(conn.via for conn in log.connections)),
    )


def summarize_lines(lines: Iterable[str]) -> TransportSummary:
    return summarize(parse_log(lines))


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def gloo_summary(nnodes: int, nproc: int) -> TransportSummary:
    """Gloo prints no transport lines, and needs none: every Gloo pair talks over TCP.

    Counted like NCCL's send connections: one per ordered pair of ranks, split by whether the
    two ranks share a node.
    """
    world = nnodes * nproc
    intra = nnodes * nproc * (nproc - 1)
    inter = world * (world - 1) - intra
    return TransportSummary(
        intra={Transport.SOCKET.value: intra} if intra else {},
        inter={Transport.SOCKET.value: inter} if inter else {},
        version=None,
        ib_devices={},
        networks=["Socket"],
        warnings=[],
        vias={"Gloo/TCP": world * (world - 1)} if world > 1 else {},
        backend="gloo",
    )

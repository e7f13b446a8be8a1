"""Reading `NCCL_DEBUG=INFO` output (FIELD_NOTES section 5, issue 11): versions, IB devices, net
plugins, ranks, hosts and every `Channel … via …` connection. kit.verify.nccl turns what is read
here into the transport summary (which link is intra- or inter-node).

Pure functions over text lines, one line at a time (`NcclParser.feed`), so a log of any size is
read in bounded memory: connections are kept once per distinct (comm, process, ranks, transport)
with a count, never once per line.

What real logs look like (fixtures with their sources in tests/fixtures/nccl_public/):
- any prefix before NCCL's own `host:pid:tid [dev] NCCL INFO`: mpirun's `[1,23]<stdout>:`, Ray's
  `(pid=1234)` / `(RayWorkerWrapper pid=…, ip=…)` with ANSI colours, CloudWatch's
  `| 2024-…Z |`, Python logging's `2025-… - INFO - `; several records glued onto one line by
  interleaved writers; a timestamp line between every record. Nothing anchors at line start.
- connection lines from NCCL 2.4 to 2.29: `Ring 00 : 43 -> 44 [receive] via NET/Socket/0` (no
  brackets), `Ring 00 : 0[0] -> 1[1] via direct shared memory` (SHM's old name),
  `Channel 00 : 0[1b000] -> 1[1c000]` (bus ids, <= 2.17), `Channel 00/0 : 26[2] -> 30[6]`
  (cuda devices, 2.18+), `via NET/AWS Libfabric/1(2)/GDRDMA/Shared` (plugin, PXN proxy rank,
  shared buffers), `via NET/IB/1/GDRDMA(PCI)`.
- NET between two GPUs of ONE host (NCCL_P2P_DISABLE/NCCL_SHM_DISABLE, NCCL_P2P_LEVEL=LOC, a
  single process driving all GPUs) is intra-node traffic through a NIC or TCP loopback, not
  cross-node. Hosts are told apart by NCCL's host prefix and pid, `nNodes`/`localRanks`,
  `ncclCommInitRank` lines and nccl-tests' `Rank N … Pid P on HOST` table; a hostname alone is
  not trusted when the log says there are more nodes than distinct hostnames (containers that
  all call themselves the same, hostnames redacted before posting).
- GPU bus ids (`Init COMPLETE … busId 1b000`, `0[1b000] -> 8[1b000]` up to NCCL 2.17): NCCL
  refuses two ranks of one communicator on one GPU of one host (`Duplicate GPU detected`), so two
  ranks with the same bus id sit on two hosts, whatever their hostnames say.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any


class Transport(str, Enum):
    """A connection's transport, best first within each scope."""

    P2P = "p2p"  # NVLink or PCIe peer to peer (P2P/CUMEM, P2P/IPC, P2P/direct pointer)
    SHM = "shm"  # same node through host memory
    IB_GDR = "ib-gdr"  # InfiniBand/RoCE with GPUDirect RDMA
    IB = "ib"  # InfiniBand/RoCE staged through host memory
    PLUGIN = "plugin"  # a net plugin (IBext, AWS Libfabric, OFI …)
    SOCKET = "socket"  # TCP sockets: the slow fallback
    OTHER = "other"


# NCCL's own prefix `host:pid:tid [dev] NCCL INFO`; anything may stand before it.
PREFIX = re.compile(r"(?<![\w.\-])(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[[^\]]*\]\s+NCCL\s+(?:INFO|WARN)")
# What NCCL prints after `via`: `NET/IB/1(4)/GDRDMA(PCI)/Shared`. Nothing else, so that what
# follows without a space (an ANSI colour reset, U+FFFD from a bad byte, Ray's dedup note) stays
# out of the label.
_VIA_TOKEN = r"(?:[A-Za-z0-9_./\-]|\([A-Za-z0-9]+\))+"
# `Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0/GDRDMA`; `Ring 00 : 43 -> 44 [receive] via …`.
_CHANNEL = re.compile(
    r"(?:Channel|Ring)\s+(?P<channel>\d+)(?:/\d+)?\s*:\s*"
    r"(?P<src>\d+)(?:\[(?P<src_dev>[0-9a-fA-Fx]+)\])?\s*->\s*(?P<dst>\d+)(?:\[(?P<dst_dev>[0-9a-fA-Fx]+)\])?"
    r"(?:\s*\[(?P<dir>send|receive)\])?\s+via\s+"
    rf"(?P<via>direct shared memory|(?:P2P/direct pointer|NET/AWS Libfabric)(?:{_VIA_TOKEN})?|{_VIA_TOKEN})"
)
# Banners: `NCCL version 2.21.5+cuda12.4` (bare, or after `NCCL INFO`, or after an mpirun/Ray
# prefix), torch's `…, NCCL version 2.7.8`, torch's tuple `NCCL version: (2, 21, 5)`.
_VERSION = re.compile(
    r"NCCL version:?\s*\(?(?P<a>\d+)(?:\.|,\s*)(?P<b>\d+)(?:\.|,\s*)(?P<c>\d+)\)?(?:\+cuda(?P<cuda>[\d.]+))?"
)
# Where the banner is missing: vLLM's `vLLM is using nccl==2.20.5`, an environment dump's
# `NCCL_VERSION=2.19.3-1` (NGC images set it), nccl-tests' `nccl-library=22105`.
# In that order of trust: NCCL_VERSION names the system libnccl of an NGC image, which a pip
# torch (bundling its own NCCL) need not load.
_VERSION_OTHER = re.compile(
    r"(?P<src>nccl==|NCCL_VERSION\s*[=:]\s*[\"']?|NCCL_VERSION\s+)(?P<v>\d+\.\d+\.\d+)|nccl-library=(?P<code>\d{4,5})\b"
)
# torch.cuda.nccl.version(): the NCCL torch loaded, as a tuple, on the call's line
# (`torch.cuda.nccl.version() = (2, 21, 5)`) or on the next line, as Python prints it
# (`>>> torch.cuda.nccl.version()` / `(2, 19, 3)`; pytorch/pytorch#122571).
_TORCH_TUPLE = re.compile(r"\(\s*(?P<a>\d+),\s*(?P<b>\d+),\s*(?P<c>\d+)\s*(?:,[^)]*)?\)")
VERSION_SOURCES = ("banner", "nccl==", "torch", "nccl-library", "NCCL_VERSION")
_CUDA_DRIVER = re.compile(r"cudaDriverVersion\s+(?P<v>\d+)")
# `NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB ib0:10.0.0.1<0>`; `[RO]` is a flag,
# not a device, and follows `NET/IB : No device found.` when there is no card at all. 2.19+
# groups merged ports: `[0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE}`.
_IB_USING = re.compile(r"NET/IB\s*:\s*Using\s+(?P<rest>.*)")
_IB_DEVICE = re.compile(r"\[\d+\]\s*(?P<dev>[\w.\-]+):(?P<port>\d+)/(?P<layer>IB|RoCE)")
_NETWORK = re.compile(r"Using network (?P<net>\S.*?)\s*$")
_PLUGIN = re.compile(r"P2P plugin (?P<name>\S+)|Initialized NET plugin (?P<init>\S.*?)\s*$")
_INIT_RANK = re.compile(
    r"ncclCommInitRank\w*\s*(?:comm\s+\S+\s+)?rank\s+(?P<rank>\d+)\s+nranks\s+(?P<nranks>\d+)"
    r".*?commId\s+(?P<comm>0x[0-9a-fA-F]+)"
)
# `ncclCommInitRank comm 0x… rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 18000 commId 0x… - Init
# COMPLETE`; before 2.12 `comm 0x… rank 0 nranks 2 cudaDev 0 busId 1b000 - Init COMPLETE`.
_INIT_BUS = re.compile(
    r"rank\s+(?P<rank>\d+)\s+nranks\s+\d+\s+cudaDev\s+\d+\s+(?:nvmlDev\s+\d+\s+)?busId\s+(?P<bus>[0-9a-fA-F]+)"
    r"(?:\s+commId\s+(?P<comm>0x[0-9a-fA-F]+))?"
)
# `comm 0x… rank 1 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0`
_NNODES = re.compile(
    r"(?:rank\s+(?P<rank>\d+)\s+)?nRanks\s+(?P<nranks>\d+)\s+nNodes\s+(?P<nnodes>\d+)"
    r"(?:\s+localRanks\s+(?P<local>\d+))?"
)
# nccl-tests: `#  Rank  0 Group  0 Pid 1789224 on H20-GPU-05 device  0 [0000:18:00] NVIDIA H20`
_TESTS_RANK = re.compile(r"Rank\s+(?P<rank>\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(?P<pid>\d+)\s+on\s+(?P<host>\S+)\s+device")
# `Bootstrap : Using [0]eth0:10.0.0.2<0>` / `Bootstrap: Using eth0:10.0.0.2<0>`: the process's IP.
_BOOTSTRAP = re.compile(r"Bootstrap\s*:\s*Using\s+(?:\[\d+\])?(?P<iface>[^:\s]+):(?P<addr>[^<\s]+)<")
# Ray's process tag carries the node IP: `(RayWorkerWrapper pid=581, ip=10.225.128.18)`.
_RAY_IP = re.compile(r"\(\w*\s*pid=\d+,\s*ip=(?P<ip>[\d.]+)\)")

MAX_LINE = 1 << 16  # longer lines are read in pieces (a binary file may have no newline at all)
MAX_WARNINGS = 50


def classify_via(via: str) -> Transport:
    """The transport of `via` text: `P2P/CUMEM/read` -> P2P, `NET/IB/0/GDRDMA` -> IB_GDR."""
    v = via.strip()
    if v.startswith("P2P"):
        return Transport.P2P
    if v.startswith("SHM") or v == "direct shared memory":
        return Transport.SHM
    if v.startswith("NET/"):
        net = net_name(v)
        if net == "Socket":
            return Transport.SOCKET
        if net == "IB":
            return Transport.IB_GDR if "GDRDMA" in v else Transport.IB
        return Transport.PLUGIN  # IBext_v8, AWS Libfabric, OFI, …
    return Transport.OTHER  # CollNet, NVLS …


def net_name(via: str) -> str:
    """`NET/AWS Libfabric/1(2)/GDRDMA/Shared` -> `AWS Libfabric`; `` for non-NET transports."""
    if not via.startswith("NET/"):
        return ""
    return via.split("/")[1] if "/" in via[4:] else via[4:]


def label_of(via: str) -> str:
    """The transport without device index, proxy rank and flags: `P2P/IPC/read` -> `P2P/IPC`,
    `SHM/direct/direct` and `direct shared memory` -> `SHM`, `NET/IB/0/GDRDMA(PCI)` ->
    `NET/IB+GDRDMA`, `NET/AWS Libfabric/1(2)/GDRDMA/Shared` -> `NET/AWS Libfabric+GDRDMA`."""
    v = via.strip()
    if v.startswith("SHM") or v == "direct shared memory":
        return "SHM"
    if v.startswith("P2P/"):
        parts = v.split("/")
        return f"P2P/{parts[1]}" if len(parts) > 1 else "P2P"
    if v.startswith("NET/"):
        return f"NET/{net_name(v)}" + ("+GDRDMA" if "GDRDMA" in v else "")
    return v.split("/")[0]


@dataclass(frozen=True)
class Connection:
    """One distinct `Channel … via …` connection (several channels and repeats counted)."""

    host: str | None  # NCCL's host prefix of the line, if present
    pid: int | None
    channel: int  # the first channel seen
    src: int
    dst: int
    direction: str  # "send", "receive" or "" (intra-node lines carry no direction)
    via: str  # raw transport text, e.g. "P2P/CUMEM/read"
    transport: Transport
    comm: str | None = None  # commId of the communicator the process initialised last
    count: int = 1  # lines (channels) with this connection
    line: int = 0  # 1-based line number of the first one


@dataclass
class NcclLog:
    """What one or more NCCL logs say: versions, IB devices, plugin and every connection."""

    versions: set[str] = field(default_factory=set)  # from banners
    other_versions: dict[str, set[str]] = field(default_factory=dict)  # source -> versions
    cuda_driver: str | None = None  # from `cudaDriverVersion 12040` -> "12.4"
    ib_devices: dict[str, str] = field(default_factory=dict)  # "mlx5_0:1" -> "IB" | "RoCE"
    networks: set[str] = field(default_factory=set)  # "Socket", "IB", "IBext_v8", …
    plugins: set[str] = field(default_factory=set)  # "IBext_v8", "AWS Libfabric", …
    connections: list[Connection] = field(default_factory=list)
    # commId ("" when unknown) -> rank -> host, from init lines, nccl-tests' rank table and the
    # local side of connection lines.
    # Values are node keys: the hostname, plus `@ip` when the process printed its bootstrap IP
    # (containers on different nodes may share a hostname; two processes of one node share both).
    rank_hosts: dict[str, dict[int, str]] = field(default_factory=dict)
    rank_procs: dict[str, dict[int, tuple[str, int]]] = field(default_factory=dict)  # same, (host, pid)
    bootstrap: dict[tuple[str, int], str] = field(default_factory=dict)  # (host, pid) -> IP
    ambiguous: set[str] = field(default_factory=set)  # rank maps that mix communicators
    # commId ("" when unknown) -> rank -> GPU bus id ("1b000"), from init lines and old brackets
    rank_bus: dict[str, dict[int, str]] = field(default_factory=dict)
    bus_ambiguous: set[str] = field(default_factory=set)  # a rank with two bus ids: mixed comms
    min_hosts: int = 0  # hosts the log spans at least: most ranks of one map on one bus id
    comm_nnodes: dict[str, int] = field(default_factory=dict)  # commId -> nNodes
    nnodes: int | None = None  # largest `nNodes` any communicator reported
    processes: set[tuple[str, int]] = field(default_factory=set)  # (host, pid) of NCCL lines
    ray_ips: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)  # NCCL WARN lines (first MAX_WARNINGS)
    warning_count: int = 0
    lines: int = 0
    # Things left out once the parser held MAX_ENTRIES distinct ones (connections, ranks,
    # hosts, versions): a log of a million distinct transports stays bounded (issue 27).
    dropped: int = 0


MAX_ENTRIES = 100_000  # distinct connections, ranks, hosts, ... (a 512-GPU job logs ~10,000)


class NcclParser:
    """Incremental parser: `feed` one line at a time, then `log`. Memory is bounded by the
    topology (distinct connections, ranks, hosts), not by the length of the log, and the
    topology by MAX_ENTRIES: what a log names beyond that is counted in `log.dropped`."""

    def __init__(self) -> None:
        self.log = NcclLog()
        self._last_comm: dict[tuple[str, int], str] = {}
        self._conns: dict[tuple[object, ...], Connection] = {}
        self._counts: Counter[tuple[object, ...]] = Counter()
        self._torch_call = False  # the last line called torch's nccl.version(): a tuple may follow
        self._entries = 0

    def _room(self) -> bool:
        """One more distinct entry, if the parser holds fewer than MAX_ENTRIES."""
        if self._entries >= MAX_ENTRIES:
            self.log.dropped += 1
            return False
        self._entries += 1
        return True

    def _add(self, into: set[Any], item: Any) -> None:
        if item not in into and self._room():
            into.add(item)

    def _put(self, into: dict[Any, Any], key: Any, value: Any) -> None:
        if key in into or self._room():
            into[key] = value

    def _group(self, into: dict[Any, Any], key: Any) -> Any:
        """The inner collection under `key` (a new one counts as an entry; when there is no room,
        a throwaway one that is never kept)."""
        found = into.get(key)
        if found is None:
            found = {} if into is not self.log.other_versions else set()
            if self._room():
                into[key] = found
        return found

    def feed(self, raw: str, lineno: int | None = None) -> None:
        log = self.log
        log.lines += 1
        n = lineno if lineno is not None else log.lines
        if self._torch_call and (text := raw.strip()):
            self._torch_call = False
            if m := _TORCH_TUPLE.fullmatch(text):
                self._add(self._group(log.other_versions, "torch"), f"{m['a']}.{m['b']}.{m['c']}")
                return
        if "NCCL" not in raw and "via" not in raw and "nccl" not in raw and "Rank" not in raw:
            return
        line = raw.rstrip("\r\n")
        if "pid=" in line and (ip := _RAY_IP.search(line)):
            self._add(log.ray_ips, ip.group("ip"))
        # Interleaved writers glue records together: split at every NCCL prefix.
        starts = list(PREFIX.finditer(line))
        if len(starts) <= 1:
            self._segment(line, starts[0] if starts else None, n)
            return
        if starts[0].start() > 0:
            self._segment(line[: starts[0].start()], None, n)
        for i, m in enumerate(starts):
            end = starts[i + 1].start() if i + 1 < len(starts) else len(line)
            self._segment(line[m.start() : end], PREFIX.match(line, m.start(), end), n)

    def _segment(self, text: str, prefix: re.Match[str] | None, n: int) -> None:
        log = self.log
        host = prefix.group("host") if prefix else None
        pid = int(prefix.group("pid")) if prefix else None
        if host is not None and pid is not None:
            self._add(log.processes, (host, pid))
        if "NCCL WARN" in text:
            log.warning_count += 1
            if len(log.warnings) < MAX_WARNINGS:
                log.warnings.append(text.strip()[:500])
        if " via " in text:
            found = False
            for cm in _CHANNEL.finditer(text):
                self._connection(cm, host, pid, n)
                found = True
            if found:
                return
        if not self._version(text):
            self._topology(text, host, pid)

    def _version(self, text: str) -> bool:
        """Read a line that names a version (NCCL's, from any source) or the CUDA driver's."""
        log = self.log
        # Cheap literal guards first: most NCCL INFO lines match none of these (nor of _topology's).
        if "ersion" in text and (m := _VERSION.search(text)):
            self._add(log.versions, f"{m.group('a')}.{m.group('b')}.{m.group('c')}")
        elif "nccl.version()" in text:
            after = text[text.index("nccl.version()") + len("nccl.version()") :]
            if m := _TORCH_TUPLE.search(after):
                self._add(self._group(log.other_versions, "torch"), f"{m['a']}.{m['b']}.{m['c']}")
            else:
                self._torch_call = True  # Python prints the result on the next line
        elif ("nccl" in text or "NCCL_VERSION" in text) and (m := _VERSION_OTHER.search(text)):
            if m.group("v"):
                src = "nccl==" if m.group("src") == "nccl==" else "NCCL_VERSION"
                self._add(self._group(log.other_versions, src), m.group("v"))
            else:
                decoded = _decode_version_code(int(m.group("code")))
                self._add(self._group(log.other_versions, "nccl-library"), decoded)
        elif "cudaDriverVersion" in text and (m := _CUDA_DRIVER.search(text)):
            code = int(m.group("v"))
            log.cuda_driver = f"{code // 1000}.{code % 1000 // 10}"
        else:
            return False
        return True

    def _topology(self, text: str, host: str | None, pid: int | None) -> None:
        """Read a line about the network, the ranks or the hosts (none of its versions)."""
        log = self.log
        if "NET/IB" in text and (m := _IB_USING.search(text)):
            for dev in _IB_DEVICE.finditer(m.group("rest")):
                self._put(log.ib_devices, f"{dev.group('dev')}:{dev.group('port')}", dev.group("layer"))
        elif "Using network" in text and (m := _NETWORK.search(text)):
            self._add(log.networks, m.group("net"))
        elif "plugin" in text and (m := _PLUGIN.search(text)):
            name = (m.group("name") or m.group("init") or "").strip()
            if name and name not in ("IB", "Socket"):
                self._add(log.plugins, name)
        elif "Init" in text and "busId" in text and (m := _INIT_BUS.search(text)):
            # Only init lines: a `Destroy COMPLETE` line carries no commId to say whose rank it is.
            self._bus(m.group("comm") or "", int(m.group("rank")), m.group("bus"))
            if "ncclCommInitRank" in text and (m := _INIT_RANK.search(text)):
                self._init_rank(m, host, pid)
        elif "ncclCommInitRank" in text and (m := _INIT_RANK.search(text)):
            self._init_rank(m, host, pid)
        elif "Bootstrap" in text and (m := _BOOTSTRAP.search(text)):
            if host is not None and pid is not None:
                self._put(log.bootstrap, (host, pid), m.group("addr"))
        elif "nNodes" in text and (m := _NNODES.search(text)):
            nnodes = int(m.group("nnodes"))
            if m.group("local") is not None and int(m.group("local")) == int(m.group("nranks")):
                nnodes = 1  # every rank is local
            log.nnodes = max(log.nnodes or 0, nnodes)
            comm = self._last_comm.get((host, pid)) if host is not None and pid is not None else None
            if comm is not None:
                self._put(log.comm_nnodes, comm, max(log.comm_nnodes.get(comm, 0), nnodes))
        elif "Pid" in text and (m := _TESTS_RANK.search(text)):
            rank, proc = int(m.group("rank")), (m.group("host"), int(m.group("pid")))
            self._put(self._group(log.rank_hosts, ""), rank, m.group("host"))
            self._put(self._group(log.rank_procs, ""), rank, proc)

    def _init_rank(self, m: re.Match[str], host: str | None, pid: int | None) -> None:
        comm, log = m.group("comm"), self.log
        if host is not None:
            rank = int(m.group("rank"))
            self._put(self._group(log.rank_hosts, comm), rank, self._node(host, pid))
            if pid is not None:
                self._put(self._last_comm, (host, pid), comm)
                self._put(self._group(log.rank_procs, comm), rank, (host, pid))

    def _bus(self, comm: str, rank: int, bus: str) -> None:
        bus = bus.lower().removeprefix("0x").lstrip("0") or "0"
        buses = self._group(self.log.rank_bus, comm)
        if rank not in buses:
            self._put(buses, rank, bus)
        elif buses[rank] != bus:
            self._add(self.log.bus_ambiguous, comm)  # lines of several communicators in one map

    def _connection(self, m: re.Match[str], host: str | None, pid: int | None, n: int) -> None:
        via = m.group("via")
        comm = self._last_comm.get((host, pid)) if host is not None and pid is not None else None
        src, dst, direction = int(m.group("src")), int(m.group("dst")), m.group("dir") or ""
        # NCCL <= 2.17 put bus ids in the brackets (`0[1b000]`), 2.18+ the cuda device (`0[0]`),
        # which every process of vLLM or Ray sees as 0: only what cannot be a device counts.
        for rank, dev in ((src, m.group("src_dev")), (dst, m.group("dst_dev"))):
            if dev and (len(dev) > 2 or not dev.isdigit()):
                self._bus(comm or "", rank, dev)
        if host is not None and pid is not None:
            # The local side of a connection lives in the line's process: the sender of [send],
            # the receiver of [receive], both ends of an intra-node (direction-less) line.
            nodes = self._group(self.log.rank_hosts, comm or "")
            procs = self._group(self.log.rank_procs, comm or "")
            node = self._node(host, pid)
            ends = [src] if direction != "receive" else []
            if direction == "send" or (not direction and via.startswith("NET/")):
                pass  # a NET line without a direction (NCCL 2.4 blogs) proves nothing about dst
            else:
                ends.append(dst)
            for rank in ends:
                if rank not in nodes:
                    self._put(nodes, rank, node)
                elif nodes[rank] != node:
                    # One rank number on two nodes: lines of several communicators (vLLM's TP,
                    # PP and world groups) landed in one map. It proves nothing any more.
                    self._add(self.log.ambiguous, comm or "")
            # The line's own process is the sender, unless the line says [receive].
            if (dst if direction == "receive" else src) not in procs:
                self._put(procs, dst if direction == "receive" else src, (host, pid))
        key = (comm, host, pid, src, dst, direction, via)
        if key in self._conns:
            self._counts[key] += 1
            return
        if not self._room():
            return
        self._counts[key] += 1
        conn = Connection(
            host=host,
            pid=pid,
            channel=int(m.group("channel")),
            src=src,
            dst=dst,
            direction=direction,
            via=via,
            transport=classify_via(via),
            comm=comm,
            count=1,
            line=n,
        )
        self._conns[key] = conn

    def _node(self, host: str, pid: int | None) -> str:
        ip = self.log.bootstrap.get((host, pid)) if pid is not None else None
        return f"{host}@{ip}" if ip else host

    def result(self) -> NcclLog:
        conns = [replace(c, count=self._counts[k]) for k, c in self._conns.items()]
        self.log.connections = sorted(conns, key=lambda c: c.line)
        maps = [m for key, m in self.log.rank_bus.items() if key not in self.log.bus_ambiguous]
        self.log.min_hosts = max((max(Counter(m.values()).values()) for m in maps if m), default=0)
        return self.log


def _decode_version_code(code: int) -> str:
    """NCCL_VERSION_CODE: 2.9+ is major*10000 + minor*100 + patch, before that *1000."""
    if code >= 20900:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def parse_log(lines: Iterable[str]) -> NcclLog:
    """Parse NCCL_DEBUG=INFO output (any prefix, several processes interleaved)."""
    parser = NcclParser()
    for line in lines:
        parser.feed(line)
    return parser.result()

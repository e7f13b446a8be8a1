"""Checks of the collective: correctness, the intra- and inter-node transport against `--expect`,
and bus bandwidth against a floor per link type.

Net plugins (NET/IBext*, NET/AWS Libfabric, NET/OFI, any other NET/<name> than IB and Socket)
carry RDMA fabrics (InfiniBand through HPC-X, EFA, Slingshot). The policy treats them like
NET/IB: `ib` accepts a plugin with or without GPUDirect RDMA; `ib-gdr` (and `auto`/`nvlink` on
nodes with RDMA ports) accept it only when every inter-node plugin link shows /GDRDMA;
`socket-ok` accepts anything. Reasons name the plugin and whether GDRDMA is used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kit.verify.checks import FAIL, IB_FIX, PASS, WARN, Check
from kit.verify.facts import CollectiveFacts, CollectiveRun, NodeFacts
from kit.verify.nccl import Transport, TransportSummary

EXPECTS = ("auto", "nvlink", "ib-gdr", "ib", "socket-ok")

# Bus-bandwidth floors (GB/s, at the largest size measured) by the slowest link type seen.
# Deliberately low: below them something is wrong, not merely old hardware.
# 2x H200 NV18 gives ~327 (P2P), 28 (SHM), 4 (Socket); one NDR NIC ~46 cross-node.
FLOORS_GBPS: dict[str, float] = {
    "nvlink": 100.0,
    Transport.P2P.value: 8.0,  # P2P over PCIe
    Transport.SHM.value: 5.0,
    Transport.IB_GDR.value: 10.0,
    Transport.PLUGIN.value: 5.0,
    Transport.IB.value: 5.0,
    Transport.SOCKET.value: 0.5,
}

_LABEL = {
    Transport.P2P.value: "P2P",
    Transport.SHM.value: "SHM",
    Transport.IB_GDR.value: "NET/IB+GDRDMA",
    Transport.IB.value: "NET/IB",
    Transport.PLUGIN.value: "NET/plugin",
    Transport.SOCKET.value: "NET/Socket",
    Transport.OTHER.value: "other",
}


def check_collective(
    coll: CollectiveFacts,
    summary: TransportSummary | None,
    *,
    expect: str,
    nodes: Mapping[str, NodeFacts],
) -> list[Check]:
    """Correctness of every collective run, then (NCCL) the transports and bandwidth, or (Gloo)
    what TCP can and cannot meet."""
    if expect not in EXPECTS:
        raise ValueError(f"unknown expectation {expect!r}")
    if not coll.ok:
        names = " and ".join(r.name for r in coll.runs) or "all-reduce"
        return [
            Check(
                "collective",
                FAIL,
                f"{names} failed: {coll.error}",
                "see the NCCL lines (kit verify --json) or run `kit diagnose` on the logs",
            )
        ]
    checks = [check_correct(run, coll) for run in coll.runs]
    checks += [check_latency_sum(run) for run in coll.runs if run.latency_correct is False]
    if coll.backend == "gloo":
        return checks + check_gloo(expect, coll.nnodes)
    if coll.backend != "nccl" or summary is None:
        return checks
    is_nvlinked = _all_nvlinked(nodes)
    ports = sorted({p for f in nodes.values() for p in f.infiniband.active_ports} | set(summary.ib_devices))
    checks.append(check_intra(summary, expect, is_nvlinked, coll.nccl_env))
    checks.append(check_inter(summary, expect, ports, nodes, coll.nnodes))
    for run in coll.runs:
        checks.extend(check_bandwidth(run, summary, is_nvlinked))
    return checks


def _all_nvlinked(nodes: Mapping[str, NodeFacts]) -> bool | None:
    """True when every node's GPUs are all NVLinked, False when some node's are not, else None."""
    links = [f.all_nvlink for f in nodes.values()]
    if links and all(v is True for v in links):
        return True
    return False if False in links else None


def check_correct(run: CollectiveRun, coll: CollectiveFacts) -> Check:
    if run.name == "all-reduce":
        check, good, bad = "collective.correct", "gave the right sum", "all-reduce gave a wrong sum"
    else:
        how = run.method or "all_to_all_single"
        how += f"; {run.fallback_reason}" if run.fallback_reason else ""
        check = "collective.all_to_all.correct"
        good, bad = f"delivered every chunk to its rank ({how})", f"all-to-all delivered wrong data ({how})"
    if run.correct:
        return Check(check, PASS, f"{run.name} over {coll.world_size} ranks ({coll.backend}) {good}")
    return Check(check, FAIL, bad, "check GPU health (nvidia-smi -q, dmesg Xid) and NCCL_PROTO/ALGO overrides")


def check_latency_sum(run: CollectiveRun) -> Check:
    """The decode-latency all-reduce (issue 30) runs on NCCL too, through another path (ctypes,
    CUDA graphs): a wrong sum there is a broken GPU or NCCL as much as in the bandwidth loop."""
    return Check(
        "collective.latency.correct",
        FAIL,
        f"the decode-latency all-reduce ({run.latency_method}) gave a wrong sum",
        "check GPU health (nvidia-smi -q, dmesg Xid) and NCCL_PROTO/ALGO overrides",
    )


def check_gloo(expect: str, nnodes: int) -> list[Check]:
    """No GPUs: the collective ran on Gloo, whose links are all TCP sockets (it prints no NCCL
    lines to classify). Fine for CPU nodes; a policy that asks for more cannot be met."""
    checks = []
    gloo_fix = "give the nodes GPUs (accelerator: gpu) so the collective runs on NCCL, or use --expect socket-ok"
    if expect == "nvlink":
        checks.append(
            Check(
                "transport.intra",
                FAIL,
                "--expect nvlink needs NVLinked GPUs, but the collective ran on Gloo (no GPUs)",
                gloo_fix,
            )
        )
    if nnodes <= 1:
        checks.append(Check("transport.inter", PASS, "single node: no inter-node links"))
    elif expect in ("ib-gdr", "ib"):
        need = "InfiniBand with GPUDirect RDMA" if expect == "ib-gdr" else "InfiniBand/RoCE"
        checks.append(
            Check(
                "transport.inter",
                FAIL,
                f"inter-node links use Socket (Gloo over TCP, no GPUs) but --expect {expect} needs {need}",
                gloo_fix,
            )
        )
    else:
        checks.append(Check("transport.inter", PASS, f"inter-node: Socket (Gloo over TCP) across {nnodes} nodes"))
    return checks


def check_intra(s: TransportSummary, expect: str, is_nvlinked: bool | None, env: Mapping[str, str]) -> Check:
    """Links between GPUs of one node: P2P where they are NVLinked (or --expect nvlink asks for it)."""
    worst = s.intra_worst
    if worst is None:
        return Check("transport.intra", PASS, "no intra-node links (one GPU per node)")
    seen = _names(s.intra)
    disabled = [k for k in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE") if env.get(k) not in (None, "", "0")]
    fix = f"unset {' and '.join(disabled)}" if disabled else "run containers with --ipc=host and check NCCL_P2P_LEVEL"
    need_p2p = expect == "nvlink" or (expect == "auto" and is_nvlinked is True)
    if need_p2p and worst is not Transport.P2P:
        why = "although the GPUs are NVLinked" if is_nvlinked else "but --expect nvlink needs P2P"
        return Check("transport.intra", FAIL, f"intra-node links use {seen} {why}", fix)
    if expect == "nvlink" and is_nvlinked is False:
        return Check(
            "transport.intra",
            FAIL,
            f"intra-node links use {seen} but the GPUs are not NVLinked (nvidia-smi topo -m)",
            "use --expect auto on PCIe machines",
        )
    if worst not in (Transport.P2P, Transport.SHM) and expect != "socket-ok":
        via_net = _labels(s.intra_labels) or seen
        return Check(
            "transport.intra", WARN, f"intra-node via NET (GPUs of one host talk through the network): {via_net}", fix
        )
    return Check("transport.intra", PASS, f"intra-node: {_labels(s.intra_labels) or seen}")


def check_inter(
    s: TransportSummary,
    expect: str,
    ports: Sequence[str],
    nodes: Mapping[str, NodeFacts],
    nnodes: int,
) -> Check:
    """Links between nodes: RDMA (with GPUDirect where expected) unless --expect socket-ok."""
    worst = s.inter_worst
    if worst is None:
        if nnodes > 1:
            return Check(
                "transport.inter",
                WARN,
                f"{nnodes} nodes but no inter-node connection in the NCCL output",
                "rerun with NCCL_DEBUG=INFO not filtered (NCCL_DEBUG_SUBSYS)",
            )
        return Check("transport.inter", PASS, "single node: no inter-node links")
    seen = _labels(s.inter_labels) or _names(s.inter)
    if s.inter_plugin:
        seen += f" (net plugin {s.inter_plugin}, {'GDRDMA' if s.inter_gdrdma else 'no GDRDMA'})"
    need_gdr = expect == "ib-gdr" or (expect in ("auto", "nvlink") and bool(ports))
    if worst is Transport.SOCKET:
        return _inter_socket(seen, expect, ports, nodes, need_rdma=need_gdr or expect == "ib")
    if need_gdr and not (worst is Transport.IB_GDR or (worst is Transport.PLUGIN and s.inter_gdrdma is True)):
        gdr = [n for n, f in nodes.items() if ports and not f.infiniband.gdr_module]
        fix = (
            f"modprobe nvidia_peermem on {', '.join(gdr)}"
            if gdr
            else "check NCCL_NET_GDR_LEVEL and the GPU-NIC PCIe topology"
        )
        return Check("transport.inter", FAIL, f"inter-node links use {seen} without GPUDirect RDMA", fix)
    if worst is Transport.PLUGIN and expect == "ib":
        return Check("transport.inter", PASS, f"inter-node: {seen}: an RDMA net plugin meets --expect ib")
    return Check("transport.inter", PASS, f"inter-node: {seen}")


def _inter_socket(
    seen: str, expect: str, ports: Sequence[str], nodes: Mapping[str, NodeFacts], *, need_rdma: bool
) -> Check:
    """Inter-node traffic over TCP sockets: a failure where RDMA is expected, else slow."""
    present = f"although {', '.join(ports)} is present" if ports else "and no RDMA device is present"
    if need_rdma:
        no_dev = [n for n, f in nodes.items() if f.infiniband.active_ports and not f.infiniband.uverbs]
        where = f" (no /dev/infiniband in {', '.join(no_dev)})" if no_dev else ""
        return Check("transport.inter", FAIL, f"inter-node links use NET/Socket {present}{where}", IB_FIX)
    if expect == "socket-ok":
        return Check("transport.inter", PASS, f"inter-node: {seen} (socket-ok)")
    return Check(
        "transport.inter",
        WARN,
        f"inter-node links use NET/Socket {present}: slow",
        "use an RDMA network (IB/RoCE) for tensor parallelism across nodes",
    )


def check_bandwidth(run: CollectiveRun, s: TransportSummary, is_nvlinked: bool | None) -> list[Check]:
    """busbw at the largest size against the floor of the slowest link. The same floors serve
    the all-to-all: nccl-tests' alltoall busbw is scaled to be compared with the link too."""
    check = "bandwidth" if run.name == "all-reduce" else "bandwidth.all_to_all"
    results = [r for r in run.results if r.bytes >= 32 << 20]
    worst = s.inter_worst or s.intra_worst
    if not results or worst is None:
        return []
    top = max(results, key=lambda r: r.bytes)
    link = "nvlink" if worst is Transport.P2P and is_nvlinked and not s.inter else worst.value
    floor = FLOORS_GBPS.get(link)
    what = "" if run.name == "all-reduce" else f"{run.name} "
    text = f"{what}busbw {top.busbw_gbps} GB/s at {_size(top.bytes)} over {_LABEL.get(link, link)}"
    if floor is not None and top.busbw_gbps < floor:
        return [
            Check(
                check,
                WARN,
                f"{text}, below the {floor:g} GB/s floor for this link",
                "check for other GPU jobs, PCIe/NVLink errors (nvidia-smi nvlink -e) and NIC speed",
            )
        ]
    return [Check(check, PASS, text)]


def _names(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{_LABEL.get(k, k)} x{v}" for k, v in counts.items())


def _labels(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))


def _size(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 and n % (1 << 30) == 0 else f"{n >> 20} MiB"

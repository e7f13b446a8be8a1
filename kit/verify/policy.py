"""The verification gate: node facts + collective results -> checks that pass, warn or fail.

Pure functions over the probes' JSON (kit.verify.probe, kit.verify.collective) and the NCCL
transport summary (kit.verify.nccl). Every check has a one-line reason and, unless it passed,
a fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kit.verify.nccl import Transport, TransportSummary

if TYPE_CHECKING:
    from kit.plan.exposure import Exposure

EXPECTS = ("auto", "nvlink", "ib-gdr", "ib", "socket-ok")
# Net plugins (NET/IBext*, NET/AWS Libfabric, NET/OFI, any other NET/<name> than IB and Socket)
# carry RDMA fabrics (InfiniBand through HPC-X, EFA, Slingshot). The policy treats them like
# NET/IB: `ib` accepts a plugin with or without GPUDirect RDMA; `ib-gdr` (and `auto`/`nvlink` on
# nodes with RDMA ports) accept it only when every inter-node plugin link shows /GDRDMA;
# `socket-ok` accepts anything. Reasons name the plugin and whether GDRDMA is used.
PASS, WARN, FAIL = "pass", "warn", "fail"
_RANK = {PASS: 0, WARN: 1, FAIL: 2}

SHM_MIN_BYTES = 1 << 30  # Docker's default 64 MB breaks NCCL/Ray (FIELD_NOTES row 6)
# "packages": a fingerprint of every installed distribution (name==version), so a pip tree that
# differs anywhere is caught, not only in the packages named here.
VERSION_KEYS = ("python", "torch", "cuda", "nccl", "vllm", "ray", "kit_probe", "packages", "image_digest")

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

IB_FIX = (
    "start containers with /dev/infiniband, IPC_LOCK and memlock=unlimited "
    "(--device /dev/infiniband --cap-add IPC_LOCK --ulimit memlock=-1) and RDMA userland "
    "(libibverbs, libmlx5) in the image"
)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass | warn | fail
    reason: str
    fix: str | None = None
    node: str | None = None  # None: about the whole cluster

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "node": self.node,
            "status": self.status,
            "reason": self.reason,
            "fix": self.fix,
        }


def overall(checks: Sequence[Check]) -> str:
    return max((c.status for c in checks), key=_RANK.__getitem__, default=PASS)


def _get(d: Mapping[str, Any] | None, *path: str) -> Any:
    cur: Any = d
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def ib_ports(facts: Mapping[str, Any]) -> list[str]:
    """Active InfiniBand/RoCE ports of a node, as `mlx5_0:1/IB`."""
    ports = []
    for d in _get(facts, "infiniband", "devices") or []:
        if str(d.get("state", "")).upper() == "ACTIVE":
            layer = "RoCE" if d.get("link_layer") == "Ethernet" else "IB"
            ports.append(f"{d['device']}:{d['port']}/{layer}")
    return ports


def nvlinked(facts: Mapping[str, Any]) -> bool | None:
    """True when every GPU pair is NVLinked, False when some is not, None when unknown."""
    value = _get(facts, "gpu", "topology", "all_nvlink")
    return value if isinstance(value, bool) else None


# --- per node -------------------------------------------------------------------------------


def check_node(
    node: str,
    facts: Mapping[str, Any],
    *,
    expected_gpus: int | None = None,
    planned_ip: str | None = None,
    accelerator: str = "gpu",
) -> list[Check]:
    checks: list[Check] = []
    gpus = _get(facts, "gpu", "gpus") or []
    torch = _get(facts, "torch") or {}
    n = len(gpus)
    if accelerator == "cpu" and not n:
        checks.append(Check("gpu.count", PASS, "accelerator cpu: no GPUs expected (collective on Gloo)", node=node))
    elif expected_gpus is not None and accelerator != "cpu" and n != expected_gpus:
        checks.append(
            Check(
                "gpu.count",
                FAIL,
                f"{n} GPUs, the plan expects {expected_gpus}",
                "fix --gpus-per-node / the config, or the GPUs given to the container (--gpus all)",
                node,
            )
        )
    elif n:
        models = sorted({f"{g['name']} {round((g.get('memory_mib') or 0) / 1024)} GiB" for g in gpus})
        checks.append(
            Check(
                "gpu.count",
                PASS,
                f"{n} x {', '.join(models)}, driver {gpus[0]['driver']}",
                node=node,
            )
        )
    else:
        checks.append(
            Check(
                "gpu.count",
                WARN,
                "no NVIDIA GPUs found (nvidia-smi): the collective probe runs on Gloo/CPU",
                "pass --gpus all / --nv if GPUs were expected",
                node,
            )
        )
    if torch:
        if not torch.get("importable"):
            checks.append(
                Check(
                    "gpu.cuda",
                    FAIL,
                    f"torch is not importable: {torch.get('error')}",
                    "use the vLLM image's Python (or --python on a host)",
                    node,
                )
            )
        elif n and not torch.get("cuda_available"):
            checks.append(
                Check(
                    "gpu.cuda",
                    FAIL,
                    f"torch {torch.get('version')} cannot use CUDA"
                    f"{': ' + torch['error'] if torch.get('error') else ''}",
                    "match the image's CUDA to the driver; start the container with GPUs",
                    node,
                )
            )
        elif n and torch.get("device_count") != n:
            checks.append(
                Check(
                    "gpu.cuda",
                    FAIL,
                    f"torch sees {torch.get('device_count')} GPUs, nvidia-smi {n}",
                    "check CUDA_VISIBLE_DEVICES",
                    node,
                )
            )
        elif n:
            checks.append(
                Check(
                    "gpu.cuda",
                    PASS,
                    f"torch {torch.get('version')} uses CUDA {torch.get('cuda')} on {n} GPUs",
                    node=node,
                )
            )

    shm = _get(facts, "shm", "size_bytes")
    if shm is None:
        checks.append(Check("node.shm", WARN, "/dev/shm not found", "--ipc=host", node))
    elif shm < SHM_MIN_BYTES:
        checks.append(
            Check(
                "node.shm",
                FAIL,
                f"/dev/shm is {_gib(shm)} (NCCL and Ray need more)",
                "start containers with --ipc=host, or --shm-size sized from host memory",
                node,
            )
        )
    else:
        checks.append(Check("node.shm", PASS, f"/dev/shm {_gib(shm)}", node=node))

    ports = ib_ports(facts)
    lock = _get(facts, "memlock") or {}
    if ports and not lock.get("unlimited"):
        checks.append(
            Check(
                "node.memlock",
                FAIL,
                f"memlock limit {lock.get('soft')} bytes with RDMA devices present",
                "--ulimit memlock=-1 (and --cap-add IPC_LOCK)",
                node,
            )
        )
    else:
        what = "unlimited" if lock.get("unlimited") else f"{lock.get('soft')} bytes (no RDMA in use)"
        checks.append(Check("node.memlock", PASS, f"memlock {what}", node=node))

    if ports:
        opened = _get(facts, "infiniband", "dev_infiniband") or []
        if not opened:
            checks.append(
                Check(
                    "node.rdma",
                    FAIL,
                    f"{', '.join(ports)} present but /dev/infiniband is not available inside the container",
                    IB_FIX,
                    node,
                )
            )
        else:
            checks.append(
                Check(
                    "node.rdma",
                    PASS,
                    f"{', '.join(ports)}; {len(opened)} uverbs devices",
                    node=node,
                )
            )
        if not _get(facts, "infiniband", "gdr_module"):
            checks.append(
                Check(
                    "node.gdr",
                    WARN,
                    "GPUDirect RDMA module (nvidia_peermem) not loaded",
                    "modprobe nvidia_peermem on the host",
                    node,
                )
            )
        else:
            checks.append(Check("node.gdr", PASS, "nvidia_peermem loaded", node=node))
    else:
        checks.append(Check("node.rdma", PASS, "no active InfiniBand/RoCE ports", node=node))

    # The head's Ray view (facts["ray"], cluster mode) supersedes the node's own session file.
    checks.extend(_network_checks(node, _get(facts, "network") or {}, planned_ip, ray_file="ray" not in facts))
    if "ray" in facts:
        checks.append(_ray_check(node, facts["ray"], _get(facts, "network", "node_ip"), planned_ip))
    hf = _get(facts, "hf_cache") or {}
    if hf.get("model"):  # no model asked for (--host without --model): the cache does not matter
        checks.append(_hf_cache_check(node, hf))
    from kit.verify.container_checks import check_container  # what enroot's hooks gave a pyxis/EDF container

    checks.extend(check_container(node, facts))
    return checks


def _hf_cache_check(node: str, hf: Mapping[str, Any]) -> Check:
    if not hf.get("present"):
        return Check(
            "node.hf_cache",
            WARN,
            f"no HF cache at {hf.get('home') or hf.get('hub')}: this node downloads models by itself",
            "mount the same HF cache on every node (config: hf_cache)",
            node,
        )
    return Check("node.hf_cache", PASS, f"HF cache at {hf.get('home') or hf.get('hub')}", node=node)


def _ray_check(node: str, row: Mapping[str, Any] | None, node_ip: str | None, planned_ip: str | None) -> Check:
    """What Ray registered for this node (the head's view, kit.commands.status.ray_view)."""
    ip = planned_ip or node_ip
    fix = f"ray start --node-ip-address {ip} with VLLM_HOST_IP={ip} (kit up does); then `kit up --replace`"
    if row is None:
        return Check("node.ray_ip", FAIL, f"Ray has no alive node registered as {ip}", fix, node)
    registered, host_ip = row.get("ip"), row.get("vllm_host_ip")
    if registered != ip:
        return Check("node.ray_ip", FAIL, f"Ray registered {registered}, the node IP is {ip}", fix, node)
    if host_ip is None:
        return Check(
            "node.ray_ip", WARN, f"Ray registered {registered}; its VLLM_HOST_IP could not be read", None, node
        )
    if host_ip != registered:
        return Check("node.ray_ip", FAIL, f"Ray registered {registered}, VLLM_HOST_IP is {host_ip}", fix, node)
    return Check("node.ray_ip", PASS, f"Ray registered {registered} = VLLM_HOST_IP", node=node)


def _network_checks(node: str, net: Mapping[str, Any], planned_ip: str | None, *, ray_file: bool = True) -> list[Check]:
    ip, iface = net.get("node_ip"), net.get("interface")
    addrs = net.get("interfaces") or {}
    if not ip:
        return [Check("node.ip", FAIL, "no node IP found (no route)", "set VLLM_HOST_IP", node)]
    if addrs and ip not in addrs.values():
        return [
            Check(
                "node.ip",
                FAIL,
                f"VLLM_HOST_IP {ip} is on no interface of this node (container IP vs host IP)",
                "use host networking and the host's IP",
                node,
            )
        ]
    checks = []
    if planned_ip and planned_ip != ip:
        checks.append(
            Check(
                "node.ip",
                FAIL,
                f"node IP {ip} differs from the planned {planned_ip}",
                "pass the planned IP as VLLM_HOST_IP (kit up does)",
                node,
            )
        )
    else:
        checks.append(Check("node.ip", PASS, f"{ip} on {iface or '?'}", node=node))
    ray_ip = net.get("ray_node_ip") if ray_file else None
    if ray_ip and ray_ip != ip:
        checks.append(
            Check(
                "node.ray_ip",
                FAIL,
                f"Ray registered {ray_ip}, vLLM uses {ip}",
                f"ray start --node-ip-address {ip} (and VLLM_HOST_IP={ip})",
                node,
            )
        )
    elif ray_ip:
        checks.append(Check("node.ray_ip", PASS, f"Ray registered {ray_ip}", node=node))
    for var in ("nccl_socket_ifname", "gloo_socket_ifname"):
        value = net.get(var)
        if value and iface and not value.startswith("^") and iface not in value.split(","):
            checks.append(
                Check(
                    f"node.{var}",
                    WARN,
                    f"{var.upper()}={value} but the node IP is on {iface}",
                    f"{var.upper()}={iface}",
                    node,
                )
            )
    return checks


# --- across nodes ---------------------------------------------------------------------------


def version_table(nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, str | None]]:
    """key -> node -> value, for VERSION_KEYS plus the GPU driver."""
    return {
        key: {node: _get(facts, "versions", key) for node, facts in nodes.items()} for key in (*VERSION_KEYS, "driver")
    }


def package_differences(nodes: Mapping[str, Mapping[str, Any]], limit: int = 5) -> list[str]:
    """`six (a 1.17.0, b 1.16.0)` for each installed package whose version differs across nodes."""
    trees = {n: _get(f, "packages") or {} for n, f in nodes.items()}
    names = sorted({p for tree in trees.values() for p in tree})
    out = []
    for name in names:
        seen = {n: tree.get(name) for n, tree in trees.items()}
        if len(set(seen.values())) > 1:
            per_node = ", ".join(f"{n} {v or 'absent'}" for n, v in seen.items())
            out.append(f"{name} ({per_node})")
    return out[:limit] + ([f"and {len(out) - limit} more"] if len(out) > limit else [])


def check_versions(nodes: Mapping[str, Mapping[str, Any]]) -> list[Check]:
    checks = []
    for key, values in version_table(nodes).items():
        distinct = {v for v in values.values()}
        if len(distinct) > 1:
            status = WARN if key == "driver" else FAIL
            detail = ", ".join(f"{n}={v}" for n, v in values.items())
            if key == "packages" and (diff := package_differences(nodes)):
                detail = "; ".join(diff)
            checks.append(
                Check(
                    f"versions.{key}",
                    status,
                    f"{key} differs: {detail}",
                    "run the same image digest on every node (kit pull)",
                )
            )
    if not checks:
        checks.append(Check("versions", PASS, f"identical on {len(nodes)} node(s)"))
    return checks


def check_cluster(
    nodes: Mapping[str, Mapping[str, Any]],
    *,
    expected_nodes: int | None = None,
    ray: Sequence[Mapping[str, Any]] | None = None,
    ray_error: str | None = None,
) -> list[Check]:
    checks = []
    if expected_nodes is not None and len(nodes) != expected_nodes:
        checks.append(
            Check(
                "cluster.nodes",
                FAIL,
                f"{len(nodes)} nodes found, the plan expects {expected_nodes}",
                "start the missing nodes (kit up) or fix --nodes",
            )
        )
    if ray_error:
        checks.append(Check("cluster.ray", FAIL, ray_error, "is the head ready? see `kit logs --role head`"))
    elif ray is not None:
        alive = sorted(str(r.get("ip")) for r in ray if not r.get("lost") and r.get("alive", True))
        want = expected_nodes if expected_nodes is not None else len(nodes)
        if len(alive) < want:
            checks.append(
                Check(
                    "cluster.ray",
                    FAIL,
                    f"Ray sees {len(alive)} alive node(s) ({', '.join(alive) or 'none'}), the plan expects {want}",
                    "start the missing workers (kit up --worker) and see `kit status`",
                )
            )
        else:
            checks.append(Check("cluster.ray", PASS, f"Ray sees {len(alive)} alive node(s): {', '.join(alive)}"))
    models = {g["name"] for f in nodes.values() for g in _get(f, "gpu", "gpus") or []}
    if len(models) > 1:
        checks.append(
            Check(
                "cluster.gpu_models",
                WARN,
                f"mixed GPU models: {', '.join(sorted(models))}",
                "use one GPU model per replica",
            )
        )
    checks.extend(check_versions(nodes))
    snaps = {n: _get(f, "hf_cache") or {} for n, f in nodes.items()}
    if any(s.get("model") for s in snaps.values()):
        prints = {n: s.get("fingerprint") for n, s in snaps.items()}
        missing = [n for n, p in prints.items() if not p]
        model = next(s["model"] for s in snaps.values() if s.get("model"))
        if missing and len(missing) == len(prints):
            checks.append(
                Check(
                    "cluster.hf_snapshot",
                    WARN,
                    f"{model} is in the HF cache of no node: every node downloads it at start",
                    "download it once into the shared HF cache (huggingface-cli download)",
                )
            )
        elif missing:
            checks.append(
                Check(
                    "cluster.hf_snapshot",
                    FAIL,
                    f"{model} not in the HF cache on {', '.join(missing)}",
                    "mount the same HF cache on every node",
                )
            )
        elif len(set(prints.values())) > 1:
            checks.append(
                Check(
                    "cluster.hf_snapshot",
                    FAIL,
                    f"{model} snapshots differ across nodes",
                    "mount one shared HF cache, or download the same revision everywhere",
                )
            )
        else:
            checks.append(Check("cluster.hf_snapshot", PASS, f"{model} identical on all nodes"))
    return checks


# --- collective -----------------------------------------------------------------------------


def check_collective(
    collective: Mapping[str, Any],
    summary: TransportSummary | None,
    *,
    expect: str,
    nodes: Mapping[str, Mapping[str, Any]],
) -> list[Check]:
    if expect not in EXPECTS:
        raise ValueError(f"unknown expectation {expect!r}")
    colls: Mapping[str, Any] = collective.get("collectives") or {
        "all-reduce": {"correct": collective.get("correct"), "results": collective.get("results") or []}
    }
    names = " and ".join(colls) or "all-reduce"
    if not collective.get("ok"):
        return [
            Check(
                "collective",
                FAIL,
                f"{names} failed: {collective.get('error')}",
                "see the NCCL lines (kit verify --json) or run `kit diagnose` on the logs",
            )
        ]
    checks = []
    world = collective.get("world_size")
    backend = collective.get("backend")
    for name, c in colls.items():
        check = "collective.correct" if name == "all-reduce" else "collective.all_to_all.correct"
        if name == "all-reduce":
            good, bad = "gave the right sum", "all-reduce gave a wrong sum"
        else:
            how = c.get("method") or "all_to_all_single"
            how += f"; {c['fallback_reason']}" if c.get("fallback_reason") else ""
            good = f"delivered every chunk to its rank ({how})"
            bad = f"all-to-all delivered wrong data ({how})"
        if c.get("correct"):
            checks.append(Check(check, PASS, f"{name} over {world} ranks ({backend}) {good}"))
        else:
            checks.append(
                Check(check, FAIL, bad, "check GPU health (nvidia-smi -q, dmesg Xid) and NCCL_PROTO/ALGO overrides")
            )
    if collective.get("backend") == "gloo":
        checks.extend(_gloo(expect, int(collective.get("nnodes") or 1)))
        return checks
    if collective.get("backend") != "nccl" or summary is None:
        return checks
    links = [nvlinked(f) for f in nodes.values()]
    is_nvlinked = True if links and all(v is True for v in links) else (False if False in links else None)
    ports = sorted({p for f in nodes.values() for p in ib_ports(f)} | set(summary.ib_devices))
    env = collective.get("nccl_env") or {}
    checks.append(_intra(summary, expect, is_nvlinked, env))
    checks.append(_inter(summary, expect, ports, nodes, int(collective.get("nnodes") or 1)))
    for name, c in colls.items():
        checks.extend(_bandwidth(c.get("results") or [], summary, is_nvlinked, name))
    return checks


def _gloo(expect: str, nnodes: int) -> list[Check]:
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


def _names(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{_LABEL.get(k, k)} x{v}" for k, v in counts.items())


_LABEL = {
    Transport.P2P.value: "P2P",
    Transport.SHM.value: "SHM",
    Transport.IB_GDR.value: "NET/IB+GDRDMA",
    Transport.IB.value: "NET/IB",
    Transport.PLUGIN.value: "NET/plugin",
    Transport.SOCKET.value: "NET/Socket",
    Transport.OTHER.value: "other",
}


def _intra(s: TransportSummary, expect: str, is_nvlinked: bool | None, env: Mapping[str, str]) -> Check:
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


def _inter(
    s: TransportSummary,
    expect: str,
    ports: Sequence[str],
    nodes: Mapping[str, Mapping[str, Any]],
    nnodes: int,
) -> Check:
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
    gdr_everywhere = s.inter_gdrdma is True
    need_gdr = expect == "ib-gdr" or (expect in ("auto", "nvlink") and bool(ports))
    need_rdma = need_gdr or expect == "ib"
    present = f"although {', '.join(ports)} is present" if ports else "and no RDMA device is present"
    if worst is Transport.SOCKET:
        if need_rdma:
            no_dev = [n for n, f in nodes.items() if ib_ports(f) and not _get(f, "infiniband", "dev_infiniband")]
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
    if need_gdr and not (worst is Transport.IB_GDR or (worst is Transport.PLUGIN and gdr_everywhere)):
        gdr = [n for n, f in nodes.items() if ports and not _get(f, "infiniband", "gdr_module")]
        fix = (
            f"modprobe nvidia_peermem on {', '.join(gdr)}"
            if gdr
            else "check NCCL_NET_GDR_LEVEL and the GPU-NIC PCIe topology"
        )
        return Check("transport.inter", FAIL, f"inter-node links use {seen} without GPUDirect RDMA", fix)
    if worst is Transport.PLUGIN and expect == "ib":
        return Check("transport.inter", PASS, f"inter-node: {seen}: an RDMA net plugin meets --expect ib")
    return Check("transport.inter", PASS, f"inter-node: {seen}")


def _labels(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))


def _bandwidth(
    all_results: Sequence[Mapping[str, Any]], s: TransportSummary, is_nvlinked: bool | None, name: str
) -> list[Check]:
    """busbw at the largest size against the floor of the slowest link. The same floors serve
    the all-to-all: nccl-tests' alltoall busbw is scaled to be compared with the link too."""
    check = "bandwidth" if name == "all-reduce" else "bandwidth.all_to_all"
    results = [r for r in all_results if r.get("bytes", 0) >= 32 << 20]
    if not results:
        return []
    top = max(results, key=lambda r: r["bytes"])
    worst = s.inter_worst or s.intra_worst
    if worst is None:
        return []
    link = "nvlink" if worst is Transport.P2P and is_nvlinked and not s.inter else worst.value
    floor = FLOORS_GBPS.get(link)
    size = _size(top["bytes"])
    what = "" if name == "all-reduce" else f"{name} "
    text = f"{what}busbw {top['busbw_gbps']} GB/s at {size} over {_LABEL.get(link, link)}"
    if floor is not None and top["busbw_gbps"] < floor:
        return [
            Check(
                check,
                WARN,
                f"{text}, below the {floor:g} GB/s floor for this link",
                "check for other GPU jobs, PCIe/NVLink errors (nvidia-smi nvlink -e) and NIC speed",
            )
        ]
    return [Check(check, PASS, text)]


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _size(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 and n % (1 << 30) == 0 else f"{n >> 20} MiB"


def check_exposure(exposures: Sequence[Exposure]) -> list[Check]:
    """What the cluster leaves open to anyone who can reach it (kit.plan.exposure: the API without
    a key, Ray without token authentication): warnings, never failures."""
    return [Check(e.check, WARN, e.message, e.fix) for e in exposures]


def evaluate(
    nodes: Mapping[str, Mapping[str, Any]],
    collective: Mapping[str, Any] | None,
    summary: TransportSummary | None,
    *,
    expect: str = "auto",
    expected_nodes: int | None = None,
    expected_gpus_per_node: int | None = None,
    planned_ips: Mapping[str, str | None] | None = None,
    accelerator: str = "gpu",
    ray: Sequence[Mapping[str, Any]] | None = None,
    ray_error: str | None = None,
) -> list[Check]:
    """All checks, per node first, then across nodes, then the collective."""
    checks: list[Check] = []
    for node, facts in nodes.items():
        checks.extend(
            check_node(
                node,
                facts,
                expected_gpus=expected_gpus_per_node,
                planned_ip=(planned_ips or {}).get(node),
                accelerator=accelerator,
            )
        )
    checks.extend(check_cluster(nodes, expected_nodes=expected_nodes, ray=ray, ray_error=ray_error))
    if collective is not None:
        checks.extend(check_collective(collective, summary, expect=expect, nodes=nodes))
    return checks

"""Checks of one node: GPUs, CUDA, /dev/shm, memlock, RDMA, node IP, Ray registration, HF cache."""

from __future__ import annotations

from collections.abc import Sequence

from kit.verify.checks import FAIL, IB_FIX, PASS, WARN, Check
from kit.verify.facts import Gpu, HfCacheFacts, InfinibandFacts, Memlock, NetworkFacts, NodeFacts, RayNode, TorchFacts

SHM_MIN_BYTES = 1 << 30  # Docker's default 64 MB breaks NCCL/Ray (FIELD_NOTES row 6)


def check_node(
    node: str,
    facts: NodeFacts,
    *,
    expected_gpus: int | None = None,
    planned_ip: str | None = None,
    accelerator: str = "gpu",
) -> list[Check]:
    """Every check of one node, in the order the report lists them."""
    checks = [check_gpu_count(node, facts.gpus, expected_gpus, accelerator)]
    if facts.torch is not None and (cuda := check_cuda(node, facts.torch, len(facts.gpus))):
        checks.append(cuda)
    checks.append(check_shm(node, facts.shm_bytes))
    checks.append(check_memlock(node, facts.memlock, rdma=bool(facts.infiniband.active_ports)))
    checks.extend(check_rdma(node, facts.infiniband))
    # The head's Ray view (cluster mode) supersedes the node's own session file.
    checks.extend(check_network(node, facts.network, planned_ip, ray_file=not facts.in_ray_view))
    if facts.in_ray_view:
        checks.append(check_ray_registration(node, facts.ray, facts.network.node_ip, planned_ip))
    if facts.hf_cache.model:  # no model asked for (--host without --model): the cache does not matter
        checks.append(check_hf_cache(node, facts.hf_cache))
    return checks


def check_gpu_count(node: str, gpus: Sequence[Gpu], expected: int | None, accelerator: str) -> Check:
    n = len(gpus)
    if accelerator == "cpu" and not n:
        return Check("gpu.count", PASS, "accelerator cpu: no GPUs expected (collective on Gloo)", node=node)
    if expected is not None and accelerator != "cpu" and n != expected:
        return Check(
            "gpu.count",
            FAIL,
            f"{n} GPUs, the plan expects {expected}",
            "fix --gpus-per-node / the config, or the GPUs given to the container (--gpus all)",
            node,
        )
    if n:
        models = sorted({f"{g.name} {round((g.memory_mib or 0) / 1024)} GiB" for g in gpus})
        return Check("gpu.count", PASS, f"{n} x {', '.join(models)}, driver {gpus[0].driver}", node=node)
    return Check(
        "gpu.count",
        WARN,
        "no NVIDIA GPUs found (nvidia-smi): the collective probe runs on Gloo/CPU",
        "pass --gpus all / --nv if GPUs were expected",
        node,
    )


def check_cuda(node: str, torch: TorchFacts, gpus: int) -> Check | None:
    """Whether torch can use the GPUs nvidia-smi lists (None: no GPUs, nothing to use)."""
    if not torch.importable:
        return Check(
            "gpu.cuda",
            FAIL,
            f"torch is not importable: {torch.error}",
            "use the vLLM image's Python (or --python on a host)",
            node,
        )
    if not gpus:
        return None
    if not torch.cuda_available:
        return Check(
            "gpu.cuda",
            FAIL,
            f"torch {torch.version} cannot use CUDA{': ' + torch.error if torch.error else ''}",
            "match the image's CUDA to the driver; start the container with GPUs",
            node,
        )
    if torch.device_count != gpus:
        return Check(
            "gpu.cuda",
            FAIL,
            f"torch sees {torch.device_count} GPUs, nvidia-smi {gpus}",
            "check CUDA_VISIBLE_DEVICES",
            node,
        )
    return Check("gpu.cuda", PASS, f"torch {torch.version} uses CUDA {torch.cuda} on {gpus} GPUs", node=node)


def check_shm(node: str, size: int | None) -> Check:
    if size is None:
        return Check("node.shm", WARN, "/dev/shm not found", "--ipc=host", node)
    if size < SHM_MIN_BYTES:
        return Check(
            "node.shm",
            FAIL,
            f"/dev/shm is {_gib(size)} (NCCL and Ray need more)",
            "start containers with --ipc=host, or --shm-size sized from host memory",
            node,
        )
    return Check("node.shm", PASS, f"/dev/shm {_gib(size)}", node=node)


def check_memlock(node: str, lock: Memlock, *, rdma: bool) -> Check:
    """RDMA pins memory: with RDMA ports present the limit must be unlimited."""
    if rdma and not lock.unlimited:
        return Check(
            "node.memlock",
            FAIL,
            f"memlock limit {lock.soft} bytes with RDMA devices present",
            "--ulimit memlock=-1 (and --cap-add IPC_LOCK)",
            node,
        )
    what = "unlimited" if lock.unlimited else f"{lock.soft} bytes (no RDMA in use)"
    return Check("node.memlock", PASS, f"memlock {what}", node=node)


def check_rdma(node: str, ib: InfinibandFacts) -> list[Check]:
    """Active IB/RoCE ports must be usable inside the container (node.rdma), with GPUDirect
    RDMA's kernel module loaded on the host (node.gdr)."""
    ports = ib.active_ports
    if not ports:
        return [Check("node.rdma", PASS, "no active InfiniBand/RoCE ports", node=node)]
    if not ib.uverbs:
        rdma = Check(
            "node.rdma",
            FAIL,
            f"{', '.join(ports)} present but /dev/infiniband is not available inside the container",
            IB_FIX,
            node,
        )
    else:
        rdma = Check("node.rdma", PASS, f"{', '.join(ports)}; {len(ib.uverbs)} uverbs devices", node=node)
    if not ib.gdr_module:
        gdr = Check(
            "node.gdr",
            WARN,
            "GPUDirect RDMA module (nvidia_peermem) not loaded",
            "modprobe nvidia_peermem on the host",
            node,
        )
    else:
        gdr = Check("node.gdr", PASS, "nvidia_peermem loaded", node=node)
    return [rdma, gdr]


def check_network(node: str, net: NetworkFacts, planned_ip: str | None, *, ray_file: bool = True) -> list[Check]:
    """The node IP (usable, as planned), the IP in Ray's session file (ray_file: when no Ray view
    from the head supersedes it) and the socket interfaces NCCL and Gloo are told to use."""
    unusable = _unusable_ip(node, net)
    if unusable is not None:
        return [unusable]
    checks = [_planned_ip(node, net, planned_ip)]
    ray_ip = net.ray_node_ip if ray_file else None
    if ray_ip and ray_ip != net.node_ip:
        checks.append(
            Check(
                "node.ray_ip",
                FAIL,
                f"Ray registered {ray_ip}, vLLM uses {net.node_ip}",
                f"ray start --node-ip-address {net.node_ip} (and VLLM_HOST_IP={net.node_ip})",
                node,
            )
        )
    elif ray_ip:
        checks.append(Check("node.ray_ip", PASS, f"Ray registered {ray_ip}", node=node))
    checks.extend(_socket_ifnames(node, net))
    return checks


def _unusable_ip(node: str, net: NetworkFacts) -> Check | None:
    if not net.node_ip:
        return Check("node.ip", FAIL, "no node IP found (no route)", "set VLLM_HOST_IP", node)
    if net.interfaces and net.node_ip not in net.interfaces.values():
        return Check(
            "node.ip",
            FAIL,
            f"VLLM_HOST_IP {net.node_ip} is on no interface of this node (container IP vs host IP)",
            "use host networking and the host's IP",
            node,
        )
    return None


def _planned_ip(node: str, net: NetworkFacts, planned_ip: str | None) -> Check:
    if planned_ip and planned_ip != net.node_ip:
        return Check(
            "node.ip",
            FAIL,
            f"node IP {net.node_ip} differs from the planned {planned_ip}",
            "pass the planned IP as VLLM_HOST_IP (kit up does)",
            node,
        )
    return Check("node.ip", PASS, f"{net.node_ip} on {net.interface or '?'}", node=node)


def _socket_ifnames(node: str, net: NetworkFacts) -> list[Check]:
    """NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME that leave out the node IP's interface."""
    iface = net.interface
    checks = []
    for var, value in (("nccl_socket_ifname", net.nccl_socket_ifname), ("gloo_socket_ifname", net.gloo_socket_ifname)):
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


def check_ray_registration(node: str, row: RayNode | None, node_ip: str | None, planned_ip: str | None) -> Check:
    """What Ray registered for this node (its row of the head's view): the node's own IP, and the
    VLLM_HOST_IP its raylet sees is that IP too."""
    ip = planned_ip or node_ip
    fix = f"ray start --node-ip-address {ip} with VLLM_HOST_IP={ip} (kit up does); then `kit up --replace`"
    if row is None:
        return Check("node.ray_ip", FAIL, f"Ray has no alive node registered as {ip}", fix, node)
    if row.ip != ip:
        return Check("node.ray_ip", FAIL, f"Ray registered {row.ip}, the node IP is {ip}", fix, node)
    if row.vllm_host_ip is None:
        return Check("node.ray_ip", WARN, f"Ray registered {row.ip}; its VLLM_HOST_IP could not be read", None, node)
    if row.vllm_host_ip != row.ip:
        return Check("node.ray_ip", FAIL, f"Ray registered {row.ip}, VLLM_HOST_IP is {row.vllm_host_ip}", fix, node)
    return Check("node.ray_ip", PASS, f"Ray registered {row.ip} = VLLM_HOST_IP", node=node)


def check_hf_cache(node: str, hf: HfCacheFacts) -> Check:
    if not hf.present:
        return Check(
            "node.hf_cache",
            WARN,
            f"no HF cache at {hf.location}: this node downloads models by itself",
            "mount the same HF cache on every node (config: hf_cache)",
            node,
        )
    return Check("node.hf_cache", PASS, f"HF cache at {hf.location}", node=node)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"

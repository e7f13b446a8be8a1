"""The container spec of one node: the data every runtime adapter starts unchanged."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kit import __version__, labels
from kit.config import KitConfig
from kit.images import vllm_releases as versions
from kit.labels import LayoutLabels
from kit.plan.host_share import held_gpus, host_ports, ports_label
from kit.plan.network import NodeNet
from kit.plan.paths import (
    API_KEY_PATH,
    COMPILE_CACHE,
    HF_HOME,
    HF_TOKEN_PATH,
    RAY_TOKEN_PATH,
    USER_HOME,
    VLLM_CONFIG_ROOT,
)
from kit.plan.roles import Role
from kit.plan.scripts import node_script, ray_token_enabled
from kit.plan.vllm import REPLICA_HEAD_VAR, container_gpu_ids, device_ids_selected, serves_api


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False
    key: str | None = None  # the config key it comes from, when not told by its target (a refusal names it)


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    image: str
    role: Role
    labels: Mapping[str, str]
    env: Mapping[str, str]
    mounts: tuple[Mount, ...]
    script: str  # the node entrypoint, run as `bash -c SCRIPT NAME [ARG...]`
    network: str = "host"  # "host", or a Docker network name (local simulation)
    ip: str | None = None  # fixed IP on that network
    ipc_host: bool = True
    shm_size: str | None = None
    gpus: str | tuple[str, ...] | None = "all"  # "all", selected indices, or None (CPU)
    devices: tuple[str, ...] = ()
    cap_add: tuple[str, ...] = ()
    ulimits: tuple[tuple[str, int, int], ...] = ()
    script_args: tuple[str, ...] = ()  # the script's "$1"...: data it needs, e.g. scripts it runs
    user: str | None = None  # UID[:GID] (Docker --user; Apptainer always runs as the calling user)
    read_only: bool = False  # read-only image filesystem (Docker --read-only; Apptainer's always is)
    tmpfs: tuple[str, ...] = ()  # container paths given a fresh tmpfs (Docker --tmpfs)
    # Apptainer's options: its GPU options (when the node has GPUs) and the site's extra ones.
    apptainer_gpu_args: tuple[str, ...] = ("--nv",)
    apptainer_args: tuple[str, ...] = ()

    @property
    def command(self) -> list[str]:
        """Arguments after the image: the entrypoint is /bin/bash (FIELD_NOTES §1 row 16:
        never depend on scripts inside the image)."""
        return ["-c", self.script, self.name, *self.script_args]


def container_name(cluster: str, role: Role) -> str:
    return f"kit-{cluster}-{role.label}"


def node_labels(config: KitConfig, role: Role, net: NodeNet) -> dict[str, str]:
    """What kit finds the node by (kit.labels), and the layout it was started for: `kit status`,
    `kit bench` and `kit tune` read it back instead of re-deciding it on their own host."""
    lay = config.layout
    m = config.model
    layout = LayoutLabels(lay, config.served_name, m.id, m.max_model_len)
    held = host_ports(config, role)
    gpus = held_gpus(config)
    return {
        labels.MANAGED: labels.MANAGED_TRUE,
        labels.CLUSTER: config.cluster,
        labels.ROLE: role.kind,
        labels.RANK: str(role.rank),
        labels.NODE_IP: net.ip,
        labels.BACKEND: config.backend,
        labels.ACCELERATOR: config.accelerator,
        labels.IMAGE: config.image,
        labels.VERSION: __version__,
        **layout.to_labels(),
        **operating_labels(config, net),
        **({labels.HOST_PORTS: ports_label(held)} if held else {}),
        **({labels.GPUS: gpus} if gpus else {}),
    }


def operating_labels(config: KitConfig, net: NodeNet) -> dict[str, str]:
    """What a later command needs to reach and operate the cluster with no config at hand (issue
    25): its size, the head's address, its ports and where its API key file is (a path: the key
    itself never leaves its file)."""
    out = {
        labels.NODES: str(config.nodes),
        labels.GPUS_PER_NODE: str(config.gpus_per_node),
        labels.HEAD_ADDRESS: net.head_address,
        labels.API_PORT: str(config.ports.api),
        labels.RAY_GCS_PORT: str(config.ports.ray_gcs),
        labels.RAY_METRICS_PORT: str(config.ports.ray_metrics_export),
        labels.SUPERVISOR_PORT: str(config.ports.supervisor),
    }
    if config.api_key_file:
        out[labels.API_KEY_FILE] = config.api_key_file
    return out


def node_env(config: KitConfig, role: Role, net: NodeNet) -> dict[str, str]:
    """Per-node environment, set at container start (FIELD_NOTES §1 rows 1, 3, 10, 11)."""
    env = {
        "VLLM_HOST_IP": net.ip,
        "NCCL_SOCKET_IFNAME": net.interface,
        "GLOO_SOCKET_IFNAME": net.interface,
        "KIT_CLUSTER": config.cluster,
        "KIT_ROLE": role.kind,
        "KIT_NODE_RANK": str(role.rank),
        "KIT_NNODES": str(config.nodes),
        "KIT_HEAD_ADDRESS": net.head_address,
        **({REPLICA_HEAD_VAR: net.replica_head} if net.replica_head else {}),
        "HF_HOME": HF_HOME,
        "VLLM_CONFIG_ROOT": VLLM_CONFIG_ROOT,
        "RAY_USAGE_STATS_ENABLED": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    env.update(compile_cache_env(config, str(role.rank)))
    if config.hf_token_file:
        env["HF_TOKEN_PATH"] = HF_TOKEN_PATH  # the token itself never enters env or argv
    if ray_token_enabled(config):
        # Ray's token authentication (Ray >= 2.52): every Ray process of the node, vLLM's Ray
        # workers included, reads the token from the mounted file; the token never enters env,
        # argv or `docker inspect`. The node script refuses to start a Ray without it.
        env["RAY_AUTH_MODE"] = "token"
        env["RAY_AUTH_TOKEN_PATH"] = RAY_TOKEN_PATH
    if config.gpus != "all" and config.accelerator == "gpu" and not device_ids_selected(config):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(container_gpu_ids(config))
    if config.docker.user:
        # A user the image has no home or name for: vLLM, torch and Triton write their caches
        # under ~, and Python's getpass.getuser() (torch's Inductor, Ray) fails without a passwd
        # entry unless USER/LOGNAME name one. Apptainer gives the container the user's own.
        env.update({"HOME": USER_HOME, "USER": "kit", "LOGNAME": "kit"})
    if config.model.all2all != "auto" and not versions.all2all_by_flag(config.vllm.version, config.image_options):
        # An image without --all2all-backend (vLLM < 0.11.1) reads it from the environment only.
        env[versions.ALL2ALL_ENV] = config.model.all2all
    env.update(config.env)
    return env


# The compile caches a vLLM start fills (issue 19, warm caches), each pointed into the
# compile_cache.dir mount (read in vLLM 0.32's envs.py and vllm/compilation/):
# - VLLM_CACHE_ROOT (default ~/.cache/vllm): torch.compile's artifacts under torch_compile_cache/
#   (keyed by a hash of the vLLM config, torch version and model code), which vLLM's Inductor
#   backend gives its own inductor_cache/ and triton_cache/ beside them; model info, assets.
# - TRITON_CACHE_DIR (default ~/.triton/cache): Triton kernels JIT-compiled outside torch.compile
#   (vLLM's own Triton kernels: fused MoE, attention); set, vLLM also puts torch.compile's Triton
#   kernels there. Content-addressed, written by atomic rename.
# - TORCHINDUCTOR_CACHE_DIR (default /tmp/torchinductor_USER): Inductor outside vLLM's compile
#   backend (torch.compile'd helpers); vLLM sets its own per-hash one for the model's graph.
# - FLASHINFER_WORKSPACE_BASE (default ~): FlashInfer's JIT-built kernels and downloaded cubins
#   under .cache/flashinfer/ (GPU images).
COMPILE_CACHE_DIRS = {
    "VLLM_CACHE_ROOT": "vllm",
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
}


def compile_cache_env(config: KitConfig, rank: str) -> dict[str, str]:
    """The cache variables of node `rank` ({} when compile_cache.dir is unset: the caches then
    live and die with the container). Every node mounts the folder at COMPILE_CACHE; per-node
    points node k into its subfolder node-k, so no two nodes of a cluster write the same files,
    which matters on a shared filesystem (NFS, Lustre), where the compilers' file locks do not
    reliably reach across hosts. Keyed by rank, not hostname: under SLURM node k of the next job
    finds node k's cache warm whichever host it lands on (the nodes of a partition are alike, and
    the caches are keyed by GPU arch and software anyway). The subfolder is chosen by the
    environment, not the mount, so one mount serves every node of a SLURM step (pyxis starts all
    workers with one srun). shared: the folder itself on every node: for a node-local disk (each
    host keeps its own), or to let one node's compile warm identical nodes on a shared one."""
    if config.compile_cache.dir is None:
        return {}
    base = f"{COMPILE_CACHE}/node-{rank}" if config.compile_cache.scope == "per-node" else COMPILE_CACHE
    return {name: f"{base}/{sub}" for name, sub in COMPILE_CACHE_DIRS.items()}


def node_mounts(config: KitConfig, role: Role) -> tuple[Mount, ...]:
    """The HF cache, the compile caches, the secret files (read-only) and the extra mounts. The API
    key only where an API server runs (the head; every node with hybrid DP load balancing): other
    nodes never answer API requests (issue 16, closed by default)."""
    mounts = [Mount(config.hf_cache, HF_HOME)]
    if config.compile_cache.dir:
        mounts.append(Mount(config.compile_cache.dir, COMPILE_CACHE))
    if config.hf_token_file:
        mounts.append(Mount(config.hf_token_file, HF_TOKEN_PATH, read_only=True))
    if config.api_key_file and serves_api(config, role):
        mounts.append(Mount(config.api_key_file, API_KEY_PATH, read_only=True))
    if ray_token_enabled(config) and config.ray_token_file:
        mounts.append(Mount(config.ray_token_file, RAY_TOKEN_PATH, read_only=True))
    local = local_model_dir(config)
    if local is not None:  # issue 28: vLLM finds it at the path model.id names, and never writes it
        mounts.append(Mount(local, local, read_only=True, key="model.id"))
    for item in config.mounts:
        parts = item.split(":")
        mounts.append(Mount(parts[0], parts[1], read_only=len(parts) == 3 and parts[2] == "ro"))
    return tuple(mounts)


LOCAL_MODEL_PREFIXES = ("/", "~", "./", "../")


def local_model_dir(config: KitConfig) -> str | None:
    """model.id when it names a directory rather than a hub id (a hub id never starts with '/',
    '~' or '.'): mounted read-only at the same path in every runtime, so `vllm serve PATH` finds it
    there (kit.cluster.resolve makes it absolute and checks it holds a config.json)."""
    model = config.model.id
    return model if model.startswith(LOCAL_MODEL_PREFIXES) else None


def plan_node(config: KitConfig, role: Role, net: NodeNet, *, has_infiniband: bool = False) -> ContainerSpec:
    """Config + role + this node's network -> the container to start."""
    gpus: str | tuple[str, ...] | None
    if config.accelerator == "cpu":
        gpus = None
    elif config.gpus == "all":
        gpus = "all"
    else:
        gpus = tuple(g.strip() for g in config.gpus.split(","))
    use_ib = config.infiniband == "on" or (config.infiniband == "auto" and has_infiniband)
    return ContainerSpec(
        name=container_name(config.cluster, role),
        image=config.image,
        role=role,
        labels=node_labels(config, role, net),
        env=node_env(config, role, net),
        mounts=node_mounts(config, role),
        script=node_script(config, role),
        network=config.network or "host",
        ip=net.ip if config.network else None,
        ipc_host=config.ipc_host,
        shm_size=None if config.ipc_host else config.shm_size,
        gpus=gpus,
        # FIELD_NOTES §1 rows 4-5: without these NCCL silently falls back to TCP sockets.
        devices=("/dev/infiniband:/dev/infiniband",) if use_ib else (),
        cap_add=("IPC_LOCK",) if use_ib else (),
        ulimits=(("memlock", -1, -1),) if use_ib else (),
        # Each runtime's own keys (kit.plan.checks refuses them with another runtime).
        user=config.docker.user,
        read_only=config.docker.read_only,
        # A read-only image still needs a writable /tmp (kit's run files, Ray, torch): Apptainer's
        # is the host's.
        tmpfs=("/tmp",) if config.docker.read_only else (),
        apptainer_gpu_args=config.apptainer.gpu_args,
        apptainer_args=config.apptainer.extra_args,
    )

"""The `vllm serve` argv for each backend and role (FIELD_NOTES §2)."""

from __future__ import annotations

from kit.config import KitConfig
from kit.images import vllm_releases as versions
from kit.plan.replicas import Replica, router_mode
from kit.plan.roles import Role
from kit.render import Arg, EnvRef, option, positional

# The first node of this node's replica (model.dp_lb router, a replica over several nodes).
REPLICA_HEAD_VAR = "KIT_REPLICA_HEAD_ADDRESS"

# Set by the serve script from KIT_NODE_RANK (node rank × DP ranks per node), so the same script
# text runs on every worker and inside SLURM jobs.
DP_START_RANK_VAR = "KIT_DP_START_RANK"


def vllm_serve_argv(config: KitConfig, role: Role) -> list[Arg]:
    """Head (Ray): the only vllm process, --distributed-executor-backend ray.
    mp backend: every node runs it; node rank and head address come from the node's env.
    DP > 1: each node runs its DP ranks (mp) or the head places them all through Ray.

    Values a user or the node controls (names, addresses) are attached as `--flag=value`, so one
    that starts with `-` stays a value; kit's own integers keep the `--flag N` form. The API listens
    on the head's node IP (VLLM_HOST_IP), not on every interface (issue 16, closed by default):
    kit's clients, health checks and tunnels all use that IP; `api_listen: all` opens it (issue 28: a
    login node that reaches the head by another network than `interface`). model.extra_args may
    not repeat an option kit writes (kit.plan.image_check, issue 24)."""
    m = config.model
    version = config.vllm.version
    argv: list[Arg] = ["vllm", "serve", positional(m.id, key="model.id")]
    if serves_api(config, role):
        argv += [
            option("--served-model-name", config.served_name),
            option("--host", "0.0.0.0" if config.api_listen == "all" else EnvRef("VLLM_HOST_IP")),
            "--port",
            str(config.ports.api),
        ]
        if m.api_servers != "auto":
            argv += ["--api-server-count", str(m.api_servers)]
    argv += ["--tensor-parallel-size", str(config.tp), "--pipeline-parallel-size", str(config.pp)]
    if m.max_model_len is not None:
        argv += ["--max-model-len", str(m.max_model_len)]
    if config.dp > 1:
        argv += data_parallel_args(config, role)
    elif config.backend == "ray":
        argv += ["--distributed-executor-backend", "ray"]
    elif config.nodes > 1:
        argv += [
            "--nnodes",
            str(config.nodes),
            "--node-rank",
            EnvRef("KIT_NODE_RANK"),
            option("--master-addr", EnvRef("KIT_HEAD_ADDRESS")),
            "--master-port",
            str(config.ports.mp_master),
        ]
        if not role.is_head:
            argv.append("--headless")
    if m.ep:
        argv.append("--enable-expert-parallel")
    if m.all2all != "auto" and versions.all2all_by_flag(version, config.image_options):
        argv.append(option("--all2all-backend", m.all2all))  # older releases: node_env's variable
    if device_ids_selected(config):
        argv.append(option("--device-ids", ",".join(container_gpu_ids(config))))
    argv += list(m.extra_args)
    return argv


def replica_serve_argv(config: KitConfig, replica: Replica, node: int, *, node_rank: Arg | None = None) -> list[Arg]:
    """model.dp_lb router (issue 29): one replica's `vllm serve` on node `node`, an independent
    server of TP×PP (no DP flag: no rank of one replica knows another; vLLM's router in front
    balances over them). Its API server on its first node, at ports.replica + its slot; a replica
    over several nodes is vLLM's multi-node backend (--nnodes, --node-rank inside the replica,
    --master-addr its first node), the other nodes --headless. On part of a node (several
    replicas per node) it gets its own GPUs: --device-ids (vLLM >= 0.24) or CUDA_VISIBLE_DEVICES
    (kit.plan.scripts). `node_rank`: the node's rank inside the replica where only the node knows
    it (a SLURM array task's headless nodes: kit.plan.slurm_replicas), else `node`'s."""
    m = config.model
    argv: list[Arg] = ["vllm", "serve", positional(m.id, key="model.id")]
    if node == replica.head:
        argv += [
            option("--served-model-name", config.served_name),
            option("--host", "0.0.0.0" if config.api_listen == "all" else EnvRef("VLLM_HOST_IP")),
            "--port",
            str(replica.port),
        ]
        if m.api_servers != "auto":
            argv += ["--api-server-count", str(m.api_servers)]
    argv += ["--tensor-parallel-size", str(config.tp), "--pipeline-parallel-size", str(config.pp)]
    if m.max_model_len is not None:
        argv += ["--max-model-len", str(m.max_model_len)]
    if replica.spans_nodes:
        argv += [
            "--nnodes",
            str(len(replica.nodes)),
            "--node-rank",
            str(replica.rank_in(node)) if node_rank is None else node_rank,
            option("--master-addr", EnvRef(REPLICA_HEAD_VAR)),
            "--master-port",
            str(replica.master_port),
        ]
        if node != replica.head:
            argv.append("--headless")
    if replica_device_ids(config, replica):
        argv.append(option("--device-ids", ",".join(str(i) for i in replica.gpus)))
    argv += list(m.extra_args)
    return argv


def replica_device_ids(config: KitConfig, replica: Replica) -> bool:
    """A replica on part of a node (or on a GPU selection) names its GPUs with --device-ids where
    the image's parser (or, without a record, the release) has it; else the serve script sets
    CUDA_VISIBLE_DEVICES."""
    partial = len(replica.gpus) < config.gpus_per_node
    return (
        config.accelerator == "gpu"
        and (partial or config.gpus != "all")
        and versions.uses_device_ids(config.vllm.version, config.backend, config.image_options)
    )


def hybrid_lb(config: KitConfig) -> bool:
    """Hybrid DP load balancing (model.dp_lb): every node runs an API server over its local ranks."""
    return config.model.dp_lb == "hybrid" and config.backend == "mp" and config.dp > 1 and config.nodes > 1


def serves_api(config: KitConfig, role: Role) -> bool:
    """The head; with hybrid DP load balancing or router replicas every node (each one then needs
    the API key: a replica's first node serves its API, and its supervisor speaks to the router)."""
    return role.is_head or hybrid_lb(config) or router_mode(config)


def container_gpu_ids(config: KitConfig) -> list[str]:
    """The selected GPUs (config.gpus, not "all") as the container numbers them (issue 28): Docker's
    `--gpus device=2,3` shows only those, renumbered 0 and 1; Apptainer's --nv shows every GPU of
    the host under its own number, so the physical ids stay (0,1 there would be other GPUs).
    (Under SLURM the allocation's GPUs are SLURM's to choose: `kit slurm` refuses `gpus`.)"""
    ids = [g.strip() for g in config.gpus.split(",")]
    if config.runtime == "apptainer":
        return ids
    return [str(i) for i in range(len(ids))]


def device_ids_selected(config: KitConfig) -> bool:
    """The node's selected GPUs go to vLLM as --device-ids (an image that has it, mp backend) instead of
    CUDA_VISIBLE_DEVICES (kit.plan.node): the container sees only them, numbered from 0."""
    return (
        config.accelerator == "gpu"
        and config.gpus != "all"
        and versions.uses_device_ids(config.vllm.version, config.backend, config.image_options)
    )


def data_parallel_args(config: KitConfig, role: Role) -> list[Arg]:
    """vLLM's multi-node DP flags (docs/serving/data_parallel_deployment.md, "Internal Load
    Balancing"): one API endpoint on the head. mp: the head runs the API server and its local DP
    ranks; every other node runs its ranks `--headless` from `--data-parallel-start-rank`. Ray: the
    head alone places every rank on the Ray cluster (`--data-parallel-backend ray`); vLLM takes
    the head's IP as the DP address and needs no RPC port."""
    args: list[Arg] = ["--data-parallel-size", str(config.dp), "--data-parallel-size-local", str(config.dp_local)]
    if config.backend == "ray":
        return [*args, "--data-parallel-backend", "ray"]
    if config.nodes == 1:
        return ["--data-parallel-size", str(config.dp)]
    args += [
        option("--data-parallel-address", EnvRef("KIT_HEAD_ADDRESS")),
        "--data-parallel-rpc-port",
        str(config.ports.dp_rpc),
    ]
    if hybrid_lb(config):
        # Each node balances over its own ranks behind its own API server (no --headless).
        args.append("--data-parallel-hybrid-lb")
        if not role.is_head:
            args += ["--data-parallel-start-rank", EnvRef(DP_START_RANK_VAR)]
    elif not role.is_head:
        args += ["--headless", "--data-parallel-start-rank", EnvRef(DP_START_RANK_VAR)]
    return args

"""Node entrypoint and serve scripts, rendered from kit/templates/*.sh.j2.

Scripts depend on the cluster plan and the role kind only; node-specific values (IP, rank, head
address, interface) come from the node's environment, so the same text runs on every worker and
inside SLURM jobs.
"""

from __future__ import annotations

from collections.abc import Mapping

from kit import __version__
from kit.config import KitConfig
from kit.images.facts import packed_probe
from kit.plan.image_check import precheck_spec
from kit.plan.paths import API_KEY_PATH
from kit.plan.ray import ray_head_args, ray_resource, ray_worker_args
from kit.plan.replicas import Replica, describe, replicas_on, router_mode
from kit.plan.roles import Role
from kit.plan.vllm import (
    DP_START_RANK_VAR,
    REPLICA_HEAD_VAR,
    replica_device_ids,
    replica_serve_argv,
    serves_api,
    vllm_serve_argv,
)
from kit.render import Arg, render
from kit.resources import program_source

# Per-node network variables vLLM must not copy from the head to Ray workers (FIELD_NOTES §1 row 11).
NON_CARRY_OVER = [
    "VLLM_HOST_IP",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "CUDA_VISIBLE_DEVICES",
    "KIT_NODE_RANK",
    "KIT_ROLE",
]
READY_MARK = "KIT_READY"
JOINED_MARK = "KIT_JOINED"
SERVE_LOG = "/tmp/kit/serve.log"


def ray_token_enabled(config: KitConfig) -> bool:
    """Ray's token authentication, for a Ray cluster with a ray_token_file."""
    return config.backend == "ray" and bool(config.ray_token_file)


def image_precheck(config: KitConfig, role: Role, *, serve: bool) -> dict[str, object]:
    """The in-container check of a launcher written without a record of the image (issue 24):
    kit's probe as one word (gzip + base64), what it is told (kit.plan.image_check)."""
    return {
        "program": packed_probe(),
        "spec": precheck_spec(config, role, serve=serve),
        "serve": serve,
        "what": "every option below against the image's own `vllm serve` parser" if serve else "that the image has Ray",
    }


def node_script(config: KitConfig, role: Role, *, precheck: bool = False) -> str:
    """The container's main process: a Ray head with a barrier, a Ray worker that retries joining,
    or (mp backend) a node that holds the container until `kit serve` starts the engine.
    `precheck`: with Ray, check first that the image has it (a launcher kit wrote without a
    record of the image)."""
    common = {
        "version": __version__,
        "non_carry_over": NON_CARRY_OVER,
        "ready_mark": READY_MARK,
        "joined_mark": JOINED_MARK,
        "join_timeout": config.timeouts.join,
        "ray_token": ray_token_enabled(config),
        "precheck": image_precheck(config, role, serve=False) if precheck and config.backend == "ray" else None,
    }
    if config.backend == "mp":
        return render("node_mp.sh.j2", role=role.kind, **common)
    if role.is_head:
        resource, expected = ray_resource(config)
        return render(
            "node_ray_head.sh.j2",
            ray_args=ray_head_args(config),
            gcs_port=config.ports.ray_gcs,
            nodes=config.nodes,
            resource=resource,
            expected=expected,
            barrier=program_source("cluster/ray_barrier.py"),
            **common,
        )
    return render("node_ray_worker.sh.j2", ray_args=ray_worker_args(config), gcs_port=config.ports.ray_gcs, **common)


def serve_script(
    config: KitConfig,
    role: Role,
    *,
    env: Mapping[str, str] | None = None,
    precheck: bool = False,
    slot: int | None = None,
) -> str:
    """`vllm serve` for this role; the API key is read from its file into VLLM_API_KEY (never argv).
    `env`: variables the serve process exports (kit's own, e.g. HF_HUB_OFFLINE from
    kit.cluster.model), over what the container was started with. `precheck`: check the command
    against the image's own parser first (a launcher kit wrote without a record of the image).
    `slot` (router replicas): only the replica in that slot of the node, not all of them."""
    if router_mode(config):
        return replicas_script(config, role, env=env, precheck=precheck, slot=slot)
    if config.backend == "ray" and not role.is_head:
        raise ValueError("with the Ray backend only the head runs `vllm serve`")
    headless_dp = config.dp > 1 and config.backend == "mp" and config.nodes > 1 and not role.is_head
    return render(
        "serve.sh.j2",
        version=__version__,
        role=role.kind,
        argv=vllm_serve_argv(config, role),
        api_key_path=API_KEY_PATH if (config.api_key_file and serves_api(config, role)) else None,
        ray_address=config.backend == "ray",
        gcs_port=config.ports.ray_gcs,
        dp_local=config.dp_local if headless_dp else None,
        dp_start_var=DP_START_RANK_VAR,
        env=dict(sorted((env or {}).items())),
        precheck=image_precheck(config, role, serve=True) if precheck else None,
    )


def replicas_script(
    config: KitConfig,
    role: Role,
    *,
    env: Mapping[str, str] | None = None,
    precheck: bool = False,
    slot: int | None = None,
) -> str:
    """model.dp_lb router (issue 29): the node's part of every replica placed on it
    (kit.plan.replicas), or of the one in slot `slot` (supervised: one group per replica): one
    `vllm serve` (exec'd), or several side by side on their own GPUs. `precheck` (a SLURM
    launcher written without a record of the image): as serve_script's."""
    mine = [r for r in replicas_on(config, role.rank) if slot is None or r.slot == slot]
    if not mine:
        raise ValueError(f"node {role.rank} holds no replica in slot {slot}")
    parts = [replica_part(config, replica, role.rank) for replica in mine]
    return render_replicas(config, role.rank, parts, env=env, precheck=role if precheck else None)


def replica_part(config: KitConfig, replica: Replica, node: int, *, node_rank: Arg | None = None) -> dict[str, object]:
    """One replica's part on node `node`, as serve_replicas.sh.j2 renders it (`node_rank`:
    kit.plan.vllm.replica_serve_argv)."""
    partial = len(replica.gpus) < config.gpus_per_node
    cuda = None
    if config.accelerator == "gpu" and partial and not replica_device_ids(config, replica):
        cuda = ",".join(str(i) for i in replica.gpus)
    return {
        "name": replica.name,
        "api": replica.head == node,
        "port": replica.port,
        "cuda": cuda,
        "argv": replica_serve_argv(config, replica, node, node_rank=node_rank),
        "spans_nodes": replica.spans_nodes,
    }


def render_replicas(
    config: KitConfig,
    node: int | str,
    parts: list[dict[str, object]],
    *,
    env: Mapping[str, str] | None = None,
    precheck: Role | None = None,
) -> str:
    """serve_replicas.sh.j2 for these parts of replicas on one node (`node`: its rank, or words
    saying which nodes run it). `precheck`: check the one replica's `vllm serve` against the
    image's own parser first, as this role's."""
    return render(
        "serve_replicas.sh.j2",
        version=__version__,
        node=node,
        what=describe(config),
        replicas=parts,
        replica_head=REPLICA_HEAD_VAR if any(p["spans_nodes"] for p in parts) else None,
        api_key_path=API_KEY_PATH if config.api_key_file else None,
        env=dict(sorted((env or {}).items())),
        precheck=image_precheck(config, precheck, serve=True) if precheck and len(parts) == 1 else None,
    )

"""What `kit slurm` does with every config key (issue 28): the launcher honours it, another verb
reads it (the same kit.yaml serves `kit pull`, `kit verify`), or it has no meaning inside a job
and is refused when set, never silently dropped. `tests/unit/test_slurm_keys.py` checks that
every key of kit.config.schema is in exactly one of these tables.
"""

from __future__ import annotations

from collections.abc import Mapping

from kit.config import KitConfig
from kit.errors import ConfigError

# Keys the launcher carries (into #SBATCH lines, the node step, a container, a script).
HONOURED = frozenset(
    {
        "cluster", "runtime", "image", "vllm_version", "backend", "accelerator", "nodes", "gpus_per_node",
        "interface", "infiniband", "ports.ray_gcs", "ports.ray_client", "ports.ray_dashboard",
        "ports.ray_node_manager", "ports.ray_object_manager", "ports.ray_metrics_export",
        "ports.ray_dashboard_agent_grpc", "ports.ray_dashboard_agent_http", "ports.ray_runtime_env_agent",
        "ports.ray_min_worker", "ports.ray_max_worker", "ports.api", "ports.mp_master", "ports.dp_rpc",
        "ports.supervisor", "api_listen", "tunnel.login_host", "tunnel.ssh_port", "model.id",
        "model.served_name", "model.tp", "model.pp", "model.dp", "model.ep", "model.all2all",
        "model.api_servers", "model.dp_lb", "model.max_model_len", "model.gpu_memory", "model.extra_args",
        "model.offline", "hf_cache", "hf_token_file", "api_key_file", "ray_token_file", "compile_cache.dir",
        "compile_cache.scope", "ipc_host", "shm_size", "env", "mounts", "timeouts.join", "timeouts.ready",
        "timeouts.liveness", "supervise.enabled", "supervise.max_restarts", "supervise.backoff",
        "supervise.stable", "ray.temp_dir", "ray.dashboard", "apptainer.gpu_args", "apptainer.extra_args",
        "docker.user", "docker.read_only", "slurm.account", "slurm.partition", "slurm.qos", "slurm.time",
        "slurm.cpus_per_task", "slurm.job_name", "slurm.output", "slurm.error", "slurm.requeue",
        "slurm.exclusive", "slurm.prologue", "ports.replica", "ports.router_metrics", "router.image",
        "router.policy", "router.health_interval",
    }
)  # fmt: skip

# Keys of other verbs: kit.yaml holds them for those; the launcher has no use for them.
OTHER_VERBS = {
    "ports.verify": "kit verify",
    "apptainer.image_dir": "kit pull / kit build",
    "apptainer.cache_dir": "kit pull / kit build",
    "apptainer.tmp_dir": "kit pull / kit build",
    "enroot.image_dir": "kit pull",
}

# Keys a job decides for itself: refused when set (their value, and the hint).
REFUSED = {
    "head_address": "the job finds the head itself (the first node of the allocation): unset head_address",
    "node_ip": "every node finds its own IP inside the job (from its route to the head, or `interface`): "
    "unset node_ip, or set interface",
    "gpus": "SLURM gives each node its GPUs (gpus_per_node -> --gpus-per-task): unset gpus",
    "network": "SLURM nodes use host networking: unset network",
    # model.dp_lb router (issue 29): each array task's first node is its replica's (kit.plan.slurm_replicas)
    "replica_head": "each array task finds its replica's first node itself: unset replica_head",
    "network_subnet": "network_subnet belongs to a Docker simulation network, which a job has not: unset it",
}

# The value each refused key may keep (its default): `auto`, `all`, unset.
_HARMLESS: Mapping[str, object] = {"node_ip": "auto", "gpus": "all"}


def check_slurm_keys(config: KitConfig, sources: Mapping[str, str]) -> None:
    """Refuse the keys a job cannot honour (REFUSED) when the user set them."""
    for key, hint in REFUSED.items():
        source = sources.get(key, "default")
        value = _value(config, key)
        if source == "default" or value is None or value == _HARMLESS.get(key):
            continue
        raise ConfigError(
            f"`kit slurm` cannot honour {key}: {hint.split(':')[0]}",
            key=key,
            source=source,
            hint=hint.split(": ", 1)[1] if ": " in hint else hint,
        )


def _value(config: KitConfig, key: str) -> object:
    value: object = config
    for part in key.split("."):
        value = getattr(value, part)
    return value

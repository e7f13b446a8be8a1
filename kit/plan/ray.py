"""`ray start` arguments with every port pinned (FIELD_NOTES §1 row 14).

The node IP and the head address are node-specific: the templates add them as
`--node-ip-address="${VLLM_HOST_IP}"` and `--address="${KIT_HEAD_ADDRESS}:PORT"`.
"""

from __future__ import annotations

from kit.config import KitConfig


def ray_common_args(config: KitConfig) -> list[str]:
    p = config.ports
    return [
        f"--node-manager-port={p.ray_node_manager}",
        f"--object-manager-port={p.ray_object_manager}",
        f"--metrics-export-port={p.ray_metrics_export}",
        f"--dashboard-agent-grpc-port={p.ray_dashboard_agent_grpc}",
        f"--dashboard-agent-listen-port={p.ray_dashboard_agent_http}",
        f"--runtime-env-agent-port={p.ray_runtime_env_agent}",
        f"--min-worker-port={p.ray_min_worker}",
        f"--max-worker-port={p.ray_max_worker}",
        "--disable-usage-stats",
    ]


def ray_head_args(config: KitConfig) -> list[str]:
    p = config.ports
    args = [f"--port={p.ray_gcs}", f"--ray-client-server-port={p.ray_client}", f"--temp-dir={config.ray.temp_dir}"]
    if config.ray.dashboard:
        args += ["--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={p.ray_dashboard}"]
    else:
        args.append("--include-dashboard=false")
    return args + ray_common_args(config)


def ray_worker_args(config: KitConfig) -> list[str]:
    return ray_common_args(config)


def ray_resource(config: KitConfig) -> tuple[str, int]:
    """The resource the head's barrier counts, and how much of it the cluster must have."""
    return ("GPU" if config.accelerator == "gpu" else "CPU"), config.nodes * config.gpus_per_node

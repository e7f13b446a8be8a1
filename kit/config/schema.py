"""kit's configuration schema: every key, its type, default, bounds and help. kit/config/__init__.py
loads and layers the values; `kit config show` and the README's key list read this table.
"""

from __future__ import annotations

from kit.images.vllm_releases import DP_LB_MODES
from kit.validate import Spec

# Names that become parts of container, network and label names (Docker's rule).
NAME_PATTERN = (r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}", "letters, digits, '.', '_' or '-' (at most 63)")
# A Linux interface name (IFNAMSIZ 16: at most 15 characters, no '/', ':' or blanks), or auto.
INTERFACE_PATTERN = (r"auto|[A-Za-z0-9_.@][A-Za-z0-9_.@-]{0,14}", "an interface name like eth0 or ib0, or auto")
# vllm_version: a release kit.images.vllm_releases renders for, or auto.
VERSION_PATTERN = (r"auto|v?[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}", "auto or a vLLM release like 0.33.0")
# model.all2all: a backend name; which ones exist is the image's parser's to say (issue 24).
ALL2ALL_PATTERN = (r"auto|[a-z][a-z0-9_]{0,63}", "auto or a backend name like deepep_low_latency")


def _port(default: int, help: str) -> Spec:
    return Spec("int", default, help, low=1, high=65535)


# Dotted key -> Spec. This table is the schema; the dataclasses below mirror it.
SCHEMA: dict[str, Spec] = {
    "cluster": Spec("str", "kit", "cluster name: container names and labels derive from it", pattern=NAME_PATTERN),
    "runtime": Spec(
        "choice",
        "docker",
        "container runtime (pyxis, edf: SLURM only, with enroot; enroot: kit pull)",
        ("docker", "apptainer", "pyxis", "edf", "enroot"),
    ),
    "image": Spec(
        "str", "vllm/vllm-openai:v0.33.0", "Docker image reference, or a SIF path for apptainer", text="path"
    ),
    "vllm_version": Spec(
        "str", "auto", "the image's vLLM release X.Y.Z, or auto (kit's record, the tag)", pattern=VERSION_PATTERN
    ),
    # mp, vLLM's own multi-node backend, is the default (issue 24): vLLM stopped depending on Ray in
    # 0.18.0 and its stock images have no `ray` since. Ray needs an image that has it (kit build ray).
    "backend": Spec("choice", "mp", "multi-node backend: vLLM's own (mp), or Ray (an image with Ray)", ("mp", "ray")),
    "accelerator": Spec("choice", "gpu", "gpu, or cpu (vLLM's CPU build; demo and tests)", ("gpu", "cpu")),
    "nodes": Spec("int", 1, "number of nodes in the cluster", low=1, high=16384),
    "gpus_per_node": Spec("int", 1, "GPUs per node (with accelerator=cpu: engine ranks per node)", low=1, high=1024),
    "gpus": Spec("str", "all", "GPUs given to the container: 'all' or indices like '0,1'"),
    "head_address": Spec("str", None, "the head node's IP (required on workers)", optional=True),
    "replica_head": Spec(
        "str",
        None,
        "model.dp_lb router, host networking: the IP of the first node of this node's replica (one over several nodes)",
        optional=True,
    ),
    "node_ip": Spec("str", "auto", "this node's IPv4 address, or auto (route to the head / default route)"),
    "interface": Spec(
        "str",
        "auto",
        "network interface for NCCL/Gloo, or auto (the one carrying node_ip)",
        pattern=INTERFACE_PATTERN,
    ),
    "infiniband": Spec("choice", "auto", "pass /dev/infiniband, IPC_LOCK, memlock", ("auto", "on", "off")),
    "network": Spec(
        "str",
        None,
        "Docker network for local multi-node simulation (instead of host networking)",
        optional=True,
        pattern=NAME_PATTERN,
    ),
    "network_subnet": Spec("str", "172.30.77.0/24", "subnet of the simulation network; node k gets .(10+k)"),
    "ports.ray_gcs": _port(6379, "Ray GCS port (head)"),
    "ports.ray_client": _port(10001, "Ray client server port (head)"),
    "ports.ray_dashboard": _port(8265, "Ray dashboard port (bound to loopback when enabled)"),
    "ports.ray_node_manager": _port(6380, "raylet node manager port"),
    "ports.ray_object_manager": _port(6381, "object manager port"),
    "ports.ray_metrics_export": _port(6382, "metrics export port"),
    "ports.ray_dashboard_agent_grpc": _port(6383, "dashboard agent gRPC port"),
    "ports.ray_dashboard_agent_http": _port(6384, "dashboard agent HTTP port"),
    "ports.ray_runtime_env_agent": _port(6385, "runtime env agent port"),
    "ports.ray_min_worker": _port(11000, "lowest Ray worker port"),
    "ports.ray_max_worker": _port(11999, "highest Ray worker port"),
    "ports.api": _port(8000, "vLLM OpenAI API port"),
    "ports.mp_master": _port(29500, "mp backend master port (torch.distributed rendezvous)"),
    "ports.verify": Spec(
        "int", 29512, "rendezvous port of `kit verify`'s collective probe (free while serving)", low=1, high=65535
    ),
    "ports.dp_rpc": Spec(
        "int", 29550, "data-parallel RPC port on the head (--data-parallel-rpc-port; vLLM's default)", low=1, high=65535
    ),
    "ports.supervisor": _port(
        29570,
        "supervisor control endpoint on the head's node IP (supervise.enabled; router replicas: + the replica's slot)",
    ),
    "ports.replica": _port(8100, "model.dp_lb router: the first replica's API port on a node (the next replica +1)"),
    "ports.router_metrics": _port(29000, "model.dp_lb router: the router's Prometheus port (on loopback)"),
    "api_listen": Spec(
        "choice",
        "node-ip",
        "where the API listens: node-ip (the head's node IP only), or all (every interface: a login node "
        "reaching the head by another network than `interface`)",
        ("node-ip", "all"),
    ),
    "tunnel.login_host": Spec(
        "str",
        None,
        "[USER@]HOST the SSH tunnel hint goes through (default: the job's submit host)",
        optional=True,
        pattern=(r"([A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}@)?[A-Za-z0-9][A-Za-z0-9.-]{0,252}", "a host name, or USER@HOST"),
    ),
    "tunnel.ssh_port": Spec("int", 22, "SSH port of tunnel.login_host", low=1, high=65535),
    "model.id": Spec(
        "str", "Qwen/Qwen2.5-7B-Instruct", "model id on the hub, or a path inside the HF cache mount", text="path"
    ),
    "model.served_name": Spec("str", None, "name clients use (default: the model id)", optional=True),
    "model.tp": Spec(
        "int_auto",
        "auto",
        "tensor parallel size, or auto (kit plan; = gpus_per_node without a model)",
        low=1,
        high=1 << 20,
    ),
    "model.pp": Spec(
        "int_auto", "auto", "pipeline parallel size, or auto (kit plan; = nodes without a model)", low=1, high=1 << 20
    ),
    "model.dp": Spec(
        "int_auto",
        1,
        "data parallel size (engine replicas of TP×PP GPUs each), or auto = GPUs / (tp × pp)",
        low=1,
        high=1 << 20,
    ),
    "model.ep": Spec("bool", False, "expert parallelism for MoE layers (--enable-expert-parallel), over TP×DP GPUs"),
    # vLLM reads --max-model-len -1 as auto: the longest context that fits (human_readable_int_or_auto).
    "model.all2all": Spec(
        "str", "auto", "EP all-to-all backend (one the image's vLLM accepts), or auto (vLLM's)", pattern=ALL2ALL_PATTERN
    ),
    "model.api_servers": Spec("int_auto", "auto", "--api-server-count, or auto (vLLM's)", low=1, high=1024),
    "model.dp_lb": Spec(
        "choice",
        "internal",
        "DP load balancing: internal (head), hybrid (per node), or router (independent replicas behind vllm-router)",
        DP_LB_MODES,
    ),
    "model.max_model_len": Spec(
        "int",
        None,
        "maximum context length (-1: the longest that fits)",
        optional=True,
        low=1,
        high=2**31 - 1,
        special=(-1,),
    ),
    "model.gpu_memory": Spec(
        "str", None, "GPU model or memory per GPU (H100-80GB, 40GiB) for tp/pp auto from `kit plan`", optional=True
    ),
    "model.extra_args": Spec("list", [], "extra `vllm serve` arguments, as a list", text="arg", high=1024),
    "model.offline": Spec(
        "choice",
        "auto",
        "run vLLM with HF_HUB_OFFLINE=1: auto (when the model is complete in hf_cache), true, false",
        ("auto", "true", "false"),
    ),
    "hf_cache": Spec(
        "str", "~/.cache/huggingface", "host HF cache dir, mounted at the same path on every node", text="path"
    ),
    "hf_token_file": Spec(
        "str",
        None,
        "file holding the HF token (mounted read-only; HF_TOKEN_PATH)",
        optional=True,
        text="path",
    ),
    "api_key_file": Spec("str", None, "file holding the API key for the server", optional=True, text="path"),
    "ray_token_file": Spec("str", None, "file holding the Ray token (Ray token auth)", optional=True, text="path"),
    "compile_cache.dir": Spec(
        "str",
        None,
        "host folder for vLLM's compile caches (torch.compile, Triton, Inductor, FlashInfer), kept across starts",
        optional=True,
        text="path",
        pattern=(r"(/|~/)[^:,]*", "an absolute host path (or ~/...) without ':' or ','"),
    ),
    "compile_cache.scope": Spec(
        "choice",
        "per-node",
        "per-node: a subfolder node-RANK for each node; shared: every node uses the folder itself",
        ("per-node", "shared"),
    ),
    "ipc_host": Spec("bool", True, "share the host IPC namespace (--ipc=host); false uses shm_size"),
    "shm_size": Spec("size", "16g", "/dev/shm size when ipc_host is false (e.g. 10.24g)"),
    "env": Spec(
        "dict", {}, "extra environment for every node (never secrets: use the *_file keys)", text="env", high=1024
    ),
    "mounts": Spec("list", [], "extra mounts '/HOST:/CONTAINER[:ro]' (absolute host path)", text="mount", high=256),
    "timeouts.join": Spec(
        "int", 600, "seconds a worker keeps retrying to join the head / head waits for nodes", low=1, high=10_000_000
    ),
    "timeouts.ready": Spec(
        "int_auto",
        "auto",
        "seconds to wait for the server to become healthy, or auto: 1800, and under SLURM the job's remaining walltime",
        low=1,
        high=10_000_000,
    ),
    "timeouts.liveness": Spec(
        "int",
        30,
        "seconds without token progress (or an unanswered one-token probe) before an engine is hung",
        low=1,
        high=10_000_000,
    ),
    "supervise.enabled": Spec("bool", False, "supervise the server: restart the whole group on a failure"),
    "supervise.max_restarts": Spec(
        "int", 5, "restarts in a row before supervision gives up (exit 6)", low=0, high=1000
    ),
    "supervise.backoff": Spec(
        "int", 5, "seconds before the 2nd restart in a row, doubling after (max 300)", low=0, high=86_400
    ),
    "supervise.stable": Spec(
        "int", 300, "seconds of serving after which restarts count from 0 again", low=1, high=10_000_000
    ),
    "router.image": Spec(
        "str", "kit/vllm-router:0.1.17", "model.dp_lb router: the router's image (`kit build router`)", text="path"
    ),
    "router.policy": Spec(
        "choice",
        "round_robin",
        "model.dp_lb router: vllm-router's balancing policy",
        ("round_robin", "random", "power_of_two", "cache_aware", "consistent_hash"),
    ),
    "router.health_interval": Spec(
        "int", 2, "model.dp_lb router: seconds between the router's health checks of each replica", low=1, high=3600
    ),
    "ray.temp_dir": Spec("str", "/tmp/ray", "Ray --temp-dir inside the container", text="path"),
    "ray.dashboard": Spec("bool", False, "start the Ray dashboard (on loopback only)"),
    "apptainer.image_dir": Spec("str", "~/.local/share/kit/images", "where SIF files are written", text="path"),
    "apptainer.cache_dir": Spec("str", None, "APPTAINER_CACHEDIR", optional=True, text="path"),
    "apptainer.tmp_dir": Spec(
        "str", None, "APPTAINER_TMPDIR (needs room for the unpacked image)", optional=True, text="path"
    ),
    "apptainer.gpu_args": Spec(
        "list",
        ["--nv"],
        "Apptainer's GPU options on every node (a site may need [--nvccli, --writable-tmpfs])",
        text="arg",
        high=32,
    ),
    "apptainer.extra_args": Spec(
        "list",
        [],
        "more options of every node's `apptainer exec`/`instance start` (e.g. --fakeroot)",
        text="arg",
        high=64,
    ),
    "docker.user": Spec(
        "str",
        None,
        "run the node containers as UID[:GID] (docker run --user), as Apptainer runs them as you",
        optional=True,
        pattern=(r"[0-9]{1,10}(:[0-9]{1,10})?", "a numeric UID or UID:GID, e.g. 1000:1000"),
    ),
    "docker.read_only": Spec(
        "bool", False, "read-only image filesystem (docker run --read-only; /tmp a tmpfs), as Apptainer's image is"
    ),
    "enroot.image_dir": Spec(
        "str", "~/.local/share/kit/images", "where `kit pull --runtime enroot` writes squashfs files", text="path"
    ),
    "slurm.account": Spec("str", None, "#SBATCH --account", optional=True),
    "slurm.partition": Spec("str", None, "#SBATCH --partition", optional=True),
    "slurm.qos": Spec("str", None, "#SBATCH --qos", optional=True),
    "slurm.time": Spec("str", "01:00:00", "#SBATCH --time (walltime)"),
    "slurm.cpus_per_task": Spec("int", None, "#SBATCH --cpus-per-task", optional=True, low=1, high=100_000),
    "slurm.job_name": Spec("str", "kit-vllm", "#SBATCH --job-name"),
    "slurm.output": Spec("str", "kit-%j.out", "#SBATCH --output", text="path"),
    "slurm.error": Spec("str", "kit-%j.err", "#SBATCH --error", text="path"),
    "slurm.requeue": Spec("bool", False, "#SBATCH --requeue, and requeue the job when supervision gives up"),
    "slurm.exclusive": Spec(
        "bool", False, "#SBATCH --exclusive (whole nodes: runtime docker then gives the containers every GPU)"
    ),
    "slurm.prologue": Spec(
        "str",
        None,
        "a shell file of yours every node sources before anything starts (module load apptainer, site "
        "environment); kit only sources it, never copies it",
        optional=True,
        text="path",
    ),
}

SECRET_ENV_NAMES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY", "OPENAI_API_KEY", "RAY_AUTH_TOKEN")

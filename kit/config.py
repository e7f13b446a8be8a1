"""kit's configuration: a typed schema, frozen dataclasses, and a layered loader.

Layers, lowest first: built-in defaults < kit.yaml < KIT_* environment < command-line flags.
Every resolved key remembers where its value came from (`kit config show`).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kit.errors import ConfigError


@dataclass(frozen=True)
class Spec:
    kind: str  # str | int | float | bool | list | dict | choice | int_auto | size
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    optional: bool = False  # None allowed
    secret: bool = False  # value is a path to a secret; shown, but the secret never read here


# Dotted key -> Spec. This table is the schema; the dataclasses below mirror it.
SCHEMA: dict[str, Spec] = {
    "cluster": Spec("str", "kit", "cluster name: container names and labels derive from it"),
    "runtime": Spec("choice", "docker", "container runtime", ("docker", "apptainer")),
    "image": Spec("str", "vllm/vllm-openai:v0.11.0", "Docker image reference, or a SIF path for apptainer"),
    "backend": Spec("choice", "ray", "multi-node backend: Ray, or vLLM's own (mp)", ("ray", "mp")),
    "accelerator": Spec("choice", "gpu", "gpu, or cpu (vLLM's CPU build; demo and tests)", ("gpu", "cpu")),
    "nodes": Spec("int", 1, "number of nodes in the cluster"),
    "gpus_per_node": Spec("int", 1, "GPUs per node (with accelerator=cpu: engine ranks per node)"),
    "gpus": Spec("str", "all", "GPUs given to the container: 'all' or indices like '0,1'"),
    "head_address": Spec("str", None, "the head node's IP (required on workers)", optional=True),
    "node_ip": Spec("str", "auto", "this node's IPv4 address, or auto (route to the head / default route)"),
    "interface": Spec("str", "auto", "network interface for NCCL/Gloo, or auto (the one carrying node_ip)"),
    "infiniband": Spec("choice", "auto", "pass /dev/infiniband, IPC_LOCK, memlock", ("auto", "on", "off")),
    "network": Spec(
        "str", None, "Docker network for local multi-node simulation (instead of host networking)", optional=True
    ),
    "network_subnet": Spec("str", "172.30.77.0/24", "subnet of the simulation network; node k gets .(10+k)"),
    "ports.ray_gcs": Spec("int", 6379, "Ray GCS port (head)"),
    "ports.ray_client": Spec("int", 10001, "Ray client server port (head)"),
    "ports.ray_dashboard": Spec("int", 8265, "Ray dashboard port (bound to loopback when enabled)"),
    "ports.ray_node_manager": Spec("int", 6380, "raylet node manager port"),
    "ports.ray_object_manager": Spec("int", 6381, "object manager port"),
    "ports.ray_metrics_export": Spec("int", 6382, "metrics export port"),
    "ports.ray_dashboard_agent_grpc": Spec("int", 6383, "dashboard agent gRPC port"),
    "ports.ray_dashboard_agent_http": Spec("int", 6384, "dashboard agent HTTP port"),
    "ports.ray_runtime_env_agent": Spec("int", 6385, "runtime env agent port"),
    "ports.ray_min_worker": Spec("int", 11000, "lowest Ray worker port"),
    "ports.ray_max_worker": Spec("int", 11999, "highest Ray worker port"),
    "ports.api": Spec("int", 8000, "vLLM OpenAI API port"),
    "ports.mp_master": Spec("int", 29500, "mp backend master port (torch.distributed rendezvous)"),
    "ports.verify": Spec("int", 29512, "rendezvous port of `kit verify`'s collective probe (free while serving)"),
    "ports.dp_rpc": Spec("int", 29550, "data-parallel RPC port on the head (--data-parallel-rpc-port; vLLM's default)"),
    "model.id": Spec("str", "Qwen/Qwen2.5-7B-Instruct", "model id on the hub, or a path inside the HF cache mount"),
    "model.served_name": Spec("str", None, "name clients use (default: the model id)", optional=True),
    "model.tp": Spec("int_auto", "auto", "tensor parallel size, or auto (kit plan; = gpus_per_node without a model)"),
    "model.pp": Spec("int_auto", "auto", "pipeline parallel size, or auto (kit plan; = nodes without a model)"),
    "model.dp": Spec(
        "int_auto", 1, "data parallel size (engine replicas of TP×PP GPUs each), or auto = GPUs / (tp × pp)"
    ),
    "model.ep": Spec("bool", False, "expert parallelism for MoE layers (--enable-expert-parallel), over TP×DP GPUs"),
    "model.max_model_len": Spec("int", None, "maximum context length", optional=True),
    "model.gpu_memory": Spec(
        "str", None, "GPU model or memory per GPU (H100-80GB, 40GiB) for tp/pp auto from `kit plan`", optional=True
    ),
    "model.extra_args": Spec("list", [], "extra `vllm serve` arguments, as a list"),
    "hf_cache": Spec("str", "~/.cache/huggingface", "host HF cache dir, mounted at the same path on every node"),
    "hf_token_file": Spec(
        "str", None, "file holding the HF token (mounted read-only; HF_TOKEN_PATH)", optional=True, secret=True
    ),
    "api_key_file": Spec("str", None, "file holding the API key for the server", optional=True, secret=True),
    "ray_token_file": Spec("str", None, "file holding the Ray token (Ray token auth)", optional=True, secret=True),
    "ipc_host": Spec("bool", True, "share the host IPC namespace (--ipc=host); false uses shm_size"),
    "shm_size": Spec("size", "16g", "/dev/shm size when ipc_host is false (e.g. 10.24g)"),
    "env": Spec("dict", {}, "extra environment for every node (never secrets: use the *_file keys)"),
    "mounts": Spec("list", [], "extra mounts 'HOST:CONTAINER[:ro]'"),
    "timeouts.join": Spec("int", 600, "seconds a worker keeps retrying to join the head / head waits for nodes"),
    "timeouts.ready": Spec("int", 1800, "seconds to wait for the server to become healthy"),
    "ray.temp_dir": Spec("str", "/tmp/ray", "Ray --temp-dir inside the container"),
    "ray.dashboard": Spec("bool", False, "start the Ray dashboard (on loopback only)"),
    "apptainer.image_dir": Spec("str", "~/.local/share/kit/images", "where SIF files are written"),
    "apptainer.cache_dir": Spec("str", None, "APPTAINER_CACHEDIR", optional=True),
    "apptainer.tmp_dir": Spec("str", None, "APPTAINER_TMPDIR (needs room for the unpacked image)", optional=True),
    "slurm.account": Spec("str", None, "#SBATCH --account", optional=True),
    "slurm.partition": Spec("str", None, "#SBATCH --partition", optional=True),
    "slurm.qos": Spec("str", None, "#SBATCH --qos", optional=True),
    "slurm.time": Spec("str", "01:00:00", "#SBATCH --time (walltime)"),
    "slurm.cpus_per_task": Spec("int", None, "#SBATCH --cpus-per-task", optional=True),
    "slurm.job_name": Spec("str", "kit-vllm", "#SBATCH --job-name"),
    "slurm.output": Spec("str", "kit-%j.out", "#SBATCH --output"),
    "slurm.error": Spec("str", "kit-%j.err", "#SBATCH --error"),
}

SECRET_ENV_NAMES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_API_KEY", "OPENAI_API_KEY", "RAY_AUTH_TOKEN")


@dataclass(frozen=True)
class Ports:
    ray_gcs: int
    ray_client: int
    ray_dashboard: int
    ray_node_manager: int
    ray_object_manager: int
    ray_metrics_export: int
    ray_dashboard_agent_grpc: int
    ray_dashboard_agent_http: int
    ray_runtime_env_agent: int
    ray_min_worker: int
    ray_max_worker: int
    api: int
    mp_master: int
    verify: int
    dp_rpc: int


@dataclass(frozen=True)
class Model:
    id: str
    served_name: str | None
    tp: int | str
    pp: int | str
    dp: int | str
    ep: bool
    max_model_len: int | None
    gpu_memory: str | None
    extra_args: tuple[str, ...]


@dataclass(frozen=True)
class Timeouts:
    join: int
    ready: int


@dataclass(frozen=True)
class Ray:
    temp_dir: str
    dashboard: bool


@dataclass(frozen=True)
class Apptainer:
    image_dir: str
    cache_dir: str | None
    tmp_dir: str | None


@dataclass(frozen=True)
class Slurm:
    account: str | None
    partition: str | None
    qos: str | None
    time: str
    cpus_per_task: int | None
    job_name: str
    output: str
    error: str


@dataclass(frozen=True)
class KitConfig:
    cluster: str
    runtime: str
    image: str
    backend: str
    accelerator: str
    nodes: int
    gpus_per_node: int
    gpus: str
    head_address: str | None
    node_ip: str
    interface: str
    infiniband: str
    network: str | None
    network_subnet: str
    ports: Ports
    model: Model
    hf_cache: str
    hf_token_file: str | None
    api_key_file: str | None
    ray_token_file: str | None
    ipc_host: bool
    shm_size: str
    env: Mapping[str, str]
    mounts: tuple[str, ...]
    timeouts: Timeouts
    ray: Ray
    apptainer: Apptainer
    slurm: Slurm

    @property
    def tp(self) -> int:
        """Resolved tensor parallel size (auto = GPUs per node; with a fixed DP > 1, the GPUs of one
        replica: nodes × GPUs per node / (DP × PP); with DP auto, one node's GPUs / PP)."""
        if self.model.tp != "auto":
            return int(self.model.tp)
        if self.model.dp == "auto":
            return max(1, self.gpus_per_node // self.pp)
        if self._fixed_dp > 1:
            return max(1, self.nodes * self.gpus_per_node // (self._fixed_dp * self.pp))
        return self.gpus_per_node

    @property
    def pp(self) -> int:
        """Resolved pipeline parallel size (auto = nodes; 1 with DP auto or > 1, where every replica
        stays inside one node: the same whether DP is still auto or already resolved)."""
        if self.model.pp != "auto":
            return int(self.model.pp)
        return 1 if self.replicated else self.nodes

    @property
    def dp(self) -> int:
        """Resolved data parallel size (auto = nodes × GPUs per node / (TP × PP), at least 1)."""
        if self.model.dp == "auto":
            return max(1, self.nodes * self.gpus_per_node // (self.tp * self.pp))
        return int(self.model.dp)

    @property
    def dp_local(self) -> int:
        """DP ranks on each node (vLLM's --data-parallel-size-local); topology checks make it exact."""
        return max(1, self.dp // self.nodes)

    @property
    def replicated(self) -> bool:
        """Data parallel (DP auto or > 1): every replica stays inside one node."""
        return self.model.dp == "auto" or self._fixed_dp > 1

    @property
    def _fixed_dp(self) -> int:
        return 1 if self.model.dp == "auto" else int(self.model.dp)

    @property
    def served_name(self) -> str:
        return self.model.served_name or self.model.id

    def replace(self, **changes: Any) -> KitConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Resolved:
    """The config plus where each key's value came from."""

    config: KitConfig
    values: Mapping[str, Any]
    sources: Mapping[str, str]
    path: str | None = None

    def show(self) -> list[tuple[str, Any, str]]:
        return [(k, self.values[k], self.sources[k]) for k in SCHEMA]


def env_name(key: str) -> str:
    return "KIT_" + key.upper().replace(".", "_")


ENV_TO_KEY = {env_name(k): k for k in SCHEMA}
RESERVED_ENV = {"KIT_CONFIG", "KIT_STATE_DIR", "KIT_LOG_LEVEL"}

_SIZE_RE = re.compile(r"^\d+(\.\d+)?[kmgt]?b?$", re.IGNORECASE)


def _suggest(key: str, known: list[str]) -> str | None:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return close[0] if close else None


def coerce(key: str, value: Any, source: str) -> Any:
    """Check (and lightly convert) one value against the schema; raise ConfigError naming the key."""
    spec = SCHEMA[key]
    if value is None:
        if spec.optional:
            return None
        raise ConfigError("must not be empty", key=key, source=source, hint=f"set it or remove it ({spec.help})")
    kind = spec.kind
    bad = ConfigError(
        f"expected {_KIND_WORDS[kind]}, got {type(value).__name__} {value!r}",
        key=key,
        source=source,
        hint=spec.help,
    )
    if kind == "str":
        if isinstance(value, (bool, list, dict)):
            raise bad
        return str(value)
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad
        return value
    if kind == "int_auto":
        if value == "auto":
            return "auto"
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if kind == "choice":
        if value not in spec.choices:
            raise ConfigError(
                f"{value!r} is not one of {', '.join(spec.choices)}",
                key=key,
                source=source,
                hint=f"use one of: {', '.join(spec.choices)}",
            )
        return value
    if kind == "size":
        if not _SIZE_RE.match(str(value)):
            raise ConfigError(f"{value!r} is not a size", key=key, source=source, hint="write it like 16g or 10.24g")
        return str(value)
    if kind == "list":
        if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
            raise bad
        return [str(v) for v in value]
    if kind == "dict":
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise bad
        return {k: ("" if v is None else str(v)) for k, v in value.items()}
    raise AssertionError(kind)  # pragma: no cover


_KIND_WORDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "int_auto": "an integer or auto",
    "choice": "one of the listed choices",
    "size": "a size like 16g",
    "list": "a list of strings",
    "dict": "a mapping of NAME: value",
}


def _flatten_yaml(text: str, path: str) -> dict[str, tuple[Any, str]]:
    """Parse YAML and flatten it to dotted keys, each with 'file:line' as its source."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 0
        raise ConfigError(
            f"invalid YAML: {exc.problem}", source=f"{path}:{line}", hint="fix the YAML syntax on that line"
        ) from None
    if root is None:
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError("the top level must be a mapping of keys", source=f"{path}:1")
    out: dict[str, tuple[Any, str]] = {}
    sections = {k.split(".")[0] for k in SCHEMA if "." in k}
    known = list(SCHEMA) + sorted(sections)
    constructor = yaml.SafeLoader("")

    def walk(node: yaml.MappingNode, prefix: str) -> None:
        for key_node, value_node in node.value:
            key = f"{prefix}{key_node.value}"
            where = f"{path}:{key_node.start_mark.line + 1}"
            if key in SCHEMA:
                out[key] = (constructor.construct_object(value_node, deep=True), where)
            elif key in sections and isinstance(value_node, yaml.MappingNode):
                walk(value_node, key + ".")
            else:
                guess = _suggest(key, known)
                raise ConfigError(
                    "unknown key",
                    key=key,
                    source=where,
                    hint=f"did you mean '{guess}'?" if guess else "see `kit config show` for every key",
                )

    walk(root, "")
    return out


def _from_env(environ: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    out: dict[str, tuple[Any, str]] = {}
    for name, raw in environ.items():
        if not name.startswith("KIT_") or name in RESERVED_ENV:
            continue
        key = ENV_TO_KEY.get(name)
        if key is None:
            # Other KIT_* variables belong to kit's scripts and tests (KIT_STATE_DIR, KIT_REQUIRE_DOCKER,
            # ...): only a name one typo away from a config key is an error.
            guess = next((known for known in ENV_TO_KEY if _one_typo_apart(name, known)), None)
            if guess:
                raise ConfigError("unknown variable", source=f"env {name}", hint=f"did you mean {guess}?")
            continue
        out[key] = (parse_scalar(key, raw), f"env {name}")
    return out


def _one_typo_apart(a: str, b: str) -> bool:
    """One inserted, deleted, replaced or swapped character."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        return len(diff) == 1 or (
            len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]
        )
    short, long_ = sorted((a, b), key=len)
    return any(long_[:i] + long_[i + 1 :] == short for i in range(len(long_)))


def parse_scalar(key: str, raw: str) -> Any:
    """Parse a string from the environment or a flag into the key's type (YAML syntax for lists/maps)."""
    kind = SCHEMA[key].kind
    if kind in ("str", "choice", "size"):
        return raw
    try:
        return yaml.safe_load(raw) if raw != "" else None
    except yaml.YAMLError:
        return raw


def find_config_path(explicit: str | None, environ: Mapping[str, str], cwd: Path) -> Path | None:
    if explicit:
        return Path(explicit)
    if environ.get("KIT_CONFIG"):
        return Path(environ["KIT_CONFIG"])
    candidate = cwd / "kit.yaml"
    return candidate if candidate.is_file() else None


def load_config(
    path: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, tuple[Any, str]] | None = None,
    cwd: Path | None = None,
) -> Resolved:
    """Resolve the configuration. `overrides` maps dotted keys to (value, source) from flags."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {k: s.default for k, s in SCHEMA.items()}
    sources: dict[str, str] = dict.fromkeys(SCHEMA, "default")
    cfg_path = find_config_path(path, environ, cwd or Path.cwd())
    layers: list[dict[str, tuple[Any, str]]] = []
    if cfg_path is not None:
        try:
            text = cfg_path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"cannot read config file: {exc.strerror}",
                source=str(cfg_path),
                hint="pass an existing file with --config or KIT_CONFIG",
            ) from None
        layers.append(_flatten_yaml(text, str(cfg_path)))
    layers.append(_from_env(environ))
    layers.append(dict(overrides or {}))
    for layer in layers:
        for key, (value, source) in layer.items():
            if key not in SCHEMA:
                guess = _suggest(key, list(SCHEMA))
                raise ConfigError(
                    "unknown key", key=key, source=source, hint=f"did you mean '{guess}'?" if guess else None
                )
            values[key] = coerce(key, value, source)
            sources[key] = source
    config = build(values)
    return Resolved(config=config, values=values, sources=sources, path=str(cfg_path) if cfg_path else None)


def build(values: Mapping[str, Any]) -> KitConfig:
    def section(prefix: str) -> dict[str, Any]:
        return {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith(prefix + ".")}

    model = section("model")
    model["extra_args"] = tuple(model["extra_args"])
    top = {k: v for k, v in values.items() if "." not in k}
    top["mounts"] = tuple(top["mounts"])
    top["env"] = dict(top["env"])
    return KitConfig(
        **top,
        ports=Ports(**section("ports")),
        model=Model(**model),
        timeouts=Timeouts(**section("timeouts")),
        ray=Ray(**section("ray")),
        apptainer=Apptainer(**section("apptainer")),
        slurm=Slurm(**section("slurm")),
    )


def defaults() -> KitConfig:
    return load_config(environ={}, cwd=Path("/nonexistent")).config


def redacted_value(key: str, value: Any) -> Any:
    """Values are shown as-is: secrets live in files and kit only ever shows their paths."""
    if key == "env" and isinstance(value, dict):
        return {k: ("<redacted>" if _looks_secret(k) else v) for k, v in value.items()}
    return value


def _looks_secret(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in ("TOKEN", "KEY", "SECRET", "PASSWORD"))


__all__ = ["SCHEMA", "KitConfig", "Resolved", "field", "load_config"]

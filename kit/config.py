"""kit's configuration: a typed schema, frozen dataclasses, and a layered loader.

Layers, lowest first: built-in defaults < kit.yaml < KIT_* environment < command-line flags.
Every resolved key remembers where its value came from (`kit config show`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kit import safeload, validate
from kit.errors import ConfigError
from kit.plan.vllm_versions import ALL2ALL_BACKENDS, DP_LB_MODES, Target, target_version

if TYPE_CHECKING:
    from kit.plan.layout import Layout


@dataclass(frozen=True)
class Spec:
    kind: str  # str | int | float | bool | list | dict | choice | int_auto | size
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    optional: bool = False  # None allowed
    text: str = "name"  # kit.validate.RULES kind of the string (of each item, for lists and dicts)
    low: int | None = None  # inclusive bounds of an int (int_auto: of its number)
    high: int | None = None
    special: tuple[int, ...] = ()  # ints allowed outside the bounds (vLLM's -1 = auto)
    pattern: tuple[str, str] | None = None  # (regex the whole string matches, what it is)


# Names that become parts of container, network and label names (Docker's rule).
NAME_PATTERN = (r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}", "letters, digits, '.', '_' or '-' (at most 63)")
# A Linux interface name (IFNAMSIZ 16: at most 15 characters, no '/', ':' or blanks), or auto.
INTERFACE_PATTERN = (r"auto|[A-Za-z0-9_.@][A-Za-z0-9_.@-]{0,14}", "an interface name like eth0 or ib0, or auto")
# vllm_version: a release kit.plan.vllm_versions renders for, or auto.
VERSION_PATTERN = (r"auto|v?[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}", "auto or a vLLM release like 0.33.0")


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
    "backend": Spec("choice", "ray", "multi-node backend: Ray, or vLLM's own (mp)", ("ray", "mp")),
    "accelerator": Spec("choice", "gpu", "gpu, or cpu (vLLM's CPU build; demo and tests)", ("gpu", "cpu")),
    "nodes": Spec("int", 1, "number of nodes in the cluster", low=1, high=16384),
    "gpus_per_node": Spec("int", 1, "GPUs per node (with accelerator=cpu: engine ranks per node)", low=1, high=1024),
    "gpus": Spec("str", "all", "GPUs given to the container: 'all' or indices like '0,1'"),
    "head_address": Spec("str", None, "the head node's IP (required on workers)", optional=True),
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
    "ports.supervisor": _port(29570, "supervisor control endpoint on the head's node IP (supervise.enabled)"),
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
    "model.all2all": Spec("choice", "auto", "EP all-to-all backend, or auto (vLLM's)", ("auto", *ALL2ALL_BACKENDS)),
    "model.api_servers": Spec("int_auto", "auto", "--api-server-count, or auto (vLLM's)", low=1, high=1024),
    "model.dp_lb": Spec("choice", "internal", "DP load balancing: internal (head) or hybrid (per node)", DP_LB_MODES),
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
    "timeouts.ready": Spec("int", 1800, "seconds to wait for the server to become healthy", low=1, high=10_000_000),
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
    "ray.temp_dir": Spec("str", "/tmp/ray", "Ray --temp-dir inside the container", text="path"),
    "ray.dashboard": Spec("bool", False, "start the Ray dashboard (on loopback only)"),
    "apptainer.image_dir": Spec("str", "~/.local/share/kit/images", "where SIF files are written", text="path"),
    "apptainer.cache_dir": Spec("str", None, "APPTAINER_CACHEDIR", optional=True, text="path"),
    "apptainer.tmp_dir": Spec(
        "str", None, "APPTAINER_TMPDIR (needs room for the unpacked image)", optional=True, text="path"
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
    supervisor: int


@dataclass(frozen=True)
class Model:
    id: str
    served_name: str | None
    tp: int | str
    pp: int | str
    dp: int | str
    ep: bool
    all2all: str
    api_servers: int | str
    dp_lb: str
    max_model_len: int | None
    gpu_memory: str | None
    extra_args: tuple[str, ...]
    offline: str = "auto"  # auto | true | false (kit.cluster.model)


@dataclass(frozen=True)
class Timeouts:
    join: int
    ready: int
    liveness: int = 30


@dataclass(frozen=True)
class Supervise:
    enabled: bool
    max_restarts: int
    backoff: int
    stable: int


@dataclass(frozen=True)
class CompileCache:
    dir: str | None = None  # None: the caches live and die with the container (kit.plan.node)
    scope: str = "per-node"


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
class Enroot:
    image_dir: str


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
    requeue: bool


@dataclass(frozen=True)
class KitConfig:
    cluster: str
    runtime: str
    image: str
    vllm_version: str
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
    enroot: Enroot
    slurm: Slurm
    supervise: Supervise
    compile_cache: CompileCache = CompileCache()
    # How model.tp/pp/dp were decided, set by kit.cluster.resolve when it applies the layout
    # planner with the model's facts (None: this config alone decides, see `layout`).
    layout_from: str | None = None
    # Where kit.cluster.resolve learnt `vllm_version` when the config said auto (kit's image record).
    vllm_version_from: str | None = None

    @property
    def tp(self) -> int:
        """Tensor parallel size: the number set, or for `auto` what kit.plan.layout decides without
        the model's files. Commands resolve `auto` with the model's files first
        (kit.cluster.resolve), so for them this is the layout they show and record."""
        return self.layout.tp

    @property
    def pp(self) -> int:
        """Pipeline parallel size (as `tp`: kit.plan.layout)."""
        return self.layout.pp

    @property
    def dp(self) -> int:
        """Data parallel size (as `tp`: kit.plan.layout)."""
        return self.layout.dp

    @property
    def dp_local(self) -> int:
        """DP ranks on each node (vLLM's --data-parallel-size-local); the checks make it exact."""
        return max(1, self.dp // self.nodes)

    @functools.cached_property
    def layout(self) -> Layout:
        """The layout (kit.plan.layout): decided with the model's facts when kit.cluster.resolve
        applied it (then every value is a number and `layout_from` says how), else from this
        config alone (tests, a config built without a host)."""
        from kit.plan.layout import plan_layout

        layout = plan_layout(self, None)
        return dataclasses.replace(layout, decided_by=self.layout_from) if self.layout_from else layout

    @property
    def vllm(self) -> Target:
        """The vLLM release kit renders and checks for (kit.plan.vllm_versions)."""
        return target_version(self.vllm_version, self.image, self.vllm_version_from)

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


def _suggest(key: str, known: list[str]) -> str | None:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return close[0] if close else None


def coerce(key: str, value: Any, source: str) -> Any:
    """Check (and lightly convert) one value against the schema; raise ConfigError naming the key.
    kit.validate checks every string (length, control characters, a leading '-') and every
    number (its bounds): the one check every layer (file, env, flag) gets."""
    spec = SCHEMA[key]
    if value is None:
        if spec.optional:
            return None
        raise ConfigError("must not be empty", key=key, source=source, hint=f"set it or remove it ({spec.help})")
    try:
        return validate.config_value(spec, value)
    except validate.Invalid as exc:
        raise ConfigError(exc.message, key=key, source=source, hint=exc.hint) from None


# Keys whose values are strings (or lists/mappings of strings): YAML gives them the text the
# user wrote, never YAML 1.1's reading of it (1:00:00 is not 3600, no is not False).
_TEXT_KINDS = ("str", "choice", "size", "list", "dict")


def _flatten_yaml(text: str, path: str) -> dict[str, tuple[Any, str]]:
    """Parse YAML and flatten it to dotted keys, each with 'file:line' as its source.
    Bounded (kit.safeload): depth, size, aliases and tags are checked before any value is built."""
    root = safeload.compose_yaml(text, source=path)
    if root is None:
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError("the top level must be a mapping of keys", source=f"{path}:1")
    out: dict[str, tuple[Any, str]] = {}
    sections = {k.split(".")[0] for k in SCHEMA if "." in k}
    known = list(SCHEMA) + sorted(sections)

    def walk(node: yaml.MappingNode, prefix: str) -> None:
        for key_node, value_node in node.value:
            where = f"{path}:{key_node.start_mark.line + 1}"
            if not isinstance(key_node, yaml.ScalarNode):
                raise ConfigError(
                    f"a key must be a plain name (under {prefix or 'the top level'})",
                    source=where,
                    hint="write keys as names, like `nodes: 2`",
                )
            name = validate.preview(key_node.value) if len(key_node.value) > 64 else key_node.value
            key = f"{prefix}{name}"
            if key in SCHEMA:
                as_text = SCHEMA[key].kind in _TEXT_KINDS
                out[key] = (safeload.yaml_value(value_node, source=where, as_text=as_text), where)
            elif key in sections:
                if not isinstance(value_node, yaml.MappingNode):
                    example = next(k for k in SCHEMA if k.startswith(key + ".")).split(".", 1)[1]
                    raise ConfigError(
                        f"expected a mapping of {key}.* keys, got {_node_word(value_node)}",
                        key=key,
                        source=where,
                        hint=f"write it as a block, e.g. `{key}:` then `  {example}: …` on the next line",
                    )
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


def _node_word(node: yaml.Node) -> str:
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"the value {validate.preview(node.value)}" if isinstance(node, yaml.ScalarNode) else "a value"


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
        out[key] = (parse_scalar(key, raw, f"env {name}"), f"env {name}")
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


def parse_scalar(key: str, raw: str, source: str = "") -> Any:
    """Parse a string from the environment or a flag into the key's type (YAML syntax for lists/maps),
    bounded like kit.yaml. Text that is not YAML stays a string for the type check to refuse."""
    kind = SCHEMA[key].kind
    if kind in ("str", "choice", "size"):
        return raw
    if raw == "":
        return None
    try:
        return safeload.loads_yaml(raw, source=source or key, as_text=kind in _TEXT_KINDS)
    except safeload.YAMLSyntaxError:
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
        text = safeload.read_text(cfg_path, max_bytes=safeload.MAX_YAML_BYTES, what="config file")
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
        enroot=Enroot(**section("enroot")),
        slurm=Slurm(**section("slurm")),
        supervise=Supervise(**section("supervise")),
        compile_cache=CompileCache(**section("compile_cache")),
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

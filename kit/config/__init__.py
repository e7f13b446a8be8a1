"""kit's configuration: a typed schema, frozen dataclasses, and a layered loader.

Layers, lowest first: built-in defaults < kit.yaml < KIT_* environment < command-line flags.
Every resolved key remembers where its value came from (`kit config show`).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kit import safeload, validate
from kit.config.schema import SCHEMA
from kit.errors import ConfigError, KitError
from kit.images.vllm_releases import Target, target_version
from kit.layout import BY_CONFIG, Layout

if TYPE_CHECKING:
    from kit.layout import Layout


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


# What timeouts.ready `auto` waits outside SLURM (under SLURM: the job's remaining walltime).
READY_AUTO_S = 1800


@dataclass(frozen=True)
class Timeouts:
    join: int
    ready: int | str  # seconds, or "auto" (ready_s; the SLURM launcher: the remaining walltime)
    liveness: int = 30

    @property
    def ready_s(self) -> int:
        """Seconds `kit serve` waits for /health: the number set, or READY_AUTO_S for auto."""
        return READY_AUTO_S if self.ready == "auto" else int(self.ready)


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
    gpu_args: tuple[str, ...] = ("--nv",)  # --nv, or what the site needs (--nvccli ...)
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Docker:
    user: str | None = None  # UID[:GID]: docker run --user (as Apptainer runs as the user)
    read_only: bool = False  # docker run --read-only, /tmp a tmpfs (as Apptainer's image)


@dataclass(frozen=True)
class Tunnel:
    login_host: str | None = None  # the SSH tunnel hint's login host (None: the job's submit host)
    ssh_port: int = 22


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
    exclusive: bool = False
    prologue: str | None = None  # a file of the user's every node step sources (kit.plan.slurm)


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
    docker: Docker = Docker()
    tunnel: Tunnel = Tunnel()
    api_listen: str = "node-ip"  # node-ip | all (kit.plan.vllm: --host)
    # The layout kit.plan.layout decided (kit.cluster.resolve applies it, with the model's facts
    # when this host has them): the config never plans it itself (issue 26).
    planned: Layout | None = None
    # Where kit.cluster.resolve learnt `vllm_version` when the config said auto (kit's image record).
    vllm_version_from: str | None = None
    # The image's `vllm serve` options, from its recorded facts (kit.images.facts; set by
    # kit.cluster.resolve): where known, the image's parser decides what kit renders (issue 24).
    image_options: frozenset[str] | None = None

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

    @property
    def layout(self) -> Layout:
        """The layout kit.plan.layout decided for this config (set by kit.cluster.resolve). A
        config whose model.tp/pp/dp are all numbers reads them as they are; one with an `auto`
        left must be planned first (KitError: a bug in the caller, not the user's input)."""
        if self.planned is not None:
            return self.planned
        m = self.model
        if "auto" in (m.tp, m.pp, m.dp):
            raise KitError(
                "internal error: the layout (model.tp/pp/dp auto) was used before kit.plan.layout decided it"
            )
        return Layout(int(m.tp), int(m.pp), int(m.dp), m.ep, BY_CONFIG)

    @property
    def vllm(self) -> Target:
        """The vLLM release kit renders and checks for (kit.images.vllm_releases)."""
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
        return Path(environ["KIT_CONFIG"])  # load_config names KIT_CONFIG when it cannot be read
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
            text = safeload.read_text(cfg_path, max_bytes=safeload.MAX_YAML_BYTES, what="config file")
        except ConfigError as err:
            if path or not environ.get("KIT_CONFIG"):
                raise
            raise ConfigError(
                err.message, key="KIT_CONFIG", hint="point KIT_CONFIG at a readable kit.yaml, or unset it"
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
    apptainer = section("apptainer")
    apptainer["gpu_args"] = tuple(apptainer["gpu_args"])
    apptainer["extra_args"] = tuple(apptainer["extra_args"])
    top = {k: v for k, v in values.items() if "." not in k}
    top["mounts"] = tuple(top["mounts"])
    top["env"] = dict(top["env"])
    return KitConfig(
        **top,
        ports=Ports(**section("ports")),
        model=Model(**model),
        timeouts=Timeouts(**section("timeouts")),
        ray=Ray(**section("ray")),
        apptainer=Apptainer(**apptainer),
        enroot=Enroot(**section("enroot")),
        slurm=Slurm(**section("slurm")),
        supervise=Supervise(**section("supervise")),
        compile_cache=CompileCache(**section("compile_cache")),
        docker=Docker(**section("docker")),
        tunnel=Tunnel(**section("tunnel")),
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

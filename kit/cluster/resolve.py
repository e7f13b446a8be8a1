"""From kit.yaml (and KIT_*, flags) to a config every planner can use, in one order:

    load_settings: load (kit.config) -> absolutize host paths -> the release kit recorded
    plan: the model's facts (its config.json, read ONCE) -> the layout (kit.plan.layout, the only
          place `auto` is decided) -> the plan checks

Loading is not planning (issue 25): every verb loads its settings the one way (load_settings,
with where each value came from); only the verbs that start or render something (up, serve,
slurm, tune, demo, verify) plan, and kit.cluster.Cluster plans lazily, on first use. A model
kit cannot size therefore never stops a look or a teardown.

The model's facts are read once per command and kept (Resolution.model), so `kit tune` can plan
each of its layouts without reading the files again.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit import validate
from kit.config import KitConfig, Resolved, build, coerce, load_config
from kit.config.schema import SCHEMA
from kit.errors import ConfigError, KitError
from kit.images.vllm_releases import parse_version
from kit.layout import Layout
from kit.plan.layout import ModelFacts, plan_layout

Overrides = Mapping[str, tuple[Any, str]]  # dotted key -> (value, where it came from)

# The sources `kit config show` prints for values the planner decided (kept from before issue 17).
SOURCE_MODEL = "auto (kit plan)"
SOURCE_DP = "auto (GPUs / (tp × pp))"


@dataclass(frozen=True)
class Resolution:
    """A resolved config with its layout applied, how it was decided, and the model's facts."""

    resolved: Resolved
    layout: Layout
    model: ModelFacts | None

    @property
    def config(self) -> KitConfig:
        return self.resolved.config

    @property
    def sources(self) -> Mapping[str, str]:
        return self.resolved.sources

    @property
    def values(self) -> Mapping[str, Any]:
        return self.resolved.values


def load_settings(
    config_path: str | None,
    overrides: Overrides,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Resolved:
    """The settings of every verb (layers: defaults < file < KIT_* < overrides), host paths
    absolute: no model file is read, nothing is planned."""
    return recorded_version(absolutize(load_config(config_path, environ=environ, overrides=overrides, cwd=cwd)))


def plan(resolved: Resolved) -> Resolution:
    """Loaded settings planned: the model's facts read once, the layout applied."""
    return apply_layout(resolved, read_model_facts(resolved.config))


def resolve(
    config_path: str | None,
    overrides: Overrides,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Resolution:
    """Load the settings, then plan them (the verbs that start or render something)."""
    return plan(load_settings(config_path, overrides, environ=environ, cwd=cwd))


def recorded_version(resolved: Resolved) -> Resolved:
    """`vllm_version: auto` and kit pulled or built the image here: the release it recorded then
    (kit.state; the image's label, build argument or tag: kit.images.vllm_releases), so an image
    tagged `latest` or `test` still renders for its own release. Otherwise the image tag decides
    (KitConfig.vllm)."""
    config = resolved.config
    if config.vllm_version != "auto":
        return resolved
    from kit.images.records import recorded_image

    try:
        record = recorded_image(config.image) or {}
    except KitError:
        return resolved  # an unreadable record: the tag (or kit's default, said in the dry run) decides
    version = record.get("vllm_version")
    if not isinstance(version, str) or parse_version(version) is None:
        return resolved
    how = f"kit's image record ({record.get('vllm_version_from') or 'kit pull/build'})"
    values, sources = dict(resolved.values), dict(resolved.sources)
    values["vllm_version"], sources["vllm_version"] = version, how
    applied = config.replace(vllm_version=version, vllm_version_from=how)
    return Resolved(applied, values, sources, resolved.path)


def apply_layout(resolved: Resolved, model: ModelFacts | None) -> Resolution:
    """The planner's layout written into the config, so every planner after this one reads
    numbers, and `planned` records it with how it was decided (kit.labels, --dry-run). `kit config
    show` reports model.tp/pp as decided by kit plan when the model's files decided them, and
    model.dp when it was auto."""
    config = resolved.config
    layout = plan_layout(config, model)
    values, sources = dict(resolved.values), dict(resolved.sources)
    if model is not None and model.architecture is not None:
        for key, value in (("model.tp", layout.tp), ("model.pp", layout.pp)):
            if values[key] == "auto":
                values[key], sources[key] = value, SOURCE_MODEL
    if values["model.dp"] == "auto":
        values["model.dp"], sources["model.dp"] = layout.dp, SOURCE_DP
    modeled = dataclasses.replace(config.model, tp=layout.tp, pp=layout.pp, dp=layout.dp)
    applied = config.replace(model=modeled, planned=layout)
    return Resolution(Resolved(applied, values, sources, resolved.path), layout, model)


def relayout(base: Resolution, overrides: Overrides) -> Resolution:
    """`base` with other values for some keys (kit tune's layouts: model.tp/pp/dp/ep, nodes,
    gpus_per_node), through the planner again with the facts already read."""
    values, sources = dict(base.resolved.values), dict(base.resolved.sources)
    for key, (value, source) in overrides.items():
        values[key], sources[key] = coerce(key, value, source), source
    built = build(values).replace(vllm_version_from=base.config.vllm_version_from)
    unresolved = Resolved(built, values, sources, base.resolved.path)
    return apply_layout(absolutize(unresolved), base.model)


def values_of(config: KitConfig) -> dict[str, Any]:
    """Every key's value as `config` holds it (a config built without the loader: tests, and
    `Cluster.from_config`), so it can be planned again with other values (`relayout`)."""
    values: dict[str, Any] = {}
    for key in SCHEMA:
        value: Any = config
        for part in key.split("."):
            value = getattr(value, part)
        values[key] = value
    return values


def absolutize(resolved: Resolved) -> Resolved:
    """Host paths are expanded (~, relative) once, here, so plans carry absolute paths. A mount's
    host path is absolute or under ~ already (kit.validate refuses a relative one)."""
    cfg = resolved.config

    def host_path(p: str | None) -> str | None:
        return None if p is None else os.path.realpath(os.path.expanduser(p))

    mounts = []
    for m in cfg.mounts:
        src, sep, rest = m.partition(":")
        mounts.append(f"{host_path(src)}{sep}{rest}" if sep else m)
    config = cfg.replace(
        hf_cache=host_path(cfg.hf_cache),
        hf_token_file=host_path(cfg.hf_token_file),
        api_key_file=host_path(cfg.api_key_file),
        ray_token_file=host_path(cfg.ray_token_file),
        mounts=tuple(mounts),
        compile_cache=dataclasses.replace(cfg.compile_cache, dir=host_path(cfg.compile_cache.dir)),
    )
    return Resolved(config=config, values=resolved.values, sources=resolved.sources, path=resolved.path)


def model_dir(config: KitConfig) -> Path | None:
    """The model's local directory (a path, or its snapshot in the mounted HF cache), if any."""
    from kit import sizing

    return sizing.find_model_dir(config.model.id, str(Path(config.hf_cache) / "hub"))


def read_model_facts(config: KitConfig) -> ModelFacts | None:
    """The model's facts when its config.json is on this host (else None): parsed by kit.sizing,
    the parser `kit plan` uses. A config.json kit.sizing does not understand still gives its head
    counts (the head check applies), but no architecture: the layout is then decided as without."""
    from kit import sizing

    found = model_dir(config)
    if found is None:
        return None
    source = str(found / "config.json")
    try:
        data = sizing.load_model_config(str(found))
    except ConfigError:
        return _raw_facts(found / "config.json")
    try:
        arch = sizing.parse_architecture(data, source=source)
    except ConfigError:
        return _raw_facts(found / "config.json", data)
    experts = arch.moe.num_experts if arch.moe is not None else 0
    kv = None if arch.mla is not None else arch.num_kv_heads
    return ModelFacts(source, arch.num_attention_heads, kv, experts, arch)


def _raw_facts(path: Path, data: Mapping[str, Any] | None = None) -> ModelFacts | None:
    """Head counts straight from a config.json kit.sizing refused (or could not read)."""
    if data is None:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
    if not isinstance(data, Mapping):
        return None
    text = data.get("text_config", data)
    if not isinstance(text, Mapping):
        return None
    heads = text.get("num_attention_heads")
    kv = text.get("num_key_value_heads", heads)
    return ModelFacts(
        str(path),
        heads if isinstance(heads, int) and heads > 0 else None,
        kv if isinstance(kv, int) and kv > 0 else None,
        None,
        None,
    )


def check_plan(resolution: Resolution) -> None:
    """Every host-independent check of the plan, with the model's facts when its files are here."""
    from kit.plan.checks import check_config

    check_config(resolution.config, resolution.resolved.sources, model=resolution.model)


def check_secret_files(config: KitConfig, sources: Mapping[str, str]) -> None:
    """Secret files must be regular files this user can read (the container runtime reads them
    as this user: Apptainer binds them, Docker mounts them); kit never reads their content here."""
    for key in ("hf_token_file", "api_key_file", "ray_token_file"):
        path = getattr(config, key)
        if not path:
            continue
        try:
            validate.readable_file(path)
        except validate.Invalid as exc:
            raise ConfigError(
                exc.message, key=key, source=sources.get(key), hint="create the file (mode 600) or unset the key"
            ) from None


def check_mounts(config: KitConfig, sources: Mapping[str, str]) -> None:
    """Every extra mount's host path exists on this host (Docker would create a missing one,
    owned by root and empty, and the container would start on nothing)."""
    for item in config.mounts:
        host = item.split(":", 1)[0]
        if not os.path.exists(host):
            raise ConfigError(
                f"the host path {host} of mount {validate.preview(item)} does not exist",
                key="mounts",
                source=sources.get("mounts"),
                hint="create it, or fix the path (mounts are '/host/path:/container/path[:ro]')",
            )


def guessed_warning(layout: Layout) -> str | None:
    """The one line `kit up`/`kit serve` print when `auto` was decided without the model's files
    (another host with them would decide otherwise: FIELD_NOTES-style drift between nodes)."""
    if not layout.guessed:
        return None
    return (
        f"layout {layout.describe()} decided without the model's config.json on this host "
        "(model.tp/model.pp auto); a host with the model's files would decide by its heads: "
        "set model.tp and model.pp (see `kit plan`) so every node agrees"
    )


def refuse_guessed(layout: Layout, command: str) -> None:
    """Where the layout must be the same on every host (a SLURM launcher runs on nodes whose
    files kit cannot see), an `auto` this host can only guess is refused."""
    if layout.guessed:
        raise ConfigError(
            f"`kit {command}` cannot decide model.tp/model.pp `auto` the same way on every node without "
            f"the model's config.json here (it would guess {layout.describe()})",
            key="model.tp",
            hint="set model.tp and model.pp (e.g. --tp 8 --pp 2; `kit plan MODEL` recommends them), "
            "or put the model's files in hf_cache",
        )


def ensure_compile_cache(config: KitConfig, sources: Mapping[str, str]) -> None:
    """Create compile_cache.dir when it is missing (a cache is kit's to make, like `mkdir -p`:
    Apptainer refuses to bind a missing folder, Docker would make it owned by root). Refused with
    one line when it cannot be made (a file there, no permission)."""
    directory = config.compile_cache.dir
    if directory is None:
        return
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot create the folder {directory}: {exc.strerror or exc}",
            key="compile_cache.dir",
            source=sources.get("compile_cache.dir"),
            hint="create it (writable by you) or choose another folder; unset the key to keep caches in the container",
        ) from None

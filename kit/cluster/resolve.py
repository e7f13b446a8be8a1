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
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit import safeload, validate
from kit.config import KitConfig, Resolved, build, coerce, load_config
from kit.config.schema import SCHEMA
from kit.errors import ConfigError, KitError
from kit.images.facts import ImageFacts
from kit.images.vllm_releases import parse_version
from kit.layout import Layout
from kit.plan.layout import ModelFacts, plan_layout
from kit.plan.node import local_model_dir
from kit.safe import files as safefile
from kit.safeload import LooseSecretFile

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
    image: ImageFacts | None = None  # the image's recorded facts (issue 24), None without a record

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
    """Loaded settings planned: the image's recorded facts (issue 24) and the model's facts read
    once, the layout applied."""
    image = find_image_facts(resolved.config.image)
    return apply_layout(with_image(resolved, image), read_model_facts(resolved.config), image)


def resolve(
    config_path: str | None,
    overrides: Overrides,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Resolution:
    """Load the settings, then plan them (the verbs that start or render something)."""
    return plan(load_settings(config_path, overrides, environ=environ, cwd=cwd))


def find_image_facts(ref: str) -> ImageFacts | None:
    """The image's recorded facts (kit.cluster.image_facts; an unreadable record counts as none)."""
    from kit.cluster.image_facts import find_facts

    try:
        return find_facts(ref)
    except KitError:
        return None


def with_image(resolved: Resolved, image: ImageFacts | None) -> Resolved:
    """The image's own facts decide what kit renders (issue 24): its serve options, and with
    `vllm_version: auto` its vLLM release (over the record's label, build argument or tag)."""
    if image is None or image.serve is None:
        return resolved
    config = resolved.config.replace(image_options=frozenset(image.options()))
    values, sources = dict(resolved.values), dict(resolved.sources)
    version = image.vllm_version
    learnt = resolved.values["vllm_version"] == "auto" or resolved.sources.get("vllm_version", "").startswith("kit's")
    if learnt and version is not None and parse_version(version) is not None:
        how = "kit's record of the image's probe"
        values["vllm_version"], sources["vllm_version"] = version, how
        config = config.replace(vllm_version=version, vllm_version_from=how)
    return Resolved(config, values, sources, resolved.path)


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


def apply_layout(resolved: Resolved, model: ModelFacts | None, image: ImageFacts | None = None) -> Resolution:
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
    return Resolution(Resolved(applied, values, sources, resolved.path), layout, model, image)


def relayout(base: Resolution, overrides: Overrides) -> Resolution:
    """`base` with other values for some keys (kit tune's layouts: model.tp/pp/dp/ep, nodes,
    gpus_per_node), through the planner again with the facts already read."""
    values, sources = dict(base.resolved.values), dict(base.resolved.sources)
    for key, (value, source) in overrides.items():
        values[key], sources[key] = coerce(key, value, source), source
    built = build(values).replace(
        vllm_version_from=base.config.vllm_version_from, image_options=base.config.image_options
    )
    unresolved = Resolved(built, values, sources, base.resolved.path)
    return apply_layout(absolutize(unresolved), base.model, base.image)


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
    model = cfg.model
    if local_model_dir(cfg) is not None:
        # Absolute, as written (not through symlinks): it is also the path vLLM is given, and the
        # served name by default (issue 28: mounted read-only at this path on every node).
        model = dataclasses.replace(model, id=os.path.abspath(os.path.expanduser(model.id)))
    config = cfg.replace(
        model=model,
        slurm=dataclasses.replace(cfg.slurm, prologue=host_path(cfg.slurm.prologue)),
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
            data = safeload.load_json_file(path, what="config.json")
        except ConfigError:
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

    check_config(resolution.config, resolution.resolved.sources, model=resolution.model, facts=resolution.image)


def check_secret_files(config: KitConfig, sources: Mapping[str, str]) -> None:
    """Secret files must be regular files this user can read (the container runtime reads them
    as this user: Apptainer binds them, Docker mounts them); kit never reads their content here.
    One its group or others can read gets a warning naming the file and the chmod."""
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
        loose = safefile.loose_secret_warning(path, key)
        if loose:
            warnings.warn(LooseSecretFile(loose), stacklevel=2)


def check_mounts(config: KitConfig, sources: Mapping[str, str]) -> None:
    """Every extra mount's host path exists on this host (Docker would create a missing one,
    owned by root and empty, and the container would start on nothing), and so does a model
    directory (model.id as a path: mounted at the same path)."""
    check_local_model(config, sources)
    for item in config.mounts:
        host = item.split(":", 1)[0]
        if not os.path.exists(host):
            raise ConfigError(
                f"the host path {host} of mount {validate.preview(item)} does not exist",
                key="mounts",
                source=sources.get("mounts"),
                hint="create it, or fix the path (mounts are '/host/path:/container/path[:ro]')",
            )


def check_prologue(config: KitConfig, sources: Mapping[str, str]) -> None:
    """slurm.prologue is code the job runs as you: a regular file you own, readable, that nobody
    else may change (not group- or world-writable: ssh's rule for what runs as you)."""
    path = config.slurm.prologue
    if path is None:
        return
    key, source = "slurm.prologue", sources.get("slurm.prologue")
    try:
        validate.readable_file(path)
        st = os.stat(path)
    except (validate.Invalid, OSError) as exc:
        message = exc.message if isinstance(exc, validate.Invalid) else f"{path}: {exc.strerror}"
        raise ConfigError(message, key=key, source=source, hint="write the file (module loads, exports)") from None
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise ConfigError(
            f"{path} is {'not yours' if st.st_uid != os.getuid() else 'writable by others'}: the job would run "
            "what someone else may change",
            key=key,
            source=source,
            hint=f"own it and make it writable by you alone (chmod go-w {path})",
        )


def check_local_model(config: KitConfig, sources: Mapping[str, str]) -> None:
    """model.id naming a directory (kit.plan.node.local_model_dir) must hold the model's
    config.json on this host: the node mounts that directory read-only at the same path."""
    path = local_model_dir(config)
    if path is None:
        return
    if not os.path.isfile(os.path.join(path, "config.json")):
        what = "is not a directory" if not os.path.isdir(path) else "holds no config.json"
        raise ConfigError(
            f"the model directory {path} {what} on this host",
            key="model.id",
            source=sources.get("model.id"),
            hint="give the directory that holds the model's config.json and weights (it is mounted read-only "
            "at the same path), or a hub id like org/name",
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

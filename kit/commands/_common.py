"""Shared pieces of the command layer: config flags, host facts, path resolution."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from kit import netinfo, validate
from kit.config import SCHEMA, KitConfig, Resolved, load_config, parse_scalar
from kit.errors import ConfigError, UsageError
from kit.plan.facts import HostFacts, Role

if TYPE_CHECKING:
    from kit.sizing import Architecture

F = TypeVar("F", bound=Callable[..., Any])


def config_options(func: F) -> F:
    """--config, --cluster and --set KEY=VALUE (any config key) for every verb that reads kit.yaml."""
    func = click.option(
        "--set",
        "set_values",
        multiple=True,
        metavar="KEY=VALUE",
        help="Set any config key (dotted, e.g. model.max_model_len=8192); repeatable.",
    )(func)
    func = click.option("--cluster", help="Cluster name (config: cluster).")(func)
    func = click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        help="Config file (default: $KIT_CONFIG, else ./kit.yaml, else built-in defaults).",
    )(func)
    return func


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON document (for machines).")(func)


def overrides_from(
    flags: Mapping[str, Any], mapping: Mapping[str, str], set_values: tuple[str, ...] = ()
) -> dict[str, tuple[Any, str]]:
    """Flag values (not None) -> config overrides with 'flag --x' as their source."""
    out: dict[str, tuple[Any, str]] = {}
    for item in set_values:
        key, sep, raw = item.partition("=")
        if not sep:
            raise UsageError(f"--set {validate.preview(item)} must look like KEY=VALUE", hint="e.g. --set model.tp=4")
        if key not in SCHEMA:
            import difflib

            guess = difflib.get_close_matches(key, list(SCHEMA), n=1)
            shown = key if len(key) <= 64 else validate.preview(key)
            raise ConfigError(
                "unknown key",
                key=shown,
                source=f"flag --set {shown}",
                hint=f"did you mean '{guess[0]}'?" if guess else "see `kit config show`",
            )
        out[key] = (parse_scalar(key, raw, f"flag --set {key}"), f"flag --set {key}")
    for flag, key in mapping.items():
        value = flags.get(flag)
        if value is None or value == ():
            continue
        if isinstance(value, str) and SCHEMA[key].kind not in ("str", "choice", "size"):
            value = parse_scalar(key, value, f"flag --{flag.replace('_', '-')}")
        out[key] = (value, f"flag --{flag.replace('_', '-')}")
    return out


def resolve(config_path: str | None, overrides: Mapping[str, tuple[Any, str]]) -> Resolved:
    resolved = load_config(config_path, overrides=overrides)
    return auto_data_parallel(auto_parallel(absolutize(resolved)))


def resolve_cluster(config_path: str | None, cluster: str | None, set_values: tuple[str, ...]) -> Resolved:
    """The resolved config of a verb whose only config flags are the common ones."""
    return resolve(config_path, overrides_from({"cluster": cluster}, {"cluster": "cluster"}, set_values))


def auto_parallel(resolved: Resolved) -> Resolved:
    """model.tp/pp `auto` taken from kit plan when the model's config.json is on this host:
    TP splits the attention/KV heads within a node, PP covers the rest; with model.gpu_memory
    set, kit plan also refuses clusters too small for the weights. Without the model's files,
    auto means TP = gpus_per_node and PP = nodes (KitConfig.tp/pp)."""
    cfg = resolved.config
    if "auto" not in (cfg.model.tp, cfg.model.pp):
        return resolved
    from kit import sizing

    found = model_dir(cfg)
    if found is None:
        return resolved
    try:
        arch = sizing.parse_architecture(sizing.load_model_config(str(found)), source=str(found / "config.json"))
    except ConfigError:
        return resolved  # not a config kit plan understands: the head-count check still applies
    tp, pp = _replica_layout(cfg, arch) if cfg.replicated else _cluster_layout(cfg, arch)
    model = dataclasses.replace(cfg.model, tp=tp, pp=pp)
    sources = {**resolved.sources, "model.tp": "auto (kit plan)", "model.pp": "auto (kit plan)"}
    values = {**resolved.values, "model.tp": tp, "model.pp": pp}
    return Resolved(config=cfg.replace(model=model), values=values, sources=sources, path=resolved.path)


def _cluster_layout(cfg: KitConfig, arch: Architecture) -> tuple[int, int]:
    """TP and PP of the one replica that spans the cluster, keeping whichever the user fixed
    (with model.gpu_memory, kit plan's recommendation still refuses a cluster too small)."""
    from kit import sizing

    total = cfg.nodes * cfg.gpus_per_node
    if cfg.model.gpu_memory:
        rec = sizing.recommend(
            arch,
            gpu_memory_bytes=sizing.gpu_memory_bytes(cfg.model.gpu_memory, key="model.gpu_memory"),
            gpus_per_node=cfg.gpus_per_node,
            max_model_len=cfg.model.max_model_len if (cfg.model.max_model_len or 0) > 0 else None,  # -1: auto
            nodes=cfg.nodes,
        )
        tp, pp = rec.tp, rec.pp
    else:
        tp = sizing.best_tp(arch, cfg.gpus_per_node)
        pp = total // tp
    if cfg.model.tp != "auto":  # only pp is auto: keep the user's TP
        return int(cfg.model.tp), total // int(cfg.model.tp)
    if cfg.model.pp != "auto":  # only tp is auto: keep the user's PP
        return total // int(cfg.model.pp), int(cfg.model.pp)
    return tp, pp


def _replica_layout(cfg: KitConfig, arch: Architecture) -> tuple[int, int]:
    """TP and PP of one DP replica, which stays inside one node (topology checks): TP is the
    largest split of the replica's GPUs that divides the heads, PP (when auto) fills the rest
    of a fixed-DP replica and is 1 with DP auto (then DP = GPUs / TP takes up the slack)."""
    from kit import sizing

    pp = 1 if cfg.model.pp == "auto" else int(cfg.model.pp)
    if cfg.model.dp == "auto":
        replica = cfg.gpus_per_node
    else:
        replica = max(1, cfg.nodes * cfg.gpus_per_node // int(cfg.model.dp))
    tp = int(cfg.model.tp) if cfg.model.tp != "auto" else sizing.best_tp(arch, max(1, replica // pp))
    if cfg.model.pp == "auto" and cfg.model.dp != "auto":
        pp = max(1, replica // tp)
    return tp, pp


def auto_data_parallel(resolved: Resolved) -> Resolved:
    """model.dp `auto` = nodes × GPUs per node / (TP × PP), once TP and PP are resolved."""
    cfg = resolved.config
    if cfg.model.dp != "auto":
        return resolved
    dp = cfg.dp
    model = dataclasses.replace(cfg.model, dp=dp)
    sources = {**resolved.sources, "model.dp": "auto (GPUs / (tp × pp))"}
    values = {**resolved.values, "model.dp": dp}
    return Resolved(config=cfg.replace(model=model), values=values, sources=sources, path=resolved.path)


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
    )
    return Resolved(config=config, values=resolved.values, sources=resolved.sources, path=resolved.path)


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


def gather_host_facts(config: KitConfig) -> HostFacts:
    """The only host I/O planning needs (interfaces, routes, /dev/infiniband)."""
    route = None
    if config.head_address and not config.network:
        route = netinfo.route_source_ip(config.head_address)
    return HostFacts(
        interfaces=netinfo.interface_addresses(),
        default_interface=netinfo.default_route_interface(),
        route_to_head=route,
        has_infiniband=netinfo.has_infiniband(),
    )


def model_dir(config: KitConfig) -> Path | None:
    """The model's local directory (a path, or its snapshot in the mounted HF cache), if any."""
    from kit import sizing

    return sizing.find_model_dir(config.model.id, str(Path(config.hf_cache) / "hub"))


def model_heads(config: KitConfig) -> tuple[int | None, int | None]:
    """Attention and KV head counts when the model's config.json is on this host, else (None, None)."""
    found = model_dir(config)
    if found is None:
        return None, None
    try:
        data = json.loads((found / "config.json").read_text())
    except (OSError, ValueError):
        return None, None
    text = data.get("text_config", data)
    heads = text.get("num_attention_heads")
    kv = text.get("num_key_value_heads", heads)
    return (heads if isinstance(heads, int) else None, kv if isinstance(kv, int) else None)


def model_experts(config: KitConfig) -> int | None:
    """The model's routed expert count (0: dense) when its config.json is on this host, else None.
    Read with kit.sizing's parser, the one `kit plan` uses."""
    from kit import sizing

    found = model_dir(config)
    if found is None:
        return None
    try:
        arch = sizing.parse_architecture(sizing.load_model_config(str(found)), source=str(found / "config.json"))
    except ConfigError:
        return None
    return arch.moe.num_experts if arch.moe is not None else 0


def check_plan(resolved: Resolved) -> None:
    """Every host-independent check of the plan, with the model's facts when its files are here."""
    from kit.plan.topology import check_config

    config = resolved.config
    heads, kv = model_heads(config)
    experts = model_experts(config) if config.model.ep else None
    check_config(config, resolved.sources, attention_heads=heads, kv_heads=kv, experts=experts)


def role_from_flags(head: bool, worker: bool, node_rank: int | None) -> Role:
    if head and worker:
        raise UsageError("--head and --worker exclude each other", hint="pass one of them")
    if worker:
        return Role("worker", 1 if node_rank is None else node_rank)
    if node_rank not in (None, 0):
        raise UsageError("the head always has node rank 0", hint="drop --node-rank or add --worker")
    return Role("head", 0)

"""Several clusters on one host (issue 28): a node is refused before it starts when it would bind
a host port or take a GPU that a running node of another cluster holds (kit.plan.host_share
decides what each holds; their labels record it), and `kit serve MODEL` (one host, no kit.yaml)
gets a cluster name, a node count, a backend and ports of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kit.config import KitConfig, load_config
from kit.errors import ConfigError
from kit.plan.host_share import clashes, derived_ports, held_gpus, host_ports, one_host_name
from kit.plan.roles import Role
from kit.runtime.base import Runtime

Overrides = Mapping[str, tuple[Any, str]]
ONE_HOST = "kit serve MODEL (one host)"


def check_host_share(config: KitConfig, role: Role, runtime: Runtime | None) -> None:
    """Refuse this node when it would share a host port or a GPU with a running node of another
    cluster here. Without a container engine to ask (a dry run on a laptop) nothing is known and
    nothing is refused."""
    held = host_ports(config, role)
    gpus = held_gpus(config)
    if runtime is None or not (held or gpus):
        return
    try:
        running = runtime.host_nodes()
    except Exception:  # no engine here: nothing runs that could clash
        return
    others = [(n.cluster, n.name, n.labels) for n in running if n.cluster != config.cluster and n.state == "running"]
    found = clashes(held, gpus, others)
    if not found:
        return
    first = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    fix = (
        "select other GPUs (--gpus)"
        if first.key == "gpus"
        else f"choose another port ({first.key}; --port for the API)"
    )
    raise ConfigError(
        f"{first.what} is held by cluster {first.cluster} ({first.node}) on this host{more}",
        key=first.key,
        hint=f"{fix}, or stop it: kit down --cluster {first.cluster}",
    )


def one_host_overrides(
    config_path: str | None,
    overrides: Overrides,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> dict[str, tuple[Any, str]]:
    """`overrides` plus what `kit serve MODEL` decides for every key the user left unset (no
    kit.yaml needed): one node; the mp backend (one node needs no Ray, and vLLM images since 0.18
    have none); GPUs per node from --gpus or the layout; a cluster name from the model and the API
    port; and every other host port derived from the API port (kit.plan.host_share), so two
    servers on two API ports never share one."""
    first = load_config(config_path, environ=environ, overrides=overrides, cwd=cwd)
    config, sources = first.config, first.sources
    unset = {key for key, source in sources.items() if source == "default"}
    out = dict(overrides)

    def decide(key: str, value: Any) -> None:
        if key in unset:
            out[key] = (value, ONE_HOST)

    if "nodes" not in unset and config.nodes != 1:
        raise ConfigError(
            f"`kit serve MODEL` serves on this host alone, but nodes is {config.nodes}",
            key="nodes",
            source=sources.get("nodes"),
            hint="drop nodes (or set it to 1); a multi-node cluster starts with `kit up` on every node",
        )
    decide("nodes", 1)
    decide("backend", "mp")
    backend = "mp" if "backend" in unset else config.backend
    decide("gpus_per_node", _gpus_per_node(config))
    decide("cluster", one_host_name(config.served_name, config.ports.api))
    for key, port in derived_ports(config.ports.api, backend).items():
        decide(key, port)
    return out


def _gpus_per_node(config: KitConfig) -> int:
    """The GPUs one host serves with: those --gpus selects, else TP × PP × DP where set, else 1."""
    if config.gpus != "all":
        return len(config.gpus.split(","))
    m = config.model
    sizes = [v for v in (m.tp, m.pp, m.dp) if isinstance(v, int)]
    product = 1
    for v in sizes:
        product *= v
    return product

"""`kit down`: remove every container and network of the cluster (by label). Idempotent."""

from __future__ import annotations

import click

from kit.commands._common import config_options, json_option, overrides_from, resolve
from kit.output import emit
from kit.runtime import get_runtime


@click.command(name="down")
@config_options
@json_option
def command(config_path: str | None, cluster: str | None, set_values: tuple[str, ...], as_json: bool) -> None:
    """Remove every kit container and network of the cluster on this host (found by label).

    Running it again is harmless. On a real cluster, run it on every node.
    """
    resolved = resolve(config_path, overrides_from({"cluster": cluster}, {"cluster": "cluster"}, set_values))
    name = resolved.config.cluster
    removed = get_runtime(resolved.config).remove_cluster(name)
    emit(
        "down",
        {"cluster": name, **removed},
        as_json=as_json,
        text=lambda: (
            f"cluster {name}: removed {len(removed['containers'])} container(s)"
            + (f" ({', '.join(removed['containers'])})" if removed["containers"] else "")
            + (f" and {len(removed['networks'])} network(s)" if removed.get("networks") else "")
        ),
    )

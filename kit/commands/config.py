"""`kit config show`: the resolved configuration and where each value came from."""

from __future__ import annotations

from typing import Any

import click

from kit.cluster.resolve import resolve
from kit.commands._options import cluster_overrides, config_options, json_option
from kit.commands._params import KitGroup
from kit.config import redacted_value
from kit.config.schema import SCHEMA
from kit.output import emit, table


@click.group(name="config", cls=KitGroup)
def command() -> None:
    """Inspect kit's configuration (defaults < kit.yaml < KIT_* environment < flags)."""


@command.command(name="show")
@config_options
@json_option
def show(config_path: str | None, cluster: str | None, set_values: tuple[str, ...], as_json: bool) -> None:
    """Print every key with its resolved value and its source (default, FILE:LINE, env KIT_X, flag).

    Secrets are never shown: kit only knows the paths of the files that hold them.
    """
    resolved = resolve(config_path, cluster_overrides(cluster, set_values)).resolved
    rows = [(key, redacted_value(key, value), source) for key, value, source in resolved.show()]
    result: dict[str, Any] = {
        "path": resolved.path,
        "values": {k: {"value": v, "source": s, "help": SCHEMA[k].help} for k, v, s in rows},
    }
    emit(
        "config",
        result,
        as_json=as_json,
        text=lambda: (
            f"# config file: {resolved.path or '(none: built-in defaults)'}\n"
            + table(["key", "value", "source"], [(k, _fmt(v), s) for k, v, s in rows])
        ),
    )


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)

"""`kit config show`: the resolved configuration and where each value came from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

from kit.cluster.resolve import load_settings, plan
from kit.commands._options import cluster_overrides, config_options, json_option
from kit.commands._params import KitGroup
from kit.config import Resolved, redacted_value
from kit.config.schema import SCHEMA
from kit.errors import KitError
from kit.output import emit, table, warn


@click.group(name="config", cls=KitGroup)
def command() -> None:
    """Inspect kit's configuration (defaults < kit.yaml < KIT_* environment < flags)."""


@command.command(name="show")
@config_options
@json_option
def show(config_path: str | None, cluster: str | None, set_values: tuple[str, ...], as_json: bool) -> None:
    """Print every key with its resolved value and its source (default, FILE:LINE, env KIT_X, flag).

    Secrets are never shown: kit only knows the paths of the files that hold them. model.tp/pp/dp
    left `auto` show what kit's planner decides (with the model's files when they are here); a
    model it cannot plan (its weights do not fit model.gpu_memory) leaves them `auto`, with a
    warning that says why: the config is always shown.
    """
    resolved, why = planned(load_settings(config_path, cluster_overrides(cluster, set_values)))
    warn([why] if why else [], as_json=as_json)
    rows = [(key, redacted_value(key, value), source) for key, value, source in resolved.show()]
    emit(Shown(resolved.path, why, rows), as_json=as_json)


@dataclass(frozen=True)
class Shown:
    """`kit config show`: the config file, why the layout could not be planned, each key's row."""

    path: str | None
    plan_error: str | None
    rows: list[tuple[str, Any, str]]  # key, value (secrets redacted), source
    command = "config"

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "plan_error": self.plan_error,
            "values": {k: {"value": v, "source": s, "help": SCHEMA[k].help} for k, v, s in self.rows},
        }

    def text(self) -> str:
        return f"# config file: {self.path or '(none: built-in defaults)'}\n" + table(
            ["key", "value", "source"], [(k, _fmt(v), s) for k, v, s in self.rows]
        )


def planned(settings: Resolved) -> tuple[Resolved, str | None]:
    """The settings with the planner's layout, or as loaded and why it cannot be planned."""
    try:
        return plan(settings).resolved, None
    except KitError as err:
        return settings, f"model.tp/pp/dp stay as configured: the layout cannot be planned: {err.message}"


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)

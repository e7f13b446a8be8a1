"""Jinja2 environment for kit's generated text (package data in kit/templates/)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jinja2


@dataclass(frozen=True)
class EnvRef:
    """A value known only on the node at run time: rendered as "${NAME}" (quoted), never inlined."""

    name: str

    def __str__(self) -> str:
        return "${" + self.name + "}"


Arg = str | EnvRef


def shell_quote(value: Any) -> str:
    """Quote one value for bash. EnvRef expands inside double quotes; everything else is literal."""
    if isinstance(value, EnvRef):
        return f'"${{{value.name}}}"'
    return shlex.quote(str(value))


def shell_words(values: Any) -> str:
    return " ".join(shell_quote(v) for v in values)


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("kit", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["q"] = shell_quote
    env.filters["words"] = shell_words
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)

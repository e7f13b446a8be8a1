"""Shell text and the Jinja2 environment for kit's generated text (package data in kit/templates/).

`shell_quote` is the one quoting function for every piece of shell kit writes or prints: node
entrypoints, serve scripts, SLURM launchers, dry-runs and lines to paste. A user value reaches
shell only as one word it quoted (or through the environment or a file): never inside a
here-document, a comment or a double-quoted message (issue 16).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from kit.errors import ConfigError

if TYPE_CHECKING:
    import jinja2

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class EnvRef:
    """A value known only on the node at run time: rendered as "${NAME}" (quoted), never inlined."""

    name: str

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"{self.name!r} is not a shell variable name")

    def __str__(self) -> str:
        return "${" + self.name + "}"


@dataclass(frozen=True)
class Word:
    """One shell word made of literal text and run-time variables, e.g. `--master-addr=` followed
    by "${KIT_HEAD_ADDRESS}": each literal part single-quoted, each variable double-quoted, joined
    with nothing between them, so the shell sees one argument."""

    parts: tuple[str | EnvRef, ...]

    def __str__(self) -> str:
        return "".join(str(p) for p in self.parts)


Arg = str | EnvRef | Word


def shell_quote(value: Any) -> str:
    """Quote one value as one bash word. EnvRef expands inside double quotes; a Word joins its
    quoted parts; everything else is literal (shlex.quote: single quotes)."""
    if isinstance(value, EnvRef):
        return f'"${{{value.name}}}"'
    if isinstance(value, Word):
        return "".join(shell_quote(p) for p in value.parts if p != "") or "''"
    text = str(value)
    if "\x00" in text:
        raise ConfigError(f"{text!r} holds a NUL byte, which no command line or script can carry", hint="remove it")
    return shlex.quote(text)


def shell_words(values: Iterable[Any]) -> str:
    """A command line: every value one quoted word (what `kit` prints for a person to paste)."""
    return " ".join(shell_quote(v) for v in values)


def option(flag: str, value: str | EnvRef) -> Word:
    """`--flag=VALUE` as one word: a value that starts with `-` can never be read as an option."""
    return Word((f"{flag}=", value))


def positional(value: str, *, key: str) -> str:
    """A value placed where a program expects a positional argument (an image, a model id): one
    that starts with `-` would be parsed as an option, so it is refused here, whatever checked it
    before."""
    if value.startswith("-"):
        raise ConfigError(
            f"{value!r} starts with '-' and would be read as an option",
            key=key,
            hint="use the name without a leading '-' (for a local path, prefix it with ./)",
        )
    return value


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    import jinja2  # lazy: kit.proc quotes log lines with shell_words and must stay light

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

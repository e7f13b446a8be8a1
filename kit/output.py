"""Result rendering shared by verbs: a JSON envelope for machines, text for people."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click


def emit(command: str, result: Any, *, as_json: bool, text: str | Callable[[], str]) -> None:
    """Print a command's result: `{"ok": true, "command": ..., "result": ...}` or human text."""
    if as_json:
        click.echo(json.dumps({"ok": True, "command": command, "result": result}, indent=2, default=str))
        return
    rendered = text() if callable(text) else text
    if rendered:
        click.echo(rendered)


def progress(message: str, *, as_json: bool = False) -> None:
    """One progress line on stderr (never on stdout, so --json output stays parseable)."""
    if not as_json:
        click.echo(message, err=True)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def is_tty() -> bool:
    return sys.stderr.isatty()

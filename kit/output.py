"""Result rendering shared by verbs: a JSON envelope for machines, text for people.

Standard library only (no click), so the layers below the verbs can be imported without the CLI."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any


def echo(text: str, *, err: bool = False, nl: bool = True) -> None:
    stream = sys.stderr if err else sys.stdout
    stream.write(text + ("\n" if nl else ""))
    stream.flush()


def emit(command: str, result: Any, *, as_json: bool, text: str | Callable[[], str]) -> None:
    """Print a command's result: `{"ok": true, "command": ..., "result": ...}` or human text."""
    if as_json:
        echo(json.dumps({"ok": True, "command": command, "result": result}, indent=2, default=str))
        return
    rendered = text() if callable(text) else text
    if rendered:
        echo(rendered)


def progress(message: str, *, as_json: bool = False) -> None:
    """One progress line on stderr (never on stdout, so --json output stays parseable)."""
    if not as_json:
        echo(message, err=True)


def warn(warnings: Sequence[str], *, as_json: bool = False) -> None:
    """Each warning as one `warning: ...` line on stderr (with --json they go in the result)."""
    for warning in warnings:
        progress(f"warning: {warning}", as_json=as_json)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def is_tty() -> bool:
    return sys.stderr.isatty()


class LiveLine:
    """A progress line on stderr: rewritten in place on a terminal (like `kit pull`), plain lines
    at most every `every` seconds otherwise, nothing with --json."""

    def __init__(self, *, as_json: bool = False, every: float = 5.0) -> None:
        self.quiet = as_json
        self.tty = is_tty()
        self.every = every
        self._last = 0.0
        self._shown = False

    def update(self, text: str, *, force: bool = False) -> None:
        import time

        if self.quiet:
            return
        now = time.monotonic()
        if self.tty:
            if force or now - self._last >= 0.1:
                self._last = now
                self._shown = True
                echo("\r\x1b[2K" + text, nl=False, err=True)
        elif force or now - self._last >= self.every:
            self._last = now
            echo(text, err=True)

    def done(self, text: str | None = None) -> None:
        """Finish the line (a final text replaces it)."""
        if self.quiet:
            return
        if self.tty and self._shown:
            echo("\r\x1b[2K" + (text or ""), nl=bool(text), err=True)
        elif text:
            echo(text, err=True)
        self._shown = False


def bar(done: int, total: int, width: int = 24) -> str:
    filled = 0 if total <= 0 else min(width, round(width * done / total))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def human_bytes(n: float) -> str:
    """Decimal units, as download tools print them: 1.5 GB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"

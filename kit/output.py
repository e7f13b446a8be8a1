"""Result rendering shared by verbs: a JSON envelope for machines, text for people.

Standard library only (no click), so the layers below the verbs can be imported without the CLI.
A verb's result is a typed object (the Result protocol: its command, its JSON document, its text)
and emit() is the one function that prints it (issue 26).
Everything printed here goes through kit.safe.text (issue 27): the secrets kit knows are
redacted and control characters a server or a file put into the text are shown as escapes, so
nothing an outside party wrote can reach the terminal raw; JSON is strict (no NaN/Infinity). A
closed or broken standard output is an OutputLost error, never a silent success."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Protocol

from kit.errors import OutputLost
from kit.safe import text as safetext


def echo(text: str, *, err: bool = False, nl: bool = True) -> None:
    """Write as it is (callers clean what came from outside: out(), progress())."""
    stream = sys.stderr if err else sys.stdout
    if stream is None:
        if err:
            return  # no stderr: nothing to tell
        raise OutputLost("standard output is closed: kit's output would be lost", hint="run it without >&-")
    stream.write(text + ("\n" if nl else ""))
    stream.flush()


class Result(Protocol):
    """What a verb prints: the verb's name, its document for --json, its text for people."""

    @property
    def command(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...

    def text(self) -> str: ...


def emit(result: Result, *, as_json: bool) -> None:
    """Print a command's result: `{"ok": true, "command": ..., "result": ...}` or its text (an
    empty text prints nothing). The one printer of results."""
    if as_json:
        out(safetext.to_json({"ok": True, "command": result.command, "result": result.to_dict()}), raw=True)
        return
    rendered = result.text()
    if rendered:
        out(rendered)


def out(text: str, *, nl: bool = True, raw: bool = False) -> None:
    """Write to standard output (cleaned by kit.safe.text unless `raw`: text kit made safe
    itself); a closed or broken stdout is an OutputLost error, never a silent success."""
    try:
        echo(text if raw else safetext.clean(text), nl=nl)
    except (OSError, ValueError) as exc:
        raise output_lost(exc) from None


def output_lost(exc: BaseException) -> OutputLost:
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "it is closed"
    return OutputLost(f"cannot write to standard output ({str(why).lower()}): the output was lost")


def progress(message: str, *, as_json: bool = False) -> None:
    """One progress line on stderr (never on stdout, so --json output stays parseable)."""
    if not as_json:
        echo(safetext.clean(message), err=True)


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
                echo("\r\x1b[2K" + safetext.clean(text, newlines=False), nl=False, err=True)
        elif force or now - self._last >= self.every:
            self._last = now
            echo(safetext.clean(text, newlines=False), err=True)

    def done(self, text: str | None = None) -> None:
        """Finish the line (a final text replaces it)."""
        if self.quiet:
            return
        if self.tty and self._shown:
            echo("\r\x1b[2K" + safetext.clean(text or ""), nl=bool(text), err=True)
        elif text:
            echo(safetext.clean(text), err=True)
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

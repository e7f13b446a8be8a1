"""Loaders for files a user hands kit (config.json, datasets, saved results): bounded so that no
input can blow them up (issue 16: a 100,000-deep nesting raised RecursionError, a /dev/zero never
ended). Every failure is one ConfigError naming the file (and line when known), exit 3.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from kit.errors import ConfigError

MAX_DEPTH = 64  # real configs and datasets nest a handful of levels
MAX_FILE_BYTES = 64 * 1024 * 1024  # a model's config.json is kB; a bench dataset a few MB


def json_depth_ok(text: str, max_depth: int = MAX_DEPTH) -> bool:
    """True when no array/object nests deeper than max_depth (a linear scan that skips strings),
    checked before json.loads, whose recursion is what a deep document breaks."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def loads_json(text: str, *, source: str, max_depth: int = MAX_DEPTH, hint: str | None = None) -> Any:
    """json.loads with a nesting limit; NaN/Infinity literals are refused (not JSON)."""
    if not json_depth_ok(text, max_depth):
        raise ConfigError(f"nested deeper than {max_depth} levels", source=source, hint=hint or "pass a real file")
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            source=f"{source}:{exc.lineno}",
            hint=hint or "fix the JSON",
        ) from None
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"not valid JSON: {exc}", source=source, hint=hint or "fix the JSON") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_text(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES, what: str = "file") -> str:
    """A regular file's UTF-8 text, at most max_bytes: FIFOs and devices are refused (reading
    /dev/zero or a pipe would never end), as are other encodings."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise ConfigError(f"cannot read {what}: {exc.strerror}", source=str(p), hint="pass an existing file") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{what} is not a regular file", source=str(p), hint="pass a regular file")
    if st.st_size > max_bytes:
        raise ConfigError(
            f"{what} is {st.st_size} bytes, more than the {max_bytes} kit reads",
            source=str(p),
            hint="pass a smaller file",
        )
    try:
        with p.open("rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what}: {exc.strerror}", source=str(p), hint="check its permissions") from None
    if len(data) > max_bytes:
        raise ConfigError(f"{what} grew past {max_bytes} bytes while read", source=str(p))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{what} is not UTF-8 text", source=f"{p}:{line}", hint="save it as UTF-8") from None


def load_json_file(
    path: str | Path, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_FILE_BYTES, what: str = "file"
) -> Any:
    return loads_json(read_text(path, max_bytes=max_bytes, what=what), source=str(path), max_depth=max_depth)

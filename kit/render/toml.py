"""TOML text from data, for the CSCS environment definition files (EDF) `kit slurm --runtime edf`
writes. A small writer instead of a dependency: kit writes strings, booleans, integers, arrays of
strings and one level of tables, every string a TOML basic string escaped per the spec
(toml.io/en/v1.0.0#string), every key bare when it can be and quoted otherwise. No value is ever
concatenated into the text unescaped. Read back by tomllib in the tests.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+\Z")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(value: str) -> str:
    """A TOML basic string: quotes and backslashes escaped, control characters as escapes."""
    out = []
    for char in value:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else toml_string(key)  # fullmatch: `$` also matches before a final newline


def toml_value(value: Any) -> str:
    if isinstance(value, bool):  # before int: bool is an int
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, Sequence):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"kit writes no TOML value of type {type(value).__name__}")


def to_toml(data: Mapping[str, Any]) -> str:
    """Top-level keys first, then each mapping as a [table] (one level: what an EDF needs)."""
    lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, Mapping)]
    for name, table in data.items():
        if isinstance(table, Mapping):
            lines += ["", f"[{toml_key(name)}]"]
            lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"

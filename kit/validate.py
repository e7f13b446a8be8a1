"""One validation layer for every value a user hands kit (issue 16): strings, numbers, URLs,
mounts and the files kit reads or writes. Checked before the first container, pull, request or
file write. kit.config's coerce uses it for config keys (exit 3, naming file:line and key);
kit.commands._params uses it for flags that are not config keys (naming the flag).

Each check raises Invalid(message, hint); the caller adds the field's name. Nothing here prints
or exits, and no message embeds more than a short preview of the value (a 100 kB value or an
expanded YAML alias bomb must not come back in an error line).
"""

from __future__ import annotations

import math
import os
import re
import stat
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Spec:
    """One config key of the schema (kit/config/schema.py): its type, default, help and bounds."""

    kind: str  # str | int | float | bool | list | dict | choice | int_auto | size
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    optional: bool = False  # None allowed
    text: str = "name"  # kit.validate.RULES kind of the string (of each item, for lists and dicts)
    low: int | None = None  # inclusive bounds of an int (int_auto: of its number)
    high: int | None = None
    special: tuple[int, ...] = ()  # ints allowed outside the bounds (vLLM's -1 = auto)
    pattern: tuple[str, str] | None = None  # (regex the whole string matches, what it is)


class Invalid(ValueError):
    """A value kit refuses: `message` says what is wrong, `hint` how to fix it."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


@dataclass(frozen=True)
class Rule:
    """What a kind of string may hold."""

    limit: int  # characters
    dash: bool = False  # may start with '-' (vLLM arguments do; ids, names and paths do not)
    newlines: bool = False  # free text (a prompt) may hold tab, newline and carriage return
    empty: bool = False  # "" is a value (an environment variable may be empty)


# The kinds of strings kit takes. Limits are far above any real value and far below what
# could hurt: a name is at most a line, a path at most PATH_MAX, one vLLM argument a few KiB
# (JSON-valued options like --speculative-config are the long ones).
RULES: dict[str, Rule] = {
    "name": Rule(256),  # cluster, served name, interface, network, SLURM names, addresses
    "path": Rule(4096),  # host or container paths, model ids (a path or org/name), image refs
    "value": Rule(4096),  # any other option value
    "arg": Rule(16384, dash=True),  # one item of model.extra_args
    "env": Rule(16384, dash=True, empty=True),  # an env: value
    "text": Rule(1 << 20, dash=True, newlines=True),  # a prompt: sent in a JSON body, never to a shell
}

# C0 controls, DEL, C1 controls (NEL included) and the Unicode line/paragraph separators
# (str.splitlines() breaks on them): none belongs in a value that reaches a command line,
# a script, a label or a log line.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_IN_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_NAMES = {"\n": "a newline", "\r": "a carriage return", "\x00": "a NUL byte", "\x1b": "an ESC", "\t": "a tab"}


def preview(value: Any, limit: int = 40) -> str:
    """A short, printable repr of a value for an error message."""
    try:
        text = repr(value)
    except ValueError:  # an int of more than 4300 digits has no repr
        return "a value too long to show"
    return text if len(text) <= limit else text[: limit - 5] + "…" + text[-4:]


def text(value: str, kind: str = "value", *, dash: bool | None = None) -> str:
    """A string of `kind` (RULES): not empty, not too long, no control characters, and unless
    the kind (or `dash`) allows it not starting with '-' (a program would read it as an option)."""
    rule = RULES[kind]
    if value == "" and not rule.empty:
        raise Invalid("is empty", "give it a value, or leave it out for the default")
    if len(value) > rule.limit:
        raise Invalid(f"is {len(value)} characters long; kit takes at most {rule.limit}", "shorten it")
    found = (_CONTROL_IN_TEXT if rule.newlines else _CONTROL).search(value)
    if found:
        char = found.group(0)
        name = _CONTROL_NAMES.get(char, f"the control character U+{ord(char):04X}")
        raise Invalid(
            f"contains {name} (at character {found.start() + 1})",
            "remove it: kit refuses control characters in values that reach a command line or a file",
        )
    if value.startswith("-") and not (rule.dash if dash is None else dash):
        raise Invalid(
            f"{preview(value)} starts with '-'",
            "a value cannot start with '-': programs would read it as an option",
        )
    return value


def is_number(value: str) -> bool:
    """'-5', '1e3', 'inf': a number (so '-5' is a negative value, not an option)."""
    try:
        float(value)
    except ValueError:
        return False
    return True


def number(
    value: float, *, low: float | None = None, high: float | None = None, above: bool = False, what: str = ""
) -> float:
    """A finite number in [low, high] ((low, high] with above=True)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise Invalid(f"{value} is not a finite number", _range_hint(low, high, above, what))
    if low is not None and (value < low or (above and value == low)):
        bound = f"above {_fmt(low)}" if above else f"at least {_fmt(low)}"
        raise Invalid(f"must be {bound}, got {_fmt(value)}", _range_hint(low, high, above, what))
    if high is not None and value > high:
        raise Invalid(f"must be at most {_fmt(high)}, got {_fmt(value)}", _range_hint(low, high, above, what))
    return value


def _fmt(value: float) -> str:
    """10000000, not 1e+07; 0.5 stays 0.5; a 5000-digit integer is shortened."""
    if isinstance(value, int):
        return str(value) if abs(value) < 10**30 else f"a {value.bit_length()}-bit number"
    return str(int(value)) if value.is_integer() and abs(value) < 1e16 else f"{value:g}"


def _range_hint(low: float | None, high: float | None, above: bool, what: str) -> str:
    noun = what or "a number"
    if low is not None and high is not None:
        return f"use {noun} from {_fmt(low)}{' (exclusive)' if above else ''} to {_fmt(high)}"
    if low is not None:
        return f"use {noun} {'above' if above else 'of at least'} {_fmt(low)}"
    if high is not None:
        return f"use {noun} of at most {_fmt(high)}"
    return f"use a finite {noun.removeprefix('a ')}"


def url(value: str) -> str:
    """An http(s) URL with a host (and a valid port); no credentials in it."""
    text(value, "path")
    hint = "write it like http://10.0.0.1:8000"
    if any(c.isspace() for c in value):
        raise Invalid(f"{preview(value)} holds whitespace", hint)
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https"):
        raise Invalid(f"{preview(value)} is not an http:// or https:// URL", hint)
    try:
        host, _port = parts.hostname, parts.port
    except ValueError:
        raise Invalid(f"{preview(value)} has an invalid port", hint) from None
    if not host:
        raise Invalid(f"{preview(value)} has no host", hint)
    if parts.username or parts.password:
        raise Invalid("holds credentials", "drop them from the URL and pass the key with --api-key-file")
    if parts.query or parts.fragment:
        raise Invalid(f"{preview(value)} has a query or fragment", "pass the server's base URL")
    return value


def env_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,255}", name):
        raise Invalid(f"{preview(name)} is not a valid variable name", "use letters, digits and '_'")
    return name


def mount(value: str) -> tuple[str, str, str | None]:
    """'HOST:CONTAINER[:ro|rw]' with an absolute (or ~) host path and an absolute container path.
    A relative host path is refused, not made absolute against whatever the current folder is."""
    text(value, "path")
    parts = value.split(":")
    hint = "write /host/path:/container/path or /host/path:/container/path:ro"
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise Invalid(f"{preview(value)} is not a mount", hint)
    host, container = parts[0], parts[1]
    if not host.startswith(("/", "~")):
        raise Invalid(f"the host path {preview(host)} is relative", "give an absolute host path (or one under ~)")
    if not container.startswith("/"):
        raise Invalid(f"the container path {preview(container)} is not absolute", hint)
    return host, container, parts[2] if len(parts) == 3 else None


# --- config values (kit.config's coerce) --------------------------------------------------

_SIZE_RE = re.compile(r"^\d+(\.\d+)?[kmgt]?b?\Z", re.IGNORECASE)
_KIND_WORDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "int_auto": "an integer or auto",
    "choice": "one of the listed choices",
    "size": "a size like 16g",
    "list": "a list of strings",
    "dict": "a mapping of NAME: value",
}


def config_value(spec: Spec, value: Any) -> Any:
    """A config value (not None) checked, and lightly converted, against its schema entry."""
    kind = spec.kind
    bad = Invalid(f"expected {_KIND_WORDS[kind]}, got {_type_word(value)}", spec.help)
    if kind == "str":
        if isinstance(value, (bool, list, dict)):
            raise bad
        checked = text(str(value), spec.text)
        if spec.pattern and not re.fullmatch(spec.pattern[0], checked):
            raise Invalid(f"{preview(checked)} is not a valid value", f"use {spec.pattern[1]}")
        return checked
    if kind in ("int", "int_auto"):
        if kind == "int_auto" and value == "auto":
            return "auto"
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        if value not in spec.special:
            number(value, low=spec.low, high=spec.high)
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return number(float(value))
    if kind == "bool":
        if not isinstance(value, bool):
            raise bad
        return value
    if kind == "choice":
        if value not in spec.choices:
            raise Invalid(
                f"{preview(value)} is not one of {', '.join(spec.choices)}", f"use one of: {', '.join(spec.choices)}"
            )
        return value
    if kind == "size":
        if not _SIZE_RE.match(str(value)):
            raise Invalid(f"{preview(value)} is not a size", "write it like 16g or 10.24g")
        return str(value)
    if kind == "list":
        if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
            raise bad
        _count(value, spec)
        items = [str(v) for v in value]
        for i, item in enumerate(items):
            _item(i, item, spec.text)
        return items
    if kind == "dict":
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise bad
        _count(value, spec)
        for name, item in value.items():
            if not isinstance(item, (str, int, float, bool, type(None))):
                raise Invalid(f"{preview(name)}: expected a plain value, got {_type_word(item)}", "write NAME: value")
        out = {k: ("" if v is None else str(v)) for k, v in value.items()}
        for name, item in out.items():
            env_name(name)
            _item(name, item, spec.text)
        return out
    raise AssertionError(kind)  # pragma: no cover


def _count(value: list[Any] | dict[str, Any], spec: Spec) -> None:
    if spec.high is not None and len(value) > spec.high:
        raise Invalid(f"has {len(value)} entries; kit takes at most {spec.high}", "remove some")


def _item(where: int | str, item: str, kind: str) -> None:
    """One entry of a list (its index) or a mapping (its name), named in the error."""
    try:
        if kind == "mount":
            mount(item)
        else:
            text(item, kind)
    except Invalid as exc:
        label = f"item {where + 1}" if isinstance(where, int) else where
        raise Invalid(f"{label}: {exc.message}", exc.hint) from None


def _type_word(value: Any) -> str:
    """What a wrong-typed value is, without echoing a big one back (a list or mapping, which an
    alias could have made huge, is named by its type only)."""
    if isinstance(value, (list, dict)):
        return f"a {'list' if isinstance(value, list) else 'mapping'}"
    return f"{type(value).__name__} {preview(value)}"


# --- files --------------------------------------------------------------------------------


def readable_file(path: str | Path) -> Path:
    """An existing regular file this process can read (a secret, a dataset): FIFOs and devices
    are refused, since reading them may never end."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise Invalid(f"{p}: {exc.strerror}", "pass an existing, readable file") from None
    if not stat.S_ISREG(st.st_mode):
        raise Invalid(f"{p} is not a regular file", "pass a regular file")
    if not os.access(p, os.R_OK):
        raise Invalid(f"{p} is not readable by this user", f"fix its permissions (e.g. chmod 600, owned by {_user()})")
    return p


def writable_file(path: str | Path) -> Path:
    """A file kit may create or replace: its folder exists and is writable, and it is not a
    folder or a special file. Checked before any work whose result it will hold."""
    p = Path(path)
    if any(len(part.encode()) > 255 for part in p.parts):
        raise Invalid("a name in the path is longer than 255 bytes", "shorten it")
    parent = p.parent
    mode = _mode(p)
    if mode is not None and stat.S_ISDIR(mode):
        raise Invalid(f"{p} is a folder", "name a file in it")
    parent_mode = _mode(parent)
    if parent_mode is None or not stat.S_ISDIR(parent_mode):
        raise Invalid(f"the folder {parent} does not exist", "create the folder first, or write somewhere else")
    if mode is not None and not stat.S_ISREG(mode):
        raise Invalid(f"{p} is not a regular file", "name a regular file")
    if not os.access(parent, os.W_OK | os.X_OK) or (mode is not None and not os.access(p, os.W_OK)):
        raise Invalid(f"{p} is not writable by this user", "write somewhere you may write")
    return p


def _mode(p: Path) -> int | None:
    """st_mode, or None when there is nothing there (or the name cannot exist: too long, a
    component that is a file)."""
    try:
        return p.stat().st_mode
    except OSError:
        return None


def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container)
        return "you"

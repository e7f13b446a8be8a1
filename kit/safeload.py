"""Loaders for files a user hands kit (kit.yaml, config.json, datasets, saved results, secret
files) and for kit's own state files: bounded so that no input can blow them up (issue 16: a
100,000-deep nesting raised RecursionError, a /dev/zero never ended, a YAML alias bomb filled
memory). Every failure is one ConfigError naming the file (and line when known), exit 3.

The JSON half and read_text need only the standard library (PyYAML is imported by the YAML
functions when they run): kit.net.http and the supervise bundle read JSON through them.
"""

from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kit.errors import ConfigError
from kit.safe import files as safefile
from kit.safe import text as safetext

if TYPE_CHECKING:
    import yaml

MAX_DEPTH = 64  # real configs and datasets nest a handful of levels
MAX_FILE_BYTES = 64 * 1024 * 1024  # a model's config.json is kB; a bench dataset a few MB
# kit.yaml (and YAML-valued KIT_* variables and --set values): a real one is a few hundred
# bytes, nests three levels (model: extra_args: [...]) and holds tens of nodes.
MAX_YAML_BYTES = 256 * 1024
MAX_YAML_DEPTH = 16
MAX_YAML_EVENTS = 50_000  # parser events: bounds yaml.compose's work and memory
MAX_YAML_NODES = 10_000  # nodes of one value once its aliases are expanded
_TAG = "tag:yaml.org,2002:"
# The tags YAML's own resolver gives plain values; anything else (!!python/..., !!binary,
# !!set, local !tags) is refused before a constructor runs.
YAML_TAGS = {_TAG + t for t in ("null", "bool", "int", "float", "str", "seq", "map", "timestamp")}


def json_depth_ok(text: str, max_depth: int = MAX_DEPTH) -> bool:
    """True when no array/object nests deeper than max_depth (a linear scan that skips strings),
    checked before json.loads, whose recursion is what a deep document breaks."""
    if text.count("[") + text.count("{") <= max_depth:  # too few brackets to nest that deep
        return True
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


def read_bytes(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES, what: str = "file") -> bytes:
    """A regular file's bytes, at most max_bytes: FIFOs and devices are refused (reading
    /dev/zero or a pipe would never end). The file is opened without blocking and checked on
    that handle, so nothing swapped in after a check is read."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"cannot read {what}: {exc.strerror}", source=str(p), hint="pass an existing file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what} is not a regular file", source=str(p), hint="pass a regular file")
        if st.st_size > max_bytes:
            raise ConfigError(
                f"{what} is {st.st_size} bytes, more than the {max_bytes} kit reads",
                source=str(p),
                hint="pass a smaller file",
            )
        os.set_blocking(fd, True)
        data = _read_fd(fd, max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what}: {exc.strerror}", source=str(p), hint="check its permissions") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ConfigError(f"{what} grew past {max_bytes} bytes while read", source=str(p))
    return data


def read_text(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES, what: str = "file") -> str:
    """A regular file's UTF-8 text, at most max_bytes (read_bytes), other encodings refused."""
    data = read_bytes(path, max_bytes=max_bytes, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(f"{what} is not UTF-8 text", source=f"{path}:{line}", hint="save it as UTF-8") from None


def _read_fd(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit:
        piece = os.read(fd, min(1 << 20, limit - size))
        if not piece:
            break
        chunks.append(piece)
        size += len(piece)
    return b"".join(chunks)


class LooseSecretFile(UserWarning):
    """A secret file that its group or others can read (kit.cli prints it as one warning line)."""


MAX_SECRET_BYTES = 64 * 1024


def read_secret(path: str | Path, *, key: str, source: str | None = None) -> str:
    """The one secret (API key, HF token) in the file `key` names: a regular file of at most
    64 KiB holding one word. From then on kit.safe.text redacts it from everything kit prints or
    saves. A file its group or others can read gets a LooseSecretFile warning (chmod 600)."""
    where = str(Path(path).expanduser())
    try:
        text = read_text(where, max_bytes=MAX_SECRET_BYTES, what=f"{key}")
    except ConfigError as err:
        raise ConfigError(err.message, key=key, source=source, hint=err.hint or "pass a readable file") from None
    secret = text.strip()
    if not secret:
        raise ConfigError("is empty", key=key, source=source or where, hint="write the secret into the file")
    if any(c.isspace() for c in secret) or not secret.isprintable():
        raise ConfigError(
            "does not hold one token (one word, no spaces)",
            key=key,
            source=source or where,
            hint="write only the secret into the file, on one line",
        )
    safetext.register_secret(secret)
    warning = safefile.loose_secret_warning(where, key)
    if warning:
        warnings.warn(LooseSecretFile(warning), stacklevel=2)
    return secret


def load_json_file(
    path: str | Path, *, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_FILE_BYTES, what: str = "file"
) -> Any:
    return loads_json(read_text(path, max_bytes=max_bytes, what=what), source=str(path), max_depth=max_depth)


# --- YAML ---------------------------------------------------------------------------------


class YAMLSyntaxError(ConfigError):
    """Text that is not YAML (a KIT_* value that is not YAML stays a plain string instead)."""


def compose_yaml(text: str, *, source: str, lines: bool = True) -> yaml.Node | None:
    """The node graph of one YAML document, no Python object built yet. A streaming pass over the
    parser's events (the parser keeps an explicit stack) refuses deep nesting and huge documents
    first, because yaml.compose recurses once per level. `lines`: errors name source:LINE (a file;
    not a one-line environment variable)."""

    import yaml

    def at(mark: Any) -> str:
        return f"{source}:{_line(mark)}" if lines and mark is not None else source

    try:
        depth = 0
        for events, event in enumerate(yaml.parse(text, Loader=yaml.SafeLoader), 1):
            if events > MAX_YAML_EVENTS:
                raise ConfigError(
                    f"holds more than {MAX_YAML_EVENTS} YAML nodes",
                    source=at(event.start_mark),
                    hint="a kit config is a few dozen keys; pass the real one",
                )
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise ConfigError(
                        f"nested deeper than {MAX_YAML_DEPTH} levels",
                        source=at(event.start_mark),
                        hint="kit's keys nest at most three levels",
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        raise YAMLSyntaxError(
            f"invalid YAML: {exc.problem or exc.context}",
            source=at(exc.problem_mark or exc.context_mark),
            hint="fix the YAML syntax on that line",
        ) from None
    except yaml.YAMLError as exc:  # a ReaderError: a control character in the text
        message = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise YAMLSyntaxError(f"invalid YAML: {message}", source=source, hint="save it as plain UTF-8 text") from None


def _line(mark: Any) -> int:
    return int(mark.line) + 1 if mark is not None else 0


def yaml_value(node: yaml.Node, *, source: str, as_text: bool = False) -> Any:
    """The Python value of a composed node. Refused before anything is constructed: aliases that
    expand past MAX_YAML_NODES nodes or MAX_YAML_DEPTH levels (a "billion laughs"), an alias
    that contains itself, and tags other than YAML's plain ones. A tagged scalar that does not
    convert (!!int "abc") is one error. With as_text, scalars keep the text the user wrote
    (null stays None): string-valued keys get `01:00` and `no`, not YAML 1.1's 60 and False."""
    import yaml

    _check_expansion(node, source)
    if as_text:
        return _as_text(node)
    try:
        return yaml.SafeLoader("").construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        tag = node.tag.removeprefix(_TAG) if isinstance(node, yaml.ScalarNode) else None
        what = f"not a valid !!{tag}" if tag else type(exc).__name__
        raise ConfigError(f"cannot read the value ({what})", source=source, hint="write a plain value") from None


def loads_yaml(text: str, *, source: str, as_text: bool = False) -> Any:
    """One YAML value from a string (a KIT_* variable, a --set value), bounded like kit.yaml."""
    if len(text) > MAX_YAML_BYTES:
        raise ConfigError(f"is {len(text)} characters long; kit reads at most {MAX_YAML_BYTES}", source=source)
    node = compose_yaml(text, source=source, lines=False)
    return None if node is None else yaml_value(node, source=source, as_text=as_text)


def _as_text(node: yaml.Node) -> Any:
    import yaml

    if isinstance(node, yaml.ScalarNode):
        return None if node.tag == _TAG + "null" else str(node.value)
    if isinstance(node, yaml.SequenceNode):
        return [_as_text(item) for item in node.value]
    if isinstance(node, yaml.MappingNode):
        return {_key_text(k): _as_text(v) for k, v in node.value}
    raise AssertionError(node)  # pragma: no cover


def _key_text(node: yaml.Node) -> Any:
    import yaml

    # A non-scalar key ({[a]: b}) stays a list, which the schema check then refuses by type.
    return _as_text(node) if isinstance(node, yaml.ScalarNode) else [_as_text(node)]


def _check_expansion(root: yaml.Node, source: str) -> None:
    """Walk the node graph with memoised sizes: each node is visited once however many aliases
    point at it, and the walk stops as soon as a limit is passed, so the recursion stays within
    MAX_YAML_DEPTH levels and the work within the graph's size."""
    import yaml

    done: dict[int, tuple[int, int]] = {}  # id(node) -> (height, expanded node count)
    active: set[int] = set()

    def refuse(message: str) -> ConfigError:
        return ConfigError(message, source=source, hint="write the value out plainly, without aliases or tags")

    def walk(node: yaml.Node, depth: int) -> tuple[int, int]:
        key = id(node)
        if key in active:
            raise refuse("an alias refers to a value that contains it")
        if key in done:
            height, count = done[key]
        else:
            if node.tag not in YAML_TAGS:
                raise refuse(f"the YAML tag {_short_tag(node.tag)} is not allowed")
            if depth > MAX_YAML_DEPTH:
                raise refuse(f"nested deeper than {MAX_YAML_DEPTH} levels once its aliases are expanded")
            children: list[yaml.Node] = []
            if isinstance(node, yaml.SequenceNode):
                children = list(node.value)
            elif isinstance(node, yaml.MappingNode):
                children = [part for pair in node.value for part in pair]
            active.add(key)
            height, count = 0, 1
            for child in children:
                child_height, child_count = walk(child, depth + 1)
                height, count = max(height, child_height + 1), count + child_count
                if count > MAX_YAML_NODES:
                    raise refuse(f"expands to more than {MAX_YAML_NODES} YAML nodes through its aliases")
            active.discard(key)
            done[key] = (height, count)
        if depth + height > MAX_YAML_DEPTH:
            raise refuse(f"nested deeper than {MAX_YAML_DEPTH} levels once its aliases are expanded")
        return height, count

    walk(root, 1)


def _short_tag(tag: str) -> str:
    short = "!!" + tag.removeprefix(_TAG) if tag.startswith(_TAG) else tag
    return repr(short if len(short) <= 40 else short[:36] + "…")

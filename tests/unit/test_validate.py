"""kit.validate (the one validation layer) and kit.safeload's YAML bounds, as pure functions: what
each check accepts, what it refuses, and that no refusal echoes a big value back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from kit import safeload, validate
from kit.config import load_config
from kit.errors import ConfigError


@pytest.mark.parametrize(
    ("value", "kind", "needle"),
    [
        ("", "name", "is empty"),
        ("a" * 257, "name", "is 257 characters long; kit takes at most 256"),
        ("a" * 4097, "path", "at most 4096"),
        ("a\nb", "name", "contains a newline (at character 2)"),
        ("a\rb", "path", "contains a carriage return"),
        ("a\x00", "arg", "contains a NUL byte"),
        ("\x1b[31m", "env", "contains an ESC"),
        ("a\tb", "name", "contains a tab"),
        ("a\x7f", "name", "U+007F"),
        ("a\x85", "name", "U+0085"),
        ("a\u2028", "path", "U+2028"),
        ("-x", "name", "'-x' starts with '-'"),
        ("--trust-remote-code", "path", "starts with '-'"),
        ("nul\x00", "text", "contains a NUL byte"),
    ],
)
def test_text_refuses(value: str, kind: str, needle: str) -> None:
    with pytest.raises(validate.Invalid) as err:
        validate.text(value, kind)
    assert needle in err.value.message and len(err.value.message) < 120


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("org/model-7B", "path"),
        ("--enforce-eager", "arg"),
        ("", "env"),
        ("-v", "env"),
        ("line one\nline two\ttabbed\r\n", "text"),
        ("- a list item in a prompt", "text"),
        ("héllo wörld ✓", "name"),
        ("a" * 256, "name"),
    ],
)
def test_text_accepts(value: str, kind: str) -> None:
    assert validate.text(value, kind) == value


def test_dash_can_be_allowed_per_call() -> None:
    assert validate.text("-5", "value", dash=True) == "-5"
    with pytest.raises(validate.Invalid):
        validate.text("--x", "arg", dash=False)


@pytest.mark.parametrize(
    ("value", "kwargs", "needle"),
    [
        (float("nan"), {"low": 0}, "nan is not a finite number"),
        (float("inf"), {}, "inf is not a finite number"),
        (0, {"low": 1}, "must be at least 1, got 0"),
        (0.0, {"low": 0, "above": True}, "must be above 0, got 0"),
        (70000, {"low": 1, "high": 65535}, "must be at most 65535, got 70000"),
        pytest.param(10**5000, {"high": 10}, "got a 16610-bit number", id="5000-digit-int"),
        (1e30, {"high": 1}, "got 1e+30"),
    ],
)
def test_number_refuses(value: float, kwargs: dict[str, float], needle: str) -> None:
    with pytest.raises(validate.Invalid) as err:
        validate.number(value, **kwargs)  # type: ignore[arg-type]
    assert needle in err.value.message


def test_number_hint_names_the_range() -> None:
    with pytest.raises(validate.Invalid) as err:
        validate.number(0, low=1, high=10_000_000)
    assert err.value.hint == "use a number from 1 to 10000000"


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("file:///etc/passwd", "is not an http:// or https:// URL"),
        ("", "is empty"),
        ("http://", "has no host"),
        ("http://h:99999", "has an invalid port"),
        ("http://u:p@h", "holds credentials"),
        ("http://h x", "holds whitespace"),
        ("http://h/?q=1", "has a query or fragment"),
        ("h:8000", "is not an http:// or https:// URL"),
        ("--json", "starts with '-'"),
    ],
)
def test_url_refuses(value: str, needle: str) -> None:
    with pytest.raises(validate.Invalid) as err:
        validate.url(value)
    assert needle in err.value.message


def test_url_accepts_a_base_url_with_a_path() -> None:
    for value in ("http://10.0.0.1:8000", "https://host.example/prefix", "http://[::1]:8000"):
        assert validate.url(value) == value


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("data:/data", "the host path 'data' is relative"),
        ("./data:/data", "is relative"),
        ("/data:data", "the container path 'data' is not absolute"),
        ("/a:/b:rx", "is not a mount"),
        ("/a", "is not a mount"),
        ("/a:/b:ro:x", "is not a mount"),
    ],
)
def test_mount_refuses(value: str, needle: str) -> None:
    with pytest.raises(validate.Invalid) as err:
        validate.mount(value)
    assert needle in err.value.message


def test_mount_accepts_absolute_and_home_paths() -> None:
    assert validate.mount("/data:/data:ro") == ("/data", "/data", "ro")
    assert validate.mount("~/models:/models") == ("~/models", "/models", None)


def test_files(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "ok").write_text("k")
    assert validate.readable_file(tmp_path / "ok") == tmp_path / "ok"
    for path, needle in ((fifo, "not a regular file"), (tmp_path, "not a regular file"), (tmp_path / "no", "No such")):
        with pytest.raises(validate.Invalid, match=needle):
            validate.readable_file(path)
    assert validate.writable_file(tmp_path / "new.json") == tmp_path / "new.json"
    for path, needle in (
        (tmp_path / "missing" / "x.json", "does not exist"),
        (tmp_path, "is a folder"),
        (fifo, "not a regular file"),
        (tmp_path / ("n" * 300), "longer than 255 bytes"),
        (tmp_path / "ok" / "x", "does not exist"),  # a file where a folder should be
    ):
        with pytest.raises(validate.Invalid, match=needle):
            validate.writable_file(path)


# ---------------------------------------------------------------- kit.yaml through the loader


def load(tmp_path: Path, text: str | bytes) -> None:
    path = tmp_path / "kit.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    load_config(str(path), environ={})


LOL = ",".join(["x"] * 10)
BOMB = (
    "model:\n  extra_args: [&a ["
    + LOL
    + "]"
    + "".join(f", &{n} [" + ",".join([f"*{p}"] * 10) + "]" for p, n in zip("abcdefgh", "bcdefghi", strict=True))
    + ", *i]\n"
)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (BOMB, "expands to more than 10000 YAML nodes"),
        ("model:\n  extra_args: &a [*a]\n", "an alias refers to a value that contains it"),
        ("nodes: !!python/object/apply:os.system [id]\n", "the YAML tag '!!python/object/apply:os.system'"),
        ('nodes: !!int "abc"\n', "cannot read the value (not a valid !!int)"),
        ("cluster: !!binary aGk=\n", "the YAML tag '!!binary'"),
        ("model: " + "[" * 20_000 + "]" * 20_000 + "\n", "kit.yaml:1: nested deeper than 16 levels"),
        ("a: [" + "x," * 60_000 + "]\n", "kit.yaml:1: holds more than 50000 YAML nodes"),
        (b"cluster: caf\xe9\n", "kit.yaml:1: config file is not UTF-8 text"),
        ("x" * 300_000, "more than the 262144"),
        ("model: 5\n", "model: expected a mapping of model.* keys, got the value '5'"),
        ("env: [A]\n", "env: expected a mapping of NAME: value, got a list"),
    ],
)
def test_yaml_that_cannot_blow_up(tmp_path: Path, text: str | bytes, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, text)
    assert needle in err.value.message and len(err.value.message) < 300 + len(str(tmp_path))


def test_an_alias_chain_deeper_than_the_limit_is_refused_before_construction() -> None:
    # Each anchor nests the previous one a level deeper: 40 levels once expanded, 2 in the text.
    text = "v: [&a0 [x]" + "".join(f", &a{i} [*a{i - 1}]" for i in range(1, 40)) + ", *a39]\n"
    node = safeload.compose_yaml(text, source="t")
    assert isinstance(node, yaml.MappingNode)
    with pytest.raises(ConfigError, match="nested deeper than 16 levels once its aliases are expanded"):
        safeload.yaml_value(node.value[0][1], source="t")


def test_string_keys_keep_the_text_written(tmp_path: Path) -> None:
    path = tmp_path / "kit.yaml"
    path.write_text("cluster: yes\nslurm:\n  time: 1:00:00\nmodel:\n  id: 1e3\n  extra_args: [0800, no]\nnodes: 0x2\n")
    cfg = load_config(str(path), environ={}).config
    assert (cfg.cluster, cfg.slurm.time, cfg.model.id, cfg.nodes) == ("yes", "1:00:00", "1e3", 2)
    assert cfg.model.extra_args == ("0800", "no")


def test_env_and_set_values_are_bounded_too() -> None:
    with pytest.raises(ConfigError, match="env KIT_MODEL_EXTRA_ARGS: nested deeper than 16 levels"):
        load_config(environ={"KIT_MODEL_EXTRA_ARGS": "[" * 20_000}, cwd=Path("/nonexistent"))
    with pytest.raises(ConfigError, match="env KIT_ENV: expands to more than 10000"):
        load_config(environ={"KIT_ENV": "{A: " + BOMB.split("extra_args: ", 1)[1].strip() + "}"}, cwd=Path("/x"))
    # not YAML at all: stays a string, which the type check names
    with pytest.raises(ConfigError, match=r"model\.extra_args: expected a list of strings"):
        load_config(environ={"KIT_MODEL_EXTRA_ARGS": "[unclosed"}, cwd=Path("/nonexistent"))


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("model.max_model_len", 0, "must be at least 1, got 0"),
        ("model.max_model_len", -2, "must be at least 1, got -2"),
        ("timeouts.ready", 0, "must be at least 1"),
        ("slurm.cpus_per_task", -1, "must be at least 1"),
        ("ports.api", 0, "must be at least 1"),
        ("nodes", 100_000, "must be at most 16384"),
        ("interface", "eth0;id", "is not a valid value"),
        ("interface", "averyveryverylongname", "is not a valid value"),
        ("cluster", "a" * 64, "is not a valid value"),
        ("model.served_name", "x" * 100_000, "is 100000 characters long"),
        ("mounts", ["rel:/x"], "mounts: item 1: the host path 'rel' is relative"),
        ("env", {"A B": "x"}, "'A B' is not a valid variable name"),
        ("env", {"A": [1]}, "'A': expected a plain value, got a list"),
        ("model.extra_args", ["--ok"] * 1025, "has 1025 entries"),
    ],
)
def test_config_values_are_checked_in_every_layer(key: str, value: object, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(environ={}, cwd=Path("/nonexistent"), overrides={key: (value, "flag --x")})
    assert needle in err.value.message and err.value.message.startswith(f"flag --x: {key}: ")
    assert len(err.value.message) < 200


def test_vllm_auto_max_model_len_is_accepted() -> None:
    cfg = load_config(environ={}, cwd=Path("/nonexistent"), overrides={"model.max_model_len": (-1, "t")}).config
    assert cfg.model.max_model_len == -1

"""The bounded loaders refuse deep nesting, special files, bad encodings and non-JSON constants
with one ConfigError naming the file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kit.errors import ConfigError
from kit.safeload import json_depth_ok, load_json_file, loads_json, read_text


def test_depth_scan_ignores_brackets_inside_strings() -> None:
    assert json_depth_ok('{"a": "[[[[[[[[[[[[[[[[[[[["}', max_depth=2)
    assert not json_depth_ok("[[[1]]]", max_depth=2)
    assert json_depth_ok('["\\"[[["]', max_depth=1)


def test_deep_nesting_is_one_config_error_not_recursion() -> None:
    with pytest.raises(ConfigError, match="nested deeper than 64"):
        loads_json("[" * 100_000 + "]" * 100_000, source="x.json")


def test_nan_and_infinity_are_not_json() -> None:
    for text in ("NaN", '{"a": Infinity}', "[-Infinity]"):
        with pytest.raises(ConfigError, match="not valid JSON"):
            loads_json(text, source="x.json")


def test_syntax_error_names_line(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text('{\n "a": 1,\n}')
    with pytest.raises(ConfigError) as err:
        load_json_file(path)
    assert f"{path}:3" in err.value.message


def test_special_files_are_refused_without_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero"), tmp_path):
        with pytest.raises(ConfigError, match="not a regular file"):
            read_text(path)


def test_size_limit_and_encoding(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(ConfigError, match="more than the 100"):
        read_text(big, max_bytes=100)
    latin = tmp_path / "latin"
    latin.write_bytes(b"ok\n\xe9t\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8") as err:
        read_text(latin)
    assert f"{latin}:2" in err.value.message

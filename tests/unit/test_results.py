"""Typed results rendered once (issue 26), read from the source with `ast`: every verb prints its
result with one call, `emit(RESULT, as_json=...)`, where RESULT is a typed object (kit.output's
Result protocol: the verb's name, its --json document, its text), never a dict built at the call
or a text passed beside it; and every result class implements the protocol."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from kit.cli import VERBS

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "kit"
# A literal is a document or a text built at the call, not a result that renders itself.
LITERALS = (ast.Dict, ast.DictComp, ast.List, ast.Tuple, ast.Constant, ast.JoinedStr, ast.Lambda, ast.BinOp)


def emit_problems(source: str, where: str = "<src>") -> list[str]:
    """Each call of emit() in `source` that is not `emit(RESULT, as_json=...)` with a result."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "emit"):
            continue
        at = f"{where}:{node.lineno}"
        keywords = sorted(k.arg or "**" for k in node.keywords)
        if len(node.args) != 1 or keywords != ["as_json"]:
            problems.append(f"{at}: emit takes one result and as_json only, got {len(node.args)} and {keywords}")
        elif isinstance(node.args[0], LITERALS):
            problems.append(f"{at}: emit gets a {type(node.args[0]).__name__}, not a typed result")
    return problems


def result_classes(source: str) -> list[str]:
    """Classes that name a verb (a `command = "..."` line in their body): the results."""
    return [
        node.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef)
        and any(
            isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "command" for t in s.targets)
            for s in node.body
        )
    ]


def emitted_classes(source: str) -> list[str]:
    """The classes a module constructs right in its emit() calls: emit(Started(...), ...)."""
    return [
        node.args[0].func.id
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "emit"
        and node.args
        and isinstance(node.args[0], ast.Call)
        and isinstance(node.args[0].func, ast.Name)
    ]


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = {module_of(p): p.read_text() for p in KIT.rglob("*.py")}


def test_every_emit_passes_one_typed_result() -> None:
    problems = [p for name, src in SOURCES.items() for p in emit_problems(src, name)]
    assert problems == []
    assert sum(src.count("emit(") for src in SOURCES.values()) > 20  # the verbs' results are found


def test_the_emit_reader_finds_a_dict_a_text_and_a_lambda() -> None:
    broken = (
        'emit("up", {"dry_run": True}, as_json=as_json, text="x")\n'
        "emit({'a': 1}, as_json=as_json)\n"
        "emit(result, as_json=as_json, text=lambda: render(result))\n"
        "emit(f'wrote {path}', as_json=as_json)\n"
        "emit(Started(node), as_json=as_json)\n"
    )
    assert [p.split(": ", 1)[0] for p in emit_problems(broken)] == ["<src>:1", "<src>:2", "<src>:3", "<src>:4"]


def test_every_emitted_class_is_a_result() -> None:
    """A class built in an emit() call (defined or imported in its module) is a result."""
    for name, src in SOURCES.items():
        module = importlib.import_module(name) if emitted_classes(src) else None
        for cls_name in emitted_classes(src):
            assert_result(getattr(module, cls_name))


def result_class_list() -> list[tuple[str, str]]:
    return [(name, cls) for name, src in SOURCES.items() for cls in result_classes(src)]


@pytest.mark.parametrize(("module", "cls"), result_class_list())
def test_every_result_class_implements_the_protocol(module: str, cls: str) -> None:
    assert_result(getattr(importlib.import_module(module), cls))


def assert_result(cls: type) -> None:
    """kit.output.Result: `command` a verb's name, to_dict() and text() methods."""
    assert getattr(cls, "command", None) in VERBS, f"{cls.__qualname__}.command is not a verb"
    for method in ("to_dict", "text"):
        assert callable(getattr(cls, method, None)), f"{cls.__qualname__} has no {method}()"


def test_the_protocol_check_fails_on_a_class_without_text() -> None:
    class NoText:
        command = "up"

        def to_dict(self) -> dict[str, object]:
            return {}

    class NotAVerb:
        command = "upp"

    for broken in (NoText, NotAVerb):
        with pytest.raises(AssertionError):
            assert_result(broken)


def test_results_are_found() -> None:
    found = {cls for _, cls in result_class_list()}
    assert {"DownResult", "StatusResult", "VerifyResult", "Served", "Started", "Sizing"} <= found

"""The layering issue 17 asks for, read from the source with `ast` (imports inside functions
count too): no verb module imports another verb, and the cluster layer and the load/tune
layer stay free of click, so anything can drive them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

KIT = Path(__file__).resolve().parents[2] / "kit"
COMMANDS = KIT / "commands"
# Shared command-line helpers (click glue), not verbs.
HELPERS = {"_options", "_params", "__init__"}
VERBS = sorted(p.stem for p in COMMANDS.glob("*.py") if p.stem not in HELPERS)


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, anywhere in it (`from kit.commands import up` gives
    kit.commands.up)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_verbs_are_found() -> None:
    assert {"up", "serve", "status", "down", "bench", "tune", "demo", "verify", "query"} <= set(VERBS)


@pytest.mark.parametrize("verb", VERBS)
def test_no_verb_imports_another_verb(verb: str) -> None:
    others = {f"kit.commands.{v}" for v in VERBS if v != verb}
    assert not imported_modules(COMMANDS / f"{verb}.py") & others


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from kit.commands.serve import x\n    from kit.commands import up\n")
    assert {"kit.commands.serve", "kit.commands.up"} <= imported_modules(sample)


LAYERS = sorted(
    str(p.relative_to(KIT.parent))
    for p in [*(KIT / "cluster").glob("*.py"), *(KIT / "bench").glob("*.py"), *(KIT / "supervise").glob("*.py")]
)


@pytest.mark.parametrize("module", [*LAYERS, "kit/plan/layout.py", "kit/labels.py", "kit/demo.py"])
def test_the_cluster_and_bench_layers_do_not_use_click(module: str) -> None:
    imports = imported_modules(KIT.parent / module)
    assert not {m for m in imports if m.split(".")[0] == "click" or m == "kit.cli" or m.startswith("kit.commands")}

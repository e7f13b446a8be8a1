"""The structure docs/architecture.md draws, read from the source with `ast` (issue 26): every
import of kit — at module level, inside functions and under TYPE_CHECKING alike — points to a
lower layer of the page's table or stays inside its own package, with no cycle between modules;
click only in the CLI layer; no verb imports another; few loose modules; one Layout."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "kit"
COMMANDS = KIT / "commands"
# Shared command-line helpers (click glue), not verbs.
HELPERS = {"_options", "_params", "_signals", "__init__"}
VERBS = sorted(p.stem for p in COMMANDS.glob("*.py") if p.stem not in HELPERS)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in KIT.rglob("*.py")}


def imported_names(path: Path, name: str) -> Iterator[str]:
    """Every kit module `path` imports, anywhere in it. `from kit.x import y` is kit.x.y when y is
    a module, else kit.x; relative imports are resolved against `name`."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base


def imports_of(path: Path, name: str) -> set[str]:
    found = set()
    for imported in imported_names(path, name):
        while imported not in MODULES and "." in imported:
            imported = imported.rsplit(".", 1)[0]
        if imported in MODULES and imported != name:
            found.add(imported)
    return found


GRAPH = {name: imports_of(path, name) for name, path in MODULES.items()}


def unit(module: str) -> str:
    """The package (kit.cluster) or loose module (kit.errors) a module belongs to."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and (KIT / parts[1]).is_dir() else module


def documented_layers() -> dict[str, int]:
    """docs/architecture.md's layer table: `| N | `kit.x`, `kit.y` | ... |`, unit -> layer."""
    layers: dict[str, int] = {}
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        row = re.match(r"^\|\s*(\d+)\s*\|([^|]*)\|", line)
        if row:
            for found in re.findall(r"`(kit[\w.]*)`", row.group(2)):
                layers[found] = int(row.group(1))
    return layers


LAYERS = documented_layers()


def test_every_unit_is_in_the_documented_table() -> None:
    units = {unit(m) for m in MODULES}
    assert units - set(LAYERS) == set(), "add it to the layer table of docs/architecture.md"
    assert set(LAYERS) - units == set(), "the table names a unit that no longer exists"


def test_imports_point_down_the_documented_layers() -> None:
    upward = sorted(
        f"{a} -> {b} (layer {LAYERS[unit(a)]} -> {LAYERS[unit(b)]})"
        for a, targets in GRAPH.items()
        for b in targets
        if unit(a) != unit(b) and LAYERS[unit(a)] <= LAYERS[unit(b)]
    )
    assert upward == []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_modules() -> None:
    assert cycles(GRAPH) == []


def test_the_cycle_finder_finds_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_import_reader_sees_functions_type_checking_and_relative_imports(tmp_path: Path) -> None:
    text = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kit.config import KitConfig\n"
        "def f():\n    from kit.commands.serve import x\n    from kit.commands import up\n    from . import down\n"
    )
    sample_path = tmp_path / "_sample.py"
    sample_path.write_text(text)
    found = imports_of(sample_path, "kit.commands._sample")
    assert {"kit.config", "kit.commands.serve", "kit.commands.up", "kit.commands.down"} <= found


def test_the_verbs_are_found() -> None:
    assert {"up", "serve", "status", "down", "bench", "tune", "demo", "verify", "query"} <= set(VERBS)


@pytest.mark.parametrize("verb", VERBS)
def test_no_verb_imports_another_verb(verb: str) -> None:
    others = {f"kit.commands.{v}" for v in VERBS if v != verb}
    assert not GRAPH[f"kit.commands.{verb}"] & others


def test_click_only_in_the_cli_layer() -> None:
    users = sorted(
        name
        for name, path in MODULES.items()
        if any(n == "click" or n.startswith("click.") for n in _all_imports(path))
        and unit(name) not in ("kit.cli", "kit.commands")
    )
    assert users == []


def _all_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_import_kit_cluster_does_not_load_click() -> None:
    code = "import sys, kit.cluster, kit.bench.runner, kit.demo; print('click' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_at_most_a_dozen_loose_modules() -> None:
    loose = sorted(p.stem for p in KIT.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(loose) <= 12, loose


def test_one_layout_class() -> None:
    defined = [name for name, path in MODULES.items() if re.search(r"^class Layout\b", path.read_text(), re.MULTILINE)]
    assert defined == ["kit.layout"]


def test_no_python_program_in_a_string() -> None:
    """Programs kit runs inside containers are shipped files (kit.resources.PROGRAMS), not strings."""
    found = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
            if text.count("\n") > 1 and re.search(r"^(import \w|from [\w.]+ import )", text, re.MULTILINE):
                found.append(f"{name}:{node.lineno}")
    assert found == []


def test_no_python_program_in_a_template() -> None:
    """Nor in the shell templates (the Ray head's barrier was a heredoc until it became
    kit/cluster/ray_barrier.py): a template may carry a program only as a value."""
    found = [
        f"{path.name}:{n}"
        for path in sorted((KIT / "templates").glob("*.j2"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.match(r"(import \w|from [\w.]+ import )", line) or re.search(r"python3? -( |$).*<<", line)
    ]
    assert found == []


def test_every_in_container_program_is_a_file() -> None:
    from kit.resources import PROGRAMS, program_source

    for name in PROGRAMS:
        compile(program_source(name), name, "exec")


def test_test_modules_have_unique_basenames() -> None:
    """pytest's default import mode keys a test module by its basename (the tiers have no
    __init__.py): two test_x.py in different tiers stop the whole run at collection, as CI found."""
    seen: dict[str, Path] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        assert path.name not in seen, f"{path} and {seen[path.name]} share a basename"
        seen[path.name] = path


IO_MODULES = {"subprocess", "socket", "urllib", "http", "shutil", "time", "kit.proc", "kit.net", "kit.runtime"}
IO_CALLS = {"open", "read_text", "write_text", "read_bytes", "write_bytes", "mkdir", "unlink", "iterdir"}
IO_CALLS |= {"exists", "is_file", "is_dir", "stat", "glob", "rglob", "environ", "getenv", "home"}


def plan_io(path: Path, root: Path = ROOT) -> list[str]:
    """What in a kit/plan module would touch the world: an I/O module imported, a file or
    environment read."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"imports {n}" for n in names if n.split(".")[0] in IO_MODULES or n in IO_MODULES]
        elif isinstance(node, ast.Attribute) and node.attr in IO_CALLS:
            found.append(f".{node.attr}")
        elif isinstance(node, ast.Name) and node.id in IO_CALLS:
            found.append(node.id)
    return [f"{path.relative_to(root)}:{item}" for item in found]


def test_plan_does_no_io() -> None:
    """docs/architecture.md: the plan is pure (no I/O, no subprocess, no clock): what it needs of
    the world, the cluster layer reads and passes in as values."""
    found = [item for path in sorted((KIT / "plan").rglob("*.py")) for item in plan_io(path)]
    assert found == []


def test_the_plan_io_reader_sees_io(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("import subprocess\nimport os\nx = os.environ['A']\nopen('f')\n")
    assert plan_io(sample, tmp_path) == ["x.py:imports subprocess", "x.py:.environ", "x.py:open"]

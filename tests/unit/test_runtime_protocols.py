"""The runtime interfaces (kit/runtime/base.py) and the one-place rules around them (issue 17):

- every adapter implements every method of each interface it claims, with the interface's
  signature (checked on the classes, not by probing an object at run time);
- commands never probe adapters for features (no getattr/hasattr on a runtime or a store);
- only kit/proc.py starts processes (the two in-container probes excepted), only
  kit/runtime/docker.py imports docker-py or runs the docker CLI;
- the polling follow_logs every runtime inherits.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from kit.runtime.apptainer import ApptainerRuntime
from kit.runtime.base import ContainerRuntime, ExecResult, ImageStore, NodeHandle
from kit.runtime.docker import DockerRuntime
from kit.runtime.enroot import EnrootImages
from kit.runtime.slurm import JobControl, Slurm
from kit.supervise.bundle import MODULES as BUNDLE_MODULES
from tests.conftest import ROOT

KIT = ROOT / "kit"
ADAPTERS: list[tuple[type[Any], type[Any]]] = [
    (ContainerRuntime, DockerRuntime),
    (ImageStore, DockerRuntime),
    (ContainerRuntime, ApptainerRuntime),
    (ImageStore, ApptainerRuntime),
    (ImageStore, EnrootImages),
    (JobControl, Slurm),
]
# What each adapter must define itself (the rest it may inherit): every abstract method, and
# for both container runtimes, the builders (Docker and Apptainer can build).
MUST_OVERRIDE = {
    ("ImageStore", "DockerRuntime"): {"plan_build", "build"},
    ("ImageStore", "ApptainerRuntime"): {"plan_build", "build"},
}


def interface_members(interface: type[Any]) -> dict[str, Any]:
    return {
        name: member
        for name, member in vars(interface).items()
        if not name.startswith("_") and callable_or_property(member)
    }


def callable_or_property(member: Any) -> bool:
    return inspect.isfunction(member) or isinstance(member, property)


def shape(function: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """Parameter names, kinds and defaults: what a caller relies on (annotations may narrow)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize(("interface", "adapter"), ADAPTERS, ids=lambda c: c.__name__)
def test_adapter_implements_the_whole_interface(interface: type[Any], adapter: type[Any]) -> None:
    assert issubclass(adapter, interface)
    assert not inspect.isabstract(adapter), f"{adapter.__name__} leaves {sorted(adapter.__abstractmethods__)} abstract"
    own = set(vars(adapter))
    required = set(interface.__abstractmethods__) | MUST_OVERRIDE.get((interface.__name__, adapter.__name__), set())
    assert required <= own, f"{adapter.__name__} does not define {sorted(required - own)}"
    for name, member in interface_members(interface).items():
        implemented = inspect.getattr_static(adapter, name)
        if isinstance(member, property):
            assert isinstance(implemented, property), f"{adapter.__name__}.{name} must be a property"
            continue
        assert shape(implemented) == shape(member), f"{adapter.__name__}.{name} differs from {interface.__name__}"


def test_interfaces_are_the_ones_the_brief_names() -> None:
    """The method sets, so that removing one from an interface is a deliberate, visible change."""
    assert set(interface_members(ContainerRuntime)) == {
        "images", "find_nodes", "exec", "exec_detached", "state", "start", "remove", "revive", "logs",
        "follow_logs", "wait_for_mark", "remove_cluster", "ensure_network", "host_nodes",
    }  # fmt: skip
    assert set(interface_members(ImageStore)) == {
        "image_info", "plan_pull", "pull", "plan_build", "build", "remove_image", "run_probe",
    }  # fmt: skip
    assert set(interface_members(JobControl)) == {"submit", "status", "cancel"}


def test_a_store_that_cannot_build_refuses_with_a_usage_error() -> None:
    from kit.errors import UsageError
    from kit.images.build import plan_build_context
    from kit.resources import container_dir

    class PullOnly(ImageStore):
        name = "pullonly"

        def image_info(self, ref: str) -> None:
            return None

        def plan_pull(self, ref: str) -> Any:
            raise NotImplementedError

        def pull(self, plan: Any, *, on_progress: Any) -> Any:
            raise NotImplementedError

        def remove_image(self, ref: str) -> bool:
            return False

    context = plan_build_context("cpu", container_dir("cpu"), probe_files=[])
    with pytest.raises(UsageError, match="the pullonly runtime cannot build images") as err:
        PullOnly().plan_build(context)
    assert "kit pull --runtime pullonly" in (err.value.hint or "")


# ---- the default follow_logs --------------------------------------------------------------------


class GrowingLog(ContainerRuntime):
    """A runtime whose one container prints a line per logs() call and is gone after three."""

    name = "growing"

    def __init__(self) -> None:
        self.text = "a\nb\n"
        self.reads = 0

    @property
    def images(self) -> ImageStore:
        raise NotImplementedError

    def logs(self, name: str, *, tail: int | str = "all") -> str:
        self.reads += 1
        if self.reads > 1 and self.reads <= 4:
            self.text += f"line{self.reads}\n"
        lines = self.text.splitlines(keepends=True)
        return self.text if tail == "all" else "".join(lines[-int(tail) :])

    def state(self, name: str) -> str | None:
        return "running" if self.reads < 4 else None

    def find_nodes(self, cluster: str) -> list[NodeHandle]:
        return []

    def exec(
        self,
        node: NodeHandle,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        raise NotImplementedError

    def exec_detached(self, node: NodeHandle, argv: Sequence[str]) -> None:
        raise NotImplementedError

    def start(self, spec: Any) -> None:
        raise NotImplementedError

    def remove(self, name: str) -> bool:
        return False

    def wait_for_mark(
        self, name: str, marks: Sequence[str], *, timeout: float, on_progress: Callable[[str], None], what: str
    ) -> str:
        raise NotImplementedError

    def remove_cluster(self, cluster: str) -> dict[str, list[str]]:
        return {}

    def ensure_network(self, name: str, subnet: str, cluster: str) -> None:
        raise NotImplementedError


def test_default_follow_logs_polls_until_the_container_is_gone() -> None:
    chunks = list(GrowingLog().follow_logs("c", tail=1, poll_s=0))
    assert chunks == ["b\n", "line2\n", "line3\n", "line4\n"]  # the tail, then each new piece once


# ---- one place for each effect --------------------------------------------------------------------

PROBES = {"kit/verify/probe.py", "kit/verify/collective.py"}  # stdlib-only, run inside containers
# The supervisor runs inside the node containers too (kit/supervise/bundle.py packs it, stdlib
# only, no kit there): it starts and signals the serve group itself.
SUPERVISOR = {
    "kit/supervise/coordinator.py",
    "kit/supervise/main.py",
    "kit/supervise/procs.py",
}
# Writes the bundle inside a SLURM job's container and becomes it (os.execv): not in the bundle.
PROBES |= SUPERVISOR | {"kit/supervise/boot.py"}
_PROCESS_CALLS = re.compile(r"^os\.(system|popen|spawn\w*|exec\w*|posix_spawn\w*)$|^pty\.spawn$|create_subprocess")


@functools.cache  # parsed once for the tests below (they only read the trees)
def modules() -> tuple[tuple[str, ast.Module, str], ...]:
    out = []
    for path in sorted(KIT.rglob("*.py")):
        text = path.read_text()
        out.append((path.relative_to(ROOT).as_posix(), ast.parse(text), text))
    return tuple(out)


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return ""


def imported(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_only_proc_starts_processes() -> None:
    """`grep -rn "subprocess\\|os.system" kit/` shows only kit/proc.py and the two probes; no other
    module spawns a process another way either."""
    offenders = []
    for path, tree, text in modules():
        if path == "kit/proc.py" or path in PROBES:
            continue
        if "subprocess" in text or "os.system" in text or "subprocess" in imported(tree):
            offenders.append(f"{path}: mentions subprocess/os.system")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _PROCESS_CALLS.search(dotted(node.func)):
                offenders.append(f"{path}:{node.lineno}: {dotted(node.func)}")
    assert offenders == []
    assert {p.removeprefix("kit/") for p in SUPERVISOR} <= set(BUNDLE_MODULES)  # in the container, stdlib only
    for probe in PROBES:  # and the probes say why they may
        doc = " ".join((ast.get_docstring(ast.parse((ROOT / probe).read_text())) or "").lower().split())
        assert "stdlib" in doc or "standard library" in doc, probe


def test_only_the_docker_adapter_uses_docker() -> None:
    offenders = []
    for path, tree, _ in modules():
        if path in ("kit/runtime/docker.py", "kit/runtime/docker_cli.py"):
            continue
        if "docker" in imported(tree):
            offenders.append(f"{path}: imports docker-py")
        for node in ast.walk(tree):  # proc.run(["docker", ...]) and the like
            if isinstance(node, ast.Call) and dotted(node.func).startswith("proc.") and node.args:
                first = node.args[0]
                words = first.elts if isinstance(first, ast.List) else []
                if words and isinstance(words[0], ast.Constant) and words[0].value == "docker":
                    offenders.append(f"{path}:{node.lineno}: runs the docker CLI")
    assert offenders == []


_ADAPTER_NAMES = re.compile(r"(^|\.)(runtime|rt|store|images|apptainer|docker|adapter)$")


def test_no_feature_probing_of_adapters() -> None:
    """An adapter's abilities are its interface: no getattr/hasattr on a runtime or a store."""
    offenders = []
    for path, tree, _ in modules():
        for node in ast.walk(tree):
            probe = isinstance(node, ast.Call) and dotted(node.func) in ("getattr", "hasattr") and node.args
            if probe and _ADAPTER_NAMES.search(dotted(node.args[0])):
                offenders.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == []


def test_a_wait_shows_every_new_log_line_once() -> None:
    """kit up relays a node's log while it waits: two lines between polls are both shown (the
    Ray head's "1/2 nodes" followed at once by a line of Ray's own was lost, and a test waiting
    for it timed out), nothing twice, and a restarted container's shorter log from its start."""
    from kit.runtime.base import unseen_lines

    first, shown = unseen_lines(["kit: starting the Ray head"], 0)
    assert first == ["kit: starting the Ray head"]
    log = ["kit: starting the Ray head", "kit: 1/2 nodes and 1/2 CPU alive", "INFO scripts.py -- Ray runtime started"]
    new, shown = unseen_lines(log, shown)
    assert new == log[1:] and shown == 3
    assert unseen_lines(log, shown) == ([], 3)
    assert unseen_lines(["kit: starting the Ray head"], shown) == (["kit: starting the Ray head"], 1)

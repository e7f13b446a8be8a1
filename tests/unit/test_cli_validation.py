"""Every validation error: one line naming the field and the fix, its exit code, no traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kit.errors import ExitCode
from tests.conftest import PRODUCT_VERBS, run_kit

# No KIT_* variable from the caller's shell; the working directory and KIT_STATE_DIR in tmp_path.
pytestmark = pytest.mark.usefixtures("kit_env")


def yaml_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "kit.yaml"
    path.write_text(text)
    return str(path)


CASES = [
    ("model:\n  id: [x\n", [], ExitCode.CONFIG, "kit.yaml:3: invalid YAML"),
    ("model:\n  tpp: 2\n", [], ExitCode.CONFIG, "model.tpp: unknown key (fix: did you mean 'model.tp'?)"),
    ("nodes: many\n", [], ExitCode.CONFIG, "nodes: expected an integer"),
    (
        "nodes: 2\ngpus_per_node: 4\nmodel:\n  tp: 4\n  pp: 1\n",
        [],
        ExitCode.CONFIG,
        "TP×PP = 4×1 = 4 but the cluster has nodes×gpus_per_node = 2×4 = 8 GPUs",
    ),
    ("", ["--worker", "--nodes", "2"], ExitCode.CONFIG, "head_address: a worker needs the head's address"),
    ("", ["--node-ip", "203.0.113.77"], ExitCode.CONFIG, "node_ip: 203.0.113.77 is not an address of this host"),
    ("", ["--node-ip", "my-host"], ExitCode.CONFIG, "node_ip: 'my-host' is not a numeric IPv4 address"),
    (
        "",
        ["--worker", "--nodes", "2", "--head-address", "head.example"],
        ExitCode.CONFIG,
        "head_address: 'head.example' is not a numeric IPv4 address",
    ),
    ("ports:\n  api: 70000\n", [], ExitCode.CONFIG, "ports.api: must be at most 65535, got 70000"),
    ("ports:\n  api: 6379\n", [], ExitCode.CONFIG, "port 6379 is used by both ports.ray_gcs and ports.api"),
    ("ports:\n  api: 11005\n", [], ExitCode.CONFIG, "port 11005 lies inside the Ray worker port range"),
    ("image: 'Vllm/VLLM:bad tag'\n", [], ExitCode.IMAGE, "image: 'Vllm/VLLM:bad tag' is not a valid image reference"),
    ("", ["--interface", "nosuch0"], ExitCode.CONFIG, "interface: interface 'nosuch0' has no IPv4 address"),
    ("env:\n  HF_TOKEN: abc\n", [], ExitCode.CONFIG, "HF_TOKEN must not be passed as an environment variable"),
    (
        "",
        ["--worker", "--node-rank", "5", "--nodes", "2", "--head-address", "10.0.0.1"],
        ExitCode.CONFIG,
        "node rank 5 is outside 0..1",
    ),
    ("", ["--set", "hf_token_file=/nonexistent/token"], ExitCode.CONFIG, "hf_token_file: "),
    ("", ["--head", "--worker"], ExitCode.USAGE, "--head and --worker exclude each other"),
    ("", ["--set", "model.tpx=3"], ExitCode.CONFIG, "model.tpx: unknown key"),
]


@pytest.mark.parametrize(("text", "args", "code", "needle"), CASES)
def test_validation_errors(text: str, args: list[str], code: ExitCode, needle: str, tmp_path: Path) -> None:
    cfg = yaml_file(tmp_path, text)
    rc, out, err = run_kit(["up", "--dry-run", "--config", cfg, *args])
    assert rc == code, err
    assert needle in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert out == ""


def test_tp_must_divide_attention_heads(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_attention_heads": 6, "num_key_value_heads": 2}))
    rc, _, err = run_kit(["up", "--dry-run", "--model", str(model), "--gpus-per-node", "4"])
    assert rc == ExitCode.CONFIG
    assert "tensor parallel size 4 does not divide the model's 6 attention heads" in err


def test_json_errors_are_machine_readable(tmp_path: Path) -> None:
    rc, out, _ = run_kit(["up", "--dry-run", "--json", "--nodes", "0"])
    doc = json.loads(out)
    assert rc == ExitCode.CONFIG and doc["ok"] is False and doc["error"]["exit_code"] == 3
    assert "nodes" in doc["error"]["message"]


def test_runtime_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    rc, _, err = run_kit(["up", "--head", "--accelerator", "cpu"])
    assert rc == ExitCode.RUNTIME_UNAVAILABLE
    assert err.startswith("kit: error: the Docker engine is not reachable") and len(err.strip().splitlines()) == 1


def test_not_implemented_and_unknown_verb() -> None:
    rc, _, err = run_kit(["frobnicate"])
    assert rc == ExitCode.USAGE and "No such command" in err


def test_dry_run_with_no_config_is_a_complete_docker_command() -> None:
    rc, out, _ = run_kit(["up", "--head", "--dry-run"])
    assert rc == 0
    docker = next(line for line in out.splitlines() if line.startswith("docker run"))
    for needle in (
        "--network=host",
        "--ipc=host",
        "--gpus=all",
        ":/kit/hf-cache",
        "--env=VLLM_HOST_IP=",
        "--env=NCCL_SOCKET_IFNAME=",
        "--env=GLOO_SOCKET_IFNAME=",
    ):
        assert needle in docker
    # mp, the default (issue 24): the node holds GPUs and environment until `kit serve`
    assert "KIT_READY role=head" in out and "ray start" not in out
    rc, out, _ = run_kit(["up", "--head", "--dry-run", "--backend", "ray"])
    assert rc == 0 and 'ray start --head --node-ip-address="${VLLM_HOST_IP}" --port=6379' in out


def test_help_lists_every_verb_and_exit_codes() -> None:
    rc, out, _ = run_kit(["--help"])
    assert rc == 0
    for verb in PRODUCT_VERBS:
        assert f"\n  {verb} " in out
    assert "130  interrupted" in out


def test_image_drift_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kit.cluster.nodes import image_drift
    from kit.images.records import record_image

    monkeypatch.setenv("KIT_STATE_DIR", str(tmp_path))

    from kit.runtime.base import ImageInfo, ImageStore, PullPlan, PullResult

    class Images(ImageStore):
        """The image store of a runtime whose local image `ref` has `image_id` (nothing pulls)."""

        name = "fake"

        def __init__(self, image_id: str) -> None:
            self.image_id = image_id

        def image_info(self, ref: str) -> ImageInfo:
            return ImageInfo(ref=ref, id=self.image_id)

        def plan_pull(self, ref: str) -> PullPlan:
            raise AssertionError("image_drift must not pull")

        def pull(self, plan: PullPlan, *, on_progress: Any) -> PullResult:
            raise AssertionError("image_drift must not pull")

        def remove_image(self, ref: str) -> bool:
            raise AssertionError("image_drift must not remove")

    class FakeRuntime:
        def __init__(self, image_id: str) -> None:
            self.images = Images(image_id)

    assert image_drift(FakeRuntime("sha256:aaa"), "org/img:1") is None  # nothing recorded
    record_image("org/img:1", "org/img@sha256:d", image_id="sha256:aaa")
    assert image_drift(FakeRuntime("sha256:aaa"), "org/img:1") is None
    warning = image_drift(FakeRuntime("sha256:bbb"), "org/img:1")
    assert warning is not None and "kit recorded sha256:aaa" in warning and "kit pull" in warning


@pytest.mark.parametrize(
    "verb",
    [*PRODUCT_VERBS, "config"],
)
def test_every_verb_checks_its_values_before_running(verb: str) -> None:
    """Every verb is a KitCommand (or a group of them), so each flag value passes kit.validate
    before the verb runs: a new verb cannot forget it."""
    import importlib

    from kit.cli import VERBS
    from kit.commands._params import KitCommand, KitGroup

    command = importlib.import_module(f"kit.commands.{VERBS[verb][0]}").command
    if isinstance(command, KitGroup):
        assert command.commands and all(isinstance(sub, KitCommand) for sub in command.commands.values())
    else:
        assert isinstance(command, KitCommand)

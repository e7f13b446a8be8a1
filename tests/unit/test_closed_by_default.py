"""Closed by default (issue 16): the API key only where the API server runs, the API on the
node's IP, Ray's token authentication from a file, and plain warnings (and `kit verify`
findings, in test_verify_cluster_checks.py) for what is left open."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

import pytest

from kit.errors import ConfigError
from kit.plan.checks import check_env
from kit.plan.container_args import to_docker_argv, to_docker_kwargs
from kit.plan.exposure import exposures
from kit.plan.network import NodeNet
from kit.plan.node import plan_node
from kit.plan.paths import API_KEY_PATH, RAY_TOKEN_PATH
from kit.plan.roles import HEAD, Role
from kit.plan.scripts import serve_script
from kit.plan.slurm import plan_launcher
from tests.conftest import make_config, run_kit

WORKER = Role("worker", 1)
NETS = {"head": NodeNet("10.0.0.1", "eth0", "10.0.0.1"), "worker": NodeNet("10.0.0.2", "eth0", "10.0.0.1")}
TOKEN = "ray-token-" + "9c" * 16


@pytest.mark.parametrize("backend", ["ray", "mp"])
def test_the_api_key_is_mounted_only_where_the_api_server_runs(backend: str) -> None:
    cfg = make_config(backend=backend)
    head = plan_node(cfg, HEAD, NETS["head"])
    worker = plan_node(cfg, WORKER, NETS["worker"])
    assert [m.source for m in head.mounts if m.target == API_KEY_PATH] == ["/etc/kit/api_key"]
    assert not [m for m in worker.mounts if m.target == API_KEY_PATH]
    assert "VLLM_API_KEY" not in serve_script(cfg, HEAD).split("exec ")[-1]  # read from the file, never argv
    if backend == "mp":
        assert "api_key" not in serve_script(cfg, WORKER)
    head_cmd, worker_cmd = re.findall(r"    cmd=\(\n(.*?)\n    \)", plan_launcher(cfg), re.S)
    assert "/run/kit/secrets/api_key" in head_cmd and "/run/kit/secrets/api_key" not in worker_cmd


def test_the_api_listens_on_the_node_ip_and_extra_args_can_reopen_it() -> None:
    script = serve_script(make_config(), HEAD)
    assert '--host="${VLLM_HOST_IP}"' in script and "0.0.0.0" not in script
    opened = serve_script(make_config(**{"model.extra_args": ["--host=0.0.0.0"]}), HEAD)
    # argparse keeps the last --host: the user's, after kit's.
    assert opened.index('--host="${VLLM_HOST_IP}"') < opened.index("--host=0.0.0.0")


def test_ray_token_from_a_file_on_every_node(tmp_path: Path) -> None:
    token = tmp_path / "ray_token"
    token.write_text(TOKEN)
    cfg = make_config(ray_token_file=str(token))
    for role in (HEAD, WORKER):
        spec = plan_node(cfg, role, NETS[role.kind])
        assert spec.env["RAY_AUTH_MODE"] == "token" and spec.env["RAY_AUTH_TOKEN_PATH"] == RAY_TOKEN_PATH
        [mount] = [m for m in spec.mounts if m.target == RAY_TOKEN_PATH]
        assert mount.source == str(token) and mount.read_only
        shown = json.dumps(to_docker_kwargs(spec)) + " ".join(to_docker_argv(spec)) + spec.script
        assert TOKEN not in shown and "RAY_AUTH_TOKEN=" not in shown
    launcher = plan_launcher(cfg)
    assert TOKEN not in launcher and launcher.count(f"--volume={token}:{RAY_TOKEN_PATH}:ro") == 2
    # The mp backend has no Ray: nothing of it is planned.
    mp = plan_node(make_config(backend="mp", ray_token_file=str(token)), HEAD, NETS["head"])
    assert "RAY_AUTH_MODE" not in mp.env and not [m for m in mp.mounts if m.target == RAY_TOKEN_PATH]


def test_the_ray_token_never_travels_in_env() -> None:
    cfg = make_config(env={"RAY_AUTH_TOKEN": "x"})
    with pytest.raises(ConfigError, match="RAY_AUTH_TOKEN"):
        check_env(cfg, {})


@pytest.mark.parametrize(("ray_version", "ok"), [("2.60.0", True), ("2.52.1", True), ("2.51.9", False)])
def test_a_ray_without_token_auth_is_refused(ray_version: str, ok: bool, tmp_path: Path) -> None:
    """The node script's version gate, run with the Python of this test as python3 and a fake
    `ray` package reporting `ray_version` (importlib.metadata reads its dist-info)."""
    site = tmp_path / "site"
    dist = site / f"ray-{ray_version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: ray\nVersion: {ray_version}\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {__import__("sys").executable} "$@"\n')
    (bindir / "ray").write_text("#!/bin/sh\nexit 1\n")  # stop at the first `ray start`
    for path in bindir.iterdir():
        path.chmod(0o755)
    token = tmp_path / "ray_token"
    token.write_text(TOKEN)
    cfg = make_config(ray_token_file=str(token))
    cfg = dataclasses.replace(cfg, timeouts=dataclasses.replace(cfg.timeouts, join=0))  # past the config layer's >= 1
    spec = plan_node(cfg, WORKER, NETS["worker"])
    env = {**spec.env, "PATH": f"{bindir}:/usr/bin:/bin", "VLLM_CONFIG_ROOT": str(tmp_path / "cfg")}
    env["RAY_AUTH_TOKEN_PATH"] = str(token)  # where the container sees the mounted file
    result = subprocess.run(["bash", "-c", spec.script], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    refused = "ray_token_file is set, but the Ray in this image has no token authentication" in result.stderr
    assert refused != ok, result.stderr
    assert ok == ("could not join the Ray head" in result.stderr)


def test_up_and_serve_warn_about_what_is_open(tmp_path: Path) -> None:
    # model.offline false: no model-cache warning (tests/unit/test_offline.py) among these.
    base = ["--set", f"hf_cache={tmp_path}", "--network", "n", "--set", "model.offline=false"]
    code, out, err = run_kit(["up", "--head", "--dry-run", "--json", *base])
    assert code == 0, err
    warnings = json.loads(out)["result"]["warnings"]
    assert [w.split(":")[0] for w in warnings] == ["no api_key_file"]  # mp, the default: no Ray
    base += ["--backend", "ray"]
    code, out, err = run_kit(["up", "--head", "--dry-run", "--json", *base])
    warnings = json.loads(out)["result"]["warnings"]
    assert [w.split(":")[0] for w in warnings] == ["no api_key_file", "no ray_token_file"]
    code, out, err = run_kit(["up", "--head", "--dry-run", *base])
    lines = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(lines) == 2 and "answers anyone" in lines[0] and "set api_key_file" in lines[0]
    # A worker runs no API server; an mp cluster no Ray.
    code, out, err = run_kit(
        ["up", "--worker", "--head-address", "10.0.0.1", "--nodes", "2", "--dry-run", "--json", *base]
    )
    assert [w.split(":")[0] for w in json.loads(out)["result"]["warnings"]] == ["no ray_token_file"]
    code, out, err = run_kit(["serve", "--dry-run", "--json", "--set", "backend=mp", "--set", "model.offline=false"])
    assert [w.split(":")[0] for w in json.loads(out)["result"]["warnings"]] == ["no api_key_file"]
    # Closed: no warning at all.
    key, token = tmp_path / "key", tmp_path / "token"
    key.write_text("sk-x")
    token.write_text(TOKEN)
    key.chmod(0o600)
    token.chmod(0o600)
    closed = ["--set", f"api_key_file={key}", "--set", f"ray_token_file={token}"]
    code, out, err = run_kit(["up", "--head", "--dry-run", "--json", *base, *closed])
    assert code == 0 and json.loads(out)["result"]["warnings"] == [] and "warning" not in err
    # A secret file others can read (issue 27): one warning naming the file and the chmod.
    token.chmod(0o644)
    code, out, err = run_kit(["up", "--head", "--dry-run", *base, *closed])
    assert code == 0 and err.count("kit: warning:") == 1, err
    assert f"ray_token_file {token} is readable by group and others (mode 644): run `chmod 600 {token}`" in err


def test_exposures_name_their_check_and_fix() -> None:
    found = {e.check: e for e in exposures(make_config(api_key_file=None, backend="ray"))}
    assert set(found) == {"security.api_key", "security.ray_token"}
    assert "port 8000" in found["security.api_key"].message and "api_key_file" in found["security.api_key"].fix
    assert exposures(make_config(backend="mp")) == []  # the base config has an api_key_file

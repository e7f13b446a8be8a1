"""Hostile values stay one argument and are never executed; secrets never appear in output."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kit.cli import cli
from kit.config import KitConfig, Ray, Timeouts
from kit.errors import ConfigError
from kit.plan.container_args import to_apptainer_env, to_apptainer_start_argv, to_docker_argv
from kit.plan.network import NodeNet
from kit.plan.node import plan_node
from kit.plan.roles import HEAD, Role
from kit.plan.scripts import serve_script
from tests.conftest import make_config

HOSTILE = [
    "org/model with spaces",
    'it\'s "quoted"',
    "$(touch PWNED)",
    "`touch PWNED`",
    "a; touch PWNED",
    "line1\ntouch PWNED",
    "${HOME}$((1+1))",
]

# Absolute interpreter path: the fake may itself be named python3.
RECORDER = (
    f"#!{sys.executable}\n"
    + """
import json, os, sys
with open(os.environ["KIT_RECORD"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sys.exit(int(os.environ.get("KIT_RECORD_EXIT", "0")))
"""
)


def fake_bin(tmp_path: Path, *names: str) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name in names:
        path = bindir / name
        path.write_text(RECORDER)
        path.chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "KIT_RECORD": str(tmp_path / "record.jsonl")}


def recorded(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "record.jsonl").read_text().splitlines()]


def unchecked(cfg: KitConfig, **changes: object) -> KitConfig:
    """cfg with values set after validation: kit's config layer refuses control characters
    (test_config_refuses_control_characters), but the generated shell must hold up even for a
    value that got past it, so these tests feed the planners directly."""
    return dataclasses.replace(cfg, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [v for v in HOSTILE if "\n" in v])
def test_config_refuses_control_characters(value: str) -> None:
    for key in ("model.id", "model.served_name", "ray.temp_dir", "hf_cache"):
        with pytest.raises(ConfigError, match=f"{key}: contains a newline"):
            make_config(**{key: value})
    with pytest.raises(ConfigError, match="env: EXTRA: contains a newline"):
        make_config(env={"EXTRA": value})


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_model_and_args_reach_vllm_intact(value: str, tmp_path: Path) -> None:
    base = make_config(backend="mp", api_key_file=None)
    cfg = unchecked(base, model=dataclasses.replace(base.model, id=value, served_name=value, extra_args=("--x", value)))
    for role in (HEAD, Role("worker", 1)):
        script = serve_script(cfg, role)
        env = fake_bin(tmp_path, "vllm")
        env.update(VLLM_HOST_IP="10.0.0.2", KIT_NODE_RANK="1", KIT_HEAD_ADDRESS="10.0.0.1")
        subprocess.run(["bash", "-c", script, "serve"], env=env, cwd=tmp_path, check=True, timeout=30)
        argv = recorded(tmp_path)[-1]
        assert argv[:2] == ["serve", value]
        assert argv[-2:] == ["--x", value]
        assert argv[argv.index("--node-rank") + 1] == "1"
        assert not (tmp_path / "PWNED").exists()


def test_worker_gives_up_after_its_join_deadline(tmp_path: Path) -> None:
    cfg = unchecked(make_config(), timeouts=Timeouts(join=0, ready=1800))  # config refuses 0: bypassed to fail fast
    spec = plan_node(cfg, Role("worker", 1), NodeNet("10.0.0.2", "eth0", "10.0.0.1"))
    env = fake_bin(tmp_path, "ray")
    env.update(spec.env, KIT_RECORD_EXIT="1", VLLM_CONFIG_ROOT=str(tmp_path / "cfg"))
    result = subprocess.run(["bash", "-c", spec.script], env=env, timeout=30, capture_output=True, text=True)
    assert result.returncode == 1 and "could not join the Ray head at 10.0.0.1:6379" in result.stderr
    assert recorded(tmp_path)[0][:3] == ["start", "--address=10.0.0.1:6379", "--node-ip-address=10.0.0.2"]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_ray_temp_dir_reaches_ray_intact(value: str, tmp_path: Path) -> None:
    cfg = unchecked(make_config(), ray=Ray(temp_dir=value, dashboard=False), timeouts=Timeouts(join=0, ready=1800))
    spec = plan_node(cfg, HEAD, NodeNet("10.0.0.1", "eth0", "10.0.0.1"))
    env = fake_bin(tmp_path, "ray", "python3")
    env.update(spec.env)
    env["KIT_RECORD_EXIT"] = "1"  # the barrier fails at once, so the script ends
    env["VLLM_CONFIG_ROOT"] = str(tmp_path / "cfg")
    result = subprocess.run(
        ["bash", "-c", spec.script, "node"], env=env, cwd=tmp_path, timeout=30, capture_output=True, text=True
    )
    assert result.returncode == 1
    start = next(argv for argv in recorded(tmp_path) if argv[0] == "start")
    assert start[:3] == ["start", "--head", "--node-ip-address=10.0.0.1"] and f"--temp-dir={value}" in start
    assert json.loads((tmp_path / "cfg" / "ray_non_carry_over_env_vars.json").read_text())[0] == "VLLM_HOST_IP"
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_stay_one_argument_in_commands(value: str) -> None:
    cfg = unchecked(make_config(), hf_cache=f"/data/{value}", env={"EXTRA": value}, mounts=(f"/src/{value}:/dst",))
    spec = plan_node(cfg, HEAD, NodeNet("10.0.0.1", "eth0", "10.0.0.1"))
    argv = to_docker_argv(spec)
    assert shlex.split(shlex.join(argv)) == argv
    assert f"--env=EXTRA={value}" in argv
    assert any(a.startswith(f"--volume=/data/{value}:") for a in argv)
    if "$" in value or "`" in value:  # Apptainer's shell would expand them: refused (issue 20)
        with pytest.raises(ConfigError, match="env"):
            to_apptainer_start_argv(spec, f"/img/{value}.sif")
        return
    argv = to_apptainer_start_argv(spec, f"/img/{value}.sif")
    assert shlex.split(shlex.join(argv)) == argv
    assert to_apptainer_env(spec.env)["APPTAINERENV_EXTRA"] == value  # the environment, never --env
    assert any(a.startswith(f"--bind=/data/{value}:") for a in argv)


SECRET_TOKEN = "hf_" + "Zq9" * 12
SECRET_KEY = "sk-kit-" + "7f" * 16


def test_no_secret_in_dry_run_output_or_scripts(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(SECRET_TOKEN)
    key = tmp_path / "key"
    key.write_text(SECRET_KEY)
    runner = CliRunner()
    args = [
        "up",
        "--dry-run",
        "--set",
        f"hf_token_file={token}",
        "--set",
        f"api_key_file={key}",
        "--set",
        f"hf_cache={tmp_path}",
    ]
    for extra in ([], ["--json"], ["--worker", "--head-address", "10.9.9.9", "--nodes", "2"]):
        result = runner.invoke(cli, args + extra, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert SECRET_TOKEN not in result.output and SECRET_KEY not in result.output
        assert str(token) in result.output  # the path is shown, never the content
    for backend in ("ray", "mp"):
        cfg = make_config(backend=backend, hf_token_file=str(token), api_key_file=str(key))
        text = serve_script(cfg, HEAD) + plan_node(cfg, HEAD, NodeNet("1.1.1.1", "e", "1.1.1.1")).script
        assert SECRET_TOKEN not in text and SECRET_KEY not in text
    shown = runner.invoke(
        cli,
        [
            "config",
            "show",
            "--json",
            "--set",
            f"hf_token_file={token}",
            "--set",
            "env={HF_HUB_ENABLE_HF_TRANSFER: '1', MY_TOKEN: abc}",
        ],
    )
    assert SECRET_TOKEN not in shown.output and '"MY_TOKEN": "<redacted>"' in shown.output


def test_api_key_reaches_vllm_only_through_its_file(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text(SECRET_KEY)
    cfg = make_config(backend="mp", api_key_file=str(key))
    script = serve_script(cfg, HEAD).replace("/run/kit/secrets/api_key", str(key))
    env = fake_bin(tmp_path, "vllm")
    env.update(VLLM_HOST_IP="10.0.0.1", KIT_NODE_RANK="0", KIT_HEAD_ADDRESS="10.0.0.1")
    env["KIT_RECORD"] = str(tmp_path / "record.jsonl")
    # the fake vllm also records VLLM_API_KEY so we see it arrived through the environment
    (tmp_path / "bin" / "vllm").write_text(
        RECORDER.replace("sys.argv[1:]", "sys.argv[1:] + [os.environ.get('VLLM_API_KEY', '')]")
    )
    subprocess.run(["bash", "-c", script], env=env, check=True, timeout=30)
    argv = recorded(tmp_path)[-1]
    assert argv[-1] == SECRET_KEY and SECRET_KEY not in argv[:-1]

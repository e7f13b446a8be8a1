"""`kit slurm`: golden launchers for every variant, shellcheck, the deploy/slurm examples, hostile
values, secrets, and the launcher actually run (with fake srun/docker/ip/... on PATH)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from kit.cli import cli
from kit.config import load_config
from kit.errors import ConfigError
from kit.plan.node import plan_node
from kit.plan.roles import HEAD
from kit.plan.slurm import (
    SLURM_NET,
    container_scripts,
    plan_launcher,
    runtime_word,
    sbatch_line,
    walltime_seconds,
)
from kit.render import shell_quote
from tests.conftest import ROOT, fake_secret, make_config, shellcheck_text
from tests.unit.shellstubs import HOST_STUBS

DEPLOY = ROOT / "deploy" / "slurm"
VARIANTS = [(rt, be) for rt in ("apptainer", "docker") for be in ("mp", "ray")]


def slurm_config(runtime: str, backend: str, **overrides: object) -> object:
    image = "/images/vllm.sif" if runtime == "apptainer" else "vllm/vllm-openai:v0.11.0"
    base: dict[str, object] = {
        "runtime": runtime,
        "backend": backend,
        "image": image,
        "slurm.account": "proj",
        "slurm.partition": "gpu",
        "slurm.cpus_per_task": 32,
        "slurm.time": "02:00:00",
    }
    base.update(overrides)
    return make_config(**base)


def shellcheck(tmp_path: Path, name: str, text: str) -> None:
    shellcheck_text(text)
    assert subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True).returncode == 0, name


@pytest.mark.parametrize(("runtime", "backend"), VARIANTS)
def test_launcher_golden_and_shellcheck(
    runtime: str, backend: str, golden: Callable[[str, str], None], tmp_path: Path
) -> None:
    cfg = slurm_config(runtime, backend)
    text = plan_launcher(cfg)  # type: ignore[arg-type]
    golden(f"slurm_{runtime}_{backend}.sbatch", text)
    shellcheck(tmp_path, "launcher.sh", text)
    scripts = container_scripts(cfg)  # type: ignore[arg-type]
    assert "KIT_WORKER_SCRIPT" in scripts and (("KIT_RAY_HEAD_NODE_SCRIPT" in scripts) == (backend == "ray"))
    for var, script in scripts.items():
        shellcheck(tmp_path, f"{var}.sh", script)


def test_one_node_and_cpu_and_interface_variants(golden: Callable[[str, str], None], tmp_path: Path) -> None:
    cpu = slurm_config("docker", "ray", nodes=1, gpus_per_node=1, accelerator="cpu", hf_token_file=None)
    text = plan_launcher(cpu)  # type: ignore[arg-type]
    golden("slurm_docker_ray_cpu_1node.sbatch", text)
    shellcheck(tmp_path, "cpu.sh", text)
    assert "--gpus" not in text and "gpus-per-task" not in text and "KIT_WORKER_SCRIPT" not in text
    ib = plan_launcher(slurm_config("apptainer", "mp", interface="ib0"))  # type: ignore[arg-type]
    golden("slurm_apptainer_mp_ib0.sbatch", ib)
    shellcheck(tmp_path, "ib.sh", ib)
    assert 'kit_ipv4_of_interface "${KIT_INTERFACE}"' in ib and "export KIT_INTERFACE=ib0" in ib


def test_launcher_comes_from_the_same_plan_as_up() -> None:
    """Every --env/--volume/--label of `kit up`'s plan appears in the launcher, sentinels aside."""
    cfg = slurm_config("docker", "mp")
    text = plan_launcher(cfg)  # type: ignore[arg-type]
    spec = plan_node(cfg, HEAD, SLURM_NET, has_infiniband=True)  # type: ignore[arg-type]
    for key, value in spec.env.items():
        assert shell_quote(runtime_word(f"--env={key}={value}")) in text
    for m in spec.mounts:
        assert f"--volume={m.source}:{m.target}" in text
    assert "--detach" not in text and "--rm" in text


def test_apptainer_launcher_never_uses_cleanenv_or_contain() -> None:
    text = plan_launcher(slurm_config("apptainer", "ray"))  # type: ignore[arg-type]
    args = text.split()
    assert "-e" not in args and "--cleanenv" not in args and "--contain" not in args and "--containall" not in args
    assert "--nv" in args and "instance" not in args  # one foreground exec per node: srun tracks it
    assert '--bind="${KIT_JOB_TMP}"/ray:/tmp/ray' in text  # per-job Ray temp dir (FIELD_NOTES §1 row 14)


def test_ray_head_runs_barrier_then_serve(tmp_path: Path) -> None:
    """The Ray head's entry takes the node and serve scripts as its arguments ("$1", "$2"): no
    script is nested inside another."""
    cfg = slurm_config("apptainer", "ray")
    scripts = container_scripts(cfg)  # type: ignore[arg-type]
    entry = scripts["KIT_HEAD_SCRIPT"]
    assert entry.index('node_script="$1"') < entry.index("grep -q KIT_READY") < entry.index('bash -c "${serve_script}"')
    assert "ray start --head" in scripts["KIT_RAY_HEAD_NODE_SCRIPT"]
    assert "--distributed-executor-backend ray" in scripts["KIT_HEAD_SERVE_SCRIPT"]
    text = plan_launcher(cfg)  # type: ignore[arg-type]
    args = '-c "${KIT_HEAD_SCRIPT}"', 'kit-llama-head-"${SLURM_JOB_ID}"', '"${KIT_RAY_HEAD_NODE_SCRIPT}"'
    assert "\n      ".join(args) in text
    mp = container_scripts(slurm_config("apptainer", "mp"))  # type: ignore[arg-type]
    assert "--headless" not in mp["KIT_HEAD_SCRIPT"] and "--headless" in mp["KIT_WORKER_SCRIPT"]


@pytest.mark.parametrize("name", ["meluxina-apptainer-mp", "ray-2node-infiniband", "deepseek-v3-dp-ep"])
def test_deploy_examples_are_current(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    cfg = load_config(str(DEPLOY / f"{name}.yaml"), environ={}).config
    text = plan_launcher(cfg)
    path = DEPLOY / f"{name}.sbatch"
    if request.config.getoption("--update-golden"):  # regenerated like every golden
        path.write_text(text)
    assert path.read_text() == text, (
        f"{path} is stale: kit slurm --config deploy/slurm/{name}.yaml -o deploy/slurm/{name}.sbatch"
    )
    shellcheck(tmp_path, "example.sh", text)


def test_meluxina_example_matches_the_guide() -> None:
    text = (DEPLOY / "meluxina-apptainer-mp.sbatch").read_text()
    for needle in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-task=4",
        "#SBATCH --cpus-per-task=64",
        "--tensor-parallel-size 4 --pipeline-parallel-size 2",
        "--max-model-len 262144",
        "--nnodes 2",
        '--node-rank "${KIT_NODE_RANK}"',
        '--master-addr="${KIT_HEAD_ADDRESS}"',
        "--headless",
        "--quantization moe_wna16",
    ):
        assert needle in text, needle


def test_sbatch_values_are_quoted_or_refused() -> None:
    assert sbatch_line("partition", "gpu") == "#SBATCH --partition=gpu"
    assert sbatch_line("partition", "gpu; rm -rf ~") == '#SBATCH --partition="gpu; rm -rf ~"'
    assert sbatch_line("exclusive", None) == "#SBATCH --exclusive"
    for bad in ("gpu\nrm -rf ~", 'a"b', "a'b", "a\\b"):
        with pytest.raises(ConfigError):
            sbatch_line("partition", bad)


def test_walltime_formats() -> None:
    assert walltime_seconds("90") == 5400
    assert walltime_seconds("10:30") == 630
    assert walltime_seconds("01:00:00") == 3600
    assert walltime_seconds("2-00:00:00") == 172800
    assert walltime_seconds("1-12") == 129600
    with pytest.raises(ConfigError):
        walltime_seconds("soon")


def test_runtime_words_expand_only_sentinels() -> None:
    assert shell_quote(runtime_word("a b")) == "'a b'"
    assert shell_quote(runtime_word(f"VLLM_HOST_IP={SLURM_NET.ip}")) == 'VLLM_HOST_IP="${VLLM_HOST_IP}"'
    quoted = shell_quote(runtime_word(f'$(x)`y`"{SLURM_NET.ip}\\'))
    assert quoted == "'$(x)`y`\"'\"${VLLM_HOST_IP}\"'\\'"
    printed = subprocess.run(
        ["bash", "-c", f"printf %s {quoted}"], env={"VLLM_HOST_IP": "1.2.3.4"}, capture_output=True, text=True
    )
    assert printed.stdout == '$(x)`y`"1.2.3.4\\'


def test_values_that_look_like_job_variables_stay_literal() -> None:
    """Only kit's own sentinels (NUL-delimited: no configured value can hold one) become "${VAR}"."""
    cfg = slurm_config("docker", "mp", env={"A": "2147483641", "B": "@@KIT_JOB_TMP@@ ${KIT_NODE_RANK}"})
    text = plan_launcher(cfg)  # type: ignore[arg-type]
    assert "--env=A=2147483641" in text and "'--env=B=@@KIT_JOB_TMP@@ ${KIT_NODE_RANK}'" in text
    assert '--env=KIT_NODE_RANK="${KIT_NODE_RANK}"' in text and '--label=kit.rank="${KIT_NODE_RANK}"' in text


def test_no_secret_in_any_launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token, key = tmp_path / "hf_token", tmp_path / "api_key"
    hf = fake_secret("hf_", "slurm-token")
    token.write_text(hf)
    key.write_text("sk-SUPERSECRETKEY456")
    for runtime, backend in VARIANTS:
        cfg = slurm_config(runtime, backend, hf_token_file=str(token), api_key_file=str(key))
        text = plan_launcher(cfg)  # type: ignore[arg-type]
        assert "SUPERSECRET" not in text and hf not in text
        assert f"--{'bind' if runtime == 'apptainer' else 'volume'}={token}:/run/kit/secrets/hf_token:ro" in text
        assert "HF_TOKEN=" not in text and "VLLM_API_KEY=" not in text.replace('VLLM_API_KEY="$(cat', "")
    # and through the CLI, --submit included (with a fake sbatch)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text("#!/bin/sh\necho 4242\n")
    (bindir / "sbatch").chmod(0o755)
    runner = CliRunner()
    env = {"PATH": f"{bindir}:{os.environ['PATH']}"}
    monkeypatch.chdir(tmp_path)
    args = ["slurm", "--set", f"hf_token_file={token}", "--set", f"api_key_file={key}", "--submit", "--json"]
    result = runner.invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["result"]["job_id"] == "4242"
    launcher = (tmp_path / "kit-kit.sbatch").read_text()
    assert "SUPERSECRET" not in launcher and "SUPERSECRET" not in result.output
    assert hf not in launcher and hf not in result.output


def test_submit_without_sbatch_is_runtime_unavailable(tmp_path: Path) -> None:
    from kit.cli import main

    env = {**os.environ, "PATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", "from kit.cli import main; main()", "slurm", "--submit"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert main is not None
    assert result.returncode == 4, result.stderr
    assert "sbatch" in result.stderr


# ---- the launcher run for real, with fakes for SLURM, iproute2 and the container runtime ----------

RECORD = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["KIT_RECORD"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
with open(os.environ["KIT_RECORD"] + ".env", "a") as f:
    f.write(json.dumps({{k: v for k, v in os.environ.items() if k.startswith("APPTAINERENV_")}}) + "\\n")
"""


@pytest.mark.parametrize("runtime", ["docker", "apptainer"])
@pytest.mark.parametrize(
    "hostile",
    [
        "org/model with spaces",
        "$(touch PWNED)",
        "`touch PWNED`",
        "a; touch PWNED",
        "x\nKIT_HEAD_SCRIPT_EOF\ntouch PWNED",
    ],
)
def test_launcher_runs_and_hostile_values_stay_one_argument(runtime: str, hostile: str, tmp_path: Path) -> None:
    hf = tmp_path / f"hf {hostile[:6]}"
    token = tmp_path / "tok en"
    token.write_text("hf_SECRET")
    checked = slurm_config(
        runtime, "mp", nodes=1, api_key_file=None, hf_token_file=str(token), **{"slurm.partition": "gpu; touch PWNED"}
    )
    # Set after validation: kit's config layer refuses the newline (tests/unit/test_hostile_and_secrets.py),
    # but the launcher must hold up even for a value that got past it.
    model = dataclasses.replace(checked.model, id=hostile, served_name=hostile)  # type: ignore[attr-defined]
    cfg = dataclasses.replace(checked, hf_cache=str(hf), model=model)  # type: ignore[type-var]
    if runtime == "apptainer":  # every node checks it can read the image before anything starts
        sif = tmp_path / "images dir" / "vllm.sif"
        sif.parent.mkdir()
        sif.write_bytes(b"")
        cfg = dataclasses.replace(cfg, image=str(sif))
    launcher = tmp_path / "launcher.sh"
    launcher.write_text(plan_launcher(cfg))  # type: ignore[arg-type]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in HOST_STUBS.items():
        (bindir / name).write_text("#!/bin/bash\n" + body)
    for name in ("docker", "apptainer"):
        (bindir / name).write_text(RECORD)
    for path in bindir.iterdir():
        path.chmod(0o755)
    job = str(os.getpid())  # the launcher's /tmp/kit-job-<id> must not be shared with a concurrent run
    env = {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "KIT_RECORD": str(tmp_path / "record.jsonl"),
        "SLURM_JOB_ID": job,
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_SUBMIT_HOST": "login1",
        "SLURM_STEP_GPUS": "2,5",  # srun sets it in every task of a step with GPUs (physical ids)
        "USER": "alice",
    }
    result = subprocess.run(["bash", str(launcher)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (tmp_path / "PWNED").exists()
    assert "KIT_SERVER_READY url=http://10.9.0.1:8000" in result.stdout
    assert "ssh -N -L 8000:10.9.0.1:8000 alice@login1" in result.stdout
    calls = [json.loads(line) for line in (tmp_path / "record.jsonl").read_text().splitlines()]
    if runtime == "docker":  # the node checked its image before starting anything (issue 28)
        assert calls.pop(0) == ["docker", "image", "inspect", cfg.image]
    [argv] = calls
    assert argv[0] == runtime
    script = argv[argv.index("-c") + 1]
    assert script == container_scripts(cfg)["KIT_HEAD_SCRIPT"]  # type: ignore[arg-type]  # byte for byte
    assert argv[-1] == f"kit-llama-head-{job}"
    if runtime == "apptainer":  # the environment in APPTAINERENV_ variables, never --env (issue 20)
        [env] = [json.loads(line) for line in (tmp_path / "record.jsonl.env").read_text().splitlines()]
        assert env["APPTAINERENV_VLLM_HOST_IP"] == "10.9.0.1" and not any(a.startswith("--env") for a in argv)
        assert env["APPTAINERENV_NCCL_SOCKET_IFNAME"] == "ib0" and env["APPTAINERENV_KIT_HEAD_ADDRESS"] == "10.9.0.1"
    else:
        assert "--env=VLLM_HOST_IP=10.9.0.1" in argv
        assert "--env=NCCL_SOCKET_IFNAME=ib0" in argv and "--env=KIT_HEAD_ADDRESS=10.9.0.1" in argv
    mount = "--bind" if runtime == "apptainer" else "--volume"
    assert f"{mount}={token}:/run/kit/secrets/hf_token:ro" in argv
    assert f"{mount}={hf}:/kit/hf-cache" in argv
    assert "hf_SECRET" not in launcher.read_text()
    if runtime == "docker":
        assert f"--label=kit.slurm-job={job}" in argv and "--rm" in argv and "--detach" not in argv
        # only the step's GPUs, by their physical ids: never --gpus=all on a shared node (issue 28)
        assert '--gpus="device=2,5"' in argv and "--gpus=all" not in argv

"""`kit slurm` on a real HPC site (issue 28): the prologue (module loads), the site's Apptainer
options, a per-node check of the runtime, the image and the model before anything starts, the
readiness bounded by the job's walltime, where the API listens and the tunnel through the login
host's SSH port, Docker taking only the step's GPUs, every config key honoured or refused.

Goldens and shellcheck for the launchers with the new keys; the launcher run under bash with
fakes for SLURM and the runtimes (none can run here besides Docker; the real local SLURM runs
the Docker launcher in tests/slurm/test_slurm_real.py)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from kit.config.schema import SCHEMA
from kit.plan.slurm import plan_launcher
from kit.plan.slurm_keys import HONOURED, OTHER_VERBS, REFUSED
from tests.conftest import make_config, run_kit
from tests.unit.shellstubs import HOST_STUBS
from tests.unit.test_slurm import shellcheck

SITE = {
    "runtime": "apptainer",
    "backend": "mp",
    "image": "/project/images/vllm-openai.sif",
    "interface": "ib1",
    "api_listen": "all",
    "tunnel.login_host": "alice@login.meluxina.example",
    "tunnel.ssh_port": 8822,
    "apptainer.gpu_args": ["--nvccli", "--writable-tmpfs"],
    "apptainer.extra_args": ["--bind=/project/scratch"],
    "slurm.prologue": "/home/alice/site/prologue.sh",
    "slurm.time": "2-00:00:00",
    "model.id": "/project/models/Llama-3.2-3B-Instruct",
    "model.served_name": "llama-3b",
    "vllm_version": "0.33.0",
}


def test_site_launchers_golden_and_shellcheck(golden: Callable[[str, str], None], tmp_path: Path) -> None:
    text = plan_launcher(make_config(**SITE))
    golden("slurm_apptainer_site.sbatch", text)
    shellcheck(tmp_path, "site.sh", text)
    assert "source /home/alice/site/prologue.sh" in text
    assert "--nvccli\n      --writable-tmpfs\n      --bind=/project/scratch" in text and "--nv\n" not in text
    assert "--host=0.0.0.0" in text and "budget=1800" not in text  # auto: the walltime alone
    assert "-p 8822" in text and '"8000:${KIT_HEAD_HOST}:8000"' in text
    assert "--bind=/project/models/Llama-3.2-3B-Instruct:/project/models/Llama-3.2-3B-Instruct:ro" in text
    docker = plan_launcher(
        make_config(
            runtime="docker",
            backend="ray",
            infiniband="auto",
            **{"slurm.exclusive": True, "docker.user": "1000:1000", "docker.read_only": True, "timeouts.ready": 7200},
        )
    )
    golden("slurm_docker_site.sbatch", docker)
    shellcheck(tmp_path, "docker.sh", docker)
    assert "#SBATCH --exclusive" in docker and "--gpus=all" in docker and "SLURM_STEP_GPUS" not in docker
    assert "--user=1000:1000" in docker and "--read-only" in docker and "--tmpfs=/tmp" in docker
    assert "if (( budget > 7200 )); then budget=7200; fi" in docker
    assert "--device=/dev/infiniband:/dev/infiniband" in docker.split("if [ -e /dev/infiniband ]")[1]


def test_every_config_key_is_honoured_refused_or_another_verbs() -> None:
    tables = [set(HONOURED), set(OTHER_VERBS), set(REFUSED)]
    assert set().union(*tables) == set(SCHEMA), set(SCHEMA) ^ set().union(*tables)
    assert sum(len(t) for t in tables) == len(SCHEMA), "a key is in two tables"


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("head_address=10.0.0.1", "cannot honour head_address"),
        ("node_ip=10.0.0.2", "cannot honour node_ip"),
        ("gpus=2,3", "cannot honour gpus"),
        ("network_subnet=10.1.0.0/24", "cannot honour network_subnet"),
    ],
)
def test_keys_a_job_decides_itself_are_refused(flag: str, message: str, kit_env: Path) -> None:
    code, out, err = run_kit(["slurm", "--gpus-per-node", "2", "--tp", "2", "--pp", "1", "--set", flag])
    assert code == 3 and out == "" and message in err and "Traceback" not in err, err
    key = flag.split("=")[0]
    assert "unset" in err and key in err
    fine = run_kit(
        ["slurm", "--tp", "1", "--pp", "1", "--set", "node_ip=auto", "--set", "gpus=all", "--set", "nodes=1"]
    )
    assert fine[0] == 0, fine[2]  # their defaults mean nothing to refuse


def test_kit_slurm_warns_about_an_image_of_unknown_release_and_an_unreachable_api(kit_env: Path) -> None:
    code, out, err = run_kit(
        ["slurm", "--runtime", "apptainer", "--image", "/x/vllm.sif", "--tp", "1", "--pp", "1", "--interface", "ib1"]
    )
    assert code == 0, err
    assert "vLLM version is unknown" in err and "rendering for kit's default vLLM" in err
    assert "api_listen: all" in err
    code, out, _ = run_kit(["slurm", "--json", "--runtime", "apptainer", "--image", "/x/vllm.sif", "--tp", "1"])
    warnings = json.loads(out)["result"]["warnings"]
    assert any("unknown" in w for w in warnings)


def test_the_prologue_must_be_a_file_of_yours_nobody_else_may_change(kit_env: Path) -> None:
    prologue = kit_env / "prologue.sh"
    args = ["slurm", "--tp", "1", "--pp", "1", "--prologue", str(prologue)]
    code, _, err = run_kit(args)
    assert code == 3 and "slurm.prologue" in err and "No such file" in err, err
    prologue.write_text("module load apptainer/1.3.6\n")
    prologue.chmod(0o664)
    code, _, err = run_kit(args)
    assert code == 3 and "writable by others" in err and "chmod go-w" in err, err
    prologue.chmod(0o644)
    code, out, err = run_kit([*args, "--json"])
    assert code == 0, err
    launcher = json.loads(out)["result"]["launcher"]
    assert f"source {prologue}" in launcher and "apptainer/1.3.6" not in launcher  # sourced, never copied


def test_exclusive_flag_is_the_config_key(kit_env: Path) -> None:
    code, out, err = run_kit(["slurm", "--tp", "1", "--pp", "1", "--exclusive", "--json"])
    assert code == 0, err
    assert "#SBATCH --exclusive" in json.loads(out)["result"]["launcher"]


# ---- the launcher run under bash, with fakes for SLURM, iproute2 and the runtimes -----------

APPTAINER = """#!/bin/bash
printf '%s\\n' "${*:1:4}" >> "${KIT_RECORD}"
printf 'CUDA_VISIBLE_DEVICES=%s\\n' "${CUDA_VISIBLE_DEVICES:-}" >> "${KIT_RECORD}"
"""


def run_site_launcher(
    tmp_path: Path, config: dict[str, object], *, runtime_on_path: bool = True, remaining: str = "1-00:00:00"
) -> tuple[subprocess.CompletedProcess[str], Path]:
    model = tmp_path / "models" / "Llama-3.2-3B-Instruct"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text("{}")
    sif = tmp_path / "vllm.sif"
    sif.write_bytes(b"")
    prologue = tmp_path / "prologue.sh"
    # what a site's prologue does: a module that puts the runtime on PATH (module load apptainer)
    prologue.write_text(f'export PATH="{tmp_path / "modules"}:$PATH"\nexport SITE_MODULES=loaded\n')
    settings = {
        **SITE,
        "image": str(sif),
        "model.id": str(model),
        "slurm.prologue": str(prologue),
        "hf_token_file": None,
        "api_key_file": None,
        "nodes": 1,
        **config,
    }
    launcher = tmp_path / "launcher.sh"
    launcher.write_text(plan_launcher(make_config(**settings)))
    bindir, modules = tmp_path / "bin", tmp_path / "modules"
    bindir.mkdir(exist_ok=True)
    modules.mkdir(exist_ok=True)
    for name, body in {**HOST_STUBS, "squeue": f"echo {remaining}\n"}.items():
        (bindir / name).write_text("#!/bin/bash\n" + body)
    if runtime_on_path:
        (modules / "apptainer").write_text(APPTAINER)
    for path in [*bindir.iterdir(), *modules.iterdir()]:
        path.chmod(0o755)
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "KIT_RECORD": str(tmp_path / "record"),
        "SLURM_JOB_ID": f"s{os.getpid()}",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_SUBMIT_HOST": "login-internal",
        "CUDA_VISIBLE_DEVICES": "1,3",  # what SLURM sets in the job: the allocation's GPUs
        "USER": "alice",
    }
    result = subprocess.run(["bash", str(launcher)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    return result, tmp_path / "record"


def test_site_launcher_sources_the_prologue_and_keeps_slurms_gpus(tmp_path: Path) -> None:
    result, record = run_site_launcher(tmp_path, {})
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    calls = record.read_text().splitlines()
    assert calls[0].startswith("exec --nvccli --writable-tmpfs --bind=/project/scratch")  # apptainer from the module
    assert calls[1] == "CUDA_VISIBLE_DEVICES=1,3"  # SLURM's selection reaches the container untouched
    assert "kit: node 0: GPUs 1,3" in out
    # the job's walltime bounds the wait (1 day left), not 1800 s
    assert f"waiting up to {24 * 3600 - 120} s" in out
    tunnel = "tunnel: ssh -N -p 8822 -L 8000:node1:8000 alice@login.meluxina.example"
    assert tunnel in result.stdout, out


def test_a_node_without_the_runtime_says_so_in_one_line_before_anything_starts(tmp_path: Path) -> None:
    result, record = run_site_launcher(tmp_path, {}, runtime_on_path=False)
    assert result.returncode != 0 and not record.exists()
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert errors[0] == (
        "kit: error: node 0 (node1): apptainer is not on PATH (load it in slurm.prologue, e.g. module load apptainer)"
    ), result.stderr


def test_a_node_without_the_image_or_the_model_says_so(tmp_path: Path) -> None:
    result, _ = run_site_launcher(tmp_path, {"image": str(tmp_path / "missing.sif")})
    assert f"node 0 (node1): cannot read the image {tmp_path / 'missing.sif'}" in result.stderr
    result, _ = run_site_launcher(tmp_path, {"model.id": str(tmp_path / "gone")})
    assert f"node 0 (node1): cannot read the model directory {tmp_path / 'gone'}" in result.stderr


def test_an_explicit_ready_timeout_still_caps_the_wait(tmp_path: Path) -> None:
    result, _ = run_site_launcher(tmp_path, {"timeouts.ready": 600})
    assert "waiting up to 600 s" in result.stdout, result.stdout + result.stderr
    short, _ = run_site_launcher(tmp_path, {"timeouts.ready": 600}, remaining="05:00")
    assert "waiting up to 180 s" in short.stdout  # 300 s left, minus the margin

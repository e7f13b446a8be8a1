"""A kit-generated launcher submitted to a REAL SLURM (Debian's slurm-wlm + munge on this machine,
started by tests/infra/slurm.sh), with the Docker runtime and the CPU engine image.

Skipped when `sbatch` is missing, unless KIT_REQUIRE_SLURM=1 (then it fails). Needs Docker and the
image kit/vllm-cpu:test (KIT_SLURM_IMAGE overrides it).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, fake_secret

pytestmark = pytest.mark.slurm

IMAGE = os.environ.get("KIT_SLURM_IMAGE", "kit/vllm-cpu:test")
# The Ray test's image: kit's CPU image carries no Ray, like vLLM's since 0.18.0 (issue 24);
# tests/run.sh layers it on with `kit build ray`.
RAY_IMAGE = os.environ.get("KIT_SLURM_RAY_IMAGE", "kit/vllm-cpu:test-ray")
REQUIRED = os.environ.get("KIT_REQUIRE_SLURM") == "1"

HF_TOKEN = fake_secret("hf_", "slurm-real-token")  # made at run time: no token-shaped string is committed


def _missing(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"KIT_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module", autouse=True)
def slurm_up() -> None:
    if shutil.which("sbatch") is None:
        _missing("sbatch is not installed (run tests/infra/slurm.sh to get a one-node SLURM)")
    if os.geteuid() == 0 or shutil.which("sudo"):
        subprocess.run(["bash", str(ROOT / "tests" / "infra" / "slurm.sh")], check=True, timeout=600)
    if (
        shutil.which("docker") is None
        or subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode
    ):
        _missing(f"Docker or the image {IMAGE} is missing (build it with `kit build cpu --tag {IMAGE}`)")


def kit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kit", *args], cwd=cwd, capture_output=True, text=True, timeout=180)


def write_config(tmp_path: Path, slurm_extra: dict[str, object] | None = None, **extra: object) -> Path:
    config = {
        "cluster": f"slurmtest{os.getpid()}",
        "runtime": "docker",
        "accelerator": "cpu",
        "image": extra.pop("image", IMAGE),
        "nodes": 1,
        "gpus_per_node": 1,
        "hf_cache": str(tmp_path / "hf"),
        "slurm": {
            "time": "00:10:00",
            "cpus_per_task": 1,
            "job_name": "kit-test",
            "output": str(tmp_path / "job-%j.out"),
            "error": str(tmp_path / "job-%j.err"),
            **(slurm_extra or {}),
        },
        **extra,
    }
    (tmp_path / "hf").mkdir(exist_ok=True)
    path = tmp_path / "kit.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def wait_for(path: Path, mark: str, timeout: float, job: str) -> tuple[str, float]:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        text = path.read_text(errors="replace") if path.exists() else ""
        for line in text.splitlines():
            if mark in line:
                return line, time.monotonic() - start
        queue = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout
        if job not in queue and time.monotonic() - start > 10:
            break
        time.sleep(1)
    err = path.with_suffix(".err")
    tail = "\n".join(text.splitlines()[-40:])
    errors = err.read_text() if err.exists() else ""
    raise AssertionError(f"no {mark} in {path} after {time.monotonic() - start:.0f} s:\n{tail}\n{errors}")


def submit(tmp_path: Path, config: Path) -> str:
    result = kit("slurm", "--config", str(config), "--submit", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)["result"]["job_id"]
    assert re.fullmatch(r"\d+", job)
    return str(job)


def down_and_check_clean(tmp_path: Path, job: str) -> None:
    status = kit("status", "--slurm", job, "--json", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    result = kit("down", "--slurm", job, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    done = json.loads(result.stdout)["result"]["slurm"]
    assert done["was_in_queue"] and done["gone"], done
    assert subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip() == ""
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=kit.slurm-job={job}"], capture_output=True, text=True, check=True
    )
    assert left.stdout.strip() == "", "kit containers of the job are left"
    again = kit("down", "--slurm", job, "--json", cwd=tmp_path)  # idempotent
    assert again.returncode == 0 and not json.loads(again.stdout)["result"]["slurm"]["was_in_queue"]


def test_ray_head_comes_up_under_slurm_and_down_cancels_it(tmp_path: Path) -> None:
    config = write_config(tmp_path, backend="ray", image=RAY_IMAGE, model={"id": "kit/tiny-llama"})
    t0 = time.monotonic()
    job = submit(tmp_path, config)
    try:
        line, _ = wait_for(tmp_path / f"job-{job}.out", "KIT_READY", 240, job)
        print(f"job {job}: {line!r} {time.monotonic() - t0:.0f} s after submit")
        assert "nodes=1" in line
        out = (tmp_path / f"job-{job}.out").read_text()
        assert "kit: node 0 on" in out and "secret" not in out.lower()
        status = json.loads(kit("status", "--slurm", job, "--json", cwd=tmp_path).stdout)["result"]["slurm"]
        assert status["state"] == "RUNNING" and any("KIT_READY" in m for m in status["marks"])
    finally:
        down_and_check_clean(tmp_path, job)


def test_mp_server_ready_under_slurm_answers_and_down_cancels_it(tmp_path: Path) -> None:
    (tmp_path / "hf").mkdir()
    subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "-v",
            f"{tmp_path / 'hf'}:/out",
            IMAGE,
            "python3",
            "/opt/kit/make_tiny_model.py",
            "--out",
            "/out/hub",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    token = tmp_path / "hf_token"
    token.write_text(HF_TOKEN)
    # An HPC site's setup (issue 28): a prologue of the user's the job sources first (module
    # loads), the API on every interface with the tunnel through the login host's SSH port, the
    # readiness bounded by the walltime alone (40 min: more than the old 1800 s cap), and the
    # node's container run as a user on a read-only image (Apptainer's semantics, Docker standing in).
    prologue = tmp_path / "prologue.sh"
    prologue.write_text('echo "site prologue loaded on $(hostname)"\nexport SITE_MODULES=apptainer\n')
    prologue.chmod(0o600)
    config = write_config(
        tmp_path,
        backend="mp",
        hf_token_file=str(token),
        env={"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
        model={"id": "kit/tiny-llama", "extra_args": ["--enforce-eager"]},
        api_listen="all",
        tunnel={"login_host": "alice@login.example", "ssh_port": 2222},
        docker={"user": "4242:4242", "read_only": True},
        slurm_extra={"prologue": str(prologue), "time": "00:40:00"},
    )
    t0 = time.monotonic()
    job = submit(tmp_path, config)
    try:
        assert HF_TOKEN not in (tmp_path / f"kit-slurmtest{os.getpid()}.sbatch").read_text()
        line, _ = wait_for(tmp_path / f"job-{job}.out", "KIT_SERVER_READY", 420, job)
        print(f"job {job}: {line!r} {time.monotonic() - t0:.0f} s after submit")
        url = re.search(r"url=(\S+)", line)
        assert url and re.search(r"tunnel: ssh -N -p 2222 -L 8000:[^:]+:8000 alice@login\.example$", line), line
        out = (tmp_path / f"job-{job}.out").read_text()
        assert "site prologue loaded on" in out
        budget = re.search(r"kit: waiting up to (\d+) s", out)
        assert budget and 1800 < int(budget.group(1)) <= 40 * 60 - 120, out[-2000:]
        body = json.dumps({"model": "kit/tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        request = urllib.request.Request(
            url.group(1) + "/v1/chat/completions", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        reply = json.loads(urllib.request.urlopen(request, timeout=60).read())
        assert reply["choices"][0]["message"]["role"] == "assistant"
        status = json.loads(kit("status", "--slurm", job, "--json", cwd=tmp_path).stdout)["result"]["slurm"]
        assert status["server_ready"] and "KIT_SERVER_READY" in status["server_ready"]
    finally:
        down_and_check_clean(tmp_path, job)


def test_a_node_without_the_image_says_so_in_one_line_before_anything_starts(tmp_path: Path) -> None:
    """The per-node check (issue 28): the job ends at once with one line naming the node."""
    config = write_config(tmp_path, backend="mp", image="kit/no-such-image:issue-28", model={"id": "kit/tiny-llama"})
    job = submit(tmp_path, config)
    try:
        err = tmp_path / f"job-{job}.err"
        start = time.monotonic()
        while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
            assert time.monotonic() - start < 120, "the job did not end"
            time.sleep(1)
        text = err.read_text() if err.exists() else ""
        assert re.search(r"kit: error: node 0 \(\S+\): the image is not on this node .*kit/no-such-image", text), text
        assert "docker: " not in text  # nothing was started
        print(f"job {job}: refused in {time.monotonic() - start:.0f} s")
    finally:
        subprocess.run(["scancel", job], capture_output=True)

"""The supervised launcher under a REAL SLURM (issue 18; Debian's slurm-wlm + munge on this machine,
started by tests/infra/slurm.sh), with the Docker runtime and the CPU engine image: one node, mp
backend, the tiny model. The node step runs kit's supervisor around `vllm serve` inside the
container: with the model gone, a killed engine is detected and the group restarted inside the
job (the job output carries the KIT_EVENT lines, `kit status --slurm` counts the restart); the
restart fails, the supervisor gives up at the limit, the step ends and, with slurm.requeue, the
launcher requeues the job (`scontrol show job`: Restarts=1). A restart that succeeds in place
under SLURM is test_slurm_router.py's (a supervised replica).

Skipped when `sbatch` is missing, unless KIT_REQUIRE_SLURM=1. Heavy: run it under the shared lock:
    flock /tmp/kit-heavy.lock pytest tests/slurm/test_slurm_supervise.py -x -q
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

from kit.supervise import events
from tests.conftest import ROOT

pytestmark = pytest.mark.slurm

IMAGE = os.environ.get("KIT_SLURM_IMAGE", "kit/vllm-cpu:test")
MODEL_DIR = "models--kit--tiny-llama"
# kill -9 of every vLLM engine core in a container (its process title), as `docker exec bash -c`.
KILL_ENGINE = (
    'for p in /proc/[0-9]*; do case "$(tr "\\0" " " < "$p/cmdline" | head -c 16)" in VLLM::EngineCore*) '
    'kill -9 "${p#/proc/}";; esac; done'
)


@pytest.fixture(scope="module", autouse=True)
def slurm_up() -> None:
    if shutil.which("sbatch") is None:
        if os.environ.get("KIT_REQUIRE_SLURM") == "1":
            pytest.fail("KIT_REQUIRE_SLURM=1 but sbatch is not installed")
        pytest.skip("sbatch is not installed (run tests/infra/slurm.sh to get a one-node SLURM)")
    if os.geteuid() == 0 or shutil.which("sudo"):
        subprocess.run(["bash", str(ROOT / "tests" / "infra" / "slurm.sh")], check=True, timeout=600)
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode:
        pytest.skip(f"the image {IMAGE} is missing")


def kit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kit", *args], cwd=cwd, capture_output=True, text=True, timeout=180)


def events_in(path: Path) -> list[dict[str, object]]:
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return [e.to_dict() for e in events.parse_lines(lines)]


def wait_until(check: object, timeout: float, what: str, path: Path) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()  # type: ignore[operator]
        if value:
            return value
        time.sleep(1)
    tail = "\n".join(path.read_text(errors="replace").splitlines()[-40:]) if path.exists() else "(no output)"
    raise AssertionError(f"no {what} after {timeout:.0f} s:\n{tail}")


def test_a_supervised_job_restarts_then_gives_up_and_requeues(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "-v",
            f"{hf}:/out",
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
    config = {
        "cluster": f"slurmsup{os.getpid()}",
        "runtime": "docker",
        "accelerator": "cpu",
        "image": IMAGE,
        "backend": "mp",
        "nodes": 1,
        "gpus_per_node": 1,
        "hf_cache": str(hf),
        "env": {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
        "model": {"id": "kit/tiny-llama", "extra_args": ["--enforce-eager"]},
        "timeouts": {"liveness": 10, "ready": 400},
        "supervise": {"enabled": True, "max_restarts": 1, "backoff": 1, "stable": 5},
        "slurm": {
            "time": "00:20:00",
            "cpus_per_task": 1,
            "job_name": "kit-sup",
            "requeue": True,
            "output": str(tmp_path / "job-%j.out"),
            "error": str(tmp_path / "job-%j.err"),
        },
    }
    (tmp_path / "kit.yaml").write_text(yaml.safe_dump(config))
    submitted = kit("slurm", "--config", str(tmp_path / "kit.yaml"), "--submit", "--json", cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job = str(json.loads(submitted.stdout)["result"]["job_id"])
    out = tmp_path / f"job-{job}.out"
    try:
        launcher = next(tmp_path.glob("kit-*.sbatch")).read_text()
        assert "#SBATCH --requeue" in launcher and "KIT_SUPERVISE_TOKEN=" in launcher
        ready = wait_until(
            lambda: re.search(r"KIT_SERVER_READY url=(\S+)", out.read_text()) if out.exists() else None,
            420,
            "KIT_SERVER_READY",
            out,
        )
        url = ready.group(1)  # type: ignore[attr-defined]
        kinds = [e["event"] for e in events_in(out)]
        assert kinds[:2] == ["supervising", "waiting"] or kinds[0] == "supervising", kinds
        container = subprocess.run(
            ["docker", "ps", "-q", "--filter", f"label=kit.slurm-job={job}"], capture_output=True, text=True, check=True
        ).stdout.split()
        assert len(container) == 1
        body = json.dumps({"model": "kit/tiny-llama", "prompt": "hi", "max_tokens": 2}).encode()
        request = urllib.request.Request(
            url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        assert json.loads(urllib.request.urlopen(request, timeout=60).read())["choices"]

        # The model is gone, then the engine killed: the supervisor detects it and restarts the
        # group inside the job (`kit status --slurm` counts the restart from the job output); the
        # restart fails, past max_restarts the step ends and the job is requeued. (A restart that
        # succeeds in place, under SLURM: tests/slurm/test_slurm_router.py's supervised replica.)
        shutil.move(str(hf / "hub" / MODEL_DIR), str(tmp_path / MODEL_DIR))
        time.sleep(6)  # supervise.stable: a first failure
        subprocess.run(["docker", "exec", container[0], "bash", "-c", KILL_ENGINE], check=True)
        wait_until(lambda: [e for e in events_in(out) if e["event"] == "restarting"], 120, "a restart", out)
        status = kit("status", "--slurm", job, "--json", cwd=tmp_path)
        supervise = json.loads(status.stdout)["result"]["slurm"]["supervise"]
        assert supervise["restarts"] == 1 and supervise["last_failure"], supervise
        assert "supervisor: 1 restart(s)" in kit("status", "--slurm", job, cwd=tmp_path).stdout
        wait_until(lambda: [e for e in events_in(out) if e["event"] == "given-up"], 300, "given-up", out)
        restarts = wait_until(
            lambda: re.search(
                r"Restarts=([1-9])",
                subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout,
            ),
            120,
            "a requeue",
            out,
        )
        assert restarts
        shutil.move(str(tmp_path / MODEL_DIR), str(hf / "hub" / MODEL_DIR))
    finally:
        kit("down", "--slurm", job, cwd=tmp_path)
        left = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label=kit.slurm-job={job}"], capture_output=True, text=True
        ).stdout.strip()
        assert left == ""

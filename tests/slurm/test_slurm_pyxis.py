"""The pyxis and CSCS EDF launchers submitted to a REAL SLURM (Debian's slurm-wlm + munge on this
machine, started by tests/infra/slurm.sh), with FAKES for what cannot be installed here (issue 20):

- `srun` first on PATH inside the job (the submitting environment travels with sbatch) is a fake
  of pyxis and the Container Engine (tests/pyxis_fake.py): it checks every container option as
  pyxis parses it (refusing options pyxis does not have), reads the EDF as the Container Engine
  does, checks that every mount source exists on the node, then runs the step with the REAL srun,
  without a container (the environment as pyxis/the EDF give it, the working directory set);
- `vllm` is a stand-in server (it answers /health and /v1/models on the --host/--port it is
  given, and records its argv and environment): the real engine only exists inside the image,
  and the Docker launcher's test (test_slurm_real.py) serves with it under SLURM.

Everything else is real: sbatch, the allocation, the host step that finds the node's address
and checks its secret files, srun's steps, the node entry and the node probe (with this host's
python3), the readiness wait, KIT_SERVER_READY, `kit verify --job-output`, `kit down --slurm`.
Skipped when `sbatch` is missing, unless KIT_REQUIRE_SLURM=1 (then it fails).
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

REQUIRED = os.environ.get("KIT_REQUIRE_SLURM") == "1"
API_PORT = 18620 + os.getpid() % 200  # not 8000: other clusters may serve there

FAKE_SRUN = f"""#!{sys.executable}
# FAKE pyxis/Container Engine in front of the real srun (kit's tests/slurm; see the module docstring).
import json, os, shutil, sys
sys.path.insert(0, {str(ROOT)!r})
from tests.pyxis_fake import Invalid, check_pyxis, fail, parse, read_edf
args = sys.argv[1:]
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "srun.jsonl"), "a") as f:
    f.write(json.dumps(args) + "\\n")
path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if os.path.abspath(p) != here)
real = shutil.which("srun", path=path)
env = dict(os.environ)
try:
    step = parse(args)
    if step.pyxis:
        check_pyxis(step, env, files=True)
        workdir = step.pyxis.get("--container-workdir")
    elif step.environment is not None:
        data, _ = read_edf(step.environment, files=True)
        env.update(data.get("env", {{}}))
        workdir = data.get("workdir")
    else:
        workdir = None
except Invalid as exc:
    fail(str(exc))
extra = [f"--chdir={{workdir}}"] if workdir else []
os.execve(real, [real, *step.srun, *extra, *step.command], env)
"""

FAKE_VLLM = f"""#!{sys.executable}
# Stand-in vLLM server (kit's tests/slurm): /health and /v1/models on --host/--port; records argv and env.
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
opt = lambda name: next(a.split("=", 1)[1] for a in args if a.startswith(name + "="))
host = opt("--host")
port = int(args[args.index("--port") + 1])
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "vllm.json"), "w") as f:
    json.dump({{"argv": args, "env": dict(os.environ), "pid": os.getpid(), "cwd": os.getcwd()}}, f)
class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        body = json.dumps({{"data": [{{"id": opt("--served-model-name")}}]}}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
HTTPServer((host, port), Handler).serve_forever()
"""

HF_TOKEN = fake_secret("hf_", "pyxis-token")  # made at run time: no token-shaped string is committed


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


@pytest.fixture
def fakes(tmp_path: Path) -> Path:
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("vllm", FAKE_VLLM)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    return bindir


def record_parser(state: Path, image: Path) -> None:
    """kit's record of the fake image's `vllm serve` parser (the one recorded from vLLM 0.32.0),
    as `kit verify --image` would leave it: kit checks the plan against it in advance and the
    containers run no in-container check (issue 24), which needs vLLM; the fake pyxis runs the
    container's commands on this host, where there is none."""
    from kit.images import records
    from tests.unit.recorded_parsers import recorded_facts

    before = os.environ.get("KIT_STATE_DIR")
    os.environ["KIT_STATE_DIR"] = str(state)
    try:
        key = records.file_key(str(image))
        records.save_facts(key, dict(recorded_facts().data), image=str(image))
        records.link_facts(str(image), key, path=str(image), stamp=records.file_stamp(str(image)))
    finally:
        if before is None:
            del os.environ["KIT_STATE_DIR"]
        else:
            os.environ["KIT_STATE_DIR"] = before


def kit(*args: str, cwd: Path, path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{path}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    env["KIT_STATE_DIR"] = str(cwd / "state")
    return subprocess.run(
        [sys.executable, "-m", "kit", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


def wait_for(path: Path, mark: str, timeout: float, job: str) -> str:
    start = time.monotonic()
    text = ""
    while time.monotonic() - start < timeout:
        text = path.read_text(errors="replace") if path.exists() else ""
        for line in text.splitlines():
            if mark in line:
                return line
        queue = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout
        if job not in queue and time.monotonic() - start > 10:
            break
        time.sleep(1)
    err = path.with_suffix(".err")
    raise AssertionError(f"no {mark} in {path}:\n{text[-4000:]}\n{err.read_text() if err.exists() else ''}")


@pytest.mark.parametrize("runtime", ["pyxis", "edf"])
def test_enroot_launcher_under_real_slurm_serves_and_down_cancels_it(runtime: str, tmp_path: Path, fakes: Path) -> None:
    (tmp_path / "hf").mkdir()
    token = tmp_path / "hf_token"
    token.write_text(HF_TOKEN)
    image = tmp_path / "images" / "vllm.sqsh"
    image.parent.mkdir()
    image.write_text("hsqs")  # pyxis would mount it; the fake checks it is there
    record_parser(tmp_path / "state", image)
    config = {
        "cluster": f"{runtime}{os.getpid()}",
        "runtime": runtime,
        "accelerator": "cpu",
        "backend": "mp",
        "image": str(image),
        "nodes": 1,
        "gpus_per_node": 1,
        "hf_cache": str(tmp_path / "hf"),
        "hf_token_file": str(token),
        "ports": {"api": API_PORT},
        "env": {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "KIT_TEST_VALUE": "a b'c\"$(x)"},
        "model": {"id": "kit/tiny-llama", "served_name": "tiny"},
        "slurm": {
            "time": "00:10:00",
            "cpus_per_task": 1,
            "job_name": "kit-test",
            "output": str(tmp_path / "job-%j.out"),
            "error": str(tmp_path / "job-%j.err"),
        },
    }
    if runtime == "edf":
        config["env"] = {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "KIT_TEST_VALUE": "a b'c\"(x)"}  # the EDF refuses '$'
    (tmp_path / "kit.yaml").write_text(yaml.safe_dump(config))
    result = kit("slurm", "--config", "kit.yaml", "--submit", "--json", cwd=tmp_path, path=fakes)
    assert result.returncode == 0, result.stderr
    job = str(json.loads(result.stdout)["result"]["job_id"])
    out = tmp_path / f"job-{job}.out"
    try:
        line = wait_for(out, "KIT_SERVER_READY", 180, job)
        url = re.search(r"url=(\S+)", line)
        assert url and f"tunnel: ssh -N -L {API_PORT}:" in line
        models = json.loads(urllib.request.urlopen(url.group(1) + "/v1/models", timeout=10).read())
        assert models["data"][0]["id"] == "tiny"
        served = json.loads((fakes / "vllm.json").read_text())
        env = served["env"]
        # per-node values from the node table (found on the host), inside the "container"
        assert f"--host={env['VLLM_HOST_IP']}" in served["argv"] and url.group(1).endswith(
            f"{env['VLLM_HOST_IP']}:{API_PORT}"
        )
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] and env["KIT_NODE_RANK"] == "0"
        assert env["KIT_CONTAINER_RUNTIME"] == runtime and env["KIT_ROLE"] == "head"
        assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1" and env["KIT_TEST_VALUE"] == config["env"]["KIT_TEST_VALUE"]  # type: ignore[index]
        assert served["cwd"] == "/tmp"  # --container-workdir / the EDF's workdir
        steps = [json.loads(x) for x in (fakes / "srun.jsonl").read_text().splitlines()]
        container = [s for s in steps if any(a.startswith(("--container-image=", "--environment=")) for a in s)]
        assert len(container) == 1 and len(steps) == 2  # the host step, then the head's container step
        text = out.read_text()
        assert HF_TOKEN not in text and HF_TOKEN not in (tmp_path / f"kit-{config['cluster']}.sbatch").read_text()
        assert re.search(r"KIT_PROBE rank=0 part=1/", text)
        verify = kit("verify", "--job-output", str(out), "--json", cwd=tmp_path, path=fakes)
        document = json.loads(verify.stdout)
        document = document.get("result") or document["error"]["result"]
        names = {c["name"] for c in document["checks"]}
        assert {"enroot.gpus", "enroot.rdma", "enroot.memlock", "enroot.shm"} <= names, verify.stdout
        assert verify.returncode == (7 if document["status"] == "fail" else 0)
    finally:
        down = kit("down", "--slurm", job, "--json", cwd=tmp_path, path=fakes)
    assert down.returncode == 0, down.stderr
    done = json.loads(down.stdout)["result"]["slurm"]
    assert done["was_in_queue"] and done["gone"], done
    pid = json.loads((fakes / "vllm.json").read_text())["pid"]
    for _ in range(30):  # scancel ends the step: the server is gone
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(1)
    assert not Path(f"/proc/{pid}").exists(), "the job's server survived kit down"

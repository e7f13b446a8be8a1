"""The SLURM launcher with supervise.enabled (kit/plan/slurm_supervise.py, sbatch.sh.j2): goldens and
shellcheck for every runtime and backend, then the launcher run under bash with the stub binaries
of tests/unit/shellstubs.py (fakes: srun, docker/apptainer, python3) and hostile values: each
node's container hands its serve script, the bundle and the settings to kit's supervisor as one
argument each, byte for byte; the control token reaches every node's job directory as a file and
no argument; with slurm.requeue a step that ends in failure after the server was ready requeues
the job. The real thing runs in tests/slurm."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from kit.config import KitConfig
from kit.plan.roles import HEAD, Role
from kit.plan.scripts import serve_script
from kit.plan.slurm import WALLTIME_MARGIN_S, plan_launcher, supervised_config, walltime_seconds
from kit.plan.slurm_supervise import entry_script
from kit.plan.supervise import RUN_DIR, plan_supervise
from kit.resources import program_source
from kit.supervise import bundle
from tests.conftest import make_config, shellcheck_bin
from tests.unit.shellstubs import calls, make_stubs

BUNDLE_LINE = re.compile(r"^export KIT_SUPERVISE_BUNDLE=[A-Za-z0-9+/=]+$", re.MULTILINE)
HOSTILE = "x\n$(touch @C@)`touch @C@`; touch @C@ && '\"--x"


def supervised(runtime: str, backend: str, **extra: object) -> KitConfig:
    return make_config(runtime=runtime, backend=backend, **{"supervise.enabled": True, **extra})


def normalized(text: str) -> str:
    """The launcher with the bundle (kit's own code, tested on its own) replaced by its digest, so
    the golden changes when the launcher does, not with every edit of the supervisor."""
    return BUNDLE_LINE.sub(f"export KIT_SUPERVISE_BUNDLE=<bundle {bundle.digest()}>", text).replace(
        bundle.digest(), "DIGEST"
    )


@pytest.mark.parametrize(("runtime", "backend"), [("docker", "mp"), ("apptainer", "ray")])
def test_supervised_launcher_golden(runtime: str, backend: str, golden: Callable[[str, str], None]) -> None:
    text = plan_launcher(supervised(runtime, backend, **{"slurm.requeue": True}))
    assert len(BUNDLE_LINE.findall(text)) == 1
    golden(f"supervise/slurm_{runtime}_{backend}.sbatch", normalized(text))
    golden("supervise/slurm_entry.sh", entry_script())


@pytest.mark.parametrize("runtime", ["docker", "apptainer"])
@pytest.mark.parametrize("backend", ["mp", "ray"])
@pytest.mark.parametrize("requeue", [False, True])
def test_supervised_launchers_pass_shellcheck(runtime: str, backend: str, requeue: bool) -> None:
    text = plan_launcher(supervised(runtime, backend, **{"slurm.requeue": requeue}))
    for piece in (text, entry_script()):
        done = subprocess.run([shellcheck_bin(), "-s", "bash", "-"], input=piece, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout
    assert ("#SBATCH --requeue" in text) == requeue and ("scontrol requeue" in text) == requeue


def test_without_supervise_the_launcher_has_none_of_it() -> None:
    text = plan_launcher(make_config(runtime="docker", backend="mp"))
    assert "KIT_SUPERVISE" not in text and "kit-supervise" not in text and "requeue" not in text


def hostile_config(root: Path, runtime: str, backend: str, **extra: object) -> KitConfig:
    value = HOSTILE.replace("@C@", str(root / "canary"))
    if runtime == "apptainer":  # kit refuses `$` and backticks in Apptainer's environment (test_apptainer.py)
        value = value.replace("$", "").replace("`", "")
    base = supervised(runtime, backend, nodes=2, gpus_per_node=1, **{"model.tp": 1, "model.pp": 2, **extra})
    image = base.image
    if runtime == "apptainer":  # every node checks it can read the image before anything starts
        (root / "vllm.sif").write_bytes(b"")
        image = str(root / "vllm.sif")
    return dataclasses.replace(
        base,
        image=image,
        cluster=value,
        hf_cache=str(root / "hf"),
        hf_token_file=None,
        api_key_file=None,
        ray_token_file=None,
        model=dataclasses.replace(base.model, id=value, served_name=value, extra_args=("--x", value)),
        timeouts=dataclasses.replace(base.timeouts, join=0),
    )


def run_launcher(root: Path, text: str, job: str, *, srun_rc: int | None = None) -> subprocess.CompletedProcess[str]:
    stubs = make_stubs(root / "bin")
    if srun_rc is not None:  # the step ends as a supervisor that gave up would end it
        (root / "bin" / "srun").write_text(
            f'#!/bin/bash\nsleep 1; printf "%s\\0" srun > "$KIT_RECORD/srun"\nexit {srun_rc}\n'
        )
    for sub in ("record", "containers"):
        (root / sub).mkdir(exist_ok=True)
    env = stubs.env(
        root / "record",
        root / "containers",
        SLURM_JOB_ID=job,
        SLURM_JOB_NUM_NODES="2",
        SLURM_JOB_NODELIST="node1",
        SLURM_SUBMIT_HOST="login1",
        SLURM_STEP_GPUS="0",  # srun's, in every task of a step with GPUs (Docker takes these)
        USER="alice",
        KIT_STUB_RAY_BLOCK="10",
    )
    # From a file, as sbatch runs it: the launcher carries the supervise bundle, and with it passes
    # the 128 KiB Linux allows one argv word (the bundle word alone stays under it:
    # test_supervise_bundle.py).
    script = root / "launcher.sh"
    script.write_text(text)
    return subprocess.run(["bash", str(script)], env=env, cwd=root, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("runtime", ["docker", "apptainer"])
@pytest.mark.parametrize("backend", ["mp", "ray"])
def test_every_node_hands_its_serve_script_bundle_and_settings_to_the_supervisor_verbatim(
    runtime: str, backend: str, tmp_path: Path
) -> None:
    cfg = hostile_config(tmp_path, runtime, backend)
    job = f"{os.getpid()}{abs(hash((runtime, backend))) % 10000}"
    result = run_launcher(tmp_path, plan_launcher(cfg), job)
    assert not (tmp_path / "canary").exists(), "a value was executed"
    assert "KIT_SERVER_READY url=http://10.9.0.1:8000" in result.stdout, result.stdout + result.stderr
    record = calls(tmp_path / "record")
    boots = [c[1:] for c in record if c[0] == "python3" and c[1:3] == ["-c", program_source("supervise/boot.py")]]
    roles = [HEAD, Role("worker", 1)] if backend == "mp" else [HEAD]
    assert len(boots) == len(roles), record
    for argv, role in zip(boots, roles, strict=True):
        run_dir, serve, packed, settings = argv[2:]
        assert run_dir == RUN_DIR
        assert serve == serve_script(cfg, role, precheck=cfg.image_options is None)  # issue 24: no record
        assert base64.b64decode(packed) == bundle.build()
        # timeouts.ready auto: the job's supervisor waits as long as the walltime leaves (issue 28)
        assert json.loads(settings) == plan_supervise(supervised_config(cfg))
        assert json.loads(settings)["ready_s"] == walltime_seconds(cfg.slurm.time) - WALLTIME_MARGIN_S
        assert json.loads(settings)["cluster"] == cfg.cluster
    runs = [c for c in record if c[0] == runtime and c[1] in ("run", "exec")]
    assert len(runs) == 2
    mount = "--volume" if runtime == "docker" else "--bind"
    assert all(f"{mount}=/tmp/kit-job-{job}/kit:/tmp/kit" in argv for argv in runs)
    hexwords = [w for c in record for w in c if re.fullmatch(r"[0-9a-f]{32}", w)]
    assert hexwords == [], "the control token is never an argument"


def test_each_node_step_writes_the_jobs_token_into_its_job_directory(tmp_path: Path) -> None:
    """The node step's own lines, run alone: the token of the job lands in the job directory's
    supervise/token with mode 600 (the container sees it as /tmp/kit/supervise/token)."""
    text = plan_launcher(hostile_config(tmp_path, "docker", "mp"))
    lines = [ln.strip() for ln in text.splitlines() if "KIT_SUPERVISE_TOKEN" in ln and "umask" in ln]
    assert lines == ['(umask 077 && printf \'%s\' "${KIT_SUPERVISE_TOKEN}" >"${KIT_JOB_TMP}/kit/supervise/token")']
    (tmp_path / "job" / "kit" / "supervise").mkdir(parents=True)
    env = {
        "KIT_SUPERVISE_TOKEN": "0123456789abcdef0123456789abcdef",
        "KIT_JOB_TMP": str(tmp_path / "job"),
        "PATH": os.environ["PATH"],
    }
    subprocess.run(["bash", "-c", lines[0]], env=env, check=True)
    token = tmp_path / "job" / "kit" / "supervise" / "token"
    assert token.read_text() == env["KIT_SUPERVISE_TOKEN"] and token.stat().st_mode & 0o777 == 0o600
    made = [ln for ln in text.splitlines() if ln.startswith("KIT_SUPERVISE_TOKEN=")]
    assert made == ["KIT_SUPERVISE_TOKEN=\"$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')\""]
    out = subprocess.run(["bash", "-c", made[0] + '; printf %s "$KIT_SUPERVISE_TOKEN"'], capture_output=True, text=True)
    assert re.fullmatch(r"[0-9a-f]{32}", out.stdout)


@pytest.mark.parametrize(("rc", "requeued"), [(6, True), (0, False)])
def test_requeue_after_the_nodes_fail(rc: int, requeued: bool, tmp_path: Path) -> None:
    cfg = hostile_config(tmp_path, "docker", "mp", **{"slurm.requeue": True})
    job = f"{os.getpid()}{rc}"
    result = run_launcher(tmp_path, plan_launcher(cfg), job, srun_rc=rc)
    assert result.returncode == rc
    scontrol = [c[1:] for c in calls(tmp_path / "record") if c[0] == "scontrol"]
    assert (["requeue", job] in scontrol) == requeued, scontrol
    assert ("requeueing job" in result.stdout) == requeued


def test_boot_py_writes_the_run_and_becomes_the_bundles_entry(tmp_path: Path) -> None:
    """kit/supervise/boot.py for real, with a bundle whose entry only reports how it was called."""
    import io
    import zipfile

    fake = io.BytesIO()
    with zipfile.ZipFile(fake, "w") as archive:
        archive.writestr("__main__.py", "import sys, json; print(json.dumps(sys.argv[1:]))\n")
    settings = json.dumps({"serve_script": str(tmp_path / "kit" / "serve.sh")})
    run_dir = tmp_path / "kit" / "supervise"
    serve = "#!/bin/bash\nexec vllm serve 'a b'\n"
    done = subprocess.run(
        [
            "python3",
            "-c",
            program_source("supervise/boot.py"),
            str(run_dir),
            serve,
            base64.b64encode(fake.getvalue()).decode(),
            settings,
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["entry", str(run_dir)]
    assert (tmp_path / "kit" / "serve.sh").read_text() == serve
    assert (run_dir / "supervise.json").read_text() == settings

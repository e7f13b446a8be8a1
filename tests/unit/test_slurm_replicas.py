"""`kit slurm` with model.dp_lb router (issue 29): one array task per replica and vLLM's router as
a job of its own (kit.plan.slurm_replicas). The launchers' shape, their refusals, and both run
under bash with recording stubs for SLURM, Docker and curl, hostile values arriving verbatim.
The real thing runs in tests/slurm/test_slurm_router.py."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kit.config import KitConfig
from kit.errors import ConfigError
from kit.plan.slurm import check_slurm_config
from kit.plan.slurm_replicas import (
    plan_replicas_launcher,
    plan_router_files,
    plan_router_launcher,
    replica_config,
    replica_scripts,
    router_launcher_path,
)
from kit.runtime.slurm import parse_replica_rows, parse_replicas_job, parse_squeue
from tests.conftest import fake_secret, make_config, shellcheck_text


def router_config(nodes: int = 1, gpus: int = 8, tp: int = 4, dp: int = 2, **overrides: object) -> KitConfig:
    base: dict[str, object] = {
        "backend": "mp",
        "runtime": "docker",
        "nodes": nodes,
        "gpus_per_node": gpus,
        "model.tp": tp,
        "model.pp": 1,
        "model.dp": dp,
        "model.dp_lb": "router",
        "image": "vllm/vllm-openai:v0.33.0",
        "slurm.time": "01:00:00",
    }
    base.update(overrides)
    return make_config(**base)


def task_block(text: str, index: int) -> str:
    """The array task's part of the launcher's `case` that picks its replica's scripts."""
    start = text.index(f"\n  {index})\n    KIT_REPLICA_PORT=")
    return text[start : text.index("\n    ;;\n", start)]


# ---- the launchers' shape ----------------------------------------------------------------------


def test_two_tp4_replicas_are_an_array_of_two_tasks_each_with_its_gpus_and_port() -> None:
    config = router_config(nodes=1, gpus=8, tp=4, dp=2)
    text = plan_replicas_launcher(config)
    shellcheck_text(text)
    assert "#SBATCH --array=0-1" in text and "#SBATCH --nodes=1" in text
    assert "#SBATCH --gpus-per-task=4" in text  # one replica's TP×PP, never the node's 8
    for k in (0, 1):
        block = task_block(text, k)
        assert f"KIT_REPLICA_PORT={8100 + k}" in block
        assert f"--port {8100 + k}" in block and "--tensor-parallel-size 4" in block
        assert "--data-parallel" not in block and "CUDA_VISIBLE_DEVICES" not in block and "--device-ids" not in block
        assert f"    {k}:0)\n" in text and f"--label=kit.replica={k}" in text
    # Docker takes the step's GPUs (SLURM_STEP_GPUS); every container is labelled with the array's job
    assert """'--gpus="device='"${KIT_GPUS}"'"'""" in text and "--gpus=all" not in text
    assert '--label=kit.slurm-job="${SLURM_ARRAY_JOB_ID}"' in text
    # the router finds the task through its comment; the readiness wait is the replica's
    assert 'Comment="http://${KIT_HEAD_ADDRESS}:${KIT_REPLICA_PORT}"' in text
    assert 'health="http://${KIT_HEAD_ADDRESS}:${KIT_REPLICA_PORT}/health"' in text
    assert 'scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in plan_replicas_launcher(
        router_config(nodes=1, gpus=8, tp=4, dp=2, **{"slurm.requeue": True})
    )
    assert "KIT_REPLICA_READY" in text and "KIT_SERVER_READY" not in text.split("set -euo pipefail", 1)[1]


def test_a_replica_over_two_nodes_is_a_task_of_two_nodes_meeting_at_its_first() -> None:
    config = router_config(nodes=4, gpus=8, tp=16, dp=2)  # TP16 × DP2 over 4 × 8 GPUs
    text = plan_replicas_launcher(config)
    shellcheck_text(text)
    assert "#SBATCH --array=0-1" in text and "#SBATCH --nodes=2" in text and "#SBATCH --gpus-per-task=8" in text
    rc = replica_config(config, 1)
    scripts = replica_scripts(rc, 1)
    head, worker = scripts["KIT_HEAD_SCRIPT"], scripts["KIT_WORKER_SCRIPT"]
    for script in (head, worker):
        assert "--nnodes 2" in script and "--master-port 29501" in script
        assert '--master-addr="${KIT_REPLICA_HEAD_ADDRESS}"' in script
    assert "--node-rank 0" in head and "--port 8101" in head and "--headless" not in head
    assert '--node-rank "${KIT_NODE_RANK}"' in worker and "--headless" in worker and "--port" not in worker
    assert "    1:*)\n" in text  # task 1's other node runs the headless part
    assert '--env=KIT_REPLICA_HEAD_ADDRESS="${KIT_HEAD_ADDRESS}"' in text


def test_supervised_replicas_each_run_kits_supervisor_with_their_own_ports() -> None:
    """supervise.enabled: every task's containers run kit's supervisor around its replica's serve
    scripts (the same entry as a supervised job), with the replica's settings: its API port, its
    own supervisor port (tasks may share a node), one engine, no router to call (the router's job
    follows the replicas' health)."""
    config = router_config(nodes=4, gpus=8, tp=16, dp=2, **{"supervise.enabled": True})
    text = plan_replicas_launcher(config)
    shellcheck_text(text)
    assert 'KIT_SUPERVISE_TOKEN="$(od -An -N16' in text  # made in the job, never written here
    assert '>"${KIT_JOB_TMP}/kit/supervise/token"' in text
    for k in (0, 1):
        block = task_block(text, k)
        for var in ("KIT_SUPERVISE_BUNDLE", "KIT_SUPERVISE_JSON", "KIT_HEAD_SERVE_SCRIPT", "KIT_WORKER_SERVE_SCRIPT"):
            assert f"export {var}=" in block, var
        doc = json.loads(shlex.split(block.split("export KIT_SUPERVISE_JSON=", 1)[1])[0])  # one quoted word
        assert (doc["api_port"], doc["port"], doc["engines"]) == (8100 + k, 29570 + k, ["0"])
        assert doc["nodes"] == ["head", "worker-1"] and doc["router_url"] is None
    for part in ("HEAD", "WORKER"):  # each task's containers get their serve script and the settings
        args = rf'"\$\{{KIT_{part}_SERVE_SCRIPT\}}"\s+"\$\{{KIT_SUPERVISE_BUNDLE\}}"\s+"\$\{{KIT_SUPERVISE_JSON\}}"'
        assert len(re.findall(args, text)) == 2, part
    unsupervised = plan_replicas_launcher(router_config(nodes=4, gpus=8, tp=16, dp=2))
    assert "KIT_SUPERVISE" not in unsupervised


def test_the_router_job_runs_kits_router_and_registers_replicas_through_the_admin_endpoint(tmp_path: Path) -> None:
    key = tmp_path / "api key"
    secret = fake_secret("sk-", "router-job-key")
    key.write_text(secret)
    config = router_config(api_key_file=str(key), **{"router.policy": "power_of_two", "slurm.requeue": True})
    text = plan_router_launcher(config)
    shellcheck_text(text)
    assert secret not in text
    assert "#SBATCH --nodes=1" in text and "#SBATCH --cpus-per-task=1" in text and "gpus" not in text.split("#\n")[0]
    assert "#SBATCH --requeue" in text and "--array" not in text
    assert "kit/vllm-router:0.1.17" in text and "exec python3 /opt/kit/kit_router.py" in text
    assert "--policy\n      power_of_two" in text
    assert "/add_worker?url=" in text and "/remove_worker?url=" in text
    # the key: a header curl reads on stdin, never an argument; the router only gets validation URLs
    assert "-H @-" in text and "Bearer" in text and "--api-key-validation-url" in text
    assert 'Comment="kit-replicas-job=${KIT_REPLICAS_JOB}"' in text


def test_kit_slurm_writes_both_files_and_submits_the_array_then_the_router(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kit.cli import cli

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text(
        f'#!/bin/sh\necho "$@" >> {tmp_path}/sbatch.log\n[ -z "$3" ] && echo 41 || echo 42\n'
    )
    (bindir / "sbatch").chmod(0o755)
    out = tmp_path / "serve.sbatch"
    args = ["slurm", "--runtime", "docker", "--backend", "mp", "--nodes", "1", "--gpus-per-node", "2", "--tp", "1"]
    args += ["--dp", "2", "--set", "model.dp_lb=router", "-o", str(out), "--submit", "--json"]
    result = CliRunner().invoke(cli, args, env={"PATH": f"{bindir}:{os.environ['PATH']}"})
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output.splitlines()[-1] if result.output.startswith("{") is False else result.output)
    done = doc["result"]
    assert done["replicas_job"] == "41" and done["job_id"] == "42"
    assert done["router_launcher"] == str(tmp_path / "serve-router.sbatch")
    calls = (tmp_path / "sbatch.log").read_text().splitlines()
    assert calls == [f"--parsable {out}", f"--parsable {tmp_path / 'serve-router.sbatch'} 41"]
    assert set(plan_router_files(router_config(), str(out))) == {str(out), str(tmp_path / "serve-router.sbatch")}
    assert router_launcher_path("/x/kit-a.sbatch") == "/x/kit-a-router.sbatch"
    assert router_launcher_path("/x.d/launcher") == "/x.d/launcher-router"


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        ({"runtime": "pyxis", "image": "/i/vllm.sqsh"}, "runtime", "runtime docker or apptainer"),
        (
            {"runtime": "apptainer", "image": "/i/vllm.sif"},
            "router.image",
            "kit build router --runtime apptainer",
        ),
        ({"supervise.enabled": True, "ports.supervisor": 8999}, "ports.supervisor", "ports.supervisor 8999-9000"),
        ({"ports.replica": 8999}, "ports.replica", "ports.replica 8999-9000"),
    ],
)
def test_what_router_replicas_under_slurm_refuse_is_one_line_with_key_and_fix(
    overrides: dict[str, object], key: str, words: str
) -> None:
    config = router_config(**{"ports.verify": 9000, **overrides})
    with pytest.raises(ConfigError) as err:
        check_slurm_config(config, {})
    assert err.value.key == key and words in str(err.value) + (err.value.hint or ""), str(err.value)
    assert "\n" not in str(err.value)


def test_replica_head_is_refused_under_slurm() -> None:
    config = router_config(replica_head="10.0.0.5")
    with pytest.raises(ConfigError) as err:
        check_slurm_config(config, {"replica_head": "kit.yaml"})
    assert err.value.key == "replica_head" and "unset replica_head" in (err.value.hint or "")


def test_squeue_and_comment_parsers() -> None:
    rows = "26_0|RUNNING|vm|x\n26_1|PENDING|vm|y\n"
    assert parse_squeue("|".join(["26_[0-1]", "PENDING", "0:00", "1:00", "1", "(None)", "kit", "debug"]), "26")
    assert parse_squeue(rows, "2") is None
    assert parse_replicas_job("kit-replicas-job=26\n") == "26"
    assert parse_replicas_job("kit-replicas-job=26; rm -rf /") is None and parse_replicas_job("(null)") is None
    got = parse_replica_rows("26_0|RUNNING|http://10.0.0.1:8100\n26_1|PENDING|(null)\n")
    assert got == [
        {"task": "26_0", "state": "RUNNING", "url": "http://10.0.0.1:8100"},
        {"task": "26_1", "state": "PENDING", "url": ""},
    ]


# ---- both launchers run under bash, with recording stubs --------------------------------------

RECORDER = f"""#!{sys.executable} -S
import json, os, sys
name, args = sys.argv[1], sys.argv[2:]  # `record "${{0##*/}}" "$@"` in each stub
stdin = sys.stdin.read() if name == "curl" and "@-" in args else ""
with open(os.environ["KIT_RECORD"], "a") as f:
    f.write(json.dumps([name, *args, {{"stdin": stdin}}]) + "\\n")
"""
STUBS = {
    "getent": 'echo "10.9.0.1      STREAM node1"\n',
    "hostname": 'if [ "${1:-}" = -I ]; then echo 10.9.0.1; else echo node1; fi\n',
    "ip": r"""case "$*" in
  *"route get"*) echo "$4 dev ib0 src 10.9.0.1 uid 0" ;;
  *"addr show"*) echo "3: ib0    inet 10.9.0.1/16 brd 10.9.255.255 scope global ib0" ;;
esac
""",
    "srun": 'while [ "${1#-}" != "$1" ]; do shift; done\nSLURM_NODEID=0 exec "$@"\n',
    "scontrol": 'record "${0##*/}" "$@"\n[ "$1" = show ] && echo node1\nexit 0\n',
    "scancel": 'record "${0##*/}" "$@"\n',
    "vllm": 'record "${0##*/}" "$@"\n',
}


SCENARIO = f"""#!{sys.executable} -S
# One stub for squeue, curl, docker, apptainer and sleep, driven by KIT_SCENARIO: a JSON list of rounds of the
# router job's loop, each {{"running": [task URLs], "healthy": [URLs answering /health]}}. Each
# `squeue -o %i` (the loop's first call) starts the next round; past the last, the array is gone.
import json, os, subprocess, sys, time
name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
record, rounds = os.environ["KIT_RECORD"], json.loads(open(os.environ["KIT_SCENARIO"]).read())
counter = record + ".round"
now = int(open(counter).read()) if os.path.exists(counter) else -1
stdin = sys.stdin.read() if name == "curl" and "@-" in args else ""
given = {{"stdin": stdin}}
if name == "apptainer":  # the container's environment (APPTAINERENV_NAME), never an argument
    given["env"] = {{k: v for k, v in os.environ.items() if k.startswith("APPTAINERENV_")}}
with open(record, "a") as f:
    f.write(json.dumps([name, *args, given, now]) + "\\n")
if name == "sleep":
    time.sleep(0.05)
elif name == "squeue" and "%i" in args:
    now += 1
    open(counter, "w").write(str(now))
    print("77_0" if now < len(rounds) else "")
elif name == "squeue" and "RUNNING" in args:
    print("\\n".join(rounds[now]["running"]))
elif name == "squeue":
    print("1:00:00")
elif name == "curl" and "-w" in args:
    print("ok\\n200", end="")
elif name == "curl":
    url = args[-1].removesuffix("/health")
    sys.exit(0 if ":8000" in url or url in rounds[now]["healthy"] else 7)
elif name == "apptainer" and any("/opt/kit/kit_router.py" in a for a in args):
    os.execv("/bin/sleep", ["sleep", "20"])  # the router runs until the job's kill -TERM
elif name == "docker" and args[0] == "run" and "--label=kit.role=router" in args:
    open(record + ".router", "w").write(str(os.getpid()))
    os.execv("/bin/sleep", ["sleep", "20"])  # the router runs until `docker stop`
elif name == "docker" and args[0] == "stop" and os.path.exists(record + ".router"):
    subprocess.run(["kill", open(record + ".router").read()], check=False)
"""


def stub_dir(tmp_path: Path, rounds: list[dict[str, list[str]]] | None = None) -> Path:
    """The stubs; squeue, curl, docker and sleep are SCENARIO (below), playing `rounds` (by
    default one round: task 1's replica running and healthy, then the array gone)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "record").write_text(RECORDER)
    for name, body in STUBS.items():
        (bindir / name).write_text("#!/bin/bash\n" + body)
    (bindir / "scenario").write_text(SCENARIO)
    for name in ("squeue", "curl", "docker", "apptainer", "sleep"):
        (bindir / name).symlink_to(bindir / "scenario")
    for path in bindir.iterdir():
        path.chmod(0o755)
    task = "http://10.9.0.7:8101"
    default = [{"running": [task, "(null)"], "healthy": [task, "http://10.9.0.1:8101"]}]
    (tmp_path / "rounds.json").write_text(json.dumps(default if rounds is None else rounds))
    return bindir


def stub_env(tmp_path: Path, bindir: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "KIT_RECORD": str(tmp_path / "record.jsonl"),
        "KIT_SCENARIO": str(tmp_path / "rounds.json"),
        **extra,
    }


def calls(tmp_path: Path) -> list[list[object]]:
    path = tmp_path / "record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


HOSTILE = ["org/model with spaces", "$(touch PWNED)", "`touch PWNED`", "a; touch PWNED", "x'y\"z\\"]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_both_launchers_run_and_hostile_values_stay_one_argument(hostile: str, tmp_path: Path) -> None:
    key = tmp_path / f"key {hostile[:4]}"
    secret = fake_secret("sk-", "stub-run-key")
    key.write_text(secret)
    checked = router_config(
        nodes=1, gpus=2, tp=1, dp=2, accelerator="cpu", api_key_file=str(key), **{"slurm.partition": "p; touch PWNED"}
    )
    # Set after validation: the launchers must hold up even for a value that got past the config layer.
    model = dataclasses.replace(checked.model, id=hostile, served_name=hostile)
    token = tmp_path / "hf token"
    token.write_text(fake_secret("hf_", "stub-run-token"))
    cfg = dataclasses.replace(
        checked, model=model, hf_cache=str(tmp_path / f"hf {hostile[:6]}"), hf_token_file=str(token)
    )
    bindir = stub_dir(tmp_path)
    env = stub_env(
        tmp_path, bindir, SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="node1", SLURM_SUBMIT_HOST="login1", USER="alice"
    )
    # replica 1: array task 1 of job 77 (its own job id 79)
    launcher = tmp_path / "replicas.sbatch"
    launcher.write_text(plan_replicas_launcher(cfg))
    run_env = {**env, "SLURM_JOB_ID": f"79{os.getpid()}", "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "1"}
    done = subprocess.run(
        ["bash", str(launcher)], env=run_env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "KIT_REPLICA_READY url=http://10.9.0.1:8101" in done.stdout
    assert not (tmp_path / "PWNED").exists()
    recorded = calls(tmp_path)
    # the task alone (JobId=77 would name every task of the array)
    assert ["scontrol", "update", "JobId=77_1", "Comment=http://10.9.0.1:8101", {"stdin": ""}] in recorded
    [run] = [c for c in recorded if c[:2] == ["docker", "run"]]
    assert "--label=kit.slurm-job=77" in run and "--label=kit.replica=1" in run
    script = run[run.index("-c") + 1]
    assert script == replica_scripts(replica_config(cfg, 1), 1)["KIT_HEAD_SCRIPT"]  # byte for byte
    assert f"--volume={key}:/run/kit/secrets/api_key:ro" in run
    assert secret not in launcher.read_text() and secret not in json.dumps(recorded)
    # the router's job, given the array's job id: it adds the running task's replica, then ends
    (tmp_path / "record.jsonl").unlink()
    router = tmp_path / "router.sbatch"
    router.write_text(plan_router_launcher(cfg))
    done = subprocess.run(
        ["bash", str(router), "77"], env={**env, "SLURM_JOB_ID": "78"}, cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "PWNED").exists()
    out = done.stdout
    assert "kit: replica http://10.9.0.7:8101: routed" in out, out
    ready = re.search(r"KIT_SERVER_READY url=http://10\.9\.0\.1:8000 model=(.*) tunnel: ssh -N -L ", out)
    assert ready, out
    quoted = subprocess.run(["bash", "-c", 'printf %q "$1"', "_", hostile], capture_output=True, text=True).stdout
    assert ready.group(1) == quoted  # the served name, verbatim (one %q word)
    recorded = calls(tmp_path)
    [run] = [c for c in recorded if c[:2] == ["docker", "run"]]
    assert "--name=kit-llama-router-78" in run and "--label=kit.slurm-job=78" in run
    assert run[-4:-2] == ["--api-key-validation-url", "http://10.9.0.7:8101/v1/models"]  # then stdin, round
    [add] = [c for c in recorded if c[0] == "curl" and any("/add_worker" in str(a) for a in c)]
    assert "http://10.9.0.1:8000/add_worker?url=http%3A%2F%2F10.9.0.7%3A8101" in add
    assert add[-2] == {"stdin": f"Authorization: Bearer {secret}\n"}  # the key on stdin only
    assert all(secret not in json.dumps([a for a in c if not isinstance(a, dict)]) for c in recorded)
    assert ["scontrol", "update", "JobId=78", "Comment=kit-replicas-job=77", {"stdin": ""}] in recorded
    assert "the replicas' job 77 has left the queue; stopping the router" in out
    assert any(c[:2] == ["docker", "stop"] for c in recorded)


def test_apptainer_replicas_and_their_router_run_from_sif_files(tmp_path: Path) -> None:
    """runtime apptainer (a fake: Apptainer cannot be installed here): each task's node is an
    `apptainer exec` of the engine's SIF with its environment in APPTAINERENV_ variables, the
    router an `apptainer exec` of the router's SIF, stopped by a signal (no Docker anywhere)."""
    key = tmp_path / "key"
    secret = fake_secret("sk-", "apptainer-key")
    key.write_text(secret)
    images = {"image": str(tmp_path / "vllm.sif"), "router.image": str(tmp_path / "router.sif")}
    for path in images.values():
        Path(path).write_bytes(b"")
    token = tmp_path / "token"
    token.write_text(fake_secret("hf_", "apptainer-token"))
    files = {"api_key_file": str(key), "hf_token_file": str(token), "hf_cache": str(tmp_path / "hf")}
    cfg = router_config(nodes=1, gpus=2, tp=1, dp=2, accelerator="cpu", runtime="apptainer", **files, **images)
    check_slurm_config(cfg, {})
    bindir = stub_dir(tmp_path)
    env = stub_env(
        tmp_path, bindir, SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="node1", SLURM_SUBMIT_HOST="login1", USER="al"
    )
    launcher = tmp_path / "replicas.sbatch"
    launcher.write_text(plan_replicas_launcher(cfg))
    shellcheck_text(launcher.read_text())
    task = {**env, "SLURM_JOB_ID": "79", "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "1"}
    done = subprocess.run(["bash", str(launcher)], env=task, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "KIT_REPLICA_READY url=http://10.9.0.1:8101" in done.stdout
    [run] = [c for c in calls(tmp_path) if c[:2] == ["apptainer", "exec"]]
    assert images["image"] in run and f"--bind={key}:/run/kit/secrets/api_key:ro" in run
    assert not any(str(a).startswith("--env") for a in run) and not any(c[0] == "docker" for c in calls(tmp_path))
    given = run[-2]
    assert isinstance(given, dict) and given["env"]["APPTAINERENV_KIT_CLUSTER"] == cfg.cluster
    assert given["env"]["APPTAINERENV_VLLM_HOST_IP"] == "10.9.0.1"
    (tmp_path / "record.jsonl").unlink()
    router = tmp_path / "router.sbatch"
    router.write_text(plan_router_launcher(cfg))
    shellcheck_text(router.read_text())
    done = subprocess.run(
        ["bash", str(router), "77"], env={**env, "SLURM_JOB_ID": "78"}, cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "kit: replica http://10.9.0.7:8101: routed" in out and "stopping the router" in out, out
    recorded = calls(tmp_path)
    [run] = [c for c in recorded if c[:2] == ["apptainer", "exec"]]
    assert run[2] == images["router.image"] and "/opt/kit/kit_router.py" in run[5]
    assert run[-4:-2] == ["--api-key-validation-url", "http://10.9.0.7:8101/v1/models"]
    assert run[-2]["env"] == {"APPTAINERENV_KIT_CLUSTER": cfg.cluster}  # type: ignore[index]
    assert not any(c[0] == "docker" for c in recorded)
    assert secret not in router.read_text() and secret not in json.dumps([c[:-2] for c in recorded])


def test_the_router_job_refuses_a_missing_or_odd_array_job_id(tmp_path: Path) -> None:
    bindir = stub_dir(tmp_path)
    router = tmp_path / "router.sbatch"
    router.write_text(plan_router_launcher(router_config()))
    env = stub_env(tmp_path, bindir)
    for args in ([], ["12; rm -rf /"]):
        done = subprocess.run(
            ["bash", str(router), *args], env={**env, "SLURM_JOB_ID": "5"}, capture_output=True, text=True
        )
        assert done.returncode == 1 and "give this job the replicas' array job id" in done.stderr
        assert not (tmp_path / "record.jsonl").exists()  # nothing ran


# ---- kit status/down --slurm of the router's job reach the replicas' array ---------------------

FAKE_SQUEUE = r"""#!/bin/bash
# squeue -h -j JOB -o FORMAT: job 42 (the router's, its comment naming 41) and array 41 (two tasks),
# each gone once scancel touched $KIT_FAKE_DIR/cancelled-JOB.
job="$3" format="$5"
[ -e "${KIT_FAKE_DIR}/cancelled-${job}" ] && { echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1; }
case "${job}:${format}" in
  42:%k) echo "kit-replicas-job=41" ;;
  42:*) echo "42|RUNNING|0:10|9:50|1|vm|kit-router|debug" ;;
  41:%i\|%T\|%k) echo "41_0|RUNNING|http://10.0.0.1:8100"; echo "41_1|RUNNING|http://10.0.0.1:8101" ;;
  41:%k) echo "http://10.0.0.1:8100" ;;
  41:*) echo "41_0|RUNNING|0:10|9:50|1|vm|kit|debug"; echo "41_1|RUNNING|0:10|9:50|1|vm|kit|debug" ;;
esac
"""


def test_status_and_down_of_the_router_job_reach_its_replicas(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kit.runtime.slurm import Slurm

    bindir = tmp_path / "bin"
    bindir.mkdir()
    stubs = {
        "squeue": FAKE_SQUEUE,
        "scontrol": "#!/bin/sh\nexit 1\n",
        "scancel": '#!/bin/sh\necho "$@" >> "$KIT_FAKE_DIR/scancel.log"; touch "$KIT_FAKE_DIR/cancelled-$1"\n',
    }
    for name, body in stubs.items():
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("KIT_FAKE_DIR", str(tmp_path))
    removed: list[str] = []
    slurm = Slurm(remove_containers=lambda job: removed.append(job) or [f"kit-c-{job}"])

    status = slurm.status("42")
    assert status.replicas_job == "41" and [r["task"] for r in status.replicas] == ["41_0", "41_1"]
    assert "  replicas: job 41" in status.render() and "41_1: RUNNING http://10.0.0.1:8101" in status.render()
    array = slurm.status("41")  # the array's own id: its first task's row, no replicas of its own
    assert array.in_queue and array.state == "RUNNING" and array.replicas_job is None

    done = slurm.cancel("42", timeout=5)
    assert done.gone and done.replicas is not None and done.replicas.gone and done.replicas.was_in_queue
    assert (tmp_path / "scancel.log").read_text().split() == ["42", "41"] and sorted(removed) == ["41", "42"]
    assert done.to_dict()["replicas"]["job_id"] == "41"
    assert "replicas: job 41: cancelled (RUNNING)" in done.render()


# ---- the router job's loop, round by round (a scripted SLURM and replicas) ---------------------


def run_router_rounds(tmp_path: Path, rounds: list[dict[str, list[str]]]) -> tuple[str, list[list[object]]]:
    key = tmp_path / "key"
    key.write_text(fake_secret("sk-", "rounds-key"))
    cfg = router_config(nodes=1, gpus=2, tp=1, dp=2, accelerator="cpu", api_key_file=str(key))
    bindir = stub_dir(tmp_path, rounds)
    router = tmp_path / "router.sbatch"
    router.write_text(plan_router_launcher(cfg))
    env = stub_env(
        tmp_path,
        bindir,
        SLURM_JOB_ID="78",
        SLURM_JOB_NUM_NODES="1",
        SLURM_JOB_NODELIST="node1",
        SLURM_SUBMIT_HOST="login1",
        USER="alice",
    )
    done = subprocess.run(
        ["bash", str(router), "77"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr, calls(tmp_path)


def router_runs(recorded: list[list[object]]) -> list[list[str]]:
    """Each router start: the replicas it checks keys against."""
    runs = [c for c in recorded if c[:2] == ["docker", "run"]]
    return [[str(a).removesuffix("/v1/models") for a in c if str(a).endswith("/v1/models")] for c in runs]


A, B, C = "http://10.9.0.7:8100", "http://10.9.0.8:8101", "http://10.9.0.9:8100"


def test_the_router_checks_keys_against_every_running_task_and_a_cancelled_one_is_taken_out(tmp_path: Path) -> None:
    # B still loads when A first answers; then A's task is cancelled: B checks keys, nothing restarts.
    out, recorded = run_router_rounds(
        tmp_path,
        [
            {"running": [A, B], "healthy": [A]},
            {"running": [A, B], "healthy": [A, B]},
            {"running": [B], "healthy": [B]},
            {"running": [B], "healthy": [B]},
        ],
    )
    assert router_runs(recorded) == [[A, B]], out
    assert f"replica {B}: routed" in out
    assert f"replica {A}: its task is no longer running; taken out of the router (HTTP 200)" in out, out
    removes = [c for c in recorded if c[0] == "curl" and any("/remove_worker" in str(a) for a in c)]
    assert len(removes) == 1 and any("10.9.0.7%3A8100" in str(a) for a in removes[0])
    assert "restarting the router" not in out


def test_the_router_restarts_only_when_no_task_it_checks_keys_against_runs(tmp_path: Path) -> None:
    # Both first tasks leave; task 0 is requeued onto another node (a new URL): the router restarts,
    # checking keys against it, and routes it.
    out, recorded = run_router_rounds(
        tmp_path,
        [
            {"running": [A, B], "healthy": [A, B]},
            {"running": [C], "healthy": []},
            {"running": [C], "healthy": [C]},
        ],
    )
    assert router_runs(recorded) == [[A, B], [C]], out
    for url in (A, B):
        assert f"replica {url}: its task is no longer running; taken out of the router" in out
    assert out.index("none of the replicas that check keys answers; restarting the router") < out.index(
        f"replica {C}: routed"
    )
    assert not [c for c in recorded if c[0] == "curl" and any("/remove_worker" in str(a) for a in c)]

"""Golden tests for every generated artefact, shellcheck on every script, and the container spec."""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from kit.plan.container_args import (
    to_apptainer_env,
    to_apptainer_exec_argv,
    to_apptainer_start_argv,
    to_docker_argv,
    to_docker_kwargs,
)
from kit.plan.network import NodeNet
from kit.plan.node import plan_node
from kit.plan.roles import Role
from kit.plan.scripts import serve_script
from kit.plan.vllm import vllm_serve_argv
from tests.conftest import make_config, shellcheck_bin

HEAD = Role("head", 0)
WORKER = Role("worker", 1)
NETS = {"head": NodeNet("10.0.0.1", "ib0", "10.0.0.1"), "worker": NodeNet("10.0.0.2", "ib0", "10.0.0.1")}


def fmt_argv(argv: list[str]) -> str:
    """One option (with its value) per line, shell-quoted: readable goldens."""
    lines: list[str] = []
    for arg in argv:
        quoted = shlex.quote(arg)
        joinable = lines and lines[-1].startswith("-") and " " not in lines[-1] and "=" not in lines[-1]
        if joinable and not arg.startswith("-"):
            lines[-1] += " " + quoted
        else:
            lines.append(quoted)
    return " \\\n  ".join(lines) + "\n"


def role(name: str) -> Role:
    return HEAD if name == "head" else WORKER


@pytest.mark.parametrize("backend", ["ray", "mp"])
@pytest.mark.parametrize("who", ["head", "worker"])
def test_node_scripts_golden_and_shellcheck(
    backend: str, who: str, golden: Callable[[str, str], None], tmp_path: Path
) -> None:
    cfg = make_config(backend=backend)
    spec = plan_node(cfg, role(who), NETS[who], has_infiniband=True)
    golden(f"node_{backend}_{who}.sh", spec.script)
    scripts = [("node.sh", spec.script)]
    if backend == "mp" or who == "head":
        serve = serve_script(cfg, role(who))
        golden(f"serve_{backend}_{who}.sh", serve)
        scripts.append(("serve.sh", serve))
    for name, text in scripts:
        path = tmp_path / name
        path.write_text(text)
        result = subprocess.run([shellcheck_bin(), "-s", "bash", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("who", ["head", "worker"])
def test_docker_and_apptainer_forms_golden(who: str, golden: Callable[[str, str], None]) -> None:
    spec = plan_node(make_config(), role(who), NETS[who], has_infiniband=True)
    kwargs = to_docker_kwargs(spec)
    assert kwargs["command"][1] == spec.script
    kwargs["command"][1] = f"<node_ray_{who}.sh>"
    golden(f"docker_kwargs_{who}.json", json.dumps(kwargs, indent=2, sort_keys=True) + "\n")
    argv = to_docker_argv(spec)
    argv[argv.index(spec.script)] = f"<node_ray_{who}.sh>"
    golden(f"docker_argv_{who}.txt", fmt_argv(argv))
    # Apptainer's environment is APPTAINERENV_ variables of both commands, never --env (issue 20).
    env = ["env", *(f"{k}={v}" for k, v in to_apptainer_env(spec.env).items())]
    app = [*env, *to_apptainer_start_argv(spec, "/images/vllm.sif"), "&&", *env, *to_apptainer_exec_argv(spec)]
    app[app.index(spec.script)] = f"<node_ray_{who}.sh>"
    golden(f"apptainer_{who}.txt", fmt_argv(app))


def test_container_spec_essentials() -> None:
    spec = plan_node(make_config(), WORKER, NETS["worker"], has_infiniband=True)
    kw = to_docker_kwargs(spec)
    assert kw["network_mode"] == "host" and kw["ipc_mode"] == "host"
    assert kw["device_requests"] == [{"count": -1, "capabilities": [["gpu"]]}]
    assert "/data/hf:/kit/hf-cache:rw" in kw["volumes"]
    assert "/etc/kit/hf_token:/run/kit/secrets/hf_token:ro" in kw["volumes"]
    # One host path mounted twice keeps both mounts (docker-py's dict form would keep one).
    twice = to_docker_kwargs(plan_node(make_config(mounts=["/data/hf:/models:ro"]), WORKER, NETS["worker"]))
    assert {"/data/hf:/kit/hf-cache:rw", "/data/hf:/models:ro"} <= set(twice["volumes"])
    env = kw["environment"]
    assert env["VLLM_HOST_IP"] == "10.0.0.2" and env["KIT_HEAD_ADDRESS"] == "10.0.0.1"
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ib0"
    assert env["HF_TOKEN_PATH"] == "/run/kit/secrets/hf_token"
    assert "HF_TOKEN" not in env and "VLLM_API_KEY" not in env
    assert kw["devices"] == ["/dev/infiniband:/dev/infiniband"] and kw["cap_add"] == ["IPC_LOCK"]
    assert kw["ulimits"] == [{"name": "memlock", "soft": -1, "hard": -1}]
    assert kw["labels"]["kit.cluster"] == "llama" and kw["labels"]["kit.role"] == "worker"
    assert kw["labels"]["kit.rank"] == "1" and kw["name"] == "kit-llama-worker-1"


def test_no_infiniband_no_rdma_flags_and_cpu_has_no_gpus() -> None:
    cfg = make_config(infiniband="auto", accelerator="cpu", ipc_host=False, shm_size="2g")
    kw = to_docker_kwargs(plan_node(cfg, HEAD, NETS["head"], has_infiniband=False))
    assert not {"devices", "cap_add", "ulimits", "device_requests", "ipc_mode"} & set(kw)
    assert kw["shm_size"] == "2g"


def test_gpu_selection_and_simulation_network() -> None:
    cfg = make_config(gpus="4,5,6,7", gpus_per_node=4, nodes=2, network="kitnet")
    spec = plan_node(cfg, HEAD, NodeNet("172.30.77.10", "eth0", "172.30.77.10"))
    kw = to_docker_kwargs(spec)
    assert kw["device_requests"] == [{"device_ids": ["4", "5", "6", "7"], "capabilities": [["gpu"]]}]
    assert kw["network"] == "kitnet" and "network_mode" not in kw and spec.ip == "172.30.77.10"
    assert kw["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert "--ip=172.30.77.10" in to_docker_argv(spec)
    assert kw["networking_config"] == {"kitnet": {"ipv4_address": "172.30.77.10"}}


def test_vllm_argv_per_backend() -> None:
    ray = [str(a) for a in vllm_serve_argv(make_config(backend="ray"), HEAD)]
    assert ray[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct"]
    assert ray[ray.index("--tensor-parallel-size") + 1] == "8"
    assert ray[ray.index("--pipeline-parallel-size") + 1] == "2"
    assert ray[ray.index("--distributed-executor-backend") + 1] == "ray"
    assert "--api-key" not in ray
    mp = [str(a) for a in vllm_serve_argv(make_config(backend="mp"), WORKER)]
    assert mp[mp.index("--nnodes") + 1] == "2" and "--headless" in mp
    assert mp[mp.index("--node-rank") + 1] == "${KIT_NODE_RANK}"
    assert "--headless" not in [str(a) for a in vllm_serve_argv(make_config(backend="mp"), HEAD)]

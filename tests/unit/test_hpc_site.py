"""Containers as an HPC site runs them (issue 28): every path kit mounts or writes is reachable for
a user who is not root (Apptainer runs as the calling user; the vLLM image's /root is mode 0700),
Docker's --user/--read-only stand-in, Apptainer's site options, physical GPU ids where the runtime
does not renumber, and a local model directory mounted read-only at its own path.

The Apptainer forms are pure argv here (no apptainer binary can exist on these machines: the
adapter is tested against a recording fake in test_apptainer.py); the Docker stand-in runs for
real in tests/integration/test_serve.py (non-root, read-only, two nodes serving)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kit.plan import paths
from kit.plan.container_args import (
    to_apptainer_start_argv,
    to_docker_argv,
    to_docker_kwargs,
    to_edf,
    to_pyxis_options,
)
from kit.plan.network import NodeNet
from kit.plan.node import plan_node
from kit.plan.roles import HEAD
from kit.plan.vllm import vllm_serve_argv
from tests.conftest import make_config, run_kit

NET = NodeNet("10.0.0.1", "eth0", "10.0.0.1")


@pytest.mark.parametrize("runtime", ["docker", "apptainer", "pyxis", "edf"])
def test_no_container_path_of_kit_lies_under_root(runtime: str) -> None:
    cfg = make_config(
        runtime=runtime,
        image="/images/vllm.sif" if runtime != "docker" else "vllm/vllm-openai:v0.11.0",
        **{"compile_cache.dir": "/scratch/cc", "ray_token_file": "/etc/kit/ray"},
    )
    spec = plan_node(cfg, HEAD, NET)
    targets = [m.target for m in spec.mounts] + [v for v in spec.env.values() if v.startswith("/")]
    assert targets and not [t for t in targets if t == "/root" or t.startswith("/root/")], targets
    constants = [v for k, v in vars(paths).items() if k.isupper() and isinstance(v, str)]
    assert not [c for c in constants if c.startswith("/root")]
    assert spec.env["HF_HOME"] == "/kit/hf-cache" and spec.env["VLLM_CACHE_ROOT"].startswith("/kit/compile-cache/")


def test_docker_user_and_read_only_reach_docker_run_and_docker_py() -> None:
    cfg = make_config(**{"docker.user": "4242:4343", "docker.read_only": True})
    spec = plan_node(cfg, HEAD, NET)
    kwargs = to_docker_kwargs(spec)
    assert kwargs["user"] == "4242:4343" and kwargs["read_only"] is True and kwargs["tmpfs"] == {"/tmp": ""}
    argv = to_docker_argv(spec)
    assert {"--user=4242:4343", "--read-only", "--tmpfs=/tmp"} <= set(argv)
    # a user the image has no home for: ~ is a writable folder of the node's /tmp
    assert kwargs["environment"]["HOME"] == paths.USER_HOME and kwargs["environment"]["USER"] == "kit"
    plain = to_docker_kwargs(plan_node(make_config(), HEAD, NET))
    assert not {"user", "read_only", "tmpfs"} & set(plain) and "HOME" not in plain["environment"]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("docker.user", "1000", "docker.user is for runtime docker"),
        ("docker.read_only", "true", "docker.read_only is for runtime docker"),
    ],
)
def test_docker_keys_are_refused_with_apptainer(key: str, value: str, message: str, kit_env: Path) -> None:
    args = ["up", "--dry-run", "--runtime", "apptainer", "--image", "/x.sif", "--set", f"{key}={value}"]
    code, _, err = run_kit(args)
    assert code == 3 and message in err and "Traceback" not in err, err


def test_apptainer_site_options_replace_nv() -> None:
    cfg = make_config(
        runtime="apptainer",
        image="/images/vllm.sif",
        **{"apptainer.gpu_args": ["--nvccli", "--writable-tmpfs"], "apptainer.extra_args": ["--bind=/scratch"]},
    )
    argv = to_apptainer_start_argv(plan_node(cfg, HEAD, NET), cfg.image, foreground=True)
    options = argv[2 : argv.index(cfg.image)]
    assert options[:3] == ["--nvccli", "--writable-tmpfs", "--bind=/scratch"] and "--nv" not in options
    cpu = make_config(runtime="apptainer", image="/i.sif", accelerator="cpu", **{"apptainer.extra_args": ["--x"]})
    cpu_argv = to_apptainer_start_argv(plan_node(cpu, HEAD, NET), cpu.image)
    assert "--nv" not in cpu_argv and "--x" in cpu_argv  # no GPU options without GPUs


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ("[--contain]", "--contain gives the node a private /tmp"),
        ("[-e]", "-e gives the node a cleaned environment"),
        ("[--containall=true]", "--containall gives the node"),
        ("[--bind, /scratch]", "'/scratch' is not one option word"),
        ("['--bind /a:/b']", "is not one option word"),
    ],
)
def test_apptainer_options_that_break_a_node_are_refused(items: str, message: str, kit_env: Path) -> None:
    args = ["up", "--dry-run", "--runtime", "apptainer", "--image", "/x.sif", "--set", f"apptainer.extra_args={items}"]
    code, _, err = run_kit(args)
    assert code == 3 and message in err and "apptainer.extra_args" in err, err


def test_apptainer_keys_are_refused_with_docker(kit_env: Path) -> None:
    code, _, err = run_kit(["up", "--dry-run", "--set", "apptainer.gpu_args=[--nvccli]"])
    assert code == 3 and "apptainer.gpu_args is for runtime apptainer" in err, err


@pytest.mark.parametrize(
    ("runtime", "version", "backend", "env", "flag"),
    [
        ("docker", "0.23.0", "mp", "0,1", None),  # Docker renumbers the selected GPUs
        ("apptainer", "0.23.0", "mp", "2,3", None),  # --nv shows every GPU: the physical ids
        ("docker", "0.24.0", "mp", None, "--device-ids=0,1"),
        ("apptainer", "0.24.0", "mp", None, "--device-ids=2,3"),
        ("apptainer", "0.24.0", "ray", "2,3", None),
    ],
)
def test_selected_gpus_are_numbered_as_the_container_sees_them(
    runtime: str, version: str, backend: str, env: str | None, flag: str | None
) -> None:
    image = "/images/vllm.sif" if runtime == "apptainer" else "vllm/vllm-openai:v0.11.0"
    cfg = make_config(
        runtime=runtime, image=image, vllm_version=version, backend=backend, gpus="2,3", gpus_per_node=2, nodes=1
    )
    spec = plan_node(cfg, HEAD, NET)
    assert spec.env.get("CUDA_VISIBLE_DEVICES") == env
    argv = [str(a) for a in vllm_serve_argv(cfg, HEAD)]
    assert (flag in argv) if flag else not any(a.startswith("--device-ids") for a in argv)
    if runtime == "docker":
        assert '--gpus="device=2,3"' in to_docker_argv(spec)  # the daemon selects by physical id


def test_a_local_model_directory_is_mounted_read_only_at_its_path(kit_env: Path) -> None:
    model = kit_env / "models" / "Llama-3.2-3B-Instruct"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"num_attention_heads": 24, "num_key_value_heads": 8}))
    code, out, err = run_kit(["up", "--dry-run", "--json", "--model", str(model)])
    assert code == 0, err
    plan = json.loads(out)["result"]
    assert f"{model}:{model}:ro" in plan["docker_kwargs"]["volumes"]
    script_args = plan["docker_argv"]
    assert f"--volume={model}:{model}:ro" in script_args
    # the same mount in every runtime's form
    cfg = make_config(runtime="apptainer", image="/i.sif", **{"model.id": str(model)})
    spec = plan_node(cfg, HEAD, NET)
    assert f"--bind={model}:{model}:ro" in to_apptainer_start_argv(spec, cfg.image)
    pyxis = [o for o in to_pyxis_options(spec, "/i.sqsh") if o.startswith("--container-mounts=")]
    assert f"{model}:{model}:ro" in pyxis[0].split(",")
    assert f"{model}:{model}:ro" in to_edf(spec, "/i.sqsh")["mounts"]
    assert str(model) in [str(a) for a in vllm_serve_argv(cfg, HEAD)][:3]


def test_a_missing_model_directory_is_refused_with_the_fix(kit_env: Path) -> None:
    code, out, err = run_kit(["up", "--dry-run", "--model", str(kit_env / "nowhere")])
    assert code == 3 and out == "", err
    assert "model.id" in err and "is not a directory on this host" in err and "config.json" in err
    empty = kit_env / "empty"
    empty.mkdir()
    code, _, err = run_kit(["up", "--dry-run", "--model", "./empty"])  # relative: from here, made absolute
    assert code == 3 and f"{empty} holds no config.json" in err, err


def test_a_model_directory_with_a_comma_is_refused_for_apptainer(kit_env: Path) -> None:
    model = kit_env / "a,b"
    model.mkdir()
    (model / "config.json").write_text("{}")
    args = ["up", "--dry-run", "--runtime", "apptainer", "--image", "/x.sif", "--model", str(model)]
    code, _, err = run_kit(args)
    assert code == 3 and "model.id" in err and "','" in err, err


@pytest.mark.parametrize("setting", ["ipc_host=false", "shm_size=8g"])
def test_docker_only_ipc_keys_are_refused_where_the_host_ipc_is_always_shared(setting: str, kit_env: Path) -> None:
    args = ["up", "--dry-run", "--runtime", "apptainer", "--image", "/x.sif", "--set", setting]
    code, _, err = run_kit(args)
    assert code == 3 and "is for runtime docker" in err and "/dev/shm" in err, err
    assert run_kit(["up", "--dry-run", "--set", setting])[0] == 0  # Docker honours it

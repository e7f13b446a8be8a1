"""compile_cache (issue 19, warm caches): the host folder mounted into every node and the cache
variables pointed into it, the same in `kit up` (Docker, Apptainer), its --dry-run and the SLURM
launchers; bad values refused with one line (exit 3); the folder created by `kit up`, and by the
launcher on each node."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from kit.cluster.resolve import ensure_compile_cache
from kit.errors import ConfigError
from kit.plan.container_args import to_apptainer_env, to_apptainer_start_argv, to_docker_argv
from kit.plan.network import NodeNet
from kit.plan.node import COMPILE_CACHE_DIRS, Mount, plan_node
from kit.plan.paths import COMPILE_CACHE
from kit.plan.roles import HEAD, Role
from kit.plan.slurm import enroot_specs, job_var, plan_launcher, runtime_word
from kit.plan.slurm_enroot import enroot_steps, plan_edfs
from kit.render import shell_quote
from tests.conftest import make_config, run_kit, shellcheck_bin
from tests.unit.shellstubs import HOST_STUBS

NET = NodeNet("10.0.0.2", "ib0", "10.0.0.1")
WORKER = Role("worker", 1)


def cache_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k in COMPILE_CACHE_DIRS}


def test_unset_keeps_the_caches_in_the_container() -> None:
    spec = plan_node(make_config(), WORKER, NET)
    assert all(m.target != COMPILE_CACHE for m in spec.mounts)
    assert not cache_env(spec.env)


def test_per_node_mounts_the_folder_and_points_each_node_into_its_subfolder() -> None:
    cfg = make_config(**{"compile_cache.dir": "/scratch/kit cc"})
    head, worker = plan_node(cfg, HEAD, NET), plan_node(cfg, WORKER, NET)
    for spec, rank in ((head, 0), (worker, 1)):
        assert Mount("/scratch/kit cc", COMPILE_CACHE) in spec.mounts
        assert cache_env(spec.env) == {
            "VLLM_CACHE_ROOT": f"{COMPILE_CACHE}/node-{rank}/vllm",
            "TRITON_CACHE_DIR": f"{COMPILE_CACHE}/node-{rank}/triton",
            "TORCHINDUCTOR_CACHE_DIR": f"{COMPILE_CACHE}/node-{rank}/inductor",
            "FLASHINFER_WORKSPACE_BASE": f"{COMPILE_CACHE}/node-{rank}/flashinfer",
        }
    # The same plan in each runtime's terms.
    argv = to_docker_argv(worker)
    assert f"--volume=/scratch/kit cc:{COMPILE_CACHE}" in argv
    assert f"--env=VLLM_CACHE_ROOT={COMPILE_CACHE}/node-1/vllm" in argv
    assert f"--bind=/scratch/kit cc:{COMPILE_CACHE}" in to_apptainer_start_argv(worker, "/img.sif")
    assert to_apptainer_env(worker.env)["APPTAINERENV_TRITON_CACHE_DIR"] == f"{COMPILE_CACHE}/node-1/triton"
    # A user's env still wins (set after kit's own values).
    mine = plan_node(make_config(**{"compile_cache.dir": "/c", "env": {"TRITON_CACHE_DIR": "/t"}}), WORKER, NET)
    assert mine.env["TRITON_CACHE_DIR"] == "/t"


def test_shared_points_every_node_at_the_folder_itself() -> None:
    cfg = make_config(**{"compile_cache.dir": "/local/cc", "compile_cache.scope": "shared"})
    head, worker = plan_node(cfg, HEAD, NET), plan_node(cfg, WORKER, NET)
    assert cache_env(head.env) == cache_env(worker.env)
    assert head.env["VLLM_CACHE_ROOT"] == f"{COMPILE_CACHE}/vllm"


def test_dry_run_shows_it_and_creates_nothing(kit_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = kit_env / "cc"
    monkeypatch.setenv("KIT_COMPILE_CACHE_DIR", str(folder))
    monkeypatch.setenv("KIT_NODES", "2")
    monkeypatch.setenv("KIT_HEAD_ADDRESS", "10.0.0.1")
    code, out, err = run_kit(["up", "--worker", "--dry-run", "--json"])
    assert code == 0, err
    text = json.dumps(json.loads(out))
    assert f"{folder}:{COMPILE_CACHE}" in text and f"VLLM_CACHE_ROOT={COMPILE_CACHE}/node-1/vllm" in text
    assert not folder.exists()


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("compile_cache.dir", "cache/vllm", "is not a valid value"),
        ("compile_cache.dir", "/a:b", "is not a valid value"),
        ("compile_cache.dir", "/a,b", "is not a valid value"),
        ("compile_cache.scope", "per-host", "is not one of per-node, shared"),
    ],
)
def test_bad_values_are_refused_in_one_line(kit_env: Path, key: str, value: str, says: str) -> None:
    code, out, err = run_kit(["up", "--dry-run", "--set", f"{key}={value}"])
    assert code == 3 and not out
    assert len(err.strip().splitlines()) == 1 and key in err and says in err and "Traceback" not in err


def test_up_creates_the_folder_or_refuses_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "b"
    ensure_compile_cache(make_config(**{"compile_cache.dir": str(folder)}), {})
    assert folder.is_dir()
    ensure_compile_cache(make_config(), {})  # unset: nothing to make
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError) as err:
        ensure_compile_cache(make_config(**{"compile_cache.dir": str(tmp_path / "file")}), {"compile_cache.dir": "t"})
    assert err.value.key == "compile_cache.dir" and "cannot create the folder" in err.value.message


# ---- SLURM ------------------------------------------------------------------------------------


def slurm(runtime: str, **more: object) -> object:
    image = "/images/vllm.sif" if runtime == "apptainer" else "vllm/vllm-openai:v0.11.0"
    return make_config(runtime=runtime, backend="mp", image=image, **{"compile_cache.dir": "/scratch/cc", **more})


@pytest.mark.parametrize("runtime", ["docker", "apptainer", "pyxis", "edf"])
def test_launchers_make_the_folder_and_key_the_subfolder_by_slurm_nodeid(runtime: str, tmp_path: Path) -> None:
    cfg = slurm(runtime)
    text = plan_launcher(cfg)  # type: ignore[arg-type]
    assert f"mkdir -p {shell_quote('/scratch/cc')} ||" in text
    path = tmp_path / "launcher.sh"
    path.write_text(text)
    check = subprocess.run([shellcheck_bin(), "-s", "bash", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    rank = job_var("KIT_NODE_RANK")
    if runtime in ("docker", "apptainer"):
        prefix = "--env=" if runtime == "docker" else "APPTAINERENV_"
        worker = f"{prefix}VLLM_CACHE_ROOT={COMPILE_CACHE}/node-{rank}/vllm"
        assert shell_quote(runtime_word(worker)) in text  # the worker's: the rank only its node knows
        assert f"{prefix}VLLM_CACHE_ROOT={COMPILE_CACHE}/node-0/vllm\n" in text  # the head's
    else:
        # One srun starts every worker: its node entry sets the variable (from the node table).
        specs = enroot_specs(cfg)  # type: ignore[arg-type]
        entries, steps = enroot_steps(cfg, specs, {r: f"KIT_{r.kind.upper()}_EDF" for r in specs})  # type: ignore[arg-type]
        word = shell_quote(runtime_word(f"VLLM_CACHE_ROOT={COMPILE_CACHE}/node-{rank}/vllm"))
        assert f"export {word}" in entries["KIT_WORKER_ENTRY"]
        assert not any("VLLM_CACHE_ROOT=" in word for word in steps[1].exports)
    # A user's env still wins on the workers too.
    mine = plan_launcher(slurm(runtime, env={"TRITON_CACHE_DIR": "/t"}))  # type: ignore[arg-type]
    assert "node-" + '"${KIT_NODE_RANK}"' + "/triton" not in mine
    assert runtime == "edf" or "TRITON_CACHE_DIR=/t" in mine  # EDF: in its TOML files (below)
    if runtime == "edf":
        files = plan_edfs(cfg, enroot_specs(cfg), {"head": "h.toml", "worker": "w.toml"})  # type: ignore[arg-type]
        assert f'"/scratch/cc:{COMPILE_CACHE}"' in files["w.toml"]
        assert "node-" not in files["w.toml"]  # the rank is the entry's, not the file's
        cfg = slurm(runtime, env={"TRITON_CACHE_DIR": "/t"})
        files = plan_edfs(cfg, enroot_specs(cfg), {"head": "h.toml", "worker": "w.toml"})  # type: ignore[arg-type]
        assert 'TRITON_CACHE_DIR = "/t"' in files["w.toml"] and 'TRITON_CACHE_DIR = "/t"' in files["h.toml"]


def test_docker_launcher_creates_the_folder_on_the_node(tmp_path: Path) -> None:
    """The launcher run for real under bash with fakes for SLURM, iproute2 and docker (none can
    run here): the folder exists before `docker run` and is mounted as planned."""
    folder = tmp_path / "compile cache"
    cfg = slurm("docker", nodes=1, api_key_file=None, hf_token_file=None, **{"compile_cache.dir": str(folder)})
    launcher = tmp_path / "launcher.sh"
    launcher.write_text(plan_launcher(cfg))  # type: ignore[arg-type]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in HOST_STUBS.items():
        (bindir / name).write_text("#!/bin/bash\n" + body)
    record = tmp_path / "record"
    stub = f'[ -d {shell_quote(str(folder))} ] && printf "%s\\n" "$@" > {shell_quote(str(record))}\n'
    # `docker image inspect` (the node's check that the image is there) answers yes
    (bindir / "docker").write_text('#!/bin/bash\nif [ "$1" = image ]; then exit 0; fi\n' + stub)
    for p in bindir.iterdir():
        p.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "SLURM_JOB_ID": f"cc{os.getpid()}",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_SUBMIT_HOST": "login1",
        "SLURM_STEP_GPUS": "0",  # srun's, in every task of a step with GPUs (Docker takes these)
        "USER": "alice",
    }
    done = subprocess.run(["bash", str(launcher)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    argv = record.read_text().splitlines()
    assert f"--volume={folder}:{COMPILE_CACHE}" in argv
    assert f"--env=VLLM_CACHE_ROOT={COMPILE_CACHE}/node-0/vllm" in argv

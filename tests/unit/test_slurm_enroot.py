"""`kit slurm --runtime pyxis|edf` (issue 20): golden launchers and EDF files, shellcheck of the
launcher and of the node entry, the same plan as `kit up`, what pyxis' option syntax cannot carry
(refused with one line), the EDF's TOML read back, the deploy examples, and the CLI writing the
EDF files beside the launcher. The launchers are run under a fake pyxis-aware srun in
test_shell_properties.py and submitted to the real SLURM in tests/slurm (enroot and pyxis cannot
be installed here: tests/pyxis_fake.py checks the options against pyxis' own table)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import tomllib
from hypothesis import given, settings
from hypothesis import strategies as st

from kit.config import load_config
from kit.errors import ConfigError
from kit.plan.container_args import enroot_image, to_pyxis_options
from kit.plan.node import plan_node
from kit.plan.roles import HEAD
from kit.plan.slurm import SLURM_NET, enroot_specs, plan_launcher, plan_slurm_files
from kit.plan.slurm_enroot import node_entry, split_env
from kit.render.toml import to_toml
from tests import pyxis_fake
from tests.conftest import ROOT, make_config, shellcheck_bin

DEPLOY = ROOT / "deploy" / "slurm"
EDF_PATHS = {"head": "kit-llama.head.toml", "worker": "kit-llama.worker.toml"}


def enroot_config(runtime: str, backend: str, **overrides: object) -> object:
    base: dict[str, object] = {
        "runtime": runtime,
        "backend": backend,
        "image": "/shared/images/nvcr.io_nvidia_vllm_25.01-py3.sqsh"
        if runtime == "pyxis"
        else "nvcr.io/nvidia/vllm:25.01",
        "slurm.account": "proj",
        "slurm.partition": "gpu",
        "slurm.cpus_per_task": 32,
        "slurm.time": "02:00:00",
        "env": {"NCCL_IB_HCA": "mlx5_0,mlx5_1", "MELLANOX_VISIBLE_DEVICES": "all"},
    }
    base.update(overrides)
    return make_config(**base)


def shellcheck(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    result = subprocess.run([shellcheck_bin(), "-s", "bash", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0


@pytest.mark.parametrize(("runtime", "backend"), [(rt, be) for rt in ("pyxis", "edf") for be in ("mp", "ray")])
def test_launcher_golden_and_shellcheck(
    runtime: str, backend: str, golden: Callable[[str, str], None], tmp_path: Path
) -> None:
    cfg = enroot_config(runtime, backend)
    files = plan_slurm_files(cfg, "kit-llama.sbatch")  # type: ignore[arg-type]
    text = files.pop("kit-llama.sbatch")
    golden(f"slurm_{runtime}_{backend}.sbatch", text)
    shellcheck(tmp_path, "launcher.sh", text)
    for role, spec in enroot_specs(cfg).items():  # type: ignore[arg-type]
        shellcheck(tmp_path, f"entry-{role.kind}.sh", node_entry(runtime, split_env(spec.env, runtime)[1]))
    if runtime == "edf":
        assert sorted(files) == sorted(EDF_PATHS.values())
        for path, toml in files.items():
            golden(f"slurm_edf_{backend}_{path.split('.')[1]}.toml", toml)
            assert tomllib.loads(toml)["image"] == "nvcr.io#nvidia/vllm:25.01"
    else:
        assert not files


def test_one_node_has_no_worker_step(tmp_path: Path) -> None:
    cfg = enroot_config("pyxis", "mp", nodes=1, gpus_per_node=8)
    text = plan_launcher(cfg)  # type: ignore[arg-type]
    assert "--exclude=" not in text and "KIT_WORKER_ENTRY" not in text and text.count("--container-image=") == 1
    shellcheck(tmp_path, "one.sh", text)
    assert list(plan_slurm_files(enroot_config("edf", "mp", nodes=1, gpus_per_node=8), "x/serve.sbatch")) == [  # type: ignore[arg-type]
        "x/serve.sbatch",
        "x/serve.head.toml",
    ]


def test_pyxis_step_comes_from_the_same_plan_as_up() -> None:
    """Every mount and environment variable of `kit up`'s plan reaches the pyxis step: mounts in
    --container-mounts, each name in --container-env (its value exported by the step) or set by
    the node entry (the values only the node knows); host network, no home, no entrypoint."""
    cfg = enroot_config("pyxis", "mp")
    text = plan_launcher(cfg)  # type: ignore[arg-type]
    spec = plan_node(cfg, HEAD, SLURM_NET, has_infiniband=True)  # type: ignore[arg-type]
    [mounts] = [line.strip() for line in text.splitlines() if "--container-mounts=" in line and "/api_key" in line]
    assert [pyxis_fake.parse_mount(e).source for e in mounts.removeprefix("--container-mounts=").split(",")] == [
        m.source for m in spec.mounts
    ]
    static, in_entry = split_env(spec.env, "pyxis")
    assert set(in_entry) == {"VLLM_HOST_IP", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}
    assert "--container-env=" + ",".join(static) in text
    assert "export NCCL_IB_HCA=mlx5_0,mlx5_1" in text  # a comma is safe: the value is not in a list
    for flag in ("--no-container-mount-home", "--no-container-entrypoint", "--container-workdir=/tmp"):
        assert flag in text
    assert "--container-unshare" not in text and "--network" not in text  # the host's network


def test_pyxis_options_pass_pyxis_own_parsing() -> None:
    cfg = enroot_config("pyxis", "ray", mounts=["/data/models:/models:ro"])
    for role, spec in enroot_specs(cfg).items():  # type: ignore[arg-type]
        options = to_pyxis_options(spec, cfg.image)  # type: ignore[attr-defined]
        step = pyxis_fake.parse([*options, "/bin/true"])
        mounts, names = pyxis_fake.check_pyxis(step, dict.fromkeys(spec.env, "x"))
        assert [(m.source, m.target, m.flags) for m in mounts][-1] == ("/data/models", "/models", ("ro",))
        assert names == list(spec.env) and role.is_head == any(m.target.endswith("api_key") for m in mounts)
    with pytest.raises(pyxis_fake.Invalid, match="unrecognized"):
        pyxis_fake.parse(["--container-unknown=x", "/bin/true"])


@pytest.mark.parametrize(
    ("runtime", "overrides", "key"),
    [
        ("pyxis", {"hf_cache": "/data/hf,evil:/x"}, "hf_cache"),
        ("pyxis", {"hf_cache": "/data/hf cache"}, "hf_cache"),
        ("pyxis", {"mounts": ["/a,b:/b"]}, "mounts"),
        ("pyxis", {"hf_token_file": "/etc/kit/to:ken"}, "hf_token_file"),
        ("edf", {"hf_cache": "/data/$HOME"}, "hf_cache"),
        ("edf", {"env": {"A": "${HOME}"}}, "env"),
        ("edf", {"env": {"A": ""}}, "env"),
        ("pyxis", {"image": "images/vllm.sqsh"}, "image"),
    ],
)
def test_what_the_syntax_cannot_carry_is_refused_in_one_line(
    runtime: str, overrides: dict[str, object], key: str
) -> None:
    with pytest.raises(ConfigError) as err:
        plan_slurm_files(enroot_config(runtime, "mp", **overrides), "kit-llama.sbatch")  # type: ignore[arg-type]
    assert err.value.key == key and "\n" not in err.value.message and err.value.hint


def test_pyxis_image_forms() -> None:
    assert enroot_image("/shared/x.sqsh") == "/shared/x.sqsh"
    assert "--container-image=nvcr.io#nvidia/vllm:25.01" in plan_launcher(
        enroot_config("pyxis", "mp", image="nvcr.io/nvidia/vllm:25.01")
    )  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    data=st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.one_of(
            st.text(),
            st.booleans(),
            st.integers(-(2**63), 2**63 - 1),
            st.lists(st.text(), max_size=3),
            st.dictionaries(st.text(min_size=1, max_size=8), st.text(), max_size=3),
        ),
        max_size=6,
    )
)
def test_toml_text_reads_back_as_written(data: dict[str, object]) -> None:
    """Any string (quotes, backslashes, newlines, control characters, unicode) and any key comes
    back from tomllib exactly: nothing is concatenated unescaped."""
    assert tomllib.loads(to_toml(data)) == data


@pytest.mark.parametrize("name", ["pyxis-2node-mp", "edf-2node-ray"])
def test_deploy_examples_are_current(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    cfg = load_config(str(DEPLOY / f"{name}.yaml"), environ={}).config
    files = plan_slurm_files(cfg, f"deploy/slurm/{name}.sbatch")
    for rel, text in files.items():
        path = ROOT / rel
        if request.config.getoption("--update-golden"):  # regenerated like every golden
            path.write_text(text)
        assert path.read_text() == text, f"{path} is stale: kit slurm --config deploy/slurm/{name}.yaml -o {rel}"
    shellcheck(tmp_path, "example.sh", files[f"deploy/slurm/{name}.sbatch"])


def test_kit_slurm_writes_the_edf_files_beside_the_launcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from kit.cli import cli

    monkeypatch.chdir(tmp_path)
    args = ["slurm", "--runtime", "edf", "--nodes", "2", "--gpus-per-node", "4", "--tp", "4", "--pp", "2",
            "--image", "nvcr.io/nvidia/vllm:25.01",
            "--set", f"hf_cache={tmp_path}", "-o", "out/serve.sbatch", "--json"]  # fmt: skip
    (tmp_path / "out").mkdir()
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    written = json.loads(result.stdout)["result"]
    assert written["edf"] == ["out/serve.head.toml", "out/serve.worker.toml"]
    launcher = (tmp_path / "out" / "serve.sbatch").read_text()
    assert "KIT_HEAD_EDF=out/serve.head.toml" in launcher and '--environment="${KIT_HEAD_EDF}"' in launcher
    head = tomllib.loads((tmp_path / "out" / "serve.head.toml").read_text())
    assert head["image"] == "nvcr.io#nvidia/vllm:25.01" and head["entrypoint"] is False
    assert head["env"]["KIT_ROLE"] == "head" and f"{tmp_path}:/kit/hf-cache" in head["mounts"]
    printed = CliRunner().invoke(cli, args[:-3])  # no -o: the launcher and the EDF files, printed
    assert printed.exit_code == 0 and "# ---- kit: kit-kit.head.toml (environment definition) ----" in printed.output
    assert not (tmp_path / "kit-kit.head.toml").exists()

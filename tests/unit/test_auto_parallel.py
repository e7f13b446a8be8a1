"""`--tp auto --pp auto` for up/serve/slurm come from kit plan when the model's files are local."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kit.cli import cli
from kit.cluster.resolve import resolve
from kit.commands._options import overrides_from
from kit.errors import ConfigError

DATA = Path(__file__).resolve().parents[1] / "data" / "models"


def hf_cache_with(tmp_path: Path, name: str, repo: str) -> Path:
    snap = tmp_path / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    shutil.copy(DATA / name / "config.json", snap / "config.json")
    return tmp_path


def resolved(tmp_path: Path, **values: object) -> tuple[int, int, str]:
    mapping = {k: k.replace("__", ".") for k in values}
    r = resolve(None, overrides_from(values, keys=mapping))
    return r.config.tp, r.config.pp, r.sources["model.tp"]


# No KIT_* variable from the caller's shell; the working directory and KIT_STATE_DIR in tmp_path.
pytestmark = pytest.mark.usefixtures("kit_env")


def test_tp_splits_the_heads_and_pp_takes_the_rest(tmp_path: Path) -> None:
    cache = hf_cache_with(tmp_path, "qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct")  # 28 heads, 4 KV heads
    tp, pp, source = resolved(
        tmp_path, hf_cache=str(cache), nodes=2, gpus_per_node=8, model__id="Qwen/Qwen2.5-7B-Instruct"
    )
    assert (tp, pp, source) == (4, 4, "auto (kit plan)")


def test_without_model_files_auto_is_gpus_per_node_by_nodes(tmp_path: Path) -> None:
    tp, pp, source = resolved(tmp_path, hf_cache=str(tmp_path), nodes=2, gpus_per_node=8, model__id="org/absent")
    assert (tp, pp, source) == (8, 2, "default")


def test_fixed_tp_keeps_it_and_pp_fills_the_cluster(tmp_path: Path) -> None:
    cache = hf_cache_with(tmp_path, "qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct")
    tp, pp, _ = resolved(
        tmp_path, hf_cache=str(cache), nodes=2, gpus_per_node=4, model__tp=2, model__id="Qwen/Qwen2.5-7B-Instruct"
    )
    assert (tp, pp) == (2, 4)


def test_gpu_memory_lets_the_plan_refuse_a_cluster_too_small(tmp_path: Path) -> None:
    cache = hf_cache_with(tmp_path, "wizardlm-2-8x22b", "org/big")  # 281 GB of weights
    with pytest.raises(ConfigError) as exc:
        resolved(
            tmp_path, hf_cache=str(cache), nodes=1, gpus_per_node=2, model__id="org/big", model__gpu_memory="A100-40GB"
        )
    assert "nodes" in exc.value.message or "fit" in exc.value.message


def test_up_dry_run_uses_the_planned_tp(tmp_path: Path) -> None:
    cache = hf_cache_with(tmp_path, "qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct")
    result = CliRunner().invoke(
        cli,
        [
            "up",
            "--dry-run",
            "--json",
            "--nodes",
            "2",
            "--gpus-per-node",
            "8",
            "--model",
            "Qwen/Qwen2.5-7B-Instruct",
            "--set",
            f"hf_cache={cache}",
            "--tp",
            "auto",
            "--pp",
            "auto",
        ],
    )
    assert result.exit_code == 0, result.output
    shown = CliRunner().invoke(
        cli,
        [
            "config",
            "show",
            "--set",
            f"hf_cache={cache}",
            "--set",
            "nodes=2",
            "--set",
            "gpus_per_node=8",
            "--set",
            "model.id=Qwen/Qwen2.5-7B-Instruct",
        ],
    )
    assert "auto (kit plan)" in shown.output

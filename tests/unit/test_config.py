"""Config layering (defaults < file < KIT_* env < flags), sources, and every config error."""

from __future__ import annotations

from pathlib import Path

import pytest

from kit.config import load_config
from kit.config.schema import SCHEMA
from kit.errors import ConfigError
from kit.plan.layout import plan_layout


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "kit.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_without_any_file(tmp_path: Path) -> None:
    resolved = load_config(environ={}, cwd=tmp_path)
    assert resolved.path is None
    assert resolved.config.runtime == "docker"
    assert set(resolved.sources.values()) == {"default"}
    assert set(resolved.values) == set(SCHEMA)


def test_layers_in_order_with_sources(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes: 2\ngpus_per_node: 4\nmodel:\n  id: org/m\n  tp: 4\nports:\n  api: 9000\n")
    resolved = load_config(
        path,
        environ={"KIT_PORTS_API": "9100", "KIT_MODEL_ID": "org/env"},
        overrides={"model.id": ("org/flag", "flag --model")},
    )
    cfg = resolved.config
    assert (cfg.nodes, cfg.gpus_per_node, cfg.model.tp, cfg.model.pp) == (2, 4, 4, "auto")  # loading plans nothing
    lay = plan_layout(cfg, None)
    assert (lay.tp, lay.pp) == (4, 2)
    assert cfg.ports.api == 9100 and resolved.sources["ports.api"] == "env KIT_PORTS_API"
    assert cfg.model.id == "org/flag" and resolved.sources["model.id"] == "flag --model"
    assert resolved.sources["nodes"] == f"{path}:1"
    assert resolved.sources["model.tp"] == f"{path}:5"
    assert resolved.sources["backend"] == "default"


def test_kit_config_env_and_cwd_discovery(tmp_path: Path) -> None:
    write(tmp_path, "cluster: fromcwd\n")
    assert load_config(environ={}, cwd=tmp_path).config.cluster == "fromcwd"
    other = tmp_path / "other.yaml"
    other.write_text("cluster: fromenv\n")
    assert load_config(environ={"KIT_CONFIG": str(other)}, cwd=tmp_path).config.cluster == "fromenv"


def test_bad_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes: 2\nmodel:\n  id: [unclosed\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path, environ={})
    assert f"{path}:" in exc.value.message and "invalid YAML" in exc.value.message


@pytest.mark.parametrize(
    ("text", "key", "guess"),
    [
        ("modle:\n  id: x\n", "modle", "model"),
        ("model:\n  tpp: 2\n", "model.tpp", "model.tp"),
        ("gpus_per_nodes: 2\n", "gpus_per_nodes", "gpus_per_node"),
    ],
)
def test_unknown_key_suggests_nearest(tmp_path: Path, text: str, key: str, guess: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_config(path, environ={})
    assert key in exc.value.message and "unknown key" in exc.value.message
    assert exc.value.hint == f"did you mean '{guess}'?"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("nodes: two\n", "nodes: expected an integer"),
        ("ipc_host: maybe\n", "ipc_host: expected true or false"),
        ("backend: slurm\n", "backend: 'slurm' is not one of mp, ray"),
        ("model:\n  extra_args: --foo\n", "model.extra_args: expected a list"),
        ("env: [A]\n", "env: expected a mapping"),
        ("shm_size: lots\n", "shm_size: 'lots' is not a size"),
        ("cluster:\n", "cluster: must not be empty"),
    ],
)
def test_wrong_types(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_config(path, environ={})
    assert needle in exc.value.message
    line = 2 if text.startswith("model:") else 1
    assert exc.value.message.startswith(f"{path}:{line}: ")


def test_env_typo_is_caught_and_foreign_vars_ignored(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(environ={"KIT_MODEL_TPP": "2"}, cwd=tmp_path)
    assert "KIT_MODEL_TP" in str(exc.value.hint)
    assert load_config(environ={"KIT_SOMETHING_ELSE_ENTIRELY": "1"}, cwd=tmp_path).config.nodes == 1


def test_env_values_are_typed(tmp_path: Path) -> None:
    cfg = load_config(
        environ={"KIT_NODES": "3", "KIT_IPC_HOST": "false", "KIT_MODEL_EXTRA_ARGS": "[--a, b]"}, cwd=tmp_path
    ).config
    assert cfg.nodes == 3 and cfg.ipc_host is False and cfg.model.extra_args == ("--a", "b")


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(str(tmp_path / "nope.yaml"), environ={})
    assert "cannot read config file" in exc.value.message


def test_kits_own_script_variables_are_not_config_typos(tmp_path: Path) -> None:
    env = {
        name: "1"
        for name in (
            "KIT_REQUIRE_SLURM",
            "KIT_REQUIRE_DOCKER",
            "KIT_SLURM_TIMEOUT",
            "KIT_SLURM_DIR",
            "KIT_BASE_IMAGE",
            "KIT_DOCKERD_TIMEOUT",
            "KIT_TEST_IMAGE",
            "KIT_HEAD_IP",
        )
    }
    assert load_config(environ=env, cwd=tmp_path).config.nodes == 1
    for typo in ("KIT_NODSE", "KIT_NODE", "KIT_MODEL_IDD"):
        with pytest.raises(ConfigError):
            load_config(environ={typo: "2"}, cwd=tmp_path)

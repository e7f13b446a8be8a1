"""Version-aware rendering (issues 19, 24): kit learns the image's vLLM release; what the image's
parser cannot tell (defaults that changed meaning, choices vLLM silently replaces) and the
rendering without a record of the parser come from kit.images.vllm_releases, whose boundaries are
checked here against the parsers recorded from the real releases (tests/fixtures/vllm_parsers/)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kit.cluster.resolve import resolve
from kit.config import KitConfig
from kit.errors import ConfigError
from kit.images import vllm_releases as versions
from kit.plan.checks import check_config
from kit.plan.network import NodeNet
from kit.plan.node import node_env, node_mounts
from kit.plan.roles import HEAD, Role
from kit.plan.scripts import serve_script
from kit.plan.vllm import vllm_serve_argv
from kit.render import shell_words
from tests.conftest import make_config, run_kit, shellcheck_bin
from tests.unit.recorded_parsers import RELEASES, recorded_facts

WORKER = Role("worker", 1)
NET = NodeNet("10.0.0.2", "eth0", "10.0.0.1")


def dp_ep(version: str, **overrides: object) -> KitConfig:
    """DP+EP over 2 nodes with the mp backend: 8 ranks, 4 per node, selected GPUs."""
    base: dict[str, object] = {
        "vllm_version": version,
        "backend": "mp",
        "gpus_per_node": 4,
        "gpus": "0,1,2,3",
        "model.tp": 1,
        "model.pp": 1,
        "model.dp": 8,
        "model.ep": True,
        "model.all2all": "deepep_low_latency",
        "model.id": "deepseek-ai/DeepSeek-V2-Lite",
        "model.served_name": "dsv2",
        "model.extra_args": [],
    }
    base.update(overrides)
    return make_config(**base)


def words(config: KitConfig, role: Role = HEAD) -> str:
    return shell_words(vllm_serve_argv(config, role))


def test_parse_and_tag() -> None:
    assert versions.parse_version("v0.33.0") == (0, 33, 0)
    assert versions.parse_version("0.32.0+cpu") == (0, 32, 0)
    assert versions.parse_version("0.11.1rc2") == (0, 11, 1)
    assert versions.parse_version("latest") is None and versions.parse_version("0.11") is None
    assert versions.version_from_ref("vllm/vllm-openai:v0.11.0") == (0, 11, 0)
    assert versions.version_from_ref("registry:5000/kit/vllm-cpu:0.32.0") == (0, 32, 0)
    assert versions.version_from_ref("registry:5000/kit/vllm-cpu") is None  # the port is no tag
    assert versions.version_from_ref("kit/vllm-cpu:test") is None
    assert versions.version_from_ref("/shared/images/vllm_vllm-openai_v0.11.0.sqsh") == (0, 11, 0)
    assert versions.version_from_ref("/p/images/vllm_vllm-openai_v0.32.0.sif") == (0, 32, 0)
    assert versions.version_from_ref("/p/images/mine.sif") is None


def test_how_kit_learns_the_version() -> None:
    assert versions.target_version("0.24.1", "x/y:v0.11.0") == versions.Target((0, 24, 1), "vllm_version")
    assert versions.target_version("auto", "x/y:v0.11.0") == versions.Target((0, 11, 0), "image tag")
    unknown = versions.target_version("auto", "kit/vllm-cpu:test")
    assert unknown.version == versions.DEFAULT_VERSION and not unknown.known
    assert (
        "unknown" in str(versions.unknown_warning(unknown))
        and versions.unknown_warning(versions.target_version("auto", "x/y:v0.11.0")) is None
    )
    # At pull/build: the label, then the build argument, then the tag.
    assert versions.recorded_version("k/c:test", {"kit.vllm-version": "0.20.0"}, {"VLLM_CPU_VERSION": "0.32.0"}) == (
        "0.20.0",
        "image label kit.vllm-version",
    )
    assert versions.recorded_version("k/c:test", {}, {"VLLM_TAG": "v0.30.1"}) == ("0.30.1", "build argument VLLM_TAG")
    assert versions.recorded_version("k/c:0.32.0", {}, {}) == ("0.32.0", "image tag")
    assert versions.recorded_version("k/c:test", {}, {}) is None


def test_resolve_takes_the_version_from_kits_image_record(kit_state_dir: Path, tmp_path: Path) -> None:
    kit_state_dir.mkdir(parents=True)
    record = {
        "kit/vllm-cpu:test": {
            "ref": "kit/vllm-cpu:test",
            "digest": "sha256:1",
            "vllm_version": "0.11.0",
            "vllm_version_from": "build argument VLLM_CPU_VERSION",
        }
    }
    (kit_state_dir / "images.json").write_text(json.dumps(record))
    sets = {"image": ("kit/vllm-cpu:test", "test"), "hf_cache": (str(tmp_path), "test")}
    config = resolve(None, sets, environ={}, cwd=tmp_path).config
    assert config.vllm.version == (0, 11, 0) and "kit's image record" in config.vllm.source
    # An explicit vllm_version wins over the record.
    config = resolve(None, {**sets, "vllm_version": ("0.33.0", "test")}, environ={}, cwd=tmp_path).config
    assert config.vllm.version == (0, 33, 0) and config.vllm.source == "vllm_version"


def test_all2all_is_an_env_variable_before_0_11_1_and_a_flag_after() -> None:
    old, new = dp_ep("0.11.0"), dp_ep("0.33.0")
    assert "--all2all-backend" not in words(old)
    assert node_env(old, HEAD, NET)[versions.ALL2ALL_ENV] == "deepep_low_latency"
    assert "--all2all-backend=deepep_low_latency" in words(new)
    assert versions.ALL2ALL_ENV not in node_env(new, HEAD, NET)
    assert "--all2all-backend" not in words(dp_ep("0.33.0", **{"model.all2all": "auto"}))


@pytest.mark.parametrize("backend", ["pplx", "naive"])
def test_a_removed_all2all_backend_is_refused_with_the_fix(backend: str) -> None:
    check_config(dp_ep("0.11.0", **{"model.all2all": backend}), {})  # still there in 0.11.0
    with pytest.raises(ConfigError) as exc:
        check_config(dp_ep("0.33.0", **{"model.all2all": backend}), {"model.all2all": "kit.yaml:7"})
    err = exc.value
    assert err.key == "model.all2all" and "removed" in err.message and "silently" in err.message
    assert "allgather_reducescatter" in str(err.hint)


def test_a_backend_the_images_parser_lacks_is_refused() -> None:
    """Whether a release has a backend is its parser's to say: deepep_v2 came in 0.24.0."""
    old, new = recorded_facts("0.18.0"), recorded_facts("0.24.0")
    with pytest.raises(ConfigError) as exc:
        check_config(dp_ep("0.18.0", **{"model.all2all": "deepep_v2"}), {}, facts=old)
    assert exc.value.key == "model.all2all" and "does not accept 'deepep_v2'" in exc.value.message
    check_config(dp_ep("0.24.0", **{"model.all2all": "deepep_v2"}), {}, facts=new)


def test_refusal_through_the_cli_is_one_line_exit_3(tmp_path: Path) -> None:
    args = ["serve", "--dry-run", "--set", "backend=mp", "--set", f"hf_cache={tmp_path}", "--set", "model.all2all=pplx"]
    code, out, err = run_kit(args)
    assert code == 3 and "model.all2all" in err and "Traceback" not in err and out == ""
    code, out, err = run_kit([*args, "--set", "vllm_version=0.11.0"])
    assert code == 0, err


def test_api_server_count_only_where_an_api_server_runs() -> None:
    config = dp_ep("0.33.0", **{"model.api_servers": 2})
    assert "--api-server-count 2" in words(config)
    assert "--api-server-count" not in words(config, WORKER)  # --headless with it is an error (0.32.0)
    assert "--api-server-count" not in words(dp_ep("0.33.0"))  # auto: vLLM's default
    assert versions.api_servers_default((0, 11, 0), 8, 4, "internal") == 1
    assert versions.api_servers_default((0, 15, 0), 8, 4, "internal") == 8
    assert versions.api_servers_default((0, 33, 0), 8, 4, "hybrid") == 4


def test_hybrid_load_balancing_gives_every_node_an_api_server() -> None:
    config = dp_ep("0.33.0", **{"model.dp_lb": "hybrid", "api_key_file": "/etc/kit/api_key"})
    worker = words(config, WORKER)
    assert "--headless" not in worker and "--data-parallel-hybrid-lb" in worker
    assert "--port 8000" in worker and "--data-parallel-start-rank" in worker
    assert "--data-parallel-hybrid-lb" in words(config)
    # Every API server needs the key (issue 16, closed by default).
    assert any(m.target.endswith("api_key") for m in node_mounts(config, WORKER))
    assert "VLLM_API_KEY" in serve_script(config, WORKER)
    for role in (HEAD, WORKER):
        run = subprocess.run([shellcheck_bin(), "-"], input=serve_script(config, role), capture_output=True, text=True)
        assert run.returncode == 0, run.stdout
    internal = dp_ep("0.33.0", **{"api_key_file": "/etc/kit/api_key"})
    assert "--headless" in words(internal, WORKER)
    assert not any(m.target.endswith("api_key") for m in node_mounts(internal, WORKER))


def test_hybrid_is_refused_where_it_cannot_work() -> None:
    with pytest.raises(ConfigError) as exc:
        check_config(make_config(**{"model.dp_lb": "hybrid"}), {})  # Ray, DP 1
    assert exc.value.key == "model.dp_lb"


def test_gpu_selection_moves_to_device_ids_from_0_24_0() -> None:
    new, old = dp_ep("0.24.0"), dp_ep("0.23.0")
    assert "--device-ids=0,1,2,3" in words(new) and "CUDA_VISIBLE_DEVICES" not in node_env(new, HEAD, NET)
    assert "--device-ids" not in words(old) and node_env(old, HEAD, NET)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    # The Ray executor ignores --device-ids (0.32.0): Ray keeps CUDA_VISIBLE_DEVICES.
    ray = make_config(vllm_version="0.33.0", gpus="0,1,2,3,4,5,6,7")
    assert "--device-ids" not in words(ray) and "CUDA_VISIBLE_DEVICES" in node_env(ray, HEAD, NET)
    assert "--device-ids" not in words(dp_ep("0.33.0", gpus="all"))


def _case_dp_ep(version: str) -> str:
    config = dp_ep(version, **{"model.api_servers": 4})
    parts = []
    for role in (HEAD, WORKER):
        env = node_env(config, role, NET)
        chosen = {k: env[k] for k in ("CUDA_VISIBLE_DEVICES", versions.ALL2ALL_ENV) if k in env}
        parts.append(f"### {role.label}: node env {json.dumps(chosen, sort_keys=True)}\n{serve_script(config, role)}")
    return "\n".join(parts)


def _case_ray_tp_pp(version: str) -> str:
    config = make_config(vllm_version=version, gpus="0,1,2,3,4,5,6,7", **{"model.tp": 8, "model.pp": 2})
    env = node_env(config, HEAD, NET)
    return f"### head: node env {json.dumps({'CUDA_VISIBLE_DEVICES': env['CUDA_VISIBLE_DEVICES']})}\n" + serve_script(
        config, HEAD
    )


@pytest.mark.parametrize("version", ["0.11.0", "0.33.0"])
def test_multi_node_goldens_per_release(version: str, golden: object) -> None:
    golden(f"versions/{version}/serve_dp_ep_mp.txt", _case_dp_ep(version))  # type: ignore[operator]
    golden(f"versions/{version}/serve_ray_tp_pp.txt", _case_ray_tp_pp(version))  # type: ignore[operator]


def test_the_goldens_differ_where_the_table_says() -> None:
    """If the table were ignored, both releases would render the same text."""
    assert _case_dp_ep("0.11.0") != _case_dp_ep("0.33.0")
    assert _case_ray_tp_pp("0.11.0") == _case_ray_tp_pp("0.33.0")  # Ray TP/PP: nothing changed


def test_pull_and_build_record_the_release(monkeypatch: pytest.MonkeyPatch, kit_state_dir: Path) -> None:
    """Through `kit pull`/`kit build` with the fake Docker engine of test_pull_build (no registry)."""
    from kit.images import records as state
    from tests.unit.test_pull_build import LAYER_EVENTS, FakeEngine, use_engine

    use_engine(monkeypatch, FakeEngine(LAYER_EVENTS))
    code, _, err = run_kit(["pull", "reg:5000/vllm/vllm-openai:v0.30.1"])
    assert code == 0, err
    record = state.recorded_image("reg:5000/vllm/vllm-openai:v0.30.1") or {}
    assert record.get("vllm_version") == "0.30.1" and record.get("vllm_version_from") == "image tag"
    use_engine(monkeypatch, FakeEngine([]))
    code, _, err = run_kit(["build", "cpu", "-t", "me/cpu:test", "--build-arg", "VLLM_CPU_VERSION=0.32.0"])
    assert code == 0, err
    record = state.recorded_image("me/cpu:test") or {}
    assert (
        record.get("vllm_version") == "0.32.0" and record.get("vllm_version_from") == "build argument VLLM_CPU_VERSION"
    )
    code, _, err = run_kit(["build", "cpu", "-t", "me/cpu:other"])
    assert code == 0 and "vllm_version" not in (state.recorded_image("me/cpu:other") or {})


def test_the_dry_run_says_when_the_release_is_unknown(tmp_path: Path) -> None:
    args = ["serve", "--dry-run", "--json", "--set", "backend=mp", "--set", f"hf_cache={tmp_path}"]
    code, out, err = run_kit([*args, "--set", "image=kit/vllm-cpu:test"])
    assert code == 0, err
    assert any("vLLM version is unknown" in w and "0.33.0" in w for w in json.loads(out)["result"]["warnings"])
    code, out, err = run_kit([*args, "--set", "image=kit/vllm-cpu:0.32.0"])
    assert code == 0 and not any("unknown" in w for w in json.loads(out)["result"]["warnings"])
    code, out, err = run_kit(["up", "--head", "--dry-run", "--json", "--network", "n", "--set", f"hf_cache={tmp_path}"])
    assert code == 0 and json.loads(out)["result"]["vllm"] == {"version": "0.33.0", "from": "image tag"}


# ---- the table against the recorded parsers (issue 24) --------------------------------------


def _version(text: str) -> versions.Version:
    found = versions.parse_version(text)
    assert found is not None
    return found


@pytest.mark.parametrize("release", RELEASES)
def test_the_fallback_boundaries_agree_with_every_recorded_parser(release: str) -> None:
    """Without a record kit renders by release; each boundary is where the real parsers change."""
    facts = recorded_facts(release)
    version = _version(release)
    options = frozenset(facts.options())
    assert versions.all2all_by_flag(version) == versions.all2all_by_flag(version, options)
    assert versions.uses_device_ids(version, "mp") == versions.uses_device_ids(version, "mp", options)
    # vLLM's multi-node mp options: from 0.11.1 (issue 24: kit rendered them for older images)
    assert facts.has_option("--nnodes") == (version >= (0, 11, 1))
    assert facts.has_option("--data-parallel-hybrid-lb")  # from 0.10.0: in every recording


@pytest.mark.parametrize("release", RELEASES)
def test_silently_replaced_backends_are_what_no_parser_shows(release: str) -> None:
    """pplx and naive stay among --all2all-backend's choices after vLLM removed them: only the table
    can refuse them."""
    choices = recorded_facts(release).choices("--all2all-backend")
    if choices is None:
        assert _version(release) < versions.ALL2ALL_FLAG_SINCE
        return
    assert set(versions.SILENTLY_REPLACED) <= set(choices)

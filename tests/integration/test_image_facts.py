"""The image decides (issue 24), on the real CPU image: the reusable CI step
(.github/actions/verify-image) runs against the image, and the probe's record of its `vllm serve`
parser is what `vllm serve --help=all` prints; `backend: ray` on an image without Ray is refused
before any container starts, and `kit build ray` restores it; an option the image lacks is refused
the same way; a launcher written without a record checks inside the container in seconds.

    flock /tmp/kit-docker.lock pytest tests/integration/test_image_facts.py -q -x
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.clusters import IMAGE, Cli, two_node_mp_env

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / ".github" / "actions" / "verify-image" / "action.yml"
CONFIG = ROOT / "tests" / "data" / "verify-image" / "kit.yaml"
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w.-]*)")


def help_flags(image: str) -> set[str]:
    """Every option string `vllm serve --help=all` prints (its option lines), the test's oracle."""
    out = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "vllm", image, "serve", "--help=all"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    flags: set[str] = set()
    for line in out.splitlines():
        # argparse writes an option's strings on a line indented by two spaces (its help further in;
        # vLLM's examples of dotted JSON keys are indented by three or more)
        if re.match(r"  -", line) and not line.startswith("   "):
            head = re.split(r"\s{2,}", line.strip())[0]
            flags.update(f for f in _FLAG.findall(head) if not f.isupper() and "." not in f)
    return flags


def recorded(state: Path, ref: str) -> dict[str, Any]:
    images = json.loads((state / "images.json").read_text())
    key = images[ref]["facts"]
    data: dict[str, Any] = json.loads((state / "image-facts" / (key.replace(":", "-") + ".json")).read_text())
    return data["facts"]


def containers_of(docker_client: Any, cluster: str) -> list[str]:
    found = docker_client.containers.list(all=True, filters={"label": f"kit.cluster={cluster}"})
    return [c.name for c in found]


@pytest.fixture(scope="module")
def image_without_ray(docker_client: Any, run_id: str) -> str:
    """kit's CPU image as vLLM's own images are since 0.18.0: no Ray."""
    tag = f"kit/vllm-cpu:noray-{run_id}"
    dockerfile = f"FROM {IMAGE}\nRUN python3 -m pip uninstall -y ray && ! python3 -c 'import ray'\n"
    (Path(f"/tmp/kit-noray-{run_id}")).mkdir(exist_ok=True)
    Path(f"/tmp/kit-noray-{run_id}/Dockerfile").write_text(dockerfile)
    docker_client.images.build(path=f"/tmp/kit-noray-{run_id}", tag=tag, labels={"kit.test-run": run_id}, rm=True)
    return tag


def test_ray_on_an_image_without_it_is_refused_and_kit_build_ray_restores_it(
    image_without_ray: str, cluster_name: str, kit_cli: Cli, docker_client: Any, tmp_path: Path, run_id: str
) -> None:
    env = {**two_node_mp_env(cluster_name, str(tmp_path / "hf"), None, second_octet=215)}
    env.update({"KIT_BACKEND": "ray", "KIT_IMAGE": image_without_ray, "KIT_STATE_DIR": str(tmp_path / "state")})
    started = time.monotonic()
    refused = kit_cli("up", "--head", env=env)  # first use: the image is probed, then refused
    print(f"kit up refused after {time.monotonic() - started:.1f} s (probe included)")
    assert refused.returncode == 3, refused.stdout + refused.stderr
    lines = [ln for ln in refused.stderr.splitlines() if ln.startswith("kit: error")]
    assert len(lines) == 1 and "backend" in lines[0] and "has no Ray" in lines[0], refused.stderr
    assert "backend: mp" in lines[0] and "kit build ray --base-image" in lines[0]
    assert containers_of(docker_client, cluster_name) == []  # nothing started
    again = kit_cli("up", "--head", "--dry-run", env=env)  # recorded now: the dry run refuses too
    assert again.returncode == 3 and "has no Ray" in again.stderr

    with_ray = f"{image_without_ray}-ray"
    started = time.monotonic()
    built = kit_cli("build", "ray", "--base-image", image_without_ray, "--tag", with_ray, env=env, timeout=1800)
    print(f"kit build ray: {time.monotonic() - started:.0f} s")
    try:
        assert built.returncode == 0, built.stdout + built.stderr
        assert "installing ray[default]" in built.stderr  # the pip step says what it does
        up = kit_cli("up", "--head", "--no-wait", env={**env, "KIT_IMAGE": with_ray})
        assert up.returncode == 0, up.stdout + up.stderr
        assert containers_of(docker_client, cluster_name) == [f"kit-{cluster_name}-head"]
    finally:
        kit_cli("down", env=env)
        docker_client.images.remove(with_ray, force=True)


def test_an_option_the_image_lacks_is_refused_before_anything_starts(
    cluster_name: str, kit_cli: Cli, docker_client: Any, tmp_path: Path
) -> None:
    env = two_node_mp_env(cluster_name, str(tmp_path / "hf"), None, second_octet=215)
    env["KIT_MODEL_EXTRA_ARGS"] = "[--enforce-eager, --no-such-option, '1']"
    for args in (["up", "--head"], ["up", "--head", "--dry-run"], ["serve", "--dry-run"]):
        result = kit_cli(*args, env=env)
        assert result.returncode == 3, result.stdout + result.stderr
        assert "model.extra_args" in result.stderr and "has no option --no-such-option" in result.stderr
    assert containers_of(docker_client, cluster_name) == []


def test_a_launcher_without_a_record_checks_inside_the_container_in_seconds(tmp_path: Path) -> None:
    from kit.config import load_config
    from kit.plan.roles import HEAD
    from kit.plan.scripts import serve_script

    env = two_node_mp_env("kit-precheck", str(tmp_path), None, second_octet=215)
    bad = load_config(environ={**env, "KIT_MODEL_EXTRA_ARGS": "[--no-such-option]"}, cwd=tmp_path).config
    node_env = ["-e", "VLLM_HOST_IP=10.0.0.1", "-e", "KIT_NODE_RANK=0", "-e", "KIT_HEAD_ADDRESS=10.0.0.1"]
    run = ["docker", "run", "--rm", "--network", "none", *node_env, "--entrypoint", "bash", IMAGE, "-c"]
    started = time.monotonic()
    result = subprocess.run([*run, serve_script(bad, HEAD, precheck=True)], capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    print(f"in-container check refused in {took:.1f} s")
    assert result.returncode == 3, result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("kit: model.extra_args: vLLM 0.32.0") and "--no-such-option" in last and "fix:" in last
    assert took < 120
    good = load_config(environ=env, cwd=tmp_path).config
    check = next(ln for ln in serve_script(good, HEAD, precheck=True).splitlines() if "python3 - check" in ln)
    passed = subprocess.run([*run, "set -euo pipefail; " + check], capture_output=True, text=True, timeout=300)
    assert passed.returncode == 0, passed.stderr


def test_the_reusable_ci_step_records_the_parser_vllm_serve_help_prints(tmp_path: Path) -> None:
    """.github/actions/verify-image's own commands, as the runner would run them: inputs through
    the environment, GITHUB_PATH and GITHUB_OUTPUT files, pull off (the image is local). Its `kit
    verify --image --config` probes the image into a fresh state: the record of the image's `vllm
    serve` parser is what `vllm serve --help=all` prints (one verify run for both, CI time)."""
    action = yaml.safe_load(ACTION.read_text())
    inputs = {"image": IMAGE, "config": str(CONFIG), "junit": str(tmp_path / "junit.xml"), "pull": "false"}
    inputs["python"] = "python3"
    context = {
        "github.action_path": str(ACTION.parent),
        "runner.temp": str(tmp_path),
        **{f"inputs.{k}": v for k, v in inputs.items()},
    }
    github_path, github_output = tmp_path / "path", tmp_path / "output"
    github_path.touch()
    github_output.touch()
    path = os.environ["PATH"]
    started = time.monotonic()
    for step in action["runs"]["steps"]:
        if "if" in step and step["if"] != "inputs.pull == 'true'":
            pytest.fail(f"unexpected condition {step['if']}")
        if "if" in step and inputs["pull"] != "true":
            continue
        assert "${{" not in step["run"], "inputs reach the script through the environment only"
        env = {k: re.sub(r"\$\{\{ ([\w.]+) \}\}", lambda m: context[m[1]], v) for k, v in step.get("env", {}).items()}
        extra = [p for p in github_path.read_text().splitlines() if p]
        full = {**os.environ, **env, "GITHUB_PATH": str(github_path), "GITHUB_OUTPUT": str(github_output)}
        full["PATH"] = ":".join([*extra, path])
        full["KIT_STATE_DIR"] = str(tmp_path / "state")
        result = subprocess.run(["bash", "-c", step["run"]], env=full, capture_output=True, text=True, timeout=1200)
        assert result.returncode == 0, f"{step['name']}: {result.stdout}\n{result.stderr}"
    print(f"the verify-image action's steps: {time.monotonic() - started:.0f} s")
    assert f"junit={inputs['junit']}" in github_output.read_text()
    cases = {c.get("name"): c for c in ET.parse(inputs["junit"]).getroot().iter("testcase")}
    for name in ("vllm.parser", "plan.serve_options", "plan.ray"):  # passed: neither failure nor warning
        assert name in cases and not list(cases[name]), (name, ET.tostring(cases.get(name, ET.Element("x"))))
    facts = recorded(tmp_path / "state", IMAGE)
    options = facts["vllm"]["serve"]["options"]
    ours = {flag for action in options if not action["hidden"] for flag in action["flags"]}
    theirs = help_flags(IMAGE)
    assert ours == theirs, (sorted(ours - theirs)[:20], sorted(theirs - ours)[:20])
    assert facts["vllm"]["version"].startswith("0.32.0") and facts["torch"]["version"].startswith("2.13.0")
    assert facts["user"]["name"] and facts["user"]["home"]

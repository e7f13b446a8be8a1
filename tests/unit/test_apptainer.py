"""The Apptainer adapter against a recording FAKE `apptainer`/`singularity` on PATH.

No Apptainer binary can be installed on these machines (FIELD_NOTES §4), so these tests check the
argv kit passes and how it handles failures the fake simulates (failed pull, interrupted pull,
failed or silent instance start); they do not prove Apptainer itself behaves as the fake does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from kit import resources
from kit.config import KitConfig
from kit.errors import ConfigError, ImageError, RuntimeUnavailable, StartError
from kit.images.build import plan_build_context
from kit.plan.network import NodeNet
from kit.plan.node import plan_node
from kit.plan.roles import HEAD
from kit.runtime.apptainer import (
    ApptainerRuntime,
    ApptainerSettings,
    definition_from_dockerfile,
    digest_from,
    pull_uri,
    sif_name,
)
from kit.runtime.base import Progress
from tests.conftest import ROOT, make_config

DIGEST = "sha256:" + "ab" * 32

FAKE = f"""#!{sys.executable}
# A recording fake of apptainer/singularity for kit's unit tests (not the real tool).
import json, os, sys, time
args = sys.argv[1:]
with open(os.environ["KIT_RECORD"], "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + args) + "\\n")
# The container environment arrives as APPTAINERENV_NAME variables (kit never passes --env).
with open(os.environ["KIT_RECORD"] + ".env", "a") as f:
    prefixes = ("APPTAINERENV_", "SINGULARITYENV_")
    f.write(json.dumps({{k: v for k, v in os.environ.items() if k.startswith(prefixes)}}) + "\\n")
if any(a == "--env" or a.startswith("--env=") for a in args):
    print("FAKE: kit must not pass --env (a comma list)", file=sys.stderr); sys.exit(97)
state_file = os.environ["KIT_FAKE_STATE"]
state = json.load(open(state_file)) if os.path.exists(state_file) else {{"instances": []}}
def save():
    json.dump(state, open(state_file, "w"))
if args[:1] == ["--version"]:
    print("apptainer version 1.3.4"); sys.exit(0)
if "-e" in args or "--cleanenv" in args or "--contain" in args or "--containall" in args:
    print("FAKE: kit must never pass -e/--cleanenv/--contain", file=sys.stderr); sys.exit(99)
cmd = args[0]
if cmd == "pull":
    assert args[1] == "--force", args
    path, uri = args[2], args[3]
    assert uri.startswith("docker://"), uri
    mode = os.environ.get("KIT_FAKE_PULL", "ok")
    print("INFO:    Converting OCI blobs to SIF format", file=sys.stderr)
    if mode == "fail":
        print("FATAL:   While making image from oci registry: manifest unknown", file=sys.stderr); sys.exit(255)
    open(path, "w").write("half a SIF")
    if mode == "interrupt":
        print("^C interrupted", file=sys.stderr); sys.exit(130)
    if mode == "empty":
        open(path, "w").write(""); sys.exit(0)
    open(path, "a").write(" and the rest"); sys.exit(0)
if cmd == "build":
    path, source = args[-2], args[-1]
    if os.environ.get("KIT_FAKE_BUILD") == "fail":
        print("FATAL:   Unable to build from " + source, file=sys.stderr); sys.exit(255)
    open(path, "w").write("SIF from " + source); sys.exit(0)
if cmd == "inspect":
    assert args[1:3] == ["--json", "--labels"], args
    labels = {{"org.opencontainers.image.title": "vllm", "org.opencontainers.image.base.digest": "{DIGEST}"}}
    print(json.dumps({{"data": {{"attributes": {{"labels": labels}}}}, "type": "container"}})); sys.exit(0)
if cmd == "instance":
    sub = args[1]
    if sub == "start":
        if os.environ.get("KIT_FAKE_START") == "fail":
            print("FATAL:   container creation failed: mount /nonexistent", file=sys.stderr); sys.exit(255)
        if os.environ.get("KIT_FAKE_START") != "silent":
            state["instances"].append({{"instance": args[-1], "pid": 4242, "img": args[-2], "ip": "",
                                        "logErrPath": "", "logOutPath": ""}})
            save()
        sys.exit(0)
    if sub == "list":
        assert args[2:] == ["--json"], args
        print(json.dumps({{"instances": state["instances"]}})); sys.exit(0)
    if sub == "stop":
        state["instances"] = [i for i in state["instances"] if i["instance"] != args[2]]
        save(); sys.exit(0)
if cmd == "exec":
    target = [a for a in args if a.startswith("instance://")][0]
    if args[-3:-1] == ["-c", args[-2]] and args[-4] == "/bin/bash":
        print("kit: fake node script running in " + target)
        print("KIT_READY role=head rank=0"); sys.exit(0)
    print("ran " + " ".join(args[args.index(target) + 1:])); sys.exit(0)
print("FAKE: unexpected " + " ".join(args), file=sys.stderr); sys.exit(98)
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kit_state_dir: Path) -> dict[str, Any]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("apptainer", "singularity"):
        (bindir / name).write_text(FAKE)
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setenv("KIT_RECORD", str(tmp_path / "record.jsonl"))
    monkeypatch.setenv("KIT_FAKE_STATE", str(tmp_path / "fake-state.json"))
    return {"bin": bindir, "tmp": tmp_path}


def recorded(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "record.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def recorded_env(tmp_path: Path) -> list[dict[str, str]]:
    """The APPTAINERENV_/SINGULARITYENV_ variables of each recorded call, in the same order."""
    path = tmp_path / "record.jsonl.env"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def runtime(tmp_path: Path) -> ApptainerRuntime:
    settings = ApptainerSettings(
        image_dir=str(tmp_path / "images"), cache_dir=str(tmp_path / "cache"), tmp_dir=str(tmp_path / "atmp")
    )
    return ApptainerRuntime(settings)


def apptainer_config(tmp_path: Path, **overrides: object) -> KitConfig:
    return make_config(runtime="apptainer", image=str(tmp_path / "vllm.sif"), **overrides)


def texts(events: list[Progress]) -> list[str]:
    return [e.text or "" for e in events]


def test_names_and_digests() -> None:
    assert sif_name("vllm/vllm-openai:v0.11.0") == "vllm_vllm-openai_v0.11.0.sif"
    assert sif_name("docker://vllm/vllm-openai") == "vllm_vllm-openai_latest.sif"
    assert sif_name("localhost:5000/kit/vllm@" + DIGEST).startswith("localhost_5000_kit_vllm_sha256-abab")
    assert pull_uri("vllm/vllm-openai:v1") == "docker://vllm/vllm-openai:v1"
    assert pull_uri("oras://x/y:1") == "oras://x/y:1"
    assert digest_from("x@" + DIGEST, {}) == (DIGEST, "reference")
    assert digest_from("x:1", {"a.digest": DIGEST}) == (DIGEST, "label a.digest")
    assert digest_from("x:1", {"title": "no"}) == (None, None)


def test_pull_writes_the_sif_atomically_and_records_the_digest(fake: dict[str, Any]) -> None:
    tmp = fake["tmp"]
    rt = runtime(tmp)
    events: list[Progress] = []
    plan = rt.plan_pull("vllm/vllm-openai:v0.11.0")
    sif = tmp / "images" / "vllm_vllm-openai_v0.11.0.sif"
    assert plan.destination == str(sif) and plan.source == "docker://vllm/vllm-openai:v0.11.0"
    assert rt.image_info("vllm/vllm-openai:v0.11.0") is None
    result = rt.pull(plan, on_progress=events.append)
    assert result.file is not None and result.file.path == str(sif)
    assert sif.read_text() == "half a SIF and the rest"
    assert result.file.source == "docker://vllm/vllm-openai:v0.11.0"
    assert result.digest == DIGEST and (result.file.digest_source or "").startswith("label")
    assert json.loads(Path(result.file.metadata).read_text())["digest"] == DIGEST
    assert sorted(p.name for p in (tmp / "images").iterdir()) == [sif.name, sif.name + ".json"]
    pull, inspect = recorded(tmp)
    assert pull[:3] == ["apptainer", "pull", "--force"]
    assert Path(pull[3]).name.startswith(f".{sif.name}.partial-") and pull[4] == result.file.source
    # the plan's argv is what ran, the destination replaced by the temporary name
    assert [*pull[:3], plan.destination, *pull[4:]] == list(plan.argv)
    assert inspect[:4] == ["apptainer", "inspect", "--json", "--labels"]
    assert events and "pulling" in texts(events)[0]
    assert (tmp / "cache").is_dir() and (tmp / "atmp").is_dir()  # APPTAINER_CACHEDIR/TMPDIR made
    info = rt.image_info("vllm/vllm-openai:v0.11.0")
    assert info is not None and info.path == str(sif) and info.digests == (DIGEST,)
    assert rt.remove_image("vllm/vllm-openai:v0.11.0") is True and list((tmp / "images").iterdir()) == []
    assert rt.remove_image("vllm/vllm-openai:v0.11.0") is False


@pytest.mark.parametrize("mode", ["fail", "interrupt", "empty"])
def test_failed_or_interrupted_pull_leaves_no_sif(mode: str, fake: dict[str, Any], monkeypatch: Any) -> None:
    tmp = fake["tmp"]
    monkeypatch.setenv("KIT_FAKE_PULL", mode)
    rt = runtime(tmp)
    with pytest.raises(ImageError) as err:
        rt.pull(rt.plan_pull("vllm/vllm-openai:v9"), on_progress=lambda _: None)
    assert list((tmp / "images").iterdir()) == []  # neither the SIF nor the partial file
    if mode == "fail":
        assert err.value.details and "manifest unknown" in err.value.details[-1]
        assert err.value.hint and "tag" in err.value.hint


def test_ctrl_c_during_pull_leaves_no_sif(fake: dict[str, Any]) -> None:
    tmp = fake["tmp"]

    def interrupt(event: Progress) -> None:
        if "labels" in (event.text or ""):  # after the pull wrote its file, before the rename
            raise KeyboardInterrupt

    rt = runtime(tmp)
    with pytest.raises(KeyboardInterrupt):
        rt.pull(rt.plan_pull("vllm/vllm-openai:v9"), on_progress=interrupt)
    assert list((tmp / "images").iterdir()) == []


def test_build_from_docker_daemon_and_from_a_def(fake: dict[str, Any], monkeypatch: Any) -> None:
    tmp = fake["tmp"]
    rt = runtime(tmp)
    folder = resources.container_dir("vllm")
    other_tag = plan_build_context("vllm", folder, probe_files=[], vllm_tag="v0.31.0")
    plan = rt.plan_build(other_tag, dest=str(tmp / "sif" / "kit-vllm.sif"))
    assert plan.source == "docker-daemon:kit/vllm:v0.31.0"  # the .def names another tag
    out = rt.build(plan, on_progress=lambda _: None)
    assert out.file is not None and out.image == str(tmp / "sif" / "kit-vllm.sif")
    assert Path(out.image).read_text() == "SIF from docker-daemon:kit/vllm:v0.31.0" and out.digest == DIGEST
    definition = ROOT / "containers" / "vllm" / "kit-vllm.def"
    default = rt.plan_build(plan_build_context("vllm", folder, probe_files=[]), dest=str(tmp / "sif" / "def.sif"))
    assert default.source == str(definition)  # the .def bootstraps from the default tag
    rt.build(default, on_progress=lambda _: None)
    builds = [a for a in recorded(tmp) if a[1] == "build"]
    assert builds[0][:3] == ["apptainer", "build", "--force"] and builds[0][-1] == "docker-daemon:kit/vllm:v0.31.0"
    assert builds[1][-1] == str(definition)
    assert [w for w in builds[1] if ".partial-" not in w] == [w for w in default.argv if w != default.image]
    assert rt.plan_build(other_tag).image == str(tmp / "images" / "kit_vllm_v0.31.0.sif")
    monkeypatch.setenv("KIT_FAKE_BUILD", "fail")
    nope = rt.plan_build(other_tag, source="docker-daemon:kit/nope:1", dest=str(tmp / "sif" / "nope.sif"))
    with pytest.raises(ImageError):
        runtime(tmp).build(nope, on_progress=lambda _: None)
    assert not (tmp / "sif" / "nope.sif").exists()
    assert sorted(p.name for p in (tmp / "sif").iterdir()) == [
        "def.sif",
        "def.sif.json",
        "kit-vllm.sif",
        "kit-vllm.sif.json",
    ]


def test_up_path_instance_start_exec_status_logs_down(fake: dict[str, Any]) -> None:
    tmp = fake["tmp"]
    rt = runtime(tmp)
    cfg = apptainer_config(tmp)
    spec = plan_node(cfg, HEAD, NodeNet("10.0.0.1", "ib0", "10.0.0.1"), has_infiniband=True)
    rt.start(spec)
    line = rt.wait_for_mark(spec.name, ["KIT_READY"], timeout=20, on_progress=lambda _: None, what="ready")
    assert line.startswith("KIT_READY")
    calls = list(zip(recorded(tmp), recorded_env(tmp), strict=True))
    (start, start_env), (exec_, exec_env) = [
        c for c in calls if c[0][1] in ("instance", "exec") and c[0][2:3] != ["list"]
    ][:2]
    assert start[:4] == ["apptainer", "instance", "start", "--nv"]
    assert start[-2:] == [cfg.image, "kit-llama-head"]
    assert start_env["APPTAINERENV_VLLM_HOST_IP"] == "10.0.0.1" and "-e" not in start
    # The node script exec'd into the instance gets the environment too (an instance's start
    # environment does not reach exec'd processes).
    assert exec_env == start_env == {f"APPTAINERENV_{k}": v for k, v in spec.env.items()}
    assert "--bind=/etc/kit/hf_token:/run/kit/secrets/hf_token:ro" in start
    assert exec_[:3] == ["apptainer", "exec", "instance://kit-llama-head"] and exec_[3:5] == ["/bin/bash", "-c"]
    [node] = rt.find_nodes("llama")
    assert (node.name, node.role, node.rank, node.ip, node.state) == (
        "kit-llama-head",
        "head",
        0,
        "10.0.0.1",
        "running",
    )
    assert rt.find_nodes("other") == []
    result = rt.exec(node, ["ray", "status"], env={"A": "1"}, timeout=7)
    assert result.returncode == 0 and result.stdout.rstrip().endswith("kit-exec 7 ray status")
    # Bounded inside the instance (issue 25): the command runs under `timeout` with its deadline,
    # marked in its environment so an interrupted kit can end it.
    assert recorded(tmp)[-1][:3] == ["apptainer", "exec", "instance://kit-llama-head"]
    assert recorded(tmp)[-1][3:5] == ["sh", "-c"] and recorded(tmp)[-1][-4:] == ["kit-exec", "7", "ray", "status"]
    exec_env = recorded_env(tmp)[-1]
    assert exec_env.pop("APPTAINERENV_A") == "1" and list(exec_env) == ["APPTAINERENV_KIT_EXEC_ID"]
    assert "KIT_READY" in rt.logs(spec.name) and rt.logs(spec.name, tail=1).startswith("KIT_READY")
    assert rt.remove_cluster("llama") == {"containers": ["kit-llama-head"], "networks": []}
    assert rt.state(spec.name) is None and rt.remove(spec.name) is False


@pytest.mark.parametrize("mode", ["fail", "silent"])
def test_failed_instance_start_is_a_start_error(mode: str, fake: dict[str, Any], monkeypatch: Any) -> None:
    tmp = fake["tmp"]
    monkeypatch.setenv("KIT_FAKE_START", mode)
    rt = runtime(tmp)
    spec = plan_node(apptainer_config(tmp), HEAD, NodeNet("10.0.0.1", "ib0", "10.0.0.1"))
    with pytest.raises(StartError) as err:
        rt.start(spec)
    if mode == "fail":
        assert "container creation failed" in err.value.details[-1]
    assert not any(a[1] == "exec" for a in recorded(tmp))  # the node script never ran


def test_singularity_alone_is_used_and_none_is_runtime_unavailable(fake: dict[str, Any], monkeypatch: Any) -> None:
    tmp = fake["tmp"]
    (fake["bin"] / "apptainer").unlink()
    rt = runtime(tmp)
    assert rt.binary == "singularity"
    rt.pull(rt.plan_pull("vllm/vllm-openai:v1"), on_progress=lambda _: None)
    assert recorded(tmp)[0][:2] == ["singularity", "pull"]
    (fake["bin"] / "singularity").unlink()
    none = runtime(tmp)
    assert none.plan_pull("vllm/vllm-openai:v1").argv[0] == "apptainer"  # planning needs no binary
    with pytest.raises(RuntimeUnavailable):
        none.state("kit-llama-head")


def test_no_private_networks() -> None:
    """Apptainer instances use the host network: asking for a private one is a config error."""
    with pytest.raises(ConfigError, match="host network") as err:
        ApptainerRuntime(ApptainerSettings(), binary="apptainer").ensure_network("kit-net", "10.9.0.0/24", "c")
    assert err.value.key == "network"


@pytest.mark.parametrize("name", ["cpu", "vllm"])
def test_definition_files_are_current(name: str) -> None:
    """containers/<name>/kit-<name>.def is generated from the Dockerfile (containers/make-defs.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_defs", ROOT / "containers" / "make-defs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = ROOT / "containers" / name / f"kit-{name}.def"
    assert path.read_text() == module.expected()[path], f"{path} is stale: run containers/make-defs.py"
    text = path.read_text()
    assert "Bootstrap: docker-daemon" in text and "%environment" in text


def test_definition_from_dockerfile_takes_the_final_stage() -> None:
    dockerfile = (
        "FROM base AS build\nENV BUILD_ONLY=1\nRUN make\n\nFROM base\nENV A=1 \\\n    B=two\n"
        'LABEL x.title="kit x" \\\n      x.desc=plain\nCMD ["/bin/bash"]\n'
    )
    text = definition_from_dockerfile(dockerfile, image="kit/x:1", source="containers/x/Dockerfile")
    assert "From: kit/x:1" in text and "BUILD_ONLY" not in text
    assert "    export A=1" in text and "    export B=two" in text
    assert "    x.title kit x" in text and "    x.desc plain" in text


def test_comma_values_arrive_whole_and_inject_nothing(fake: dict[str, Any]) -> None:
    """Apptainer reads --env as a comma list (NCCL_IB_HCA=mlx5_0,mlx5_1 would be split, and
    `x,LD_PRELOAD=...` would add a variable): kit passes the environment as APPTAINERENV_ variables,
    one per name, whatever the value holds."""
    tmp = fake["tmp"]
    rt = runtime(tmp)
    cfg = apptainer_config(tmp, env={"NCCL_IB_HCA": "mlx5_0,mlx5_1", "X": "x,LD_PRELOAD=/tmp/evil.so"})
    spec = plan_node(cfg, HEAD, NodeNet("10.0.0.1", "ib0", "10.0.0.1"))
    rt.start(spec)
    start_env = next(env for argv, env in zip(recorded(tmp), recorded_env(tmp), strict=True) if argv[1] == "instance"
                     and argv[2] == "start")  # fmt: skip
    assert start_env["APPTAINERENV_NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert start_env["APPTAINERENV_X"] == "x,LD_PRELOAD=/tmp/evil.so"
    assert not any("LD_PRELOAD" in key for key in start_env)
    assert not any(a.startswith("--env") for argv in recorded(tmp) for a in argv)


@pytest.mark.parametrize(
    ("overrides", "key", "char"),
    [
        ({"hf_cache": "/data/a,b"}, "hf_cache", ","),
        ({"mounts": ["/data/x:/in,side"]}, "mounts", ","),
        ({"env": {"A": "$(touch /tmp/pwned)"}}, "env", "$"),
        ({"env": {"A": "`id`"}}, "env", "`"),
    ],
)
def test_what_apptainer_would_split_or_expand_is_refused(
    overrides: dict[str, Any], key: str, char: str, fake: dict[str, Any]
) -> None:
    """A bind path with ',' (Apptainer splits --bind at commas) and an environment value with `$`
    or a backtick (Apptainer's shell evaluates them) are refused with one line naming the key,
    before anything runs."""
    from kit.errors import ConfigError

    tmp = fake["tmp"]
    rt = runtime(tmp)
    spec = plan_node(apptainer_config(tmp, **overrides), HEAD, NodeNet("10.0.0.1", "ib0", "10.0.0.1"))
    with pytest.raises(ConfigError) as err:
        rt.start(spec)
    assert err.value.key == key and repr(char) in err.value.message and "\n" not in err.value.message
    assert not any(argv[1:3] == ["instance", "start"] for argv in recorded(tmp))


def test_singularity_binary_gets_singularityenv(fake: dict[str, Any]) -> None:
    tmp = fake["tmp"]
    (fake["bin"] / "apptainer").unlink()
    rt = runtime(tmp)
    rt.start(plan_node(apptainer_config(tmp), HEAD, NodeNet("10.0.0.1", "ib0", "10.0.0.1")))
    env = next(
        e for argv, e in zip(recorded(tmp), recorded_env(tmp), strict=True) if argv[1:3] == ["instance", "start"]
    )
    assert env["SINGULARITYENV_VLLM_HOST_IP"] == "10.0.0.1" and not any(k.startswith("APPTAINERENV_") for k in env)


@pytest.mark.host_nodes
def test_site_options_gpu_ids_and_what_a_node_holds_through_the_fake(fake: dict[str, Any]) -> None:
    """Issue 28, against the recording fake (no Apptainer binary can exist here): the site's GPU
    and extra options replace --nv, the selected GPUs keep their physical ids (--nv shows every
    GPU), kit's binds lie outside /root, and the instance is found again with what it holds."""
    tmp = fake["tmp"]
    rt = runtime(tmp)
    site = {"apptainer.gpu_args": ["--nvccli", "--writable-tmpfs"], "apptainer.extra_args": ["--bind=/scratch"]}
    cfg = apptainer_config(tmp, nodes=1, gpus="2,3", gpus_per_node=2, vllm_version="0.23.0", **site)
    spec = plan_node(cfg, HEAD, NodeNet("10.0.0.1", "ib0", "10.0.0.1"))
    rt.start(spec)
    start, env = next(
        (c, e) for c, e in zip(recorded(tmp), recorded_env(tmp), strict=True) if c[1:3] == ["instance", "start"]
    )
    assert start[3:6] == ["--nvccli", "--writable-tmpfs", "--bind=/scratch"] and "--nv" not in start
    assert env["APPTAINERENV_CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "--bind=/data/hf:/kit/hf-cache" in start and not any(":/root" in a for a in start)
    [node] = rt.host_nodes()
    assert node.cluster == "llama" and node.labels["kit.gpus"] == "2,3" and node.labels["kit.host-ports"]

"""What you see is what runs (issue 17): `kit up`, `kit build` and `kit pull --dry-run` print what
the runtime adapter then executes, for every renderer. The printed command is parsed back and
compared with what the adapter hands to its backend: docker-py's `containers.run`, `api.build`
and `api.pull` arguments (a fake docker client records them: no engine is needed to see what kit
asks for) and the `apptainer` argv passed to kit.proc (recorded instead of run: no Apptainer
binary can be installed here, FIELD_NOTES §4).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import docker
import pytest

import kit.runtime
from kit import proc
from kit.images import records
from kit.runtime import apptainer_settings
from kit.runtime.apptainer import ApptainerRuntime
from kit.runtime.docker import DockerRuntime
from tests.conftest import run_kit
from tests.unit.recorded_parsers import ProbeContainer, probe_output, seed_record


def printed_commands(text: str) -> list[list[str]]:
    """The command lines `kit up --dry-run` prints under '# command:' (each may span lines: the
    node script is one quoted word), split into argv like the shell would."""
    words = shlex.split(text.split("\n# command:\n", 1)[1])
    starts = [
        i
        for i, w in enumerate(words)
        if (i == 0 or words[i - 1] != "-c")
        and (w in ("docker", "env") or (w == "apptainer" and not (i and _prefix(words[i - 1]))))
    ]
    return [words[a:b] for a, b in zip(starts, [*starts[1:], len(words)], strict=True)]


def _prefix(word: str) -> bool:
    """A word of an `env NAME=VALUE ... apptainer` prefix (Apptainer's environment, never --env)."""
    return word == "env" or word.startswith("APPTAINERENV_")


def split_env(command: list[str]) -> tuple[dict[str, str], list[str]]:
    """`env A=1 B=2 apptainer ...` -> ({A: 1, B: 2}, [apptainer, ...])."""
    if command[0] != "env":
        return {}, command
    at = command.index("apptainer")
    return dict(word.split("=", 1) for word in command[1:at]), command[at:]


# ---- Docker: the printed `docker run`, parsed back into containers.run kwargs -------------------


def kwargs_from_docker_argv(argv: Sequence[str]) -> dict[str, Any]:
    """An independent reading of `docker run` flags into docker-py kwargs (docker.types included)."""
    assert list(argv[:2]) == ["docker", "run"]
    kw: dict[str, Any] = {"labels": {}, "environment": {}, "volumes": [], "detach": False}
    i = 2
    while argv[i].startswith("-"):
        flag, _, value = argv[i].partition("=")
        i += 1
        if flag == "--detach":
            kw["detach"] = True
        elif flag == "--init":
            kw["init"] = True
        elif flag == "--restart":  # the CLI's --restart is docker-py's restart_policy
            kw["restart_policy"] = {"Name": value}
        elif flag == "--name":
            kw["name"] = value
        elif flag == "--network":
            kw["network_mode" if value == "host" else "network"] = value
        elif flag == "--hostname":
            kw["hostname"] = value
        elif flag == "--ip":
            kw["ip"] = value
        elif flag == "--ipc":
            kw["ipc_mode"] = value
        elif flag == "--shm-size":
            kw["shm_size"] = value
        elif flag == "--gpus":
            ids = None if value == "all" else value.strip('"').removeprefix("device=").split(",")
            request = docker.types.DeviceRequest(count=-1 if ids is None else None, device_ids=ids,
                                                 capabilities=[["gpu"]])  # fmt: skip
            kw.setdefault("device_requests", []).append(request)
        elif flag == "--device":
            kw.setdefault("devices", []).append(value)
        elif flag == "--cap-add":
            kw.setdefault("cap_add", []).append(value)
        elif flag == "--ulimit":
            name, _, limits = value.partition("=")
            soft, hard = (int(x) for x in limits.split(":"))
            kw.setdefault("ulimits", []).append(docker.types.Ulimit(name=name, soft=soft, hard=hard))
        elif flag == "--volume":
            kw["volumes"].append(value if value.endswith(":ro") else f"{value}:rw")
        elif flag == "--env":
            key, _, val = value.partition("=")
            kw["environment"][key] = val
        elif flag == "--label":
            key, _, val = value.partition("=")
            kw["labels"][key] = val
        elif flag == "--entrypoint":
            kw["entrypoint"] = [value]
        else:
            raise AssertionError(f"unexpected flag {argv[i - 1]}")
    kw["image"], kw["command"] = argv[i], list(argv[i + 1 :])
    return kw


class FakeDocker:
    """Just enough of docker.DockerClient for DockerRuntime.start: containers.run is recorded."""

    def __init__(self) -> None:
        self.runs: list[dict[str, Any]] = []
        self.api = self
        outer = self

        class Images:
            def get(self, ref: str) -> Any:
                return type("Image", (), {"id": "sha256:" + "0" * 64, "attrs": {}, "tags": [ref]})()

        class Containers:
            def get(self, name: str) -> Any:
                raise docker.errors.NotFound(name)

            def run(self, **kwargs: Any) -> Any:
                if kwargs.get("command", [""])[0] == "python3":  # kit's image facts probe (issue 24)
                    return ProbeContainer()
                outer.runs.append(kwargs)
                return None

        class Networks:
            def list(self, names: Sequence[str] = ()) -> list[Any]:
                return [type("Network", (), {"name": n})() for n in names]

        self.images, self.containers, self.networks = Images(), Containers(), Networks()

    def ping(self) -> bool:
        return True

    def create_endpoint_config(self, **kwargs: Any) -> Any:
        return docker.types.EndpointConfig("1.44", **kwargs)


DOCKER_CASES = {
    "host network, IPC host, all GPUs, InfiniBand": ["--set", "infiniband=on"],
    "simulation network with a fixed IP, shm, selected GPUs": [
        "--network", "rtnet", "--set", "ipc_host=false", "--set", "shm_size=2g", "--set", "gpus=0,1",
        "--gpus-per-node", "2",
    ],
    "CPU worker": ["--worker", "--head-address", "10.0.0.1", "--nodes", "2", "--accelerator", "cpu", "--network", "n"],
}  # fmt: skip


@pytest.mark.parametrize("case", DOCKER_CASES)
def test_docker_dry_run_is_what_containers_run_receives(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeDocker()
    monkeypatch.setattr(kit.runtime, "get_runtime", lambda config: DockerRuntime(client=fake))
    monkeypatch.setenv("KIT_STATE_DIR", str(tmp_path / "state"))
    # kit recorded the image (issue 24), so the dry run renders what the run will: its parser decides
    seed_record("vllm/vllm-openai:v0.33.0", "sha256:" + "0" * 64, image_id="sha256:" + "0" * 64)
    args = ["up", *DOCKER_CASES[case], "--cluster", "rt", "--set", f"hf_cache={tmp_path}"]
    code, out, err = run_kit([*args, "--dry-run"])
    assert code == 0, err
    [printed] = printed_commands(out)
    code, _, err = run_kit([*args, "--no-wait"])
    assert code == 0, err
    [ran] = fake.runs
    expected = kwargs_from_docker_argv(printed)
    if "ip" in expected:  # docker run --ip: an endpoint config on the network
        ip = expected.pop("ip")
        expected["networking_config"] = {expected["network"]: docker.types.EndpointConfig("1.44", ipv4_address=ip)}
    assert ran == expected


# ---- Apptainer: the printed `apptainer instance start` and `exec`, as kit.proc receives them ----


def test_apptainer_dry_run_is_what_the_adapter_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[list[str]] = []
    envs: list[dict[str, str]] = []
    started: list[str] = []

    def fake_run(argv: Sequence[str], env: dict[str, str] | None = None, **_: Any) -> subprocess.CompletedProcess[str]:
        ran.append(list(argv))
        envs.append({k: v for k, v in (env or {}).items() if k.startswith("APPTAINERENV_")})
        if list(argv[1:3]) == ["instance", "start"]:
            started.append(argv[-1])
        listing = {"instances": [{"instance": name, "img": "x"} for name in started]}
        stdout = json.dumps(listing) if list(argv[1:3]) == ["instance", "list"] else ""
        if list(argv[1:2]) == ["exec"] and "python3" in argv:  # kit's image facts probe (issue 24)
            ran.pop()
            envs.pop()
            stdout = probe_output()
        return subprocess.CompletedProcess(list(argv), 0, stdout, "")

    monkeypatch.setattr(proc, "run", fake_run)
    monkeypatch.setattr(
        kit.runtime,
        "get_runtime",
        lambda config: ApptainerRuntime(apptainer_settings(config), binary="apptainer", state_dir=tmp_path),
    )
    sif = tmp_path / "vllm.sif"
    sif.write_bytes(b"SIF")
    monkeypatch.setenv("KIT_STATE_DIR", str(tmp_path / "state"))
    # kit recorded the image (issue 24), so the dry run renders what the run will: its parser decides
    seed_record(str(sif), records.file_key(str(sif)), stamp=records.file_stamp(str(sif)), path=str(sif))
    args = ["up", "--runtime", "apptainer", "--image", str(tmp_path / "vllm.sif"), "--cluster", "rt",
            "--set", f"hf_cache={tmp_path}", "--set", "infiniband=on"]  # fmt: skip
    code, out, err = run_kit([*args, "--dry-run"])
    assert code == 0, err
    (start_env, start), (exec_env, exec_) = (split_env(c) for c in printed_commands(out))
    assert start_env["APPTAINERENV_VLLM_HOST_IP"] and start_env == exec_env
    (tmp_path / "vllm.sif").write_bytes(b"SIF")  # kit up checks the image is here before it starts
    code, _, err = run_kit([*args, "--no-wait"])
    assert code == 0, err
    # `apptainer instance start ...` exactly as printed, with exactly the printed environment
    assert (start, start_env) in list(zip(ran, envs, strict=True))
    [(detached, detached_env)] = [(argv, env) for argv, env in zip(ran, envs, strict=True) if argv[:2] == ["sh", "-c"]]
    assert detached[5:] == exec_  # sh -c "nohup setsid ..." kit-detach LOG <the printed exec argv>
    assert detached_env == exec_env


# ---- kit build / kit pull: the printed plan is what the adapter sends ---------------------------


class FakeEngine:
    """Just enough of docker.DockerClient (and APIClient: the same object) for DockerRuntime's
    build and pull: the requests are recorded, the image then exists."""

    def __init__(self) -> None:
        self.api = self.images = self
        self.containers = type("Containers", (), {"run": staticmethod(lambda **kw: ProbeContainer())})()
        self.builds: list[dict[str, Any]] = []
        self.pulls: list[tuple[str, str]] = []
        self.local: set[str] = set()

    def get(self, ref: str) -> Any:
        if ref not in self.local:
            raise docker.errors.ImageNotFound(ref)
        return type("Image", (), {"id": "sha256:" + "1" * 64, "attrs": {}, "tags": [ref]})()

    def build(self, **kwargs: Any) -> Any:
        self.builds.append(dict(kwargs))
        assert (Path(kwargs["path"]) / kwargs["dockerfile"]).is_file()  # the context as planned
        self.local.add(kwargs["tag"])
        yield {"stream": "Step 1/1 : FROM scratch\n"}

    def pull(self, repository: str, *, tag: str, stream: bool, decode: bool) -> Any:
        self.pulls.append((repository, tag))
        self.local.add(f"{repository}{'@' if tag.startswith('sha256:') else ':'}{tag}")
        yield {"status": "Digest: sha256:" + "2" * 64}


def build_kwargs_from_argv(argv: Sequence[str]) -> dict[str, Any]:
    """An independent reading of the printed `docker build` into docker-py APIClient.build kwargs."""
    assert list(argv[:3]) == ["DOCKER_BUILDKIT=0", "docker", "build"]  # the classic builder, as the API
    kw: dict[str, Any] = {"buildargs": {}, "labels": {}, "rm": False, "forcerm": False}
    words = list(argv[3:])
    while len(words) > 1:
        flag = words.pop(0)
        if flag in ("--rm", "--force-rm"):
            kw["rm" if flag == "--rm" else "forcerm"] = True
            continue
        value = words.pop(0)
        if flag in ("--tag", "--file"):
            kw["tag" if flag == "--tag" else "dockerfile"] = value
        elif flag in ("--build-arg", "--label"):
            key, _, val = value.partition("=")
            kw["buildargs" if flag == "--build-arg" else "labels"][key] = val
        else:
            raise AssertionError(f"unexpected flag {flag}")
    kw["path"] = words[0]
    return kw


BUILD_CASES = {
    "cpu, tag, offline, a build arg": ["cpu", "-t", "me/cpu:1", "--offline", "--build-arg", "TORCH_INDEX_URL=x y"],
    "vllm, another vLLM tag and repository": ["vllm", "--vllm-tag", "v0.31.0", "--base-image", "mirror/vllm"],
}


@pytest.mark.parametrize("case", BUILD_CASES)
def test_docker_build_dry_run_is_what_the_engine_receives(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeEngine()
    monkeypatch.setattr(kit.runtime, "get_image_store", lambda config: DockerRuntime(client=fake))
    monkeypatch.setenv("KIT_STATE_DIR", str(tmp_path / "state"))
    args = ["build", *BUILD_CASES[case]]
    code, out, err = run_kit([*args, "--dry-run"])
    assert code == 0, err
    printed = shlex.split(out.rstrip().splitlines()[-1])
    code, out, err = run_kit([*args, "--dry-run", "--json"])
    assert json.loads(out)["result"]["argv"] == printed
    assert fake.builds == []  # --dry-run sent nothing
    code, _, err = run_kit(args)
    assert code == 0, err
    [sent] = fake.builds
    assert sent.pop("decode") is True  # docker-py's client-side stream decoding, not an engine parameter
    context = sent.pop("path")
    expected = build_kwargs_from_argv(printed)
    assert expected.pop("path") == "CONTEXT" and Path(context).name.startswith("kit-build-")
    assert sent == expected


def test_apptainer_build_dry_run_is_what_the_adapter_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[list[str]] = []

    def fake_run(argv: Sequence[str], **_: Any) -> subprocess.CompletedProcess[str]:
        ran.append(list(argv))
        if argv[1] == "build":
            Path(argv[-2]).write_text("SIF")  # the temporary name the adapter gave
        stdout = json.dumps({"data": {"attributes": {"labels": {}}}}) if argv[1] == "inspect" else ""
        return subprocess.CompletedProcess(list(argv), 0, stdout, "")

    monkeypatch.setattr(proc, "run", fake_run)
    monkeypatch.setenv("KIT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(
        kit.runtime, "get_image_store", lambda config: ApptainerRuntime(apptainer_settings(config), binary="apptainer")
    )
    args = ["build", "cpu", "--runtime", "apptainer", "--set", f"apptainer.image_dir={tmp_path}"]
    code, out, err = run_kit([*args, "--dry-run"])
    assert code == 0, err
    printed = shlex.split(out.rstrip().splitlines()[-1])
    assert ran == []
    code, out, err = run_kit(args)
    assert code == 0, err
    [built] = [argv for argv in ran if argv[1] == "build"]
    dest = printed[-2]
    assert Path(built[-2]).name.startswith(f".{Path(dest).name}.partial-")
    assert [*built[:-2], dest, built[-1]] == printed
    assert Path(dest).read_text() == "SIF"


def test_pull_dry_run_is_what_the_adapters_pull(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeEngine()
    monkeypatch.setattr(kit.runtime, "get_image_store", lambda config: DockerRuntime(client=fake))
    monkeypatch.setenv("KIT_STATE_DIR", str(tmp_path / "state"))
    ref = "127.0.0.1:5000/kit/base@sha256:" + "3" * 64
    code, out, err = run_kit(["pull", ref, "--dry-run", "--json"])
    assert code == 0, err
    plan = json.loads(out)["result"]
    assert fake.pulls == [] and plan["source"] == ref
    code, _, err = run_kit(["pull", ref])
    assert code == 0, err
    assert fake.pulls == [("127.0.0.1:5000/kit/base", "sha256:" + "3" * 64)]  # the engine takes the digest as tag

    ran: list[list[str]] = []

    def fake_run(argv: Sequence[str], **_: Any) -> subprocess.CompletedProcess[str]:
        ran.append(list(argv))
        if argv[1] == "pull":
            Path(argv[3]).write_text("SIF")
        labels = {"org.opencontainers.image.base.digest": "sha256:" + "4" * 64}
        stdout = json.dumps({"data": {"attributes": {"labels": labels}}}) if argv[1] == "inspect" else ""
        return subprocess.CompletedProcess(list(argv), 0, stdout, "")

    monkeypatch.setattr(proc, "run", fake_run)
    monkeypatch.setattr(
        kit.runtime, "get_image_store", lambda config: ApptainerRuntime(apptainer_settings(config), binary="apptainer")
    )
    args = ["pull", "vllm/vllm-openai:v0.11.0", "--runtime", "apptainer", "--set", f"apptainer.image_dir={tmp_path}"]
    code, out, err = run_kit([*args, "--dry-run", "--json"])
    assert code == 0, err
    printed = json.loads(out)["result"]["argv"]
    code, _, err = run_kit(args)
    assert code == 0, err
    [pulled] = [argv for argv in ran if argv[1] == "pull"]
    assert [*pulled[:3], printed[3], *pulled[4:]] == printed and pulled[3] != printed[3]

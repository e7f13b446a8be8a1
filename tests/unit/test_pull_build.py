"""kit pull / kit build without an engine: refs, progress lines, the context plan, the state record,
and the verbs through the CLI with the real Docker adapter on a fake docker-py client (scripted
pull/build events: no engine is needed to check what kit does with them) and the real Apptainer
adapter's planning with its pull/build faked (no Apptainer binary can be installed here)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import docker
import pytest

import kit.runtime
from kit import resources
from kit.errors import ExitCode, ImageError, ImageRefError, UsageError
from kit.images import records as state
from kit.images.build import plan_build_context, write_build_context
from kit.images.progress import PullProgress, build_image_id, build_step_line, format_layer_line, shorten_build_error
from kit.images.reference import parse_ref, pick_digest
from kit.runtime import apptainer_settings
from kit.runtime.apptainer import ApptainerRuntime
from kit.runtime.base import BuildPlan, BuildResult, ImageFile, Progress, PullPlan, PullResult
from kit.runtime.docker import DockerRuntime
from tests.conftest import run_kit
from tests.unit.recorded_parsers import ProbeContainer

# No KIT_* variable from the caller's shell; the working directory and KIT_STATE_DIR in tmp_path.
pytestmark = pytest.mark.usefixtures("kit_env")


# ---- refs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "repository", "tag", "digest", "pull_tag"),
    [
        ("ubuntu", "ubuntu", "latest", None, "latest"),
        ("vllm/vllm-openai:v0.32.0", "vllm/vllm-openai", "v0.32.0", None, "v0.32.0"),
        ("127.0.0.1:5000/kit/base:test", "127.0.0.1:5000/kit/base", "test", None, "test"),
        ("localhost:5000/a/b", "localhost:5000/a/b", "latest", None, "latest"),
        ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io/nvidia/pytorch", "24.05-py3", None, "24.05-py3"),
        ("r/x@sha256:" + "a" * 64, "r/x", None, "sha256:" + "a" * 64, "sha256:" + "a" * 64),
        ("r/x:1@sha256:" + "b" * 64, "r/x", "1", "sha256:" + "b" * 64, "sha256:" + "b" * 64),
    ],
)
def test_parse_ref(ref: str, repository: str, tag: str | None, digest: str | None, pull_tag: str) -> None:
    parsed = parse_ref(ref)
    assert (parsed.repository, parsed.tag, parsed.digest, parsed.pull_tag) == (repository, tag, digest, pull_tag)


@pytest.mark.parametrize("ref", ["", "Vllm/Openai", "a b", "x:", "x@sha256:zz", "-x", "a//b"])
def test_malformed_refs_are_image_errors(ref: str) -> None:
    with pytest.raises(ImageRefError) as exc:
        parse_ref(ref)
    assert exc.value.exit_code == ExitCode.IMAGE


def test_pick_digest_prefers_the_refs_repository() -> None:
    ref = parse_ref("docker.io/library/ubuntu:22.04")
    digests = ["mirror.local/ubuntu@sha256:1", "ubuntu@sha256:2"]
    assert pick_digest(ref, digests, "sha256:id") == "ubuntu@sha256:2"
    assert pick_digest(parse_ref("other/x"), digests, "sha256:id") == "mirror.local/ubuntu@sha256:1"
    assert pick_digest(ref, [], "sha256:id") == "sha256:id"


# ---- progress -----------------------------------------------------------------------------


def test_format_layer_line() -> None:
    assert format_layer_line("a1b2c3d4", "Downloading", 12_300_000, 45_600_000) == "a1b2c3d4: Downloading 12.3/45.6 MB"
    assert format_layer_line("a1b2c3d4", "Downloading", 1_000_000, None) == "a1b2c3d4: Downloading 1.0 MB"
    assert format_layer_line("a1b2c3d4", "Pull complete") == "a1b2c3d4: Pull complete"


def dl(layer: str, current: int, total: int = 45_600_000) -> dict[str, Any]:
    return {"status": "Downloading", "id": layer, "progressDetail": {"current": current, "total": total}}


def test_pull_progress_throttles_per_layer_but_shows_every_status_change() -> None:
    p = PullProgress(interval=1.0)
    events = [
        (0.0, {"status": "Pulling from kit/base", "id": "test"}),
        (0.0, {"status": "Pulling fs layer", "id": "aaa", "progressDetail": {}}),
        (0.1, dl("aaa", 1_000_000)),  # status change: shown
        (0.5, dl("aaa", 5_000_000)),  # same status within 1 s: hidden
        (0.6, dl("bbb", 1_000_000, 2_000_000)),  # another layer: shown
        (1.2, dl("aaa", 12_300_000)),  # 1.1 s later: shown
        (1.3, {"status": "Download complete", "id": "aaa", "progressDetail": {}}),
        (1.4, {"status": "Extracting", "id": "aaa", "progressDetail": {"current": 32_768, "total": 45_600_000}}),
        (1.5, {"status": "Pull complete", "id": "aaa", "progressDetail": {}}),
        (1.6, {"status": "Digest: sha256:abc"}),
        (1.6, {"status": "Digest: sha256:abc"}),  # repeated non-layer line: hidden
    ]
    lines = [p.line(event, now) for now, event in events]
    assert [ln for ln in lines if ln] == [
        "test: Pulling from kit/base",
        "aaa: Pulling fs layer",
        "aaa: Downloading 1.0/45.6 MB",
        "bbb: Downloading 1.0/2.0 MB",
        "aaa: Downloading 12.3/45.6 MB",
        "aaa: Download complete",
        "aaa: Extracting 0.0/45.6 MB",
        "aaa: Pull complete",
        "Digest: sha256:abc",
    ]
    assert p.digest == "sha256:abc"
    assert p.summary() == "1/2 layers complete, 46.6/47.6 MB downloaded"


def test_build_event_helpers() -> None:
    assert build_step_line({"stream": "Step 3/12 : RUN apt-get update\n"}) == "Step 3/12 : RUN apt-get update"
    assert build_step_line({"stream": " ---> abc\n"}) is None
    assert len(build_step_line({"stream": "Step 1/2 : RUN " + "x" * 500}) or "") == 160
    assert build_image_id({"aux": {"ID": "sha256:feed"}}) == "sha256:feed"
    assert build_image_id({"stream": "Successfully built 1234abcd\n"}) == "1234abcd"
    assert build_image_id({"stream": "Step 1/2 : FROM x"}) is None


def test_build_error_names_the_step_not_the_whole_run_line() -> None:
    message = "The command '/bin/bash -o pipefail -c pip install a \\\n && b' returned a non-zero code: 1"
    short = shorten_build_error(message, "kit/x:1", "Step 14/26 : RUN pip install ...")
    assert short == "build of kit/x:1 failed: Step 14/26 exited with code 1"
    assert shorten_build_error("other", "kit/x:1", None) == "other"


# ---- context plan -------------------------------------------------------------------------


def make_container(tmp_path: Path, args: str = "ARG BASE_IMAGE=debian\nARG PIP_OFFLINE=0\n") -> Path:
    folder = tmp_path / "containers" / "demo"
    folder.mkdir(parents=True)
    (folder / "Dockerfile").write_text(args + "FROM ${BASE_IMAGE}\nCOPY ca/ /ca/\n")
    (folder / "helper.py").write_text("print(1)\n")
    (folder / "ca").mkdir()  # a stale ca/ in the source folder must not leak into the context
    (folder / "ca" / "old.crt").write_text("x")
    return folder


PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_plan_build_context_files_and_buildargs(tmp_path: Path) -> None:
    folder = make_container(tmp_path)
    ca = tmp_path / "corp.pem"
    ca.write_text(PEM)
    wheels = tmp_path / "wh"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(b"w")
    (wheels / "README").write_text("not a wheel")
    probe = tmp_path / "probe.py"
    probe.write_text("")

    plan = plan_build_context(
        "demo",
        folder,
        probe_files=[probe],
        ca_bundle=ca,
        wheels_dir=wheels,
        base_image="kit/debian-base:bookworm",
        offline=True,
    )
    assert plan.tag == "kit/demo:latest"
    assert plan.layout() == [
        "Dockerfile",
        "ca/",
        "ca/extra.crt",
        "helper.py",
        "probe/",
        "probe/probe.py",
        "wheels/",
        "wheels/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl",
    ]
    assert plan.files["ca/extra.crt"] == ca
    assert plan.buildargs == {"BASE_IMAGE": "kit/debian-base:bookworm", "PIP_OFFLINE": "1"}

    bare = plan_build_context("demo", folder, probe_files=[], tag="me/demo:1")
    assert bare.layout() == ["Dockerfile", "ca/", "helper.py", "probe/", "wheels/"]
    assert bare.buildargs == {} and bare.tag == "me/demo:1"

    dest = tmp_path / "ctx"
    write_build_context(plan, dest)
    written = sorted(p.relative_to(dest).as_posix() + ("/" if p.is_dir() else "") for p in dest.rglob("*"))
    assert written == plan.layout()
    assert (dest / "ca" / "extra.crt").read_text() == PEM


def test_plan_build_context_rejects_bad_inputs(tmp_path: Path) -> None:
    folder = make_container(tmp_path)
    not_pem = tmp_path / "x.crt"
    not_pem.write_text("hello")
    with pytest.raises(UsageError, match="no PEM certificate"):
        plan_build_context("demo", folder, probe_files=[], ca_bundle=not_pem)
    with pytest.raises(UsageError, match="no such file"):
        plan_build_context("demo", folder, probe_files=[], ca_bundle=tmp_path / "missing.pem")
    with pytest.raises(UsageError, match="not a directory"):
        plan_build_context("demo", folder, probe_files=[], wheels_dir=tmp_path / "none")
    with pytest.raises(UsageError, match="--vllm-tag does not apply to the demo image"):
        plan_build_context("demo", folder, probe_files=[], vllm_tag="v1")
    with pytest.raises(ImageRefError):
        plan_build_context("demo", folder, probe_files=[], tag="Bad Tag")
    with pytest.raises(ImageError, match="no Dockerfile"):
        plan_build_context("demo", tmp_path, probe_files=[])


def test_plans_for_kits_own_images() -> None:
    probes = resources.probe_files()
    assert [p.name for p in probes] == ["probe.py", "collective.py", "latency.py"]  # collective.py loads latency.py
    assert {"cpu", "vllm"} <= set(resources.image_names())

    cpu = plan_build_context("cpu", resources.container_dir("cpu"), probe_files=probes)
    assert cpu.tag.startswith("kit/vllm-cpu:") and cpu.tag != "kit/vllm-cpu:latest"
    assert {"Dockerfile", "make_tiny_model.py", "probe/probe.py", "probe/collective.py", "probe/latency.py"} <= set(
        cpu.files
    )

    vllm = plan_build_context(
        "vllm", resources.container_dir("vllm"), probe_files=probes, vllm_tag="v0.31.0", base_image="mirror/vllm"
    )
    assert vllm.tag == "kit/vllm:v0.31.0"
    assert vllm.buildargs == {"VLLM_TAG": "v0.31.0", "VLLM_IMAGE": "mirror/vllm"}
    with pytest.raises(UsageError, match="repository only"):
        plan_build_context("vllm", resources.container_dir("vllm"), probe_files=probes, base_image="mirror/vllm:v1")
    with pytest.raises(UsageError, match="no image named 'nope'") as exc:
        resources.container_dir("nope")
    assert "cpu" in (exc.value.hint or "")


# ---- state --------------------------------------------------------------------------------


def test_state_record_roundtrip(tmp_path: Path) -> None:
    assert state.recorded_image("a:1") is None
    state.record_image("a:1", "a@sha256:1", image_id="sha256:i1")
    state.record_image("b:2", "sha256:i2")
    state.record_image("a:1", "a@sha256:3")
    data = json.loads((tmp_path / "state" / "images.json").read_text())
    assert set(data) == {"a:1", "b:2"}
    record = state.recorded_image("a:1")
    assert record is not None
    assert record["digest"] == "a@sha256:3" and record["ref"] == "a:1"
    assert record["kit_version"] and record["recorded_at"].endswith("+00:00")


def test_state_dir_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KIT_STATE_DIR")
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert state.images_file() == tmp_path / ".local" / "state" / "kit" / "images.json"


# ---- the verbs on the real adapters, with a fake docker-py client -------------------------


class FakeEngine:
    """Just enough of docker.DockerClient (and its APIClient: the same object) for DockerRuntime's
    image methods: pulls and builds replay scripted events; `local` holds the engine's images."""

    def __init__(self, events: list[dict[str, Any]], *, fail_with: str | None = None, leave_tag: bool = False):
        self.api = self.images = self
        # kit's image facts probe after a pull or build (issue 24) answers as vllm-cpu 0.32.0 does
        self.containers = SimpleNamespace(run=lambda **kwargs: ProbeContainer())
        self.events = events
        self.fail_with = fail_with
        self.leave_tag = leave_tag
        self.local: dict[str, dict[str, Any]] = {}
        self.removed: list[str] = []
        self.pulled: list[tuple[str, str]] = []
        self.builds: list[dict[str, Any]] = []

    def get(self, ref: str) -> Any:  # images.get
        if ref not in self.local:
            raise docker.errors.ImageNotFound(ref)
        image = self.local[ref]
        return SimpleNamespace(id=image["id"], attrs={"RepoDigests": image["repo_digests"]}, tags=[ref])

    def pull(self, repository: str, *, tag: str, stream: bool, decode: bool) -> Iterator[dict[str, Any]]:
        assert stream and decode  # FIELD_NOTES §3: the low-level streaming pull, every event seen
        self.pulled.append((repository, tag))
        yield from self.events
        ref = f"{repository}:{tag}"
        if self.fail_with:
            if self.leave_tag:
                self.local[ref] = {"id": "sha256:half", "repo_digests": []}
            yield {"error": self.fail_with, "errorDetail": {"message": self.fail_with}}
            return
        self.local[ref] = {"id": "sha256:img", "repo_digests": [f"{repository}@sha256:good"]}

    def remove_image(self, ref: str) -> None:
        self.removed.append(ref)
        if self.local.pop(ref, None) is None:
            raise docker.errors.ImageNotFound(ref)

    def build(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        self.builds.append(dict(kwargs))
        context = Path(kwargs["path"])
        assert (context / "probe" / "probe.py").is_file()
        assert (context / "ca").is_dir() and (context / "wheels").is_dir()
        yield {"stream": "Step 1/2 : FROM base\n"}
        yield {"stream": " ---> 123\n"}
        if self.fail_with:
            yield {"stream": "pip: no such package\n"}
            message = "The command '/bin/sh -c pip' returned a non-zero code: 1"
            yield {"error": message, "errorDetail": {"message": message}}
            return
        yield {"aux": {"ID": "sha256:built"}}
        self.local[kwargs["tag"]] = {"id": "sha256:built", "repo_digests": []}


def use_engine(monkeypatch: pytest.MonkeyPatch, engine: FakeEngine) -> None:
    monkeypatch.setattr(kit.runtime, "get_image_store", lambda config: DockerRuntime(client=engine))


LAYER_EVENTS = [
    {"status": "Pulling from kit/base", "id": "test"},
    {"status": "Pulling fs layer", "id": "aaa", "progressDetail": {}},
    {"status": "Downloading", "id": "aaa", "progressDetail": {"current": 1, "total": 2}},
    {"status": "Pull complete", "id": "aaa", "progressDetail": {}},
    {"status": "Digest: sha256:good"},
]


def test_pull_records_and_prints_the_digest(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeEngine(LAYER_EVENTS)
    use_engine(monkeypatch, fake)
    code, out, err = run_kit(["pull", "reg:5000/kit/base:test"])
    assert code == 0, err
    assert fake.pulled == [("reg:5000/kit/base", "test")]
    assert "reg:5000/kit/base@sha256:good" in out
    assert "aaa: Downloading 0.0/0.0 MB" in err and "aaa: Pull complete" in err
    record = state.recorded_image("reg:5000/kit/base:test")
    assert record is not None and record["digest"] == "reg:5000/kit/base@sha256:good"
    assert record["image_id"] == "sha256:img" and record["runtime"] == "docker"

    code, out, err = run_kit(["pull", "reg:5000/kit/base:test", "--json"])
    assert code == 0 and err == ""
    result = json.loads(out)["result"]
    assert result["digest"] == "reg:5000/kit/base@sha256:good" and result["image_id"] == "sha256:img"
    assert set(result) == {"ref", "digest", "image_id", "runtime", "seconds", "record"}


def test_pull_defaults_to_the_configs_image(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeEngine([])
    use_engine(monkeypatch, fake)
    monkeypatch.setenv("KIT_IMAGE", "vllm/vllm-openai:v0.32.0")
    code, _, err = run_kit(["pull", "--json"])
    assert code == 0, err
    assert fake.pulled == [("vllm/vllm-openai", "v0.32.0")]


def test_failed_pull_is_exit_5_and_removes_a_half_tag(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeEngine(
        LAYER_EVENTS[:3], fail_with="dial tcp 127.0.0.1:5000: connect: connection refused", leave_tag=True
    )
    use_engine(monkeypatch, fake)
    code, out, err = run_kit(["pull", "127.0.0.1:5000/kit/base:test"])
    assert code == ExitCode.IMAGE
    assert out == ""
    errors = [ln for ln in err.splitlines() if ln.startswith("kit: error:")]
    assert errors == [
        "kit: error: pull of 127.0.0.1:5000/kit/base:test failed: dial tcp 127.0.0.1:5000: connect: connection "
        "refused (fix: the registry went away or is unreachable: check it (and any proxy), then retry)"
    ]
    assert fake.removed == ["127.0.0.1:5000/kit/base:test"] and not fake.local
    assert state.recorded_image("127.0.0.1:5000/kit/base:test") is None


def test_failed_pull_keeps_a_tag_that_existed_before(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeEngine([], fail_with="manifest unknown", leave_tag=True)
    fake.local["r/x:1"] = {"id": "sha256:old", "repo_digests": []}
    use_engine(monkeypatch, fake)
    code, out, _ = run_kit(["pull", "r/x:1", "--json"])
    assert code == ExitCode.IMAGE
    assert json.loads(out)["error"]["exit_code"] == ExitCode.IMAGE
    assert fake.removed == []


def test_malformed_ref_is_exit_5() -> None:
    code, _, err = run_kit(["pull", "Not A Ref"])
    assert code == ExitCode.IMAGE and "malformed image reference" in err


def test_pull_dry_run_prints_ref_runtime_and_destination(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = FakeEngine([])
    use_engine(monkeypatch, fake)
    code, out, err = run_kit(["pull", "reg:5000/kit/base:test", "--dry-run"])
    assert code == 0, err
    assert out.splitlines()[:4] == [
        "kit pull (dry run): would pull reg:5000/kit/base:test",
        "  runtime: docker",
        "  from:    reg:5000/kit/base:test",
        "  to:      the Docker engine, tagged reg:5000/kit/base:test",
    ]
    assert fake.pulled == [] and state.recorded_image("reg:5000/kit/base:test") is None

    monkeypatch.setattr(kit.runtime, "get_image_store", lambda config: ApptainerRuntime(apptainer_settings(config)))
    args = ["pull", "--runtime", "apptainer", "r/x:1", "--set", f"apptainer.image_dir={tmp_path}/sif", "--dry-run"]
    code, out, err = run_kit([*args, "--json"])
    assert code == 0, err  # planned on a host without apptainer: nothing runs
    plan = json.loads(out)["result"]
    assert plan["runtime"] == "apptainer" and plan["destination"] == f"{tmp_path}/sif/r_x_1.sif"
    assert plan["argv"] == ["apptainer", "pull", "--force", plan["destination"], "docker://r/x:1"]
    assert not (tmp_path / "sif").exists()


class PlanningApptainer(ApptainerRuntime):
    """The real Apptainer adapter's planning; pull and build record the plan they get and return
    what the adapter would (no Apptainer binary can be installed here, FIELD_NOTES §4)."""

    calls: ClassVar[list[PullPlan | BuildPlan]] = []

    def pull(self, plan: PullPlan, *, on_progress: Any) -> PullResult:
        self.calls.append(plan)
        on_progress(Progress("converting"))
        record = sif_record(plan.destination, plan.source, "sha256:sif")
        return PullResult(ref=plan.ref, runtime=self.name, digest="sha256:sif", seconds=0.1, file=record)

    def build(self, plan: BuildPlan, *, on_progress: Any) -> BuildResult:
        self.calls.append(plan)
        record = sif_record(plan.image, plan.source, "sha256:built")
        return BuildResult(plan.name, self.name, plan.image, "sha256:built", 0.1, file=record)


def sif_record(path: str, source: str, digest: str) -> ImageFile:
    return ImageFile(path, source, digest, "label x", {}, 1, 0.1, path + ".json", "2026-01-01T00:00:00+00:00", "0")


def test_apptainer_pull_and_build_run_the_adapters_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = PlanningApptainer.calls = []
    monkeypatch.setattr(kit.runtime, "get_image_store", lambda config: PlanningApptainer(apptainer_settings(config)))
    code, out, err = run_kit(["pull", "--runtime", "apptainer", "r/x:1", "--set", "apptainer.image_dir=/sif"])
    assert code == 0, err
    [pull] = calls
    assert isinstance(pull, PullPlan) and (pull.ref, pull.source, pull.destination) == (
        "r/x:1",
        "docker://r/x:1",
        "/sif/r_x_1.sif",
    )
    assert "converting" in err and "sha256:sif" in out
    assert (state.recorded_image("r/x:1") or {}).get("path") == "/sif/r_x_1.sif"

    code, out, err = run_kit(
        ["build", "cpu", "--runtime", "apptainer", "--from", "docker://kit/x:1", "--sif", "/s.sif"]
    )
    assert code == 0, err
    assert (calls[1].source, calls[1].image) == ("docker://kit/x:1", "/s.sif")
    assert (state.recorded_image("/s.sif") or {}).get("digest") == "sha256:built"

    code, out, err = run_kit(["build", "cpu", "--runtime", "apptainer", "--set", "apptainer.image_dir=/sif"])
    assert code == 0, err
    assert calls[2].source == str(resources.container_dir("cpu") / "kit-cpu.def")
    assert calls[2].image.startswith("/sif/") and calls[2].image.endswith(".sif")
    code, out, err = run_kit(["build", "vllm", "--runtime", "apptainer", "--vllm-tag", "v0.31.0", "--json"])
    assert code == 0, err
    assert calls[3].source == "docker-daemon:kit/vllm:v0.31.0"
    assert json.loads(out)["result"]["digest"] == "sha256:built"

    code, out, err = run_kit(["build", "cpu", "--runtime", "apptainer", "--dry-run"])
    assert code == 0, err  # --dry-run runs nothing (it used to build the SIF anyway)
    assert len(calls) == 4 and "apptainer build --force" in out


def test_docker_build_refuses_apptainer_flags() -> None:
    code, _, err = run_kit(["build", "cpu", "--dry-run", "--sif", "/x.sif"])
    assert code == ExitCode.USAGE and "--from and --sif are for runtime apptainer" in err


def test_build_dry_run_prints_the_plan(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text(PEM)
    code, out, err = run_kit(["build", "cpu", "--dry-run", "--ca-bundle", str(ca), "--offline", "-t", "me/cpu:1"])
    assert code == 0, err
    assert "would build me/cpu:1" in out
    assert "ca/extra.crt" in out and "probe/collective.py  kit/verify/collective.py" in out
    assert "PIP_OFFLINE=1" in out
    assert out.rstrip().splitlines()[-1] == (
        "  DOCKER_BUILDKIT=0 docker build --tag me/cpu:1 --file Dockerfile --build-arg PIP_OFFLINE=1 "
        "--label kit.managed=true --rm --force-rm CONTEXT"
    )

    code, out, _ = run_kit(["build", "--dry-run", "--json", "--set", "accelerator=cpu"])
    result = json.loads(out)["result"]
    assert (
        result["name"] == "cpu"
        and result["dry_run"] is True
        and result["argv"][:3] == ["DOCKER_BUILDKIT=0", "docker", "build"]
    )
    code, out, _ = run_kit(["build", "--dry-run", "--json"])
    assert json.loads(out)["result"]["name"] == "vllm"


def test_build_with_fake_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeEngine([])
    use_engine(monkeypatch, fake)
    code, out, err = run_kit(["build", "cpu", "-t", "me/cpu:1"])
    assert code == 0, err
    assert "Step 1/2 : FROM base" in err and "---> 123" not in err
    assert out.splitlines() == ["me/cpu:1", "  id: sha256:built"]
    record = state.recorded_image("me/cpu:1") or {}
    assert record.get("digest") == "sha256:built" and record.get("built_from") == "containers/cpu"

    fake = FakeEngine([], fail_with="x")
    use_engine(monkeypatch, fake)
    code, out, err = run_kit(["build", "cpu", "-t", "me/cpu:2"])
    assert code == ExitCode.IMAGE
    assert "kit: error: build of me/cpu:2 failed: Step 1/2 exited with code 1" in err
    assert "  | pip: no such package" in err


# ---- docker-py reads registry credentials itself (issue 3: "auth from the standard Docker config")


def test_docker_py_pull_sends_credentials_from_docker_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    docker = pytest.importorskip("docker")
    cfg = tmp_path / "dockercfg"
    cfg.mkdir()
    token = base64.b64encode(b"alice:s3cret").decode()
    (cfg / "config.json").write_text(json.dumps({"auths": {"reg.example:5000": {"auth": token}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(cfg))
    api = docker.APIClient(base_url="tcp://127.0.0.1:9", version="1.41")
    seen: dict[str, Any] = {}

    def fake_post(url: str, **kwargs: Any) -> Any:
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(api, "_post", fake_post)
    with pytest.raises(RuntimeError, match="stop here"):
        api.pull("reg.example:5000/kit/base", tag="test", stream=True, decode=True, auth_config=None)
    header = json.loads(base64.urlsafe_b64decode(seen["headers"]["X-Registry-Auth"]))
    assert header["username"] == "alice" and header["password"] == "s3cret"


def test_help_mentions_credentials_and_exit_codes() -> None:
    code, out, _ = run_kit(["pull", "--help"])
    assert code == 0
    assert "~/.docker/config.json" in out and "credential helpers" in out


def test_build_context_holds_real_wheel_files_not_symlinks(tmp_path: Path) -> None:
    """A symlinked wheel must arrive in the context as the file: Docker would ship the dangling link."""
    real = tmp_path / "store" / "pkg-1.0-py3-none-any.whl"
    real.parent.mkdir()
    real.write_bytes(b"wheel bytes")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / real.name).symlink_to(real)
    plan = plan_build_context(
        "cpu", resources.container_dir("cpu"), probe_files=resources.probe_files(), wheels_dir=wheels
    )
    dest = tmp_path / "ctx"
    write_build_context(plan, dest)
    copied = dest / "wheels" / real.name
    assert copied.is_file() and not copied.is_symlink() and copied.read_bytes() == b"wheel bytes"

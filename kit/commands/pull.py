"""`kit pull [IMAGE]`: pull the serving image, show per-layer progress, record its digest.

Docker: docker-py's low-level streaming pull (FIELD_NOTES §3: `images.pull()` swallows errors
that arrive inside the stream), every event checked. A failed pull leaves no new tag behind.
Apptainer: delegated to ApptainerRuntime.pull (a SIF under apptainer.image_dir).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from kit.cluster.resolve import resolve
from kit.commands._options import config_options, json_option, overrides_from
from kit.commands._params import KitCommand
from kit.config import KitConfig
from kit.errors import ImageError, KitError, RuntimeUnavailable
from kit.images import ImageRef, PullProgress, parse_ref, pick_digest
from kit.output import emit, is_tty, progress
from kit.state import images_file, record_image

if TYPE_CHECKING:
    from kit.runtime.docker import DockerRuntime

HELP = """Pull a vLLM image (Docker image or Apptainer SIF) and record its digest.

\b
IMAGE defaults to the config's `image`. The digest is printed and recorded in
$KIT_STATE_DIR/images.json (default ~/.local/state/kit/) so `kit up` and `kit verify`
can check every node runs the same image.
\b
Registry credentials come from the standard Docker config ($DOCKER_CONFIG/config.json,
default ~/.docker/config.json), written by `docker login`; credential helpers
(credsStore / credHelpers, e.g. docker-credential-ecr-login) are used when configured.
Progress: one line per layer on stderr (an updating line on a terminal); --json prints
only the result.
"""


def docker_runtime() -> DockerRuntime:
    """The Docker adapter (a seam for tests)."""
    from kit.runtime.docker import DockerRuntime

    return DockerRuntime()


@click.command(name="pull", help=HELP, cls=KitCommand)
@click.argument("image", required=False)
@click.option("--runtime", type=click.Choice(["docker", "apptainer"]), help="Container runtime (config: runtime).")
@config_options
@json_option
def command(
    image: str | None,
    runtime: str | None,
    config_path: str | None,
    cluster: str | None,
    set_values: tuple[str, ...],
    as_json: bool,
) -> None:
    flags = {"runtime": runtime, "cluster": cluster}
    resolved = resolve(config_path, overrides_from(flags, {"runtime": "runtime", "cluster": "cluster"}, set_values))
    config = resolved.config
    ref = config.image if image is None else image  # an empty IMAGE was refused, never replaced
    if config.runtime == "apptainer":
        # A docker:// source (kit's default scheme) must be a valid reference; other schemes
        # (oras://, library://, https://) are apptainer's to check.
        if ref.startswith("docker://") or "://" not in ref:
            parse_ref(ref.removeprefix("docker://"))
        result = pull_apptainer(config, ref, as_json=as_json)
    else:
        result = pull_docker(parse_ref(ref), as_json=as_json)
    emit(
        "pull",
        result,
        as_json=as_json,
        text=lambda: f"{result['ref']}\n  digest: {result['digest']}\n  recorded in {result['record']}",
    )


def pull_docker(ref: ImageRef, *, as_json: bool, runtime: DockerRuntime | None = None) -> dict[str, Any]:
    rt = runtime or docker_runtime()
    name = str(ref)
    before = rt.image_info(name)
    show = _progress_printer(as_json)
    tracker = PullProgress()
    started = time.monotonic()
    progress(f"pulling {name}", as_json=as_json)
    try:
        for event in rt.pull_events(ref.repository, ref.pull_tag):
            show(tracker, event)
    except ImageError as err:
        show(tracker, None)
        _drop_half_tag(rt, name, before)
        hint = err.hint
        if any(mark in err.message for mark in _UNREACHABLE):
            hint = "the registry went away or is unreachable: check it (and any proxy), then retry"
        raise ImageError(err.message, hint=hint, details=err.details) from None
    except (KitError, KeyboardInterrupt):
        show(tracker, None)
        _drop_half_tag(rt, name, before)
        raise
    show(tracker, None)
    info = rt.image_info(name)
    if info is None:  # the stream ended cleanly but nothing arrived: do not record a phantom
        raise ImageError(f"pull of {name} ended but the image is not on this host", hint="retry; see dockerd's log")
    digest = pick_digest(ref, info["repo_digests"], info["id"]) or tracker.digest or info["id"]
    record_image(name, digest, image_id=info["id"], runtime="docker")
    return {
        "ref": name,
        "digest": digest,
        "image_id": info["id"],
        "runtime": "docker",
        "seconds": round(time.monotonic() - started, 1),
        "record": str(images_file()),
    }


# Engine error texts that mean the registry, not the name or credentials, is the problem.
_UNREACHABLE = ("connection refused", "connection reset", "unexpected EOF", "i/o timeout", "no such host", "cut off")


def _drop_half_tag(rt: DockerRuntime, name: str, before: dict[str, Any] | None) -> None:
    """A failed pull must not leave a tag that was not there before (issue 3)."""
    if before is not None:
        return
    try:
        if rt.image_info(name) is not None:
            rt.remove_image(name)
    except KitError:
        pass  # the engine went away too; the pull error is the one to report


def _progress_printer(as_json: bool) -> Callable[[PullProgress, dict[str, Any] | None], None]:
    """Plain throttled per-layer lines, or one updating line on a terminal, or nothing (--json)."""
    if as_json:
        return lambda tracker, event: None
    tty = is_tty()
    last = [0.0]

    def show(tracker: PullProgress, event: dict[str, Any] | None) -> None:
        now = time.monotonic()
        if event is None:  # the end: finish the terminal line
            if tty and last[0]:
                click.echo("\r\x1b[2K" + tracker.summary(), err=True)
            return
        line = tracker.line(event, now)
        if not tty:
            if line:
                click.echo(line, err=True)
        elif now - last[0] >= 0.2:
            last[0] = now
            click.echo("\r\x1b[2K" + tracker.summary(), nl=False, err=True)

    return show


def pull_apptainer(config: KitConfig, ref: str, *, as_json: bool) -> dict[str, Any]:
    from kit.runtime.apptainer import ApptainerRuntime  # lazy: spython

    rt = ApptainerRuntime(config)
    pull = getattr(rt, "pull", None)
    if pull is None:
        raise RuntimeUnavailable("this kit's Apptainer runtime cannot pull yet", hint="use runtime: docker")
    image_dir = os.path.expanduser(config.apptainer.image_dir)
    out: dict[str, Any] = pull(ref, image_dir=image_dir, on_progress=lambda line: progress(line, as_json=as_json))
    digest = str(out.get("digest") or "")
    if not digest:
        raise ImageError(f"apptainer pull of {ref} returned no digest")
    record_image(ref, digest, path=str(out.get("path")), runtime="apptainer")
    return {**out, "ref": ref, "digest": digest, "runtime": "apptainer", "record": str(images_file())}

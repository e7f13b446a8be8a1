"""`kit pull [IMAGE]`: pull the serving image, show per-layer progress, record its digest.

The runtime's ImageStore plans the pull (what --dry-run prints) and executes that plan: Docker
through the engine's streaming pull, every event checked, no new tag left by a failed pull;
Apptainer into a SIF under apptainer.image_dir, atomically; enroot (runtime enroot, pyxis or
edf) into a squashfs under enroot.image_dir, for pyxis' --container-image or the EDF's image
(kit/runtime/).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click

import kit.runtime as runtimes
from kit.cluster.images import pull_image
from kit.cluster.resolve import load_settings
from kit.commands._options import config_flag, config_options, json_option, overrides_from
from kit.commands._params import KitCommand
from kit.images.records import images_file
from kit.output import emit
from kit.render import shell_words
from kit.runtime.base import PullPlan, PullResult

HELP = """Pull a vLLM image (Docker image, Apptainer SIF or enroot squashfs) and record its digest.

\b
IMAGE defaults to the config's `image`. The digest is printed and recorded in
$KIT_STATE_DIR/images.json (default ~/.local/state/kit/) so `kit up` and `kit verify`
can check every node runs the same image.
\b
Registry credentials come from the standard Docker config ($DOCKER_CONFIG/config.json,
default ~/.docker/config.json), written by `docker login`; credential helpers
(credsStore / credHelpers, e.g. docker-credential-ecr-login) are used when configured.
enroot reads $ENROOT_CONFIG_PATH/.credentials (netrc format; default
~/.config/enroot/.credentials), e.g. `machine nvcr.io login $oauthtoken password KEY`.
Progress: one line per layer on stderr (an updating line on a terminal); --json prints
only the result. --dry-run prints what would be pulled, by which runtime, to where.
"""


@click.command(name="pull", help=HELP, cls=KitCommand)
@click.argument("image", required=False)
@config_flag(
    "runtime",
    "--runtime",
    choices=("docker", "apptainer", "enroot", "pyxis", "edf"),
    help="container runtime",
    note="enroot, pyxis, edf: enroot import into enroot.image_dir",
)
@click.option("--dry-run", is_flag=True, help="Print the reference, runtime and destination; pull nothing.")
@config_options
@json_option
def command(
    image: str | None,
    runtime: str | None,
    dry_run: bool,
    config_path: str | None,
    cluster: str | None,
    set_values: tuple[str, ...],
    as_json: bool,
) -> None:
    flags = {"runtime": runtime, "cluster": cluster}
    # The image and the runtime only: loaded, never planned (issue 25: a model kit cannot size
    # must not stop a pull).
    config = load_settings(config_path, overrides_from(flags, set_values)).config
    ref = config.image if image is None else image  # an empty IMAGE was refused, never replaced
    store = runtimes.get_image_store(config)
    plan = store.plan_pull(ref)  # a malformed reference is refused here, before anything runs
    if dry_run:
        emit(DryRun(plan), as_json=as_json)
        return
    result = pull_image(store, plan, as_json=as_json)
    emit(Pulled(result, str(images_file()) if result.digest else None), as_json=as_json)


# A store that resolves no digest (enroot < 4, an unpinned reference): the result says why.
NO_DIGEST = "this enroot cannot resolve digests (enroot < 4): pin the image as IMAGE@sha256:..."


@dataclass(frozen=True)
class DryRun:
    """`kit pull --dry-run`: the pull plan."""

    plan: PullPlan
    command = "pull"

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), "dry_run": True}

    def text(self) -> str:
        return render_plan(self.plan)


@dataclass(frozen=True)
class Pulled:
    """`kit pull`: the image pulled and where its digest is recorded (None: no digest, and
    the note says why)."""

    result: PullResult
    record: str | None
    command = "pull"

    def to_dict(self) -> dict[str, Any]:
        done = {**self.result.to_dict(), "record": self.record}
        if not self.result.digest:  # enroot < 4 and an unpinned reference: nothing recorded, and why
            done["note"] = NO_DIGEST
        return done

    def text(self) -> str:
        result = self.result
        if not result.digest:
            path = result.file.path if result.file is not None else None
            return f"{result.ref}\n  file: {path}\n  digest: unknown (not recorded: {NO_DIGEST})"
        return f"{result.ref}\n  digest: {result.digest}\n  recorded in {self.record}"


def render_plan(plan: PullPlan) -> str:
    lines = [
        f"kit pull (dry run): would pull {plan.ref}",
        f"  runtime: {plan.runtime}",
        f"  from:    {plan.source}",
        f"  to:      {plan.destination}",
    ]
    if plan.argv:
        lines.append(f"  runs:    {shell_words(plan.argv)}  (written under a temporary name, renamed on success)")
    return "\n".join(lines)

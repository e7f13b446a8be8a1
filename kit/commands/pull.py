"""`kit pull [IMAGE]`: pull the serving image, show per-layer progress, record its digest.

The runtime's ImageStore plans the pull (what --dry-run prints) and executes that plan: Docker
through the engine's streaming pull, every event checked, no new tag left by a failed pull;
Apptainer into a SIF under apptainer.image_dir, atomically (kit/runtime/).
"""

from __future__ import annotations

import click

import kit.runtime as runtimes
from kit.commands._common import config_options, json_option, overrides_from, resolve
from kit.commands._params import KitCommand
from kit.imaging import pull_image
from kit.output import emit
from kit.render import shell_words
from kit.runtime.base import PullPlan
from kit.state import images_file

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
only the result. --dry-run prints what would be pulled, by which runtime, to where.
"""


@click.command(name="pull", help=HELP, cls=KitCommand)
@click.argument("image", required=False)
@click.option("--runtime", type=click.Choice(["docker", "apptainer"]), help="Container runtime (config: runtime).")
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
    resolved = resolve(config_path, overrides_from(flags, {"runtime": "runtime", "cluster": "cluster"}, set_values))
    config = resolved.config
    ref = config.image if image is None else image  # an empty IMAGE was refused, never replaced
    store = runtimes.get_image_store(config)
    plan = store.plan_pull(ref)  # a malformed reference is refused here, before anything runs
    if dry_run:
        emit("pull", {**plan.to_dict(), "dry_run": True}, as_json=as_json, text=lambda: render_plan(plan))
        return
    result = pull_image(store, plan, as_json=as_json)
    done = {**result.to_dict(), "record": str(images_file())}
    emit(
        "pull",
        done,
        as_json=as_json,
        text=lambda: f"{result.ref}\n  digest: {result.digest}\n  recorded in {done['record']}",
    )


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

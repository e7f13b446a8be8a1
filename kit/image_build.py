"""Building kit's images with the Docker adapter (`kit build`, and `kit demo` for its CPU image):
materialize the context kit.images planned, stream the builder's events, record the image id."""

from __future__ import annotations

import collections
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kit.errors import ImageError
from kit.images import ContextPlan, PullProgress, build_image_id, build_step_line
from kit.output import is_tty, progress
from kit.state import images_file, record_image

if TYPE_CHECKING:
    from kit.runtime.docker import DockerRuntime


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


def build_docker(plan: ContextPlan, rt: DockerRuntime, *, as_json: bool, verbose: bool = False) -> dict[str, Any]:
    """Build the planned context with the Docker adapter: the builder's steps as progress lines,
    the last lines of its output as the error's details, the image id recorded like a pull's."""
    started = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=25)
    tracker = PullProgress()  # FROM images the builder pulls report layer progress
    image_id: str | None = None
    last_step: str | None = None
    quiet_layers = as_json or is_tty()
    progress(f"building {plan.tag} from containers/{plan.name}/", as_json=as_json)
    with tempfile.TemporaryDirectory(prefix="kit-build-") as tmp:
        write_build_context(plan, Path(tmp))
        try:
            for event in rt.build_events(tmp, plan.tag, plan.buildargs):
                image_id = build_image_id(event) or image_id
                step = build_step_line(event)
                if step:
                    last_step = step
                    progress(step, as_json=as_json)
                    continue
                text = str(event.get("stream") or "")
                for line in text.splitlines():
                    if line.strip():
                        tail.append(line.rstrip())
                        if verbose:
                            progress("  " + line.rstrip(), as_json=as_json)
                if "status" in event and not quiet_layers:
                    layer_line = tracker.line(event, time.monotonic())
                    if layer_line:
                        progress("  " + layer_line, as_json=as_json)
        except ImageError as err:
            raise ImageError(
                shorten_build_error(err.message, plan.tag, last_step),
                hint=err.hint or "see the builder output above; fix the Dockerfile or the build args",
                details=list(tail),
            ) from None
    info = rt.image_info(plan.tag)
    if info is None:
        raise ImageError(f"the build of {plan.tag} finished but the image is not there", details=list(tail))
    image_id = info["id"]
    record_image(plan.tag, str(image_id), image_id=image_id, runtime="docker", built_from=f"containers/{plan.name}")
    return {
        "image": plan.tag,
        "id": image_id,
        "name": plan.name,
        "buildargs": dict(plan.buildargs),
        "seconds": round(time.monotonic() - started, 1),
        "record": str(images_file()),
    }


_RUN_FAILED = re.compile(r"The command '.*' returned a non-zero code: (\d+)\s*$", re.DOTALL)


def shorten_build_error(message: str, tag: str, step: str | None) -> str:
    """The classic builder repeats the whole RUN command in its error; name the step instead."""
    match = _RUN_FAILED.search(message)
    if match is None or step is None:
        return message
    return f"build of {tag} failed: {step.split(' : ', 1)[0]} exited with code {match.group(1)}"

"""Getting an image onto this host through an ImageStore: execute a pull or build plan, show its
progress on stderr, record the result in kit's state (kit.state: what `kit up` and `kit verify`
compare nodes with). Shared by `kit pull`, `kit build` and `kit demo`; no click options here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

from kit.cluster.image_facts import probe
from kit.errors import KitError
from kit.images.facts import ImageFacts
from kit.images.progress import BuildProgress
from kit.images.records import record_image
from kit.images.vllm_releases import recorded_version
from kit.output import echo, is_tty, progress
from kit.runtime.base import BuildPlan, BuildResult, ImageStore, Progress, PullPlan, PullResult
from kit.safe.text import clean


class _Printer:
    """Progress on stderr: steps always; builder output with `verbose`; per-layer lines when
    stderr is not a terminal, else one updating summary line (at most every 0.2 s); nothing
    with --json. `layer_prefix` indents layer lines under a build's steps."""

    def __init__(self, *, as_json: bool, verbose: bool = False, layer_prefix: str = "", summary_on_tty: bool = True):
        self.as_json = as_json
        self.verbose = verbose
        self.layer_prefix = layer_prefix
        self.tty = is_tty()
        self.summary_on_tty = summary_on_tty
        self._last = 0.0
        self._summary: str | None = None
        self.build = BuildProgress()
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def __call__(self, event: Progress) -> None:
        if self.as_json:
            return
        with self._lock:
            self._show(event)

    def _show(self, event: Progress) -> None:
        if event.level == "step":
            self.build.on_step(event.text or "", time.monotonic())
            progress(event.text or "")
        elif event.level == "detail":
            if self.verbose and event.text:
                progress("  " + event.text)
            elif event.text and (line := self.build.detail(event.text, time.monotonic())):
                progress(line)
        elif not self.tty:
            if event.text:
                progress(self.layer_prefix + event.text)
        elif self.summary_on_tty and event.summary:
            now = time.monotonic()
            self._summary = event.summary
            if now - self._last >= 0.2:
                self._last = now
                echo("\r\x1b[2K" + clean(event.summary, newlines=False), nl=False, err=True)

    def ticking(self) -> threading.Thread:
        """A thread that says a quiet build step is still running (issue 24), until finish()."""

        def tick() -> None:
            while not self._stop.wait(5.0):
                with self._lock:
                    line = self.build.heartbeat(time.monotonic())
                    if line and not self.as_json and not self.verbose:
                        progress(line)

        thread = threading.Thread(target=tick, name="kit-build-progress", daemon=True)
        thread.start()
        return thread

    def finish(self) -> None:
        """End the terminal's updating line with the last summary."""
        self._stop.set()
        if self.tty and self._last and self._summary and not self.as_json:
            echo("\r\x1b[2K" + clean(self._summary, newlines=False), err=True)


def pull_image(store: ImageStore, plan: PullPlan, *, as_json: bool) -> PullResult:
    printer = _Printer(as_json=as_json)
    try:
        result = store.pull(plan, on_progress=printer)
    finally:
        printer.finish()
    if result.digest:  # enroot < 4 resolves none: nothing to compare nodes with, nothing recorded
        record_image(result.ref, result.digest, **result.record_fields(), **_version_fields(store, result.ref, {}))
        probe_facts(store, result.ref, as_json=as_json)
    return result


def probe_facts(store: ImageStore, ref: str, *, as_json: bool) -> ImageFacts | None:
    """The image's facts, probed once now and recorded by digest (issue 24: its vLLM version,
    `vllm serve` parser, Ray, torch/CUDA/NCCL, user), so `kit up`/`serve`/`slurm` check their
    plans against it before anything starts. A store that runs no containers (enroot), or an
    image the probe cannot read, gets one warning: the image itself is still there."""
    try:
        return probe(store, ref, say=lambda line: progress(line, as_json=as_json))
    except KitError as err:
        progress(f"warning: {ref}: no image facts recorded ({err.message})", as_json=as_json)
        return None


def _version_fields(store: ImageStore, ref: str, buildargs: Mapping[str, str]) -> dict[str, str]:
    """The vLLM release of the image for kit's record (kit.images.vllm_releases: its label, the
    build argument that chose it, or its tag), so `kit up`/`kit serve` render for it."""
    try:
        info = store.image_info(ref)
    except KitError:
        info = None  # the tag (or the build argument) still says
    found = recorded_version(ref, dict(info.labels) if info is not None else {}, buildargs)
    return {"vllm_version": found[0], "vllm_version_from": found[1]} if found else {}


def build_image(store: ImageStore, plan: BuildPlan, *, as_json: bool, verbose: bool = False) -> BuildResult:
    """Execute a plan from store.plan_build and record the image (when its digest is known).
    On a terminal a build shows its steps only (no layer lines of the images it pulls)."""
    printer = _Printer(as_json=as_json, verbose=verbose, layer_prefix="  ", summary_on_tty=False)
    printer.ticking()
    try:
        result = store.build(plan, on_progress=printer)
    finally:
        printer.finish()
    if result.digest:
        version = _version_fields(store, result.image, result.buildargs)
        if result.file is not None:
            record_image(result.image, result.digest, source=result.file.source, runtime=result.runtime, **version)
        else:
            record_image(
                result.image,
                result.digest,
                image_id=result.digest,
                runtime=result.runtime,
                built_from=f"containers/{result.name}",
                **version,
            )
        probe_facts(store, result.image, as_json=as_json)
    return result

"""The two small interfaces every runtime adapter implements, and the data they exchange.

- ContainerRuntime: start the planned node containers, find them by cluster, run commands in
  them, read their output, remove them.
- ImageStore: the images those containers start from: inspect, pull, build, remove. Every
  long operation is planned first (`plan_pull`, `plan_build`: pure, no engine or binary
  needed) and the plan is what runs (`pull(plan)`, `build(plan)`), so `--dry-run` prints
  exactly what the adapter executes.

Docker (kit/runtime/docker.py) and Apptainer (kit/runtime/apptainer.py) implement both; a
store-only runtime (e.g. enroot's squashfs images, run by pyxis under srun) implements
ImageStore alone. Commands get adapters from kit.runtime.get_runtime / get_image_store and
never probe for features: a runtime that cannot do something says so from the method itself
(e.g. Apptainer's ensure_network, a store's plan_build without a builder).
"""

from __future__ import annotations

import abc
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from kit.errors import RuntimeUnavailable, UsageError

if TYPE_CHECKING:
    from kit.images.build import ContextPlan
    from kit.plan.node import ContainerSpec


@dataclass(frozen=True)
class NodeHandle:
    """A running (or stopped) kit node container found by its labels."""

    name: str  # container / instance name
    cluster: str
    role: str  # "head" | "worker"
    rank: int
    state: str  # "running", "exited", …
    ip: str | None = None  # the node IP kit planned (VLLM_HOST_IP)
    image: str = ""  # reference it was started from
    image_digest: str | None = None  # repo digest or image id
    started_at: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ExecResult:
    returncode: int
    stdout: str
    stderr: str


# ---- images: what the stores exchange ------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """One report from a pull or a build, for the verb to show or not.

    level "step": always shown (a builder step, a message of the adapter); "detail": the
    builder's own output (shown with --verbose, kept as evidence for errors); "layer": a
    per-layer transfer line (`text` None when throttled), with `summary` the whole transfer so
    far for a one-line display on a terminal.
    """

    text: str | None
    level: Literal["step", "detail", "layer"] = "step"
    summary: str | None = None


OnProgress = Callable[[Progress], None]


@dataclass(frozen=True)
class ImageInfo:
    """A local image as its store sees it."""

    ref: str
    id: str  # Docker: the image id (sha256:…); file stores: the image file's path
    digests: tuple[str, ...] = ()  # Docker: RepoDigests; file stores: the recorded source digest
    tags: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    path: str | None = None  # file stores (SIF, squashfs): the file


@dataclass(frozen=True)
class ImageFile:
    """A file-backed image (Apptainer SIF, enroot squashfs) and where it came from: the JSON
    record written beside the file (`metadata`). A `docker://` import rebuilds the file, so two
    pulls are not byte-identical: the source digest identifies the image, not a hash of the file."""

    path: str
    source: str  # what it was pulled or built from (docker://…, docker-daemon:…, a .def)
    digest: str | None  # sha256:… of the source, None when unknown
    digest_source: str | None  # "reference", "label KEY", "docker image id"
    labels: Mapping[str, str]
    size: int
    seconds: float
    metadata: str  # path of the JSON record
    created_at: str
    kit_version: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "source": self.source,
            "digest": self.digest,
            "digest_source": self.digest_source,
            "labels": dict(self.labels),
            "size": self.size,
            "seconds": self.seconds,
            "metadata": self.metadata,
            "created_at": self.created_at,
            "kit_version": self.kit_version,
        }


@dataclass(frozen=True)
class PullPlan:
    """What `kit pull` does: `--dry-run` prints it, `ImageStore.pull` executes it unchanged."""

    ref: str  # the reference as given
    runtime: str
    source: str  # what is fetched: an image reference, or a URI (docker://…) for file stores
    destination: str  # where the image lands: the engine's image store, or a file
    argv: tuple[str, ...] = ()  # CLI-driven stores: the command that runs

    def to_dict(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "runtime": self.runtime,
            "source": self.source,
            "destination": self.destination,
            "argv": list(self.argv),
        }


@dataclass(frozen=True)
class PullResult:
    ref: str
    runtime: str
    digest: str  # Docker: REPO@sha256:… (or the image id); file stores: the source digest
    seconds: float
    image_id: str | None = None  # Docker: the local image id
    file: ImageFile | None = None  # file stores: the image file and its record

    def to_dict(self) -> dict[str, Any]:
        if self.file is not None:
            return {**self.file.to_dict(), "ref": self.ref, "digest": self.digest or None, "runtime": self.runtime}
        return {
            "ref": self.ref,
            "digest": self.digest,
            "image_id": self.image_id,
            "runtime": self.runtime,
            "seconds": self.seconds,
        }

    def record_fields(self) -> dict[str, str]:
        """What kit's image record (kit.state) keeps beside the digest."""
        where = {"path": self.file.path} if self.file is not None else {"image_id": self.image_id or ""}
        return {**where, "runtime": self.runtime}


@dataclass(frozen=True)
class BuildPlan:
    """What `kit build` does: `--dry-run` prints it, `ImageStore.build` executes it unchanged."""

    name: str  # the folder under containers/
    runtime: str
    image: str  # what is made: a tag (Docker) or an image file
    source: str  # what it is made from: containers/NAME/, a .def, docker-daemon:TAG, a URI
    argv: tuple[str, ...]  # the command that runs (Docker: the CLI form of the engine API call)
    context: ContextPlan | None = None  # Docker: the build context assembled in a temp folder

    def to_dict(self) -> dict[str, Any]:
        plan = self.context.to_dict() if self.context is not None else {"name": self.name}
        return {**plan, "runtime": self.runtime, "image": self.image, "source": self.source, "argv": list(self.argv)}


@dataclass(frozen=True)
class BuildResult:
    name: str
    runtime: str
    image: str  # the tag, or the image file
    digest: str | None  # Docker: the image id; file stores: the source digest (None: unknown)
    seconds: float
    buildargs: Mapping[str, str] = field(default_factory=dict)
    file: ImageFile | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.file is not None:
            return {**self.file.to_dict(), "name": self.name, "runtime": self.runtime}
        return {
            "image": self.image,
            "id": self.digest,
            "name": self.name,
            "buildargs": dict(self.buildargs),
            "seconds": self.seconds,
        }


class ImageStore(abc.ABC):
    """The images a runtime starts containers from."""

    name: str

    @abc.abstractmethod
    def image_info(self, ref: str) -> ImageInfo | None:
        """The local image `ref` names, or None when it is not on this host. Starts no process
        that changes anything (kit up's image-drift warning calls it on every start)."""

    @abc.abstractmethod
    def plan_pull(self, ref: str) -> PullPlan:
        """Check `ref` (ImageRefError for a malformed one) and say what a pull would do. Pure:
        needs neither the engine nor the runtime's binary."""

    @abc.abstractmethod
    def pull(self, plan: PullPlan, *, on_progress: OnProgress) -> PullResult:
        """Execute the plan. A failed or interrupted pull leaves nothing behind that was not
        there before (no half tag, no partial file); ImageError says why it failed."""

    def plan_build(self, context: ContextPlan, *, source: str | None = None, dest: str | None = None) -> BuildPlan:
        """Say what building kit's image (containers/NAME, as `context` plans it) would do.
        `source`/`dest`: file stores only (what to build from, the file to write). Pure.
        A store that cannot build refuses here (the default)."""
        raise UsageError(
            f"the {self.name} runtime cannot build images",
            hint=f"build with runtime docker, then import the image with `kit pull --runtime {self.name}`",
        )

    def build(self, plan: BuildPlan, *, on_progress: OnProgress) -> BuildResult:
        """Execute a plan made by plan_build; atomic like pull."""
        raise UsageError(f"the {self.name} runtime cannot build images")

    @abc.abstractmethod
    def remove_image(self, ref: str) -> bool:
        """Remove the local image (a tag, or a file and its record); False when it was not there."""

    def run_probe(self, ref: str, program: str, args: Sequence[str], *, timeout: float = 600) -> ExecResult:
        """Run `python3 -c PROGRAM ARGS...` once in a throwaway container of the local image `ref`
        (no network), as the image's own user; its output and exit code (issue 24: the image
        facts probe). A store that starts no containers refuses here (the default)."""
        raise UsageError(
            f"the {self.name} runtime cannot run a probe in an image",
            hint="record the image's facts where Docker or Apptainer runs it: `kit verify --image IMAGE`",
        )


# ---- commands run inside containers: bounded there, and ended when kit goes away (issue 25) ----

EXEC_TIMEOUT_S = 120.0  # the deadline of an exec whose caller names none
EXEC_GRACE_S = 5.0  # the client waits this much longer than the in-container deadline
EXEC_MARK = "KIT_EXEC_ID"  # in the environment of every process one exec starts
# `docker exec` does not end the process it started when its client goes away (Ctrl-C, a
# timeout), so the deadline is kept inside the container: coreutils `timeout` (SIGTERM, then
# SIGKILL 2 s later, to the process group it makes) when the image has it. $1 is the deadline;
# the command follows as words (nothing is interpolated).
BOUNDED = 't="$1"; shift; if command -v timeout >/dev/null 2>&1; then exec timeout -k 2 "$t" "$@"; fi; exec "$@"'
# Ends every process of one exec, found by the mark in its environment (children inherit it), so
# an interrupted kit leaves nothing behind: $1 is the mark's value (kit's own hex).
END_EXEC = (
    'for d in /proc/[0-9]*; do grep -qsaF "$1" "$d/environ" && kill -KILL "${d#/proc/}" 2>/dev/null; done; exit 0'
)


def unseen_lines(lines: Sequence[str], shown: int) -> tuple[list[str], int]:
    """A node's log lines after the first `shown`, and the new count, so that a wait shows every
    line once: a poll that found two new lines used to show only the last (a `kit up` whose Ray
    head printed "1/2 nodes" and then a line of Ray's own never said "1/2 nodes"). A log shorter
    than before (a restarted container's) is shown from its start."""
    start = shown if len(lines) >= shown else 0
    return list(lines[start:]), len(lines)


def new_exec_mark() -> str:
    """A value for EXEC_MARK unique to one exec (fixed length: no mark is a prefix of another)."""
    return secrets.token_hex(12)


def bounded_argv(argv: Sequence[str], timeout_s: float) -> list[str]:
    """`argv` run under a deadline of `timeout_s` seconds inside the container."""
    return ["sh", "-c", BOUNDED, "kit-exec", f"{max(1.0, timeout_s):.0f}", *argv]


def end_exec_argv(mark: str) -> list[str]:
    """The command that ends every process of the exec marked `mark`."""
    return ["sh", "-c", END_EXEC, "kit-end-exec", f"{EXEC_MARK}={mark}"]


def call_within(call: Callable[[], Any], seconds: float, what: str) -> Any:
    """`call()` in a thread, waited for at most `seconds`: a blocked engine socket cannot hold kit
    past its deadline (the in-container deadline ends the command itself). Ctrl-C interrupts the
    wait (the thread is a daemon: it does not keep kit alive)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the waiting thread
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"kit-exec-{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise RuntimeUnavailable(
            f"the container engine did not answer within {seconds:.0f} s ({what})",
            hint="is it overloaded or stuck? (`docker info`)",
        )
    if "error" in box:
        raise box["error"]
    return box.get("value")


# ---- containers ------------------------------------------------------------------------------


class ContainerRuntime(abc.ABC):
    """Node containers: started from a ContainerSpec unchanged, found again by cluster."""

    name: str

    @property
    @abc.abstractmethod
    def images(self) -> ImageStore:
        """The store this runtime starts containers from (kit up checks a node's image there)."""

    @abc.abstractmethod
    def find_nodes(self, cluster: str) -> list[NodeHandle]:
        """Every kit node of `cluster` on this host, head first then by rank."""

    def host_nodes(self) -> list[NodeHandle]:
        """Every running kit node on this host, of any cluster: what they hold (their labels) is
        checked before another cluster's node starts (kit.cluster.host_share). An adapter that
        cannot list them returns [] (the check then sees nothing)."""
        return []

    @abc.abstractmethod
    def exec(
        self,
        node: NodeHandle,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        """Run argv inside the node's container and wait for it, at most `timeout` seconds
        (EXEC_TIMEOUT_S when None): the deadline holds inside the container (bounded_argv), and
        an exec that is interrupted or outlives it is ended there (end_exec_argv), so no process
        of it is left behind (issue 25). Past the deadline the result's returncode is 124 or 137
        (coreutils `timeout`)."""

    @abc.abstractmethod
    def exec_detached(self, node: NodeHandle, argv: Sequence[str]) -> None:
        """Start argv inside the node's container and return at once."""

    @abc.abstractmethod
    def state(self, name: str) -> str | None:
        """'running', 'exited', … or None when there is no such container."""

    @abc.abstractmethod
    def start(self, spec: ContainerSpec) -> None:
        """Create and start the planned container (detached)."""

    @abc.abstractmethod
    def remove(self, name: str) -> bool:
        """Remove the container if it exists; True if something was removed."""

    def revive(self, name: str) -> bool:
        """Start a node container again that exited (`docker kill`, `docker stop`: what a restart
        policy leaves down), as it was; True when it was started. A runtime whose stopped nodes
        are gone (an Apptainer instance) has nothing to start: False."""
        return False

    @abc.abstractmethod
    def logs(self, name: str, *, tail: int | str = "all") -> str:
        """The container's output so far ('' when there is no such container)."""

    def follow_logs(self, name: str, *, tail: int | str = "all", poll_s: float = 1.0) -> Iterator[str]:
        """The output (its last `tail` lines), then new output as it arrives, until the container
        is gone. This default polls logs(); an adapter with a native stream overrides it."""
        text = self.logs(name)
        seen = len(text)
        yield text if tail == "all" else "".join(text.splitlines(keepends=True)[-int(tail) :] if int(tail) > 0 else [])
        while True:
            alive = self.state(name) is not None
            text = self.logs(name)
            if len(text) < seen:  # the log was truncated or replaced: start over
                seen = 0
            if len(text) > seen:
                yield text[seen:]
                seen = len(text)
            if not alive:
                return
            time.sleep(poll_s)

    @abc.abstractmethod
    def wait_for_mark(
        self, name: str, marks: Sequence[str], *, timeout: float, on_progress: Callable[[str], None], what: str
    ) -> str:
        """Wait until a log line contains one of marks; raise StartError (with the log tail) on exit/timeout."""

    @abc.abstractmethod
    def remove_cluster(self, cluster: str) -> dict[str, list[str]]:
        """Remove every container (and network) of the cluster."""

    @abc.abstractmethod
    def ensure_network(self, name: str, subnet: str, cluster: str) -> None:
        """The private network `name` (subnet, labelled with the cluster) for local multi-node
        simulation, created if missing. A runtime without private networks refuses (ConfigError)."""


# The name the command modules import (kit.commands.*: `from kit.runtime.base import Runtime`).
Runtime = ContainerRuntime

"""The Docker adapter: the only module that imports docker-py or runs the docker CLI. It starts
the plan unchanged and implements both ContainerRuntime and ImageStore (kit/runtime/base.py).

docker-py quirks walled off here (FIELD_NOTES §3): images.pull() swallows errors inside the
stream (so the low-level API is used and every event checked); containers.run() silently pulls
a missing image (so presence is checked first); exec_run(stream=True) has no exit code.
The docker CLI (DockerCli) is used only where the user names the binary (`kit verify --image
--docker`); everything else goes through the engine API.
"""

from __future__ import annotations

import collections
import contextlib
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from kit.errors import ImageError, KitError, RuntimeUnavailable, StartError, UsageError
from kit.images.build import (
    CONTEXT_PLACEHOLDER,
    ContextPlan,
    docker_build_argv,
    to_docker_build_kwargs,
    write_build_context,
)
from kit.images.progress import PullProgress, build_step_line, shorten_build_error
from kit.images.reference import parse_ref, pick_digest
from kit.plan.container_args import to_docker_kwargs
from kit.plan.node import ContainerSpec
from kit.render import shell_words
from kit.runtime.base import (
    EXEC_GRACE_S,
    EXEC_MARK,
    EXEC_TIMEOUT_S,
    BuildPlan,
    BuildResult,
    ContainerRuntime,
    ExecResult,
    ImageInfo,
    ImageStore,
    NodeHandle,
    OnProgress,
    Progress,
    PullPlan,
    PullResult,
    bounded_argv,
    call_within,
    end_exec_argv,
    new_exec_mark,
    unseen_lines,
)

LABEL_MANAGED = "kit.managed=true"
# Engine error texts that mean the registry, not the name or credentials, is the problem.
_UNREACHABLE = ("connection refused", "connection reset", "unexpected EOF", "i/o timeout", "no such host", "cut off")


def _docker() -> Any:
    import docker  # lazy: keeps `kit --help` fast

    return docker


def _not_running(node: NodeHandle) -> StartError:
    """A node whose container stopped or restarts under an exec: what pollers wait out."""
    return StartError(f"{node.name} is not running", hint="see `kit status` and `kit logs`")


class DockerRuntime(ContainerRuntime, ImageStore):
    """The engine is reached on first use (RuntimeUnavailable if it cannot be), so planning
    (`plan_pull`, `plan_build`: what --dry-run prints) works on a host without it."""

    name = "docker"

    def __init__(self, client: Any = None) -> None:
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            docker = _docker()
            try:
                client = docker.from_env(timeout=120)
                client.ping()
            except Exception as exc:  # DockerException, requests errors, socket errors
                raise RuntimeUnavailable(
                    f"the Docker engine is not reachable ({_short(exc)})",
                    hint="start dockerd (or Docker Desktop), check DOCKER_HOST, and that you may use the socket",
                ) from None
            self._client = client
        return self._client

    @property
    def api(self) -> Any:
        return self.client.api

    @property
    def images(self) -> DockerRuntime:
        return self  # the engine's own image store

    # ---- images -------------------------------------------------------------------------
    def image_info(self, ref: str) -> ImageInfo | None:
        docker = _docker()
        try:
            image = self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            raise ImageError(f"cannot inspect image {ref}: {_short(exc)}") from None
        return ImageInfo(
            ref=ref,
            id=image.id,
            digests=tuple(image.attrs.get("RepoDigests") or []),
            tags=tuple(image.tags),
            labels=dict((image.attrs.get("Config") or {}).get("Labels") or {}),
        )

    def plan_pull(self, ref: str) -> PullPlan:
        name = str(parse_ref(ref))
        return PullPlan(ref=name, runtime=self.name, source=name, destination=f"the Docker engine, tagged {name}")

    def pull(self, plan: PullPlan, *, on_progress: OnProgress) -> PullResult:
        """Streaming pull with per-layer progress; a failed or interrupted pull removes a tag
        that was not there before (issue 3)."""
        ref = parse_ref(plan.source)
        name = str(ref)
        before = self.image_info(name)
        tracker = PullProgress()
        started = time.monotonic()
        on_progress(Progress(f"pulling {name}"))
        try:
            for event in self._pull_events(ref.repository, ref.pull_tag):
                line = tracker.line(event, time.monotonic())
                on_progress(Progress(line, "layer", tracker.summary()))
        except ImageError as err:
            self._drop_half_tag(name, before)
            hint = err.hint
            if any(mark in err.message for mark in _UNREACHABLE):
                hint = "the registry went away or is unreachable: check it (and any proxy), then retry"
            raise ImageError(err.message, hint=hint, details=err.details) from None
        except (KitError, KeyboardInterrupt):
            self._drop_half_tag(name, before)
            raise
        info = self.image_info(name)
        if info is None:  # the stream ended cleanly but nothing arrived: do not record a phantom
            raise ImageError(f"pull of {name} ended but the image is not on this host", hint="retry; see dockerd's log")
        digest = pick_digest(ref, info.digests, info.id) or tracker.digest or info.id
        return PullResult(
            ref=name,
            runtime=self.name,
            digest=digest,
            seconds=round(time.monotonic() - started, 1),
            image_id=info.id,
        )

    def _drop_half_tag(self, name: str, before: ImageInfo | None) -> None:
        if before is not None:
            return
        try:
            if self.image_info(name) is not None:
                self.remove_image(name)
        except KitError:
            pass  # the engine went away too; the pull error is the one to report

    def _pull_events(self, repository: str, tag: str) -> Iterator[dict[str, Any]]:
        """Low-level streaming pull; raises ImageError for errors inside the stream."""
        docker = _docker()
        hint = "check the image name, tag and registry credentials (docker login)"
        try:
            for event in self.api.pull(repository, tag=tag, stream=True, decode=True):
                if "errorDetail" in event or "error" in event:
                    detail = event.get("errorDetail", {}).get("message") or event.get("error")
                    raise ImageError(f"pull of {repository}:{tag} failed: {detail}", hint=hint)
                yield event
        except docker.errors.APIError as exc:
            raise ImageError(f"pull of {repository}:{tag} failed: {_short(exc)}", hint=hint) from None
        except Exception as exc:
            if isinstance(exc, KitError):
                raise
            # OSError, or requests' ChunkedEncodingError/ProtocolError when the registry disappears mid-pull
            raise ImageError(
                f"pull of {repository}:{tag} was cut off: {_short(exc)}",
                hint="check that the registry is reachable and retry",
            ) from None

    def plan_build(self, context: ContextPlan, *, source: str | None = None, dest: str | None = None) -> BuildPlan:
        if source is not None or dest is not None:
            raise UsageError(
                "--from and --sif are for runtime apptainer",
                hint="the Docker build always builds containers/NAME/; drop them or pass --runtime apptainer",
            )
        argv = docker_build_argv(to_docker_build_kwargs(context, CONTEXT_PLACEHOLDER))
        return BuildPlan(
            name=context.name,
            runtime=self.name,
            image=context.tag,
            source=f"containers/{context.name}/",
            argv=tuple(argv),
            context=context,
        )

    def build(self, plan: BuildPlan, *, on_progress: OnProgress) -> BuildResult:
        """Assemble the planned context in a temp folder and send the planned build request."""
        context = plan.context
        if context is None or plan.runtime != self.name:
            raise UsageError(f"not a Docker build plan: {plan.name} ({plan.runtime})")
        started = time.monotonic()
        tail: collections.deque[str] = collections.deque(maxlen=25)
        tracker = PullProgress()  # FROM images the builder pulls report layer progress
        last_step: str | None = None
        on_progress(Progress(f"building {context.tag} from containers/{context.name}/"))
        with tempfile.TemporaryDirectory(prefix="kit-build-") as tmp:
            write_build_context(context, Path(tmp))
            try:
                for event in self._build_events(to_docker_build_kwargs(context, tmp)):
                    step = build_step_line(event)
                    if step:
                        last_step = step
                        on_progress(Progress(step))
                        continue
                    for line in str(event.get("stream") or "").splitlines():
                        if line.strip():
                            tail.append(line.rstrip())
                            on_progress(Progress(line.rstrip(), "detail"))
                    if "status" in event:
                        on_progress(Progress(tracker.line(event, time.monotonic()), "layer", tracker.summary()))
            except ImageError as err:
                raise ImageError(
                    shorten_build_error(err.message, context.tag, last_step),
                    hint=err.hint or "see the builder output above; fix the Dockerfile or the build args",
                    details=list(tail),
                ) from None
        info = self.image_info(context.tag)
        if info is None:
            raise ImageError(f"the build of {context.tag} finished but the image is not there", details=list(tail))
        return BuildResult(
            name=context.name,
            runtime=self.name,
            image=context.tag,
            digest=info.id,
            seconds=round(time.monotonic() - started, 1),
            buildargs=dict(context.buildargs),
        )

    def _build_events(self, kwargs: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """The engine's build stream for the planned request; ImageError for errors inside it."""
        docker = _docker()
        try:
            for event in self.api.build(**kwargs, decode=True):  # decode: the stream as dicts
                if "errorDetail" in event or "error" in event:
                    detail = event.get("errorDetail", {}).get("message") or event.get("error")
                    raise ImageError(f"build of {kwargs['tag']} failed: {str(detail).strip()}")
                yield event
        except docker.errors.APIError as exc:
            raise ImageError(f"build of {kwargs['tag']} failed: {_short(exc)}") from None

    def remove_image(self, ref: str) -> bool:
        """Remove a local tag (and the image when no other tag uses it). False when it was not there."""
        docker = _docker()
        try:
            self.api.remove_image(ref)
            return True
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as exc:
            raise ImageError(f"cannot remove {ref}: {_short(exc)}") from None

    # ---- networks -----------------------------------------------------------------------
    def ensure_network(self, name: str, subnet: str, cluster: str) -> None:
        docker = _docker()
        existing = self.client.networks.list(names=[name])
        if any(n.name == name for n in existing):
            return
        ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=subnet)])
        try:
            self.client.networks.create(
                name, driver="bridge", ipam=ipam, labels={"kit.managed": "true", "kit.cluster": cluster}
            )
        except docker.errors.APIError as exc:
            raise StartError(
                f"cannot create Docker network {name} ({subnet}): {_short(exc)}",
                hint="pick another network_subnet that does not overlap an existing network",
            ) from None

    def used_subnets(self) -> list[str]:
        """IPv4 subnets of every Docker network on this engine."""
        out = []
        for network in self.client.networks.list():
            for cfg in (network.attrs.get("IPAM") or {}).get("Config") or []:
                if cfg.get("Subnet"):
                    out.append(str(cfg["Subnet"]))
        return out

    # ---- containers ---------------------------------------------------------------------
    def find_container(self, name: str) -> Any | None:
        docker = _docker()
        try:
            return self.client.containers.get(name)
        except docker.errors.NotFound:
            return None

    def start(self, spec: ContainerSpec) -> None:
        """Create and start the planned container, detached and labelled."""
        docker = _docker()
        if self.image_info(spec.image) is None:  # containers.run would pull it silently
            raise ImageError(
                f"image {spec.image} is not on this host",
                hint=f"run `{shell_words(['kit', 'pull', spec.image])}` first",
            )
        kwargs = to_docker_kwargs(spec)
        if "device_requests" in kwargs:
            kwargs["device_requests"] = [docker.types.DeviceRequest(**r) for r in kwargs["device_requests"]]
        if "ulimits" in kwargs:
            kwargs["ulimits"] = [docker.types.Ulimit(**u) for u in kwargs["ulimits"]]
        if "networking_config" in kwargs:
            endpoints = kwargs["networking_config"].items()
            kwargs["networking_config"] = {net: self.api.create_endpoint_config(**e) for net, e in endpoints}
        try:
            self.client.containers.run(**kwargs)
        except docker.errors.ImageNotFound:
            raise ImageError(
                f"image {spec.image} is not on this host", hint=f"run `{shell_words(['kit', 'pull', spec.image])}`"
            ) from None
        except docker.errors.APIError as exc:
            raise StartError(f"cannot start {spec.name}: {_short(exc)}", hint=_start_hint(str(exc))) from None

    def state(self, name: str) -> str | None:
        container = self.find_container(name)
        return None if container is None else str(container.status)

    def remove(self, name: str) -> bool:
        docker = _docker()
        for attempt in range(10):
            try:
                self.client.containers.get(name).remove(force=True)
                return True
            except docker.errors.NotFound:
                return False
            except docker.errors.APIError as exc:
                # 409: its removal is already in progress, or it is still being created or started
                # (kit up interrupted mid-start): the engine settles it in a moment.
                if exc.status_code != 409 or attempt == 9:
                    raise
                time.sleep(0.5)
        return False

    def revive(self, name: str) -> bool:
        docker = _docker()
        container = self.find_container(name)
        if container is None or container.status not in ("exited", "created"):
            return False
        try:
            container.start()
        except docker.errors.APIError:
            return False
        return True

    def logs(self, name: str, *, tail: int | str = "all") -> str:
        container = self.find_container(name)
        if container is None:
            return ""
        out: bytes = container.logs(tail=tail)
        return out.decode(errors="replace")

    def follow_logs(self, name: str, *, tail: int | str = "all", poll_s: float = 1.0) -> Iterator[str]:
        """The engine's own log stream (poll_s is unused: nothing is polled)."""
        container = self.find_container(name)
        if container is None:
            return
        for chunk in container.logs(stream=True, follow=True, tail=tail):
            yield chunk.decode(errors="replace")

    def wait_for_mark(
        self,
        name: str,
        marks: Sequence[str],
        *,
        timeout: float,
        on_progress: Callable[[str], None],
        what: str,
    ) -> str:
        """Wait until a log line contains one of `marks`; fail fast if the container exits."""
        deadline = time.monotonic() + timeout
        shown = 0
        while True:
            container = self.find_container(name)
            if container is None:
                raise StartError(f"{name} disappeared while waiting for {what}")
            text: str = container.logs().decode(errors="replace")
            lines: list[str] = [ln for ln in text.splitlines() if ln.strip()]
            for line in lines:
                if any(m in line for m in marks):
                    return line
            new, shown = unseen_lines(lines, shown)
            for line in new:
                on_progress(line)
            container.reload()
            # Restarted by the restart policy before it was ready: a failure too (issue 25).
            if container.status in ("exited", "dead", "restarting") or container.attrs.get("RestartCount"):
                code = container.attrs.get("State", {}).get("ExitCode")
                self._no_restart(container)
                raise StartError(
                    f"{name} exited (code {code}) before {what}",
                    details=lines[-20:],
                    hint="see `kit logs` and `kit diagnose`; fix, then `kit up --replace`",
                )
            if time.monotonic() > deadline:
                raise StartError(
                    f"{name}: timed out after {timeout:.0f} s waiting for {what}",
                    details=lines[-20:],
                    hint="check the other nodes and `kit status`; raise timeouts.join",
                )
            time.sleep(0.5)

    def _no_restart(self, container: Any) -> None:
        """Restart policy off, the container stopped: its output stays for `kit logs`."""
        docker = _docker()
        try:
            container.update(restart_policy={"Name": "no"})
            if container.status == "restarting":
                container.stop(timeout=5)
        except docker.errors.APIError:
            pass  # gone meanwhile: nothing is restarting

    def find_nodes(self, cluster: str) -> list[NodeHandle]:
        # ignore_removed: a container removed between the engine's list and its inspect is not a
        # node any more (docker-py would raise NotFound).
        containers = self.client.containers.list(
            all=True, filters={"label": [LABEL_MANAGED, f"kit.cluster={cluster}"]}, ignore_removed=True
        )
        # The router of model.dp_lb router (issue 29) is no node: found by its name, not here.
        nodes = [self._handle(c) for c in containers if c.labels.get("kit.role") != "router"]
        return sorted(nodes, key=lambda n: (n.role != "head", n.rank))

    def host_nodes(self) -> list[NodeHandle]:
        """The running kit containers of every cluster (their labels: no image lookups)."""
        containers = self.client.containers.list(filters={"label": [LABEL_MANAGED]}, ignore_removed=True)
        return [self._handle(c, digest=False) for c in containers]

    def _handle(self, container: Any, *, digest: bool = True) -> NodeHandle:
        labels = container.labels
        image_id = container.attrs.get("Image") if digest else None
        found = None
        if image_id:
            info = self.image_info(image_id)
            found = info.digests[0] if info and info.digests else image_id
        return NodeHandle(
            name=container.name,
            cluster=labels.get("kit.cluster", ""),
            role=labels.get("kit.role", "?"),
            rank=int(labels.get("kit.rank", "0")),
            state=container.status,
            ip=labels.get("kit.node-ip"),
            image=labels.get("kit.image", ""),
            image_digest=found,
            started_at=container.attrs.get("State", {}).get("StartedAt"),
            labels=dict(labels),
        )

    def exec(
        self,
        node: NodeHandle,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ExecResult:
        container = self.find_container(node.name)
        if container is None:
            raise StartError(f"{node.name} does not exist", hint="start it with `kit up`")
        limit = EXEC_TIMEOUT_S if timeout is None else timeout
        mark = new_exec_mark()
        environment = {**(env or {}), EXEC_MARK: mark}
        exec_id = self._exec_create(node, container.id, bounded_argv(argv, limit), environment=environment)
        docker = _docker()
        try:
            out, err = call_within(lambda: self.api.exec_start(exec_id, demux=True), limit + EXEC_GRACE_S, node.name)
            code = self.api.exec_inspect(exec_id).get("ExitCode")
        except docker.errors.APIError as exc:
            # The container stopped (or restarted) between the exec's creation and its start: the
            # engine dropped the exec (404) or refuses it (409). A StartError, as in _exec_create:
            # callers that poll a restarting node (`kit serve --supervise` following) expect it.
            if exc.status_code not in (404, 409):
                raise
            raise _not_running(node) from None
        except BaseException:
            # Interrupted (Ctrl-C, SIGTERM) or the engine stopped answering: end what the exec
            # started inside the container, which docker would leave running (issue 25).
            self._end_exec(container.id, mark)
            raise
        return ExecResult(
            returncode=int(code if code is not None else -1),
            stdout=(out or b"").decode(errors="replace"),
            stderr=(err or b"").decode(errors="replace"),
        )

    def _end_exec(self, container_id: str, mark: str) -> None:
        """Kill every process of the exec marked `mark` (best effort, bounded: kit is on its way out;
        the container may be gone, and the error that brought kit here is the one to report)."""
        with contextlib.suppress(BaseException):
            exec_id = str(self.api.exec_create(container_id, end_exec_argv(mark))["Id"])
            call_within(lambda: self.api.exec_start(exec_id), EXEC_GRACE_S, container_id[:12])

    def exec_detached(self, node: NodeHandle, argv: Sequence[str]) -> None:
        container = self.find_container(node.name)
        if container is None:
            raise StartError(f"{node.name} does not exist", hint="start it with `kit up`")
        exec_id = self._exec_create(node, container.id, list(argv))
        self.api.exec_start(exec_id, detach=True)

    def _exec_create(self, node: NodeHandle, container_id: str, argv: list[str], **kwargs: Any) -> str:
        """An exec in a running container; a container that stopped (or is restarting) since it
        was found is a StartError, not the engine's 409."""
        docker = _docker()
        try:
            return str(self.api.exec_create(container_id, argv, **kwargs)["Id"])
        except docker.errors.NotFound:
            raise StartError(f"{node.name} does not exist", hint="start it with `kit up`") from None
        except docker.errors.APIError as exc:
            if exc.status_code == 409:  # "is not running" / "is restarting"
                raise _not_running(node) from None
            raise

    def run_once(
        self, image: str, argv: Sequence[str], *, volumes: Mapping[str, str], labels: Mapping[str, str], **run: Any
    ) -> ExecResult:
        """A throwaway container run to completion, then removed; `run`: docker-py options, `timeout`."""
        docker = _docker()
        binds = {src: {"bind": dst, "mode": "rw"} for src, dst in volumes.items()}
        timeout = run.pop("timeout", None)
        try:
            container = self.client.containers.run(
                image=image, command=list(argv), volumes=binds, labels=dict(labels), detach=True, entrypoint=[], **run
            )
        except (docker.errors.ImageNotFound, docker.errors.APIError) as exc:
            raise ImageError(f"cannot run {image}: {_short(exc)}", hint="build or pull it first") from None
        try:
            code = int(container.wait(timeout=timeout).get("StatusCode", -1))
            out = container.logs(stdout=True, stderr=False).decode(errors="replace")
            err = container.logs(stdout=False, stderr=True).decode(errors="replace")
        except Exception as exc:  # a timeout (requests' ReadTimeout) or a lost engine
            raise ImageError(f"the container of {image} did not finish: {_short(exc)}") from None
        finally:
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True)
        return ExecResult(returncode=code, stdout=out, stderr=err)

    def run_probe(self, ref: str, program: str, args: Sequence[str], *, timeout: float = 600) -> ExecResult:
        """`python3 -c PROGRAM ARGS` without network, as the image's own user (issue 24)."""
        argv, labels = ["python3", "-c", program, *args], {"kit.managed": "true", "kit.probe": "image-facts"}
        return self.run_once(ref, argv, volumes={}, labels=labels, network_mode="none", timeout=timeout)

    def remove_labelled(self, key: str, value: str) -> list[str]:
        """Remove every kit container labelled key=value (e.g. a SLURM job's); their names."""
        docker = _docker()
        removed = []
        for container in self.client.containers.list(
            all=True, filters={"label": [f"{key}={value}"]}, ignore_removed=True
        ):
            try:
                container.remove(force=True)
                removed.append(container.name)
            except docker.errors.NotFound:
                pass
        return removed

    def remove_cluster(self, cluster: str) -> dict[str, list[str]]:
        """Remove every container and network labelled with the cluster. Idempotent."""
        docker = _docker()
        removed: dict[str, list[str]] = {"containers": [], "networks": []}
        filters = {"label": [LABEL_MANAGED, f"kit.cluster={cluster}"]}
        for container in self.client.containers.list(all=True, filters=filters, ignore_removed=True):
            try:
                container.remove(force=True)
                removed["containers"].append(container.name)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: its removal is already in progress (kit up's Ctrl-C)
                    raise
        for network in self.client.networks.list(filters=filters):
            for attempt in range(10):
                try:
                    network.remove()
                    removed["networks"].append(network.name)
                    break
                except docker.errors.NotFound:
                    break
                except docker.errors.APIError as exc:
                    # "has active endpoints": a container of it is still being removed; it goes in a moment
                    if exc.status_code not in (403, 409) or attempt == 9:
                        raise
                    time.sleep(0.5)
        return removed


def local_image_id(ref: str) -> str | None:
    """The id of a local Docker image, or None (no such image, or no engine on this host)."""
    try:
        info = DockerRuntime().image_info(ref)
    except (RuntimeUnavailable, ImageError):
        return None
    return info.id if info else None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[-1] if text else type(exc).__name__)[:300]


def _start_hint(message: str) -> str | None:
    if "could not select device driver" in message and "gpu" in message:
        return "install the NVIDIA Container Toolkit, or set accelerator: cpu"
    if "Address already in use" in message or "address already in use" in message:
        return "another process uses this IP/port; change node_ip/network_subnet or ports"
    if "Conflict" in message:
        return "a container with that name exists: `kit up --replace` or `kit down`"
    return None

"""The Docker adapter: the only module that imports docker-py. It starts the plan unchanged.

docker-py quirks walled off here (FIELD_NOTES §3): images.pull() swallows errors inside the
stream (so the low-level API is used and every event checked); containers.run() silently pulls
a missing image (so presence is checked first); exec_run(stream=True) has no exit code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from kit.errors import ImageError, KitError, RuntimeUnavailable, StartError
from kit.plan.container_args import to_docker_kwargs
from kit.plan.node import ContainerSpec
from kit.render import shell_words
from kit.runtime.base import ExecResult, NodeHandle, Runtime

LABEL_MANAGED = "kit.managed=true"


def _docker() -> Any:
    import docker  # lazy: keeps `kit --help` fast

    return docker


class DockerRuntime(Runtime):
    name = "docker"

    def __init__(self, client: Any = None) -> None:
        docker = _docker()
        try:
            self.client = client or docker.from_env(timeout=120)
            self.client.ping()
        except Exception as exc:  # DockerException, requests errors, socket errors
            raise RuntimeUnavailable(
                f"the Docker engine is not reachable ({_short(exc)})",
                hint="start dockerd (or Docker Desktop), check DOCKER_HOST, and that you may use the socket",
            ) from None
        self.api = self.client.api

    # ---- images -------------------------------------------------------------------------
    def image_info(self, ref: str) -> dict[str, Any] | None:
        """{'id', 'repo_digests', 'tags'} of a local image, or None."""
        docker = _docker()
        try:
            image = self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            raise ImageError(f"cannot inspect image {ref}: {_short(exc)}") from None
        return {
            "id": image.id,
            "repo_digests": list(image.attrs.get("RepoDigests") or []),
            "tags": list(image.tags),
            "labels": dict((image.attrs.get("Config") or {}).get("Labels") or {}),
        }

    def pull_events(
        self, repository: str, tag: str, auth_config: Mapping[str, str] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Low-level streaming pull; raises ImageError for errors inside the stream."""
        docker = _docker()
        try:
            stream = self.api.pull(repository, tag=tag, stream=True, decode=True, auth_config=auth_config)
            for event in stream:
                if "errorDetail" in event or "error" in event:
                    detail = event.get("errorDetail", {}).get("message") or event.get("error")
                    raise ImageError(
                        f"pull of {repository}:{tag} failed: {detail}",
                        hint="check the image name, tag and registry credentials (docker login)",
                    )
                yield event
        except docker.errors.APIError as exc:
            raise ImageError(
                f"pull of {repository}:{tag} failed: {_short(exc)}",
                hint="check the image name, tag and registry credentials (docker login)",
            ) from None
        except (ConnectionError, OSError) as exc:
            raise ImageError(
                f"pull of {repository}:{tag} was cut off: {_short(exc)}",
                hint="check that the registry is reachable and retry",
            ) from None
        except Exception as exc:
            if isinstance(exc, KitError):
                raise
            # requests' ChunkedEncodingError/ProtocolError when the registry disappears mid-pull
            raise ImageError(
                f"pull of {repository}:{tag} was cut off: {_short(exc)}",
                hint="check that the registry is reachable and retry",
            ) from None

    def build_events(
        self, context: str, tag: str, buildargs: Mapping[str, str], dockerfile: str = "Dockerfile"
    ) -> Iterator[dict[str, Any]]:
        docker = _docker()
        try:
            for event in self.api.build(
                path=context,
                tag=tag,
                buildargs=dict(buildargs),
                dockerfile=dockerfile,
                rm=True,
                forcerm=True,
                decode=True,
                labels={"kit.managed": "true"},
            ):
                if "errorDetail" in event or "error" in event:
                    detail = event.get("errorDetail", {}).get("message") or event.get("error")
                    raise ImageError(f"build of {tag} failed: {str(detail).strip()}")
                yield event
        except docker.errors.APIError as exc:
            raise ImageError(f"build of {tag} failed: {_short(exc)}") from None

    def tag(self, image_id: str, repository: str, tag: str) -> None:
        self.api.tag(image_id, repository, tag=tag)

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

    def start(self, spec: ContainerSpec) -> Any:
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
            return self.client.containers.run(**kwargs)
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
        try:
            self.client.containers.get(name).remove(force=True)
            return True
        except docker.errors.NotFound:
            return False

    def logs(self, name: str, *, tail: int | str = "all") -> str:
        container = self.find_container(name)
        if container is None:
            return ""
        out: bytes = container.logs(tail=tail)
        return out.decode(errors="replace")

    def follow_logs(self, name: str, *, tail: int | str = "all") -> Iterator[str]:
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
        last_line = ""
        while True:
            container = self.find_container(name)
            if container is None:
                raise StartError(f"{name} disappeared while waiting for {what}")
            text: str = container.logs().decode(errors="replace")
            lines: list[str] = [ln for ln in text.splitlines() if ln.strip()]
            for line in lines:
                if any(m in line for m in marks):
                    return line
            if lines and lines[-1] != last_line:
                last_line = lines[-1]
                on_progress(last_line)
            container.reload()
            if container.status in ("exited", "dead"):
                code = container.attrs.get("State", {}).get("ExitCode")
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

    def find_nodes(self, cluster: str) -> list[NodeHandle]:
        containers = self.client.containers.list(all=True, filters={"label": [LABEL_MANAGED, f"kit.cluster={cluster}"]})
        nodes = [self._handle(c) for c in containers]
        return sorted(nodes, key=lambda n: (n.role != "head", n.rank))

    def _handle(self, container: Any) -> NodeHandle:
        labels = container.labels
        image_id = container.attrs.get("Image")
        digest = None
        if image_id:
            info = self.image_info(image_id)
            digest = info["repo_digests"][0] if info and info["repo_digests"] else image_id
        return NodeHandle(
            name=container.name,
            cluster=labels.get("kit.cluster", ""),
            role=labels.get("kit.role", "?"),
            rank=int(labels.get("kit.rank", "0")),
            state=container.status,
            ip=labels.get("kit.node-ip"),
            image=labels.get("kit.image", ""),
            image_digest=digest,
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
        exec_id = self.api.exec_create(container.id, list(argv), environment=dict(env or {}))["Id"]
        out, err = self.api.exec_start(exec_id, demux=True)
        code = self.api.exec_inspect(exec_id).get("ExitCode")
        return ExecResult(
            returncode=int(code if code is not None else -1),
            stdout=(out or b"").decode(errors="replace"),
            stderr=(err or b"").decode(errors="replace"),
        )

    def exec_detached(self, node: NodeHandle, argv: Sequence[str]) -> None:
        container = self.find_container(node.name)
        if container is None:
            raise StartError(f"{node.name} does not exist", hint="start it with `kit up`")
        exec_id = self.api.exec_create(container.id, list(argv))["Id"]
        self.api.exec_start(exec_id, detach=True)

    def run_once(
        self, image: str, argv: Sequence[str], *, volumes: Mapping[str, str], labels: Mapping[str, str]
    ) -> ExecResult:
        """Run a throwaway container to completion (e.g. the demo's model generator)."""
        docker = _docker()
        binds = {src: {"bind": dst, "mode": "rw"} for src, dst in volumes.items()}
        try:
            container = self.client.containers.run(
                image, list(argv), volumes=binds, labels=dict(labels), detach=True, entrypoint=[]
            )
        except docker.errors.ImageNotFound:
            raise ImageError(f"image {image} is not on this host", hint="build it with `kit build`") from None
        try:
            code = int(container.wait().get("StatusCode", -1))
            out = container.logs(stdout=True, stderr=False).decode(errors="replace")
            err = container.logs(stdout=False, stderr=True).decode(errors="replace")
        finally:
            container.remove(force=True)
        return ExecResult(returncode=code, stdout=out, stderr=err)

    def remove_cluster(self, cluster: str) -> dict[str, list[str]]:
        """Remove every container and network labelled with the cluster. Idempotent."""
        docker = _docker()
        removed: dict[str, list[str]] = {"containers": [], "networks": []}
        filters = {"label": [LABEL_MANAGED, f"kit.cluster={cluster}"]}
        for container in self.client.containers.list(all=True, filters=filters):
            try:
                container.remove(force=True)
                removed["containers"].append(container.name)
            except docker.errors.NotFound:
                pass
        for network in self.client.networks.list(filters=filters):
            try:
                network.remove()
                removed["networks"].append(network.name)
            except docker.errors.NotFound:
                pass
        return removed


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

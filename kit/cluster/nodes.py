"""One node of the cluster: its plan (the host facts it needs, then the pure kit.plan.node), and
starting it with a runtime adapter: the container, then the wait for its readiness mark."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kit.config import KitConfig
from kit.errors import ImageError, StartError
from kit.net import interfaces as netinfo
from kit.plan.network import HostFacts, NodeNet
from kit.plan.node import ContainerSpec
from kit.plan.scripts import JOINED_MARK, READY_MARK
from kit.render import shell_words
from kit.runtime.base import Runtime

Progress = Callable[[str], None]


@dataclass(frozen=True)
class NodePlan:
    """What `kit up` starts on this host (and what its --dry-run prints)."""

    spec: ContainerSpec
    net: NodeNet


@dataclass(frozen=True)
class UpResult:
    container: str
    state: str  # "running" (there already), "started" (not waited for), "ready"
    created: bool
    ready_line: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"container": self.container, "state": self.state, "created": self.created}
        if self.ready_line is not None:
            out["ready_line"] = self.ready_line
        return out


def gather_host_facts(config: KitConfig) -> HostFacts:
    """The only host I/O node planning needs (interfaces, routes, /dev/infiniband)."""
    route = None
    if config.head_address and not config.network:
        route = netinfo.route_source_ip(config.head_address)
    return HostFacts(
        interfaces=netinfo.interface_addresses(),
        default_interface=netinfo.default_route_interface(),
        route_to_head=route,
        has_infiniband=netinfo.has_infiniband(),
    )


def remove_after_interrupt(runtime: Runtime, cluster: str, name: str) -> None:
    """`kit up` was interrupted while starting `name`: remove it, and the cluster's network too
    when no other container of the cluster is left on this host (another node may still use it)."""
    runtime.remove(name)
    try:
        if not [n for n in runtime.find_nodes(cluster) if n.name != name]:
            runtime.remove_cluster(cluster)
    except Exception:
        # The container is gone; the network is left for `kit down`, and the interrupt, not a
        # failure to clean up after it, is what to report.
        pass


def start_node(
    runtime: Runtime,
    config: KitConfig,
    spec: ContainerSpec,
    *,
    replace: bool,
    wait: bool,
    on_progress: Progress,
    deadline: float | None = None,
    notes: Sequence[str] = (),
) -> UpResult:
    """Start (or report) the node container and wait for readiness. Ctrl-C leaves no orphan.
    `deadline` (time.monotonic()) ends the wait earlier than timeouts.join (kit tune's budget).
    `notes`: warnings said once the engine answered, before the container starts (issue 19)."""
    state = runtime.state(spec.name)
    if state == "running" and not replace:
        on_progress(f"{spec.name} is already running (use --replace to recreate it)")
        return UpResult(spec.name, "running", created=False)
    # Every refusal before the first word of starting and before a running node is replaced
    # (issue 25: "starting ..." was printed, then the missing image refused).
    if runtime.images.image_info(spec.image) is None:
        raise ImageError(
            f"image {spec.image} is not on this host", hint=f"run `{shell_words(['kit', 'pull', spec.image])}` first"
        )
    if state is not None:
        runtime.remove(spec.name)
    if config.network and config.runtime == "docker":
        runtime.ensure_network(config.network, config.network_subnet, config.cluster)
    drift = image_drift(runtime, spec.image)
    for note in [*notes, *([drift] if drift else [])]:
        on_progress(f"warning: {note}")
    on_progress(f"starting {spec.name} from {spec.image}")
    try:
        runtime.start(spec)
        if not wait:
            return UpResult(spec.name, "started", created=True)
        line = runtime.wait_for_mark(
            spec.name,
            [READY_MARK] if _is_ready_node(config, spec) else [JOINED_MARK],
            timeout=_join_timeout(config, deadline),
            on_progress=lambda text: on_progress(f"{spec.name}: {text}"),
            what=_waiting_for(config, spec),
        )
    except KeyboardInterrupt:
        # Interrupted while starting: remove what we created so nothing is left half-up (the
        # network too, when nothing else of the cluster is left on this host: issue 18).
        remove_after_interrupt(runtime, config.cluster, spec.name)
        raise
    except StartError:
        raise  # the container stays, so `kit logs` can show why; `kit down` removes it
    return UpResult(spec.name, "ready", created=True, ready_line=line)


def _is_ready_node(config: KitConfig, spec: ContainerSpec) -> bool:
    """The head, and every mp-backend node, print READY_MARK; a Ray worker prints JOINED_MARK."""
    return spec.role.is_head or config.backend == "mp"


def _waiting_for(config: KitConfig, spec: ContainerSpec) -> str:
    if spec.role.is_head and config.backend == "ray":
        return "the Ray cluster: all nodes and GPUs/CPUs alive"
    return "the node to be ready" if _is_ready_node(config, spec) else "the worker to join the head"


def _join_timeout(config: KitConfig, deadline: float | None) -> float:
    timeout: float = config.timeouts.join + 30
    if deadline is not None:
        timeout = max(min(timeout, deadline - time.monotonic()), 0)
    return timeout


def image_drift(runtime: Runtime, ref: str) -> str | None:
    """A one-line warning when the local image is not the one `kit pull`/`kit build` recorded
    (another pull changed the tag on this node: nodes may now run different images)."""
    from kit.images.records import recorded_image

    record = recorded_image(ref)
    if not record or not record.get("image_id"):
        return None
    info = runtime.images.image_info(ref)
    if info and info.id != record["image_id"]:
        return (
            f"{ref} is now {info.id[:19]} but kit recorded {record['image_id'][:19]} "
            f"on {record.get('recorded_at', '?')}; run `kit pull` on every node, then `kit verify`"
        )
    return None

"""The cluster layer: what the verbs share, without click (issue 17).

`Cluster` is one configured cluster (its resolved config, layout and the model's facts) and the
runtime adapter its nodes run on. The verbs are shims over it: `kit up` plans and starts a node,
`kit serve` serves, `kit status`/`kit down` look and clean up, `kit query`/`kit bench` ask for
`url()`; `kit demo` and `kit tune` bring every node of a layout up on this host with
`bring_up()`, serve, and tear down.

    resolve.py   settings (loaded, never planned) -> model facts (read once) -> layout -> checks
    running.py   what runs: the nodes' labels and kit's record, drift from the config (issue 25)
    record.py    kit's record of each cluster started on this host (clusters.json)
    model.py     is the model complete in hf_cache: vLLM offline or not (issue 19)
    nodes.py     one node: host facts, plan, start and wait
    serving.py   `vllm serve` on the serving nodes and the wait for /health
    status.py    containers, the Ray view, the DP view, within one deadline
    warnings.py  the warning lines of a start (up, serve) and of a launcher (slurm)

Two ways in (issue 25): `Cluster.load` for the verbs that start or render something (its plan —
model facts, sizing, the layout — is computed on first use of `config`/`layout`), and
`Cluster.find` for the verbs that look or tear down, which operate with what runs
(`operated()`: the running cluster's values over the settings, never planned).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit.cluster import image_facts
from kit.cluster import nodes as _nodes
from kit.cluster import record as _record
from kit.cluster import replicas as _replicas
from kit.cluster import running as _running
from kit.cluster import serving as _serving
from kit.cluster import status as _status
from kit.cluster import supervised as _supervised
from kit.cluster import supervised_replicas as _supervised_replicas
from kit.cluster.host_share import check_host_share
from kit.cluster.model import ModelCache, check_model_cache, decide_offline, with_offline
from kit.cluster.nodes import NodePlan, UpResult
from kit.cluster.resolve import (
    Overrides,
    Resolution,
    apply_layout,
    check_mounts,
    check_plan,
    check_secret_files,
    ensure_compile_cache,
    load_settings,
    relayout,
    values_of,
    with_image,
)
from kit.cluster.resolve import plan as plan_settings
from kit.cluster.running import Drift, Running
from kit.cluster.serving import ServePlan, ServeResult
from kit.cluster.status import Budget, StatusResult
from kit.cluster.warnings import Warnings, start_warnings
from kit.config import KitConfig, Resolved
from kit.errors import KitError, StartError
from kit.images.facts import ImageFacts
from kit.labels import LayoutLabels
from kit.layout import Layout
from kit.plan.exposure import exposures
from kit.plan.layout import ModelFacts
from kit.plan.network import plan_node_net
from kit.plan.node import plan_node
from kit.plan.replicas import router_mode
from kit.plan.roles import HEAD, Role
from kit.plan.vllm import serves_api
from kit.runtime.base import NodeHandle, Runtime
from kit.supervise.events import Event

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class DownResult:
    cluster: str
    containers: list[str]
    networks: list[str]
    command = "down"

    def to_dict(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "containers": self.containers, "networks": self.networks}

    def text(self) -> str:
        return (
            f"cluster {self.cluster}: removed {len(self.containers)} container(s)"
            + (f" ({', '.join(self.containers)})" if self.containers else "")
            + (f" and {len(self.networks)} network(s)" if self.networks else "")
        )


class Cluster:
    """One configured cluster and its runtime. The runtime adapter is made on first use
    (kit.runtime.get_runtime), so planning and --dry-run need no container engine; the plan
    (model facts, sizing, layout) is made on first use too (issue 25)."""

    def __init__(
        self, resolution: Resolution | Resolved, runtime: Runtime | None = None, *, operating: bool = False
    ) -> None:
        self._resolution: Resolution | None = None
        if isinstance(resolution, Resolution):
            self._settings, self._resolution = resolution.resolved, resolution
        else:
            self._settings = resolution
        self._runtime = runtime
        self._model_cache: ModelCache | None = None
        # Found to look at or tear down (Cluster.find): the runtime is the one it runs on.
        self._operating = operating

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        config_path: str | None,
        overrides: Overrides,
        *,
        environ: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        runtime: Runtime | None = None,
    ) -> Cluster:
        """kit.yaml (or `config_path`), KIT_* and the overrides, to start or render the cluster:
        planned (the model's config.json read once) when `config` or `layout` is first used."""
        return cls(load_settings(config_path, overrides, environ=environ, cwd=cwd), runtime)

    @classmethod
    def find(
        cls,
        config_path: str | None,
        overrides: Overrides,
        *,
        environ: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        runtime: Runtime | None = None,
    ) -> Cluster:
        """The cluster the settings name, to look at or tear down (status, query, metrics, logs,
        bench, down, verify): nothing is planned; what runs is read back (`operated()`)."""
        return cls(load_settings(config_path, overrides, environ=environ, cwd=cwd), runtime, operating=True)

    @classmethod
    def from_config(
        cls,
        config: KitConfig,
        *,
        model: ModelFacts | None = None,
        runtime: Runtime | None = None,
        image: ImageFacts | None = None,
    ) -> Cluster:
        """A cluster of a config built elsewhere (tests, a config with every value set); `image`:
        the image's facts when known (else they are found at first use, `ensure_image`)."""
        resolved = with_image(Resolved(config, values_of(config), {}), image)
        if "auto" not in (config.model.tp, config.model.pp, config.model.dp):
            # every value a number (a resolved config's layout is applied): keep how it was decided
            return cls(Resolution(resolved, config.layout, model, image), runtime)
        return cls(apply_layout(resolved, model, image), runtime)

    def with_layout(self, overrides: Overrides) -> Cluster:
        """The same cluster with other layout values (kit tune), planned again by kit.plan.layout
        with the model's facts already read; the same runtime."""
        return Cluster(relayout(self.resolution, overrides), self._runtime)

    # ---- what it is ---------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._settings.config.cluster

    @property
    def settings(self) -> Resolved:
        """The loaded settings, with where each value came from (never planned)."""
        return self._settings

    @property
    def resolution(self) -> Resolution:
        """The settings planned: the model's facts read once, the layout applied (on first use)."""
        if self._resolution is None:
            self._resolution = plan_settings(self._settings)
        return self._resolution

    @property
    def config(self) -> KitConfig:
        return self.resolution.config

    @property
    def sources(self) -> Mapping[str, str]:
        return self.resolution.resolved.sources

    @property
    def resolved(self) -> Resolved:
        return self.resolution.resolved

    @property
    def layout(self) -> Layout:
        return self.resolution.layout

    @property
    def model(self) -> ModelFacts | None:
        return self.resolution.model

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            from kit import runtime

            self._runtime = runtime.get_runtime(self._runtime_config())
        return self._runtime

    def _runtime_config(self) -> KitConfig:
        """The configured runtime; a cluster found to look at runs on the runtime kit recorded
        when it started it (its nodes are found through it)."""
        config = self._settings.config
        if self._operating:
            recorded = ((_record.read(config.cluster) or {}).get("values") or {}).get("runtime")
            if recorded in ("docker", "apptainer") and recorded != config.runtime:
                return config.replace(runtime=recorded)
        return config

    # ---- what runs (issue 25) -------------------------------------------------------------
    def running(self) -> Running:
        """What runs: this host's nodes of the cluster (none where no runtime answers: a laptop)
        and kit's record of it."""
        try:
            nodes = self.nodes()
        except KitError:
            nodes = []
        return _running.read_running(self.name, nodes, _record.read(self.name))

    def operated(self, running: Running | None = None) -> Resolved:
        """The config to look at or tear down the cluster with: what runs over the settings."""
        return _running.operated(self._settings, running or self.running())

    def drift(self, running: Running | None = None) -> list[Drift]:
        """The configured values that disagree with what runs (kit uses what runs)."""
        return _running.drift(self._settings, running or self.running())

    def model_cache(self) -> ModelCache:
        """Is the model complete in hf_cache on this host, hence vLLM offline on the nodes
        (kit.cluster.model)? The cache is read once per cluster."""
        if self._model_cache is None:
            self._model_cache = decide_offline(self.config, check_model_cache(self.config))
        return self._model_cache

    def warnings(self, role: Role | None = None) -> Warnings:
        """The lines a start says (kit.cluster.warnings), for `role`, the node `kit up` starts (its
        API where it serves one, and Ray), or for None, the server `kit serve` starts (the API;
        Ray is the nodes')."""
        config = self.config
        exposed = exposures(config, ray=False) if role is None else exposures(config, api=serves_api(config, role))
        return start_warnings(config, self.layout, self.model_cache(), exposed)

    def check(self) -> None:
        """Every host-independent check of the plan (kit.plan.checks), with the model's facts."""
        check_plan(self.resolution)

    @property
    def image(self) -> ImageFacts | None:
        """The image's recorded facts (issue 24), None when kit has no record of it."""
        return self.resolution.image

    def ensure_image(self, on_progress: Progress = _quiet) -> ImageFacts | None:
        """Before anything starts: the image's facts, probed now when kit has no record (first
        use), and the plan checked against them (its parser, its Ray; exit 3 when refused). The
        plan is made again with them: the image's own options decide what kit renders. A runtime
        that cannot run a probe (pyxis, edf) leaves it to the launcher's in-container check."""
        if self.resolution.image is None and self.config.runtime in ("docker", "apptainer"):
            facts = image_facts.probe(self.runtime.images, self.config.image, say=on_progress)
            resolved = with_image(self.resolution.resolved, facts)
            self._resolution = apply_layout(resolved, self.resolution.model, facts)
        self.check()
        return self.resolution.image

    # ---- nodes --------------------------------------------------------------------------
    def plan_node(self, role: Role, *, check_files: bool = True, config: KitConfig | None = None) -> NodePlan:
        """Validate everything, then plan this node (`config`: a per-node variant, kit demo's GPU
        split). The host's interfaces and routes are its only input besides the config, and
        the model cache's decision: HF_HUB_OFFLINE=1 in the node's environment when complete."""
        config = with_offline(config or self.config, self.model_cache())
        self.check()
        if check_files:
            check_secret_files(config, self.sources)
            check_mounts(config, self.sources)
        host = _nodes.gather_host_facts(config)
        net = plan_node_net(config, self.sources, role, host)
        plan = NodePlan(plan_node(config, role, net, has_infiniband=host.has_infiniband), net)
        # issue 28: no host port or GPU another cluster's running node holds (a dry run included)
        check_host_share(config, role, self._runtime_or_none())
        return plan

    def _runtime_or_none(self) -> Runtime | None:
        """The runtime adapter, or None where it cannot be made here (a dry run without one)."""
        try:
            return self.runtime
        except Exception:
            return None

    def up(
        self,
        role: Role,
        *,
        replace: bool = False,
        wait: bool = True,
        deadline: float | None = None,
        on_progress: Progress = _quiet,
        plan: NodePlan | None = None,
        config: KitConfig | None = None,
        notes: Sequence[str] = (),
    ) -> UpResult:
        """Start this host's node of `role` (planned unless `plan` is given) and wait for it;
        `notes` are warnings said just before it starts."""
        plan = plan or self.plan_node(role, config=config)
        config = config or self.config
        ensure_compile_cache(config, self.sources)
        try:
            result = _nodes.start_node(
                self.runtime,
                config,
                plan.spec,
                replace=replace,
                wait=wait,
                on_progress=on_progress,
                deadline=deadline,
                notes=notes,
            )
        except StartError:
            if self.runtime.state(plan.spec.name) is not None:  # it stays for `kit logs`: recorded
                self._record_started(config, plan)
            raise
        if result.created:
            self._record_started(config, plan)
        return result

    def _record_started(self, config: KitConfig, node: NodePlan) -> None:
        """kit's record of the cluster on this host (issue 25): what a later command needs."""
        entry = {"name": node.spec.name, "role": node.spec.role.kind, "rank": node.spec.role.rank, "ip": node.net.ip}
        operating = _running.operating_values(config, node.net.head_address)
        _record.started(self.resolved, entry, operating)

    def bring_up(
        self,
        *,
        deadline: float | None = None,
        on_progress: Progress = _quiet,
        node_progress: Progress = _quiet,
        node_config: Callable[[Role], KitConfig] | None = None,
    ) -> list[UpResult]:
        """Every node on this host, workers first (they retry joining), then the head: one node,
        or the local multi-node simulation (network:). Replaces what runs. Every wait ends at
        `deadline` (time.monotonic()): the waits share it. `on_progress` hears one line per node,
        `node_progress` each node's own lines (its start, its wait)."""
        self.ensure_image(on_progress)
        roles = [Role("worker", rank) for rank in range(self.config.nodes - 1, 0, -1)] + [HEAD]
        results = []
        for role in roles:
            config = node_config(role) if node_config else self.config
            plan = self.plan_node(role, config=config)
            on_progress(f"kit up --{role.kind}: {plan.spec.name} at {plan.net.ip}")
            results.append(
                self.up(role, replace=True, deadline=deadline, on_progress=node_progress, plan=plan, config=config)
            )
        return results

    def nodes(self) -> list[NodeHandle]:
        """This cluster's nodes on this host (head first)."""
        return self.runtime.find_nodes(self.name)

    # ---- serving ------------------------------------------------------------------------
    def plan_serve(self) -> ServePlan:
        return _serving.plan_serve(self.config, env=self.model_cache().env, supervised=self.config.supervise.enabled)

    def serve(
        self,
        *,
        replace: bool = False,
        deadline: float | None = None,
        on_progress: Progress = _quiet,
        notes: Sequence[str] = (),
        supervise: bool | None = None,
        on_event: Callable[[Event], None] | None = None,
    ) -> ServeResult:
        """`vllm serve` on the serving nodes of this host, then wait until /health answers;
        `notes` are warnings said once the nodes are found, before anything starts.
        Supervised (`supervise`, default supervise.enabled; issue 18): an agent on every node and
        the coordinator in the head start the group and restart it on failures; this returns at
        the coordinator's first `ready` (its events go to `on_event`), and `follow_supervision`
        follows it after that. Before anything starts, the plan is checked against the image
        (issue 24: probed now when kit has no record of it)."""
        self.ensure_image(on_progress)
        env = self.model_cache().env  # the serve scripts export the offline decision too
        supervised = self.config.supervise.enabled if supervise is None else supervise
        if supervised or router_mode(self.config):
            for note in notes:
                on_progress(f"warning: {note}")
            result = self._serve_managed(
                supervised, replace=replace, deadline=deadline, env=env, on_progress=on_progress, on_event=on_event
            )
            _record.served(self.name, url=result.url, supervised=supervised)
            return result
        nodes = self.nodes()
        targets = _serving.serving_nodes(self.config, nodes)
        for note in notes:
            on_progress(f"warning: {note}")
        url = _serving.head_url(self.config, nodes)
        _serving.stop_running(self.runtime, targets, replace=replace, url=url, on_progress=on_progress)
        started = time.monotonic()
        try:
            # Nodes started before the model was fetched run it offline without a restart (with
            # Ray, workers keep their node's environment).
            _serving.launch(self.config, self.runtime, targets, env=env, on_progress=on_progress)
            self.wait(url, targets, started=started, deadline=deadline, on_progress=on_progress)
        except (KeyboardInterrupt, StartError):
            # Interrupted (Ctrl-C, SIGTERM) or not healthy in time: stop what was started on every
            # node, so nothing comes up later behind the user's back (issue 18).
            _serving.stop(self.runtime, targets)
            raise
        _record.served(self.name, url=url, supervised=False)
        return ServeResult(
            url, self.config.served_name, [n.name for n in targets], round(time.monotonic() - started, 1)
        )

    def follow_supervision(self, on_event: Callable[[Event], None]) -> Event:
        """Follow a supervised group's events after ready until it stops (its `stopped` event);
        StartError (exit 6) with the last log lines when the coordinator gives up."""
        if router_mode(self.config):
            return _supervised_replicas.follow_replicas(self.config, self.runtime, on_event=on_event)
        return _supervised.follow_supervised(self.config, self.runtime, on_event=on_event)

    def wait(
        self,
        url: str | None = None,
        targets: list[NodeHandle] | None = None,
        *,
        started: float | None = None,
        deadline: float | None = None,
        on_progress: Progress = _quiet,
    ) -> None:
        """Wait until the server answers /health (timeouts.ready, never past `deadline`)."""
        if targets is None:
            targets = _serving.serving_nodes(self.config, self.nodes())
        _serving.wait_healthy(
            self.config,
            self.runtime,
            targets,
            url or self.url(),
            started=time.monotonic() if started is None else started,
            deadline=deadline,
            on_progress=on_progress,
        )

    def _serve_managed(
        self,
        supervised: bool,
        *,
        replace: bool,
        deadline: float | None,
        env: Mapping[str, str],
        on_progress: Callable[[str], None],
        on_event: Callable[[Event], None] | None,
    ) -> ServeResult:
        """The serving paths another module owns: router replicas (kit/cluster/replicas.py,
        supervised_replicas.py) and a supervised group (supervised.py)."""
        cfg = self.config
        if router_mode(cfg) and not supervised:
            return _replicas.serve_replicas(
                cfg, self.runtime, replace=replace, deadline=deadline, on_progress=on_progress, env=env
            )
        if router_mode(cfg):
            return _supervised_replicas.serve_replicas_supervised(
                cfg, self.runtime, replace=replace, on_progress=on_progress, on_event=on_event, serve_env=env
            )
        # What --timeout (timeouts.ready) bounds under supervision: each start (issue 25).
        on_progress(
            f"supervised: each start has {cfg.timeouts.ready} s to answer /health (timeouts.ready, --timeout); "
            f"a failed start is restarted, at most {cfg.supervise.max_restarts} time(s) in a row "
            f"(so up to {cfg.supervise.max_restarts + 1} starts), then kit gives up (exit 6)"
        )
        return _supervised.serve_supervised(
            cfg, self.runtime, replace=replace, on_progress=on_progress, on_event=on_event, serve_env=env
        )

    def url(self, nodes: list[NodeHandle] | None = None) -> str:
        """The server's URL: this host's head container's node IP and the API port it was started
        with, else the head's address as recorded or configured, else loopback. Without a
        container engine here (a laptop) the recorded or configured address."""
        if nodes is None:
            running = self.running()
            return _serving.head_url(self.operated(running).config, list(running.nodes))
        running = _running.read_running(self.name, nodes, _record.read(self.name))
        return _serving.head_url(self.operated(running).config, nodes)

    def served_layout(self, nodes: list[NodeHandle] | None = None) -> LayoutLabels | None:
        """The layout the running nodes were started with (their labels), None without one."""
        return _status.started_layout(self.nodes() if nodes is None else nodes)

    def layout_drift(self) -> str | None:
        """A warning when this host's nodes were started with another layout than the one this
        config plans (kit status, bench and tune report what the labels say)."""
        try:
            labels = self.served_layout()
        except Exception:  # no runtime here: nothing started to compare with
            return None
        planned = self.layout
        if labels is None:
            return None
        started = labels.layout
        if (started.tp, started.pp, started.dp, started.ep) == (planned.tp, planned.pp, planned.dp, planned.ep):
            return None
        return (
            f"the nodes were started for {started.describe()}"
            + f" but this serve plans {planned.describe()}; `kit status` and `kit bench` report the "
            "layout the nodes were started with (`kit up --replace` to start them with this one)"
        )

    # ---- looking and cleaning up --------------------------------------------------------
    def status(self, *, ray: bool = True, timeout: float = 10) -> StatusResult:
        """What runs, looked at within `timeout` seconds in all (issue 25): the containers, the
        DP engines, the Ray view, the server and supervision; what could not be
        reached is named; and the configured values that disagree with what runs (drift)."""
        from kit.cluster.serving_status import status_extras

        budget = Budget(timeout)
        running = self.running()
        config = self.operated(running).config
        result = _status.collect(config, self.runtime, ray=ray, budget=budget)
        extras = status_extras(config, self.runtime, list(running.nodes), result.ray, budget)
        record = running.record or {}
        extras["drift"] = [d.to_dict() for d in self.drift(running)]
        extras["started_from"] = (record.get("config") or {}).get("path") if record else None
        extras["api_key_file"] = config.api_key_file
        return dataclasses.replace(result, extras=extras, unreached=list(budget.unreached))

    def ray_nodes(self, head: NodeHandle, nodes: list[NodeHandle], *, timeout: float = 4) -> list[dict[str, Any]]:
        """Ray's view of the nodes, asked inside the head, merged with the containers here."""
        gcs = self.operated(_running.read_running(self.name, nodes, _record.read(self.name))).config.ports.ray_gcs
        return _status.merge_views(_status.ray_view(self.runtime, head, gcs, timeout), nodes)

    def down(self) -> DownResult:
        """Remove every container and network of the cluster on this host (by label), and kit's
        record of it. Needs nothing but the cluster's name: never planned (issue 25)."""
        removed = self.runtime.remove_cluster(self.name)
        _record.forget(self.name)
        return DownResult(self.name, removed.get("containers", []), removed.get("networks", []))


__all__ = ["Cluster", "DownResult", "ModelCache", "NodePlan", "ServePlan", "ServeResult", "StatusResult", "UpResult"]

"""What runs: the cluster's containers on this host, the Ray view of every node (with the IP each
registered against its VLLM_HOST_IP), and which data-parallel engines live. `kit status`,
`kit demo` and `kit verify` read it through kit.cluster.Cluster.

Every look has a deadline (issue 25): one Budget for the whole status (10 s by default), each
step taking at most its share; a step that fails or finds the budget spent is named in
`unreached`, and the rest is still shown.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kit.config import KitConfig
from kit.errors import KitError, StartError
from kit.labels import LayoutLabels
from kit.output import table
from kit.resources import program_source
from kit.runtime.base import NodeHandle, Runtime

# vLLM names each data-parallel engine process `VLLM::EngineCore_DP<rank>` (its process title,
# vllm/v1/engine/core.py, seen in /proc/PID/cmdline): listing them inside a node container shows
# which of its DP ranks live. With the Ray DP backend the engines are Ray actors titled
# `ray::DPMoEEngineCoreActor...` / `ray::EngineCoreActor...` (no rank in the title): counted.
ENGINE_SCAN = (
    "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' "
    "| grep -oE '^(VLLM::EngineCore_DP[0-9]+|ray::(DPMoE)?EngineCoreActor)' || true"
)
_ENGINE_RE = re.compile(r"^VLLM::EngineCore_DP(\d+)$", re.MULTILINE)
_RAY_ENGINE_RE = re.compile(r"^ray::(?:DPMoE)?EngineCoreActor$", re.MULTILINE)


class Budget:
    """The time one `kit status` may take, shared by its steps: `take(cap)` is a step's deadline
    (at most `cap` and what is left), None once less than a second is left; what could not be
    looked at is noted in `unreached`, one line each."""

    def __init__(self, seconds: float, clock: Any = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self.end = clock() + seconds
        self.unreached: list[str] = []

    def left(self) -> float:
        return float(self.end - self.clock())

    def take(self, cap: float, what: str) -> float | None:
        left = self.left()
        if left < 1.0:
            self.miss(f"{what}: not asked, the {self.seconds:g} s of kit status were spent (--timeout)")
            return None
        return min(cap, left)

    def miss(self, line: str) -> None:
        self.unreached.append(line)


def alive_dp_ranks(runtime: Runtime, node: NodeHandle, timeout: float = 15) -> tuple[list[int], int]:
    """The DP ranks whose engine process runs in this node's container, and the number of
    engine processes found (Ray engine actors carry no rank)."""
    out = runtime.exec(node, ["bash", "-c", ENGINE_SCAN], timeout=timeout).stdout
    ranks = sorted({int(m) for m in _ENGINE_RE.findall(out)})
    return ranks, len(ranks) + len(_RAY_ENGINE_RE.findall(out))


@dataclass(frozen=True)
class ContainerRow:
    name: str
    role: str
    rank: int
    state: str
    node_ip: str | None
    image: str
    image_digest: str | None
    uptime: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "rank": self.rank,
            "state": self.state,
            "node_ip": self.node_ip,
            "image": self.image,
            "image_digest": self.image_digest,
            "uptime": self.uptime,
        }


@dataclass(frozen=True)
class DPNode:
    """One local node's data-parallel ranks: planned (mp), alive, and the engines found."""

    container: str
    node_rank: int
    expected: list[int]
    alive: list[int]
    engines: int
    missing: list[int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "container": self.container,
            "node_rank": self.node_rank,
            "expected": self.expected,
            "alive": self.alive,
            "engines": self.engines,
            "missing": self.missing,
        }


@dataclass(frozen=True)
class DPView:
    size: int
    per_node: int
    backend: str
    nodes: list[DPNode]

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "per_node": self.per_node,
            "backend": self.backend,
            "nodes": [n.to_dict() for n in self.nodes],
        }


@dataclass(frozen=True)
class StatusResult:
    cluster: str
    containers: list[ContainerRow]
    ray: list[dict[str, Any]] | None = None  # Ray's node list (merge_views), None when not asked
    dp: DPView | None = None
    ray_error: str | None = None
    # The layout the head was started with (its labels): shown to people; the JSON document keeps
    # the keys it had before issue 17.
    layout: LayoutLabels | None = field(default=None, compare=False)
    # What could not be looked at within the deadline, or failed, one line each (issue 25).
    unreached: list[str] = field(default_factory=list)
    # What kit.cluster.Cluster.status adds: the server, supervision, missing Ray nodes
    # (kit.cluster.serving_status), drift, the config the cluster was started from.
    extras: dict[str, Any] = field(default_factory=dict)
    command = "status"

    def text(self) -> str:
        """`kit status` for people: the containers and Ray view (render), then the lines on the
        server, supervision and what was not reached (render_status)."""
        return "\n".join([render(self), *render_status(self.to_dict())])

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cluster": self.cluster,
            "containers": [c.to_dict() for c in self.containers],
            "ray": self.ray,
        }
        if self.dp is not None:
            out["dp"] = self.dp.to_dict()
        if self.ray_error is not None:
            out["ray_error"] = self.ray_error
        out["unreached"] = list(self.unreached)
        return {**out, **self.extras}


def started_layout(nodes: Sequence[NodeHandle]) -> LayoutLabels | None:
    """The layout the cluster's nodes were started with: the head's labels (else any node's)."""
    for node in sorted(nodes, key=lambda n: n.role != "head"):
        found = LayoutLabels.from_labels(node.labels)
        if found is not None:
            return found
    return None


def collect(config: KitConfig, runtime: Runtime, *, ray: bool = True, budget: Budget | None = None) -> StatusResult:
    """The cluster's containers on this host, its DP engines and (Ray backend) the Ray view, each
    look within `budget` (10 s when None)."""
    budget = budget or Budget(10)
    nodes = runtime.find_nodes(config.cluster)
    containers = [
        ContainerRow(n.name, n.role, n.rank, n.state, n.ip, n.image, n.image_digest, uptime(n.started_at))
        for n in nodes
    ]
    layout = started_layout(nodes)
    dp = layout.layout.dp if layout is not None else config.dp
    dp_local = max(1, dp // config.nodes)
    # Router replicas (issue 29) are no DP group: `kit status` shows them from the router's view.
    router = layout.layout.router if layout is not None else config.layout.router
    view = None
    if dp > 1 and not router:
        view = DPView(dp, dp_local, config.backend, dp_view(config, runtime, nodes, dp_local, budget))
    head = next((n for n in nodes if n.role == "head" and n.state == "running"), None)
    ray_nodes, ray_error = None, None
    if ray and head is not None and config.backend == "ray":
        seconds = budget.take(6, f"the Ray view in {head.name}")
        if seconds is not None:
            try:
                ray_nodes = merge_views(ray_view(runtime, head, config.ports.ray_gcs, seconds), nodes)
            except KitError as err:
                ray_error = err.message
                budget.miss(f"Ray in {head.name}: {err.message}")
    return StatusResult(config.cluster, containers, ray_nodes, view, ray_error, layout, budget.unreached)


def dp_view(
    config: KitConfig, runtime: Runtime, nodes: Sequence[NodeHandle], dp_local: int, budget: Budget | None = None
) -> list[DPNode]:
    """Per local node: the DP ranks the plan puts there (mp: node rank × DP ranks per node …) and
    which of them have a live engine. With the Ray DP backend Ray places the ranks: none expected."""
    budget = budget or Budget(60)
    rows = []
    for node in sorted(nodes, key=lambda n: n.rank):
        expected = list(range(node.rank * dp_local, (node.rank + 1) * dp_local)) if config.backend == "mp" else []
        alive: list[int] = []
        engines = 0
        seconds = budget.take(3, f"the engines in {node.name}") if node.state == "running" else None
        if seconds is not None:
            try:
                alive, engines = alive_dp_ranks(runtime, node, seconds)
            except KitError as err:
                budget.miss(f"the engines in {node.name}: {err.message}")
        rows.append(DPNode(node.name, node.rank, expected, alive, engines, [r for r in expected if r not in alive]))
    return rows


def ray_view(runtime: Runtime, head: NodeHandle, gcs_port: int, timeout: float = 4) -> list[dict[str, Any]]:
    """Ray's node list, asked inside the head within `timeout` seconds in all (the program gets
    what is left after starting Python and joining Ray for its per-node tasks)."""
    inner = max(1.0, timeout - 3)
    argv = ["python3", "-c", program_source("cluster/ray_view.py"), str(gcs_port), f"{inner:g}"]
    result = runtime.exec(head, argv, timeout=timeout)
    for line in result.stdout.splitlines():
        if line.startswith("KIT_JSON "):
            nodes: list[dict[str, Any]] = json.loads(line[len("KIT_JSON ") :])
            for node in nodes:
                node["ip_matches"] = node["vllm_host_ip"] == node["ip"] if node["alive"] else None
            return nodes
        if line.startswith("KIT_NO_RAY "):
            raise StartError(
                f"no Ray in {head.name}: {line[len('KIT_NO_RAY ') :][:200]}",
                hint="see `kit logs --role head`; `kit up --head --replace` starts it again",
            )
    if result.returncode in (124, 137):
        raise StartError(
            f"Ray in {head.name} did not answer within {timeout:.0f} s",
            hint="is the head overloaded? raise `kit status --timeout`, or see `kit logs --role head`",
        )
    tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
    raise StartError(
        "cannot read the Ray view from the head", details=tail, hint="is the head ready? see `kit logs --role head`"
    )


def merge_views(ray: list[dict[str, Any]], local: list[NodeHandle]) -> list[dict[str, Any]]:
    """Ray's node list, one row per IP (a node that rejoined leaves a dead entry behind), with
    `lost` also set when the node's container on this host is not running: Ray's health check
    takes seconds to notice, the container state is known at once."""
    stopped = {n.ip for n in local if n.state != "running"}
    latest: dict[str, dict[str, Any]] = {}
    for node in ray:
        node = {**node, "lost": (not node["alive"]) or node["ip"] in stopped}
        kept = latest.get(node["ip"])
        if kept is None or (node["alive"] and not kept["alive"]):
            latest[node["ip"]] = node
    return sorted(latest.values(), key=lambda n: tuple(int(p) for p in str(n["ip"]).split(".") if p.isdigit()))


def uptime(started_at: str | None) -> str:
    if not started_at or started_at.startswith("0001"):
        return "-"
    try:
        start = dt.datetime.fromisoformat(started_at[:26].rstrip("Z") + "+00:00")
    except ValueError:
        return "-"
    secs = int((dt.datetime.now(dt.timezone.utc) - start).total_seconds())
    return f"{secs // 3600}h{secs % 3600 // 60:02d}m" if secs >= 3600 else f"{secs // 60}m{secs % 60:02d}s"


def render(result: StatusResult) -> str:
    """The status for people: tables of the containers, the Ray nodes and the DP ranks."""
    doc = result.to_dict()
    out = [f"cluster {result.cluster}"]
    if result.layout is not None:
        lay = result.layout.layout
        out.append(f"layout: {lay.describe()} ({lay.decided_by})")
    if not doc["containers"]:
        out.append("no kit containers of this cluster on this host")
    else:
        out.append(
            table(
                ["container", "role", "rank", "state", "node ip", "uptime", "image digest"],
                [
                    (
                        c["name"],
                        c["role"],
                        c["rank"],
                        c["state"],
                        c["node_ip"],
                        c["uptime"],
                        _short_digest(c["image_digest"]),
                    )
                    for c in doc["containers"]
                ],
            )
        )
    if doc.get("ray") is not None:
        ray = doc["ray"]
        alive = [n for n in ray if not n["lost"]]
        out.append("")
        out.append(
            f"Ray: {len(alive)} alive node(s), {len(ray) - len(alive)} lost, "
            f"{sum(n['cpus'] for n in alive):g} CPU, {sum(n['gpus'] for n in alive):g} GPU"
        )
        out.append(
            table(
                ["ray node", "alive", "registered ip", "VLLM_HOST_IP", "match", "CPU", "GPU"],
                [
                    (
                        n["node_id"][:12],
                        "LOST" if n["lost"] else "yes",
                        n["ip"],
                        n["vllm_host_ip"] or "-",
                        {True: "yes", False: "NO", None: "-"}[n["ip_matches"]],
                        f"{n['cpus']:g}",
                        f"{n['gpus']:g}",
                    )
                    for n in ray
                ],
            )
        )
    if doc.get("dp"):
        dp = doc["dp"]
        rows = dp["nodes"]
        n_alive = sum(n["engines"] for n in rows)
        out.append("")
        out.append(
            f"data parallel: {dp['size']} rank(s), {dp['per_node']} per node ({dp['backend']}); "
            f"{n_alive} alive on this host"
        )
        out.append(
            table(
                ["container", "node rank", "DP ranks", "alive", "missing"],
                [
                    (
                        n["container"],
                        n["node_rank"],
                        _ranks(n["expected"]) if n["expected"] else "(Ray places them)",
                        _ranks(n["alive"]) if n["expected"] else f"{n['engines']} engine(s)",
                        _ranks(n["missing"]) if n["missing"] else "-",
                    )
                    for n in rows
                ],
            )
        )
    return "\n".join(out)


def _ranks(ranks: list[int]) -> str:
    return ",".join(str(r) for r in ranks) if ranks else "none"


def _short_digest(digest: str | None) -> str:
    if not digest:
        return "-"
    return digest if len(digest) < 40 else digest[: digest.index(":") + 13] if ":" in digest else digest[:20]


def render_status(result: dict[str, Any]) -> list[str]:
    """The lines `kit status` adds: the server's liveness, supervision, missing Ray nodes."""
    out = []
    server = result.get("server")
    router = result.get("router")
    if router is not None:
        out.extend(render_router(router))
    if server is not None and router is not None:
        if server["serving"]:
            out.append(f"endpoint: serving at {server['url']} ({server['replicas_serving']} replica(s) serving here)")
        else:
            out.append(f"endpoint: NOT SERVING at {server['url']}: {server['reason']}")
    elif server is not None:
        if server["serving"]:
            word = "serving" if server["state"] == "serving" else "idle, answering"
            out.append(f"server: {word} at {server['url']} ({len(server['engines'])} engine(s))")
        else:
            out.append(f"server: NOT SERVING at {server['url'] or 'the head'}: {server['reason']}")
    sup = result.get("supervise")
    if sup is not None:
        out.append(supervisor_line(sup))
    if result.get("ray_missing"):
        out.append("Ray: missing " + ", ".join(result["ray_missing"]))
    if result.get("containers") and result.get("api_key_file"):
        out.append(f"API key: in {result['api_key_file']} (`kit query --cluster {result['cluster']}` finds it)")
    if result.get("started_from"):
        out.append(f"started from: {result['started_from']}")
    for line in result.get("unreached") or []:
        out.append(f"not reached: {line}")
    return out


def supervisor_line(sup: dict[str, Any]) -> str:
    """A coordinator's state in one line (the whole group's, or one router replica's)."""
    line = (
        f"supervisor: {'active' if sup['active'] else 'not running'}, {sup['phase']}, "
        f"generation {sup['generation']}, {sup['restarts']} restart(s)"
    )
    if sup.get("last_failure"):
        line += f"; last failure {sup.get('last_failure_time') or ''}: {sup['last_failure']}"
    return line


def render_router(router: dict[str, Any]) -> list[str]:
    """The router (issue 29): its container, and each replica: where, routed, healthy, serving."""
    state = router["state"] or "absent"
    out = [f"router: {router['container']} {state} at {router['url']} ({router['policy']})"]
    for row in router["replicas"]:
        server = row.get("server") or {}
        where = "on another host" if row["url"] is None else row["url"]
        routed = "routed" if row["routed"] else "NOT ROUTED"
        health = {True: "healthy", False: "UNHEALTHY", None: "-"}[row["healthy"]]
        serving = "serving" if server.get("serving") else (server.get("reason") or "-") if server else "-"
        out.append(f"  replica {row['replica']} (nodes {row['nodes']}): {where}: {routed}, {health}, {serving}")
        if row.get("supervise"):
            out.append(f"    {supervisor_line(row['supervise'])}")
    for other in router["others"]:
        out.append(f"  routed from another host: {other}")
    if router.get("recovery"):
        out.append(f"  {router['recovery']}")
    return out

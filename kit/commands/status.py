"""`kit status`: the cluster's containers on this host and the Ray view of every node."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import click

from kit.commands._common import config_options, json_option, resolve_cluster
from kit.commands._params import KitCommand
from kit.config import KitConfig
from kit.errors import StartError
from kit.output import emit, table
from kit.runtime import get_runtime
from kit.runtime.base import NodeHandle, Runtime

# Runs inside the head container: the Ray view, plus each alive node's own VLLM_HOST_IP read by a
# zero-CPU task pinned to that node (FIELD_NOTES §1 rows 1, 9: registered IP must equal it).
RAY_VIEW_PY = r"""
import json, os, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address=os.environ["VLLM_HOST_IP"] + ":" + sys.argv[1], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=0)
def host_ip():
    return os.environ.get("VLLM_HOST_IP")

nodes = ray.nodes()
refs = {}
for n in nodes:
    if n.get("Alive"):
        strategy = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        refs[n["NodeID"]] = host_ip.options(scheduling_strategy=strategy).remote()
# One shared deadline: a node that just died must not stall the whole view.
ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=float(sys.argv[2]))
ips = {}
for node_id, ref in refs.items():
    try:
        ips[node_id] = ray.get(ref, timeout=0) if ref in ready else None
    except Exception:
        ips[node_id] = None
out = []
for n in nodes:
    res = n.get("Resources", {})
    out.append({"node_id": n["NodeID"], "alive": bool(n.get("Alive")), "ip": n.get("NodeManagerAddress"),
                "cpus": res.get("CPU", 0), "gpus": res.get("GPU", 0), "vllm_host_ip": ips.get(n["NodeID"])})
print("KIT_JSON " + json.dumps(out))
"""


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


def alive_dp_ranks(runtime: Runtime, node: NodeHandle) -> tuple[list[int], int]:
    """The DP ranks whose engine process runs in this node's container, and the number of
    engine processes found (Ray engine actors carry no rank)."""
    out = runtime.exec(node, ["bash", "-c", ENGINE_SCAN], timeout=15).stdout
    ranks = sorted({int(m) for m in _ENGINE_RE.findall(out)})
    return ranks, len(ranks) + len(_RAY_ENGINE_RE.findall(out))


def dp_view(config: KitConfig, runtime: Runtime, nodes: list[NodeHandle]) -> list[dict[str, Any]]:
    """Per local node: the DP ranks the plan puts there (mp: node rank × DP ranks per node …) and
    which of them have a live engine. With the Ray DP backend Ray places the ranks: none expected."""
    rows = []
    for node in sorted(nodes, key=lambda n: n.rank):
        if config.backend == "mp":
            first = node.rank * config.dp_local
            expected = list(range(first, first + config.dp_local))
        else:
            expected = []
        alive, engines = alive_dp_ranks(runtime, node) if node.state == "running" else ([], 0)
        rows.append(
            {
                "container": node.name,
                "node_rank": node.rank,
                "expected": expected,
                "alive": alive,
                "engines": engines,
                "missing": [r for r in expected if r not in alive],
            }
        )
    return rows


def ray_view(runtime: Runtime, head: NodeHandle, gcs_port: int, timeout: float = 4) -> list[dict[str, Any]]:
    result = runtime.exec(head, ["python3", "-c", RAY_VIEW_PY, str(gcs_port), str(timeout)])
    for line in result.stdout.splitlines():
        if line.startswith("KIT_JSON "):
            nodes: list[dict[str, Any]] = json.loads(line[len("KIT_JSON ") :])
            for node in nodes:
                node["ip_matches"] = node["vllm_host_ip"] == node["ip"] if node["alive"] else None
            return nodes
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


@click.command(name="status", cls=KitCommand)
@click.option("--no-ray", is_flag=True, help="Only list containers; do not ask Ray.")
@click.option("--slurm", "slurm_job", metavar="JOB", help="Show a `kit slurm` job instead: queue state, ready line.")
@config_options
@json_option
def command(
    no_ray: bool,
    slurm_job: str | None,
    config_path: str | None,
    cluster: str | None,
    set_values: tuple[str, ...],
    as_json: bool,
) -> None:
    """Every kit container of the cluster on this host (role, state, image digest, uptime), and the
    Ray view: alive nodes, their IPs, CPUs/GPUs, and whether each node registered the same IP as
    its VLLM_HOST_IP. With model.dp > 1: the DP ranks each node should run and which have a live
    engine process. With --slurm JOB: the job's squeue state and its KIT_* lines (URL, tunnel)."""
    if slurm_job is not None:
        from kit import slurm_ctl
        from kit.supervise.hooks import render_slurm, slurm_summary

        job = slurm_ctl.status(slurm_job)
        job["supervise"] = slurm_summary(job.get("output"))  # issue 18: restarts inside the job
        emit("status", {"slurm": job}, as_json=as_json, text=lambda: slurm_ctl.render_status(job) + render_slurm(job))
        return
    resolved = resolve_cluster(config_path, cluster, set_values)
    config = resolved.config
    runtime = get_runtime(config)
    result = collect(config, runtime, ray=not no_ray)
    from kit.supervise.hooks import status_extras

    # Issue 18: whether the model is served (not only whether containers run), supervision, and
    # the Ray nodes that are missing, by name.
    result.update(status_extras(config, runtime, runtime.find_nodes(config.cluster), result["ray"]))
    emit("status", result, as_json=as_json, text=lambda: render(result))


def collect(config: KitConfig, runtime: Runtime, *, ray: bool = True) -> dict[str, Any]:
    """The cluster's containers on this host and (Ray backend) the Ray view."""
    nodes = runtime.find_nodes(config.cluster)
    containers = [
        {
            "name": n.name,
            "role": n.role,
            "rank": n.rank,
            "state": n.state,
            "node_ip": n.ip,
            "image": n.image,
            "image_digest": n.image_digest,
            "uptime": uptime(n.started_at),
        }
        for n in nodes
    ]
    result: dict[str, Any] = {"cluster": config.cluster, "containers": containers, "ray": None}
    if config.dp > 1:
        result["dp"] = {
            "size": config.dp,
            "per_node": config.dp_local,
            "backend": config.backend,
            "nodes": dp_view(config, runtime, nodes),
        }
    head = next((n for n in nodes if n.role == "head" and n.state == "running"), None)
    if ray and head is not None and config.backend == "ray":
        try:
            result["ray"] = merge_views(ray_view(runtime, head, config.ports.ray_gcs), nodes)
        except StartError as err:
            result["ray_error"] = err.message
    return result


def render(result: dict[str, Any]) -> str:
    out = [f"cluster {result['cluster']}"]
    if not result["containers"]:
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
                    for c in result["containers"]
                ],
            )
        )
    if result.get("ray") is not None:
        ray = result["ray"]
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
    if result.get("dp"):
        dp = result["dp"]
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
    if result.get("ray_error"):
        out.append(f"Ray: {result['ray_error']}")
    from kit.supervise.hooks import render_status

    out += render_status(result)  # issue 18: server liveness, supervision, missing Ray nodes
    return "\n".join(out)


def _ranks(ranks: list[int]) -> str:
    return ",".join(str(r) for r in ranks) if ranks else "none"


def _short_digest(digest: str | None) -> str:
    if not digest:
        return "-"
    return digest if len(digest) < 40 else digest[: digest.index(":") + 13] if ":" in digest else digest[:20]

"""What `kit status` adds about serving and supervision (issue 18): whether the model is served
(liveness), supervision (restarts, last failure), the Ray nodes that are missing, by name; and
supervision in a SLURM job's output. Data only: kit/commands/status.py renders it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kit.cluster import supervision as host
from kit.cluster.status import Budget
from kit.config import KitConfig
from kit.errors import KitError
from kit.plan.replicas import plan_replicas, router_mode
from kit.plan.supervise import RUN_DIR, expected_engines, run_files
from kit.runtime.base import NodeHandle, Runtime
from kit.supervise import events

# ---- kit status ---------------------------------------------------------------------------------


def server_status(config: KitConfig, url: str, deadline_s: float = 10) -> dict[str, Any]:
    """Is the model served? /health and every engine's /metrics, and a one-token request pinned to
    each idle engine (a stopped engine keeps /health at 200: kit/health/liveness.py's docstring).
    `serving` is True only when every engine the plan expects is serving or idle-and-answering.
    Every request shares `deadline_s` (issue 25)."""
    from kit.health import liveness, observe

    end = time.monotonic() + deadline_s
    try:
        # /health and /metrics, each connect and read bounded by a quarter of it
        observation, _ = observe.observe(url, deadline_s=max(0.5, deadline_s / 4))
        probes = []
        for engine in liveness.idle_engines(observation):
            left = end - time.monotonic()
            if left < 0.5:
                break  # the engines not probed are judged from /metrics alone
            probes.append(
                observe.probe(
                    url, config.served_name, engine=engine, api_key_file=config.api_key_file, deadline_s=left / 2
                )
            )
    except KitError as err:
        return {"url": url, "serving": False, "state": "unknown", "reason": err.message, "engines": []}
    verdicts = liveness.judge(
        [observation], expected=expected_engines(config), liveness_s=float(config.timeouts.liveness), probes=probes
    )
    state = liveness.worst(verdicts) or "api-down"
    bad = [v for v in verdicts if v.state in ("api-down", "dead", "hung")]
    return {
        "url": url,
        "serving": not bad,
        "state": state,
        "reason": bad[0].reason if bad else None,
        "engines": [v.to_dict() for v in verdicts],
    }


def supervision_status(
    runtime: Runtime, head: NodeHandle, timeout: float = 15, *, run_dir: str = RUN_DIR
) -> dict[str, Any] | None:
    """The coordinator's state and a summary of its events, or None when this cluster was never
    supervised from this head (router replicas: from this replica's run directory on its first node)."""
    state = host.read_state(runtime, head, timeout=timeout / 2, run_dir=run_dir)
    if state is None:
        return None
    summary = events.summary(host.read_events(runtime, head, timeout=timeout / 2, run_dir=run_dir))
    return {
        "active": state["alive"],
        "phase": state.get("phase"),
        "generation": state.get("generation"),
        "restarts": state.get("restarts", summary["restarts"]),
        "max_restarts": state.get("max_restarts"),
        "last_failure": state.get("last_failure") or summary["last_failure"],
        "last_failure_time": summary["last_failure_time"],
        "updated_s_ago": state.get("updated_s_ago"),
    }


def missing_ray_nodes(config: KitConfig, ray_nodes: Sequence[dict[str, Any]], local: Sequence[NodeHandle]) -> list[str]:
    """The nodes the plan has that the Ray cluster does not show alive: by container name and IP
    when the node is on this host, else counted (a restarted head's new Ray cluster knows only
    itself until the workers rejoin, and lists none of them as lost)."""
    alive_ips = {n["ip"] for n in ray_nodes if not n.get("lost")}
    named = [f"{n.name} ({n.ip})" for n in local if n.ip and n.ip not in alive_ips]
    unknown = config.nodes - len(alive_ips) - len(named)
    return named + ([f"{unknown} node(s) on other hosts"] if unknown > 0 else [])


def status_extras(
    config: KitConfig,
    runtime: Runtime,
    nodes: Sequence[NodeHandle],
    ray_nodes: Sequence[dict[str, Any]] | None,
    budget: Budget | None = None,
) -> dict[str, Any]:
    """What `kit status` adds to its result: `server` (liveness, once a server was started in the
    head: its serve script is there), `supervise` (when it was ever supervised) and, with Ray,
    `ray_missing` (the planned nodes the Ray cluster does not show alive). Within `budget`: a
    look that does not fit is named in budget.unreached (issue 25)."""
    from kit.cluster.serving import SERVE_SCRIPT, head_url

    budget = budget or Budget(30)
    out: dict[str, Any] = {}
    head = next((n for n in nodes if n.role == "head" and n.state == "running"), None)
    url = head_url(config, list(nodes))
    seconds = budget.take(3, f"the server's files in {head.name}") if head is not None else None
    served = False
    try:
        if head is not None and seconds is not None:
            served = runtime.exec(head, ["test", "-f", SERVE_SCRIPT], timeout=seconds).returncode == 0
    except KitError as err:  # the head stopped or is restarting while kit looked: say so, show the rest
        out["server"] = {"url": None, "serving": False, "state": "unknown", "reason": err.message, "engines": []}
        budget.miss(f"{head.name if head else 'the head'}: {err.message}")
    if served and head is not None and router_mode(config):
        seconds = budget.take(10, "the router and its replicas")
        if seconds is not None:
            out.update(replicas_status(config, runtime, nodes, deadline_s=seconds / 2))
    elif served and head is not None:
        seconds = budget.take(6, f"the server at {url}")
        if seconds is not None:
            out["server"] = server_status(config, url, seconds)
            if not out["server"]["serving"] and out["server"]["state"] in ("unknown", "api-down"):
                budget.miss(f"the server at {url}: {out['server']['reason']}")
        seconds = budget.take(4, f"the supervisor in {head.name}")
        if seconds is not None:
            try:
                supervise = supervision_status(runtime, head, seconds)
            except KitError as err:
                budget.miss(f"the supervisor in {head.name}: {err.message}")
                supervise = None
            if supervise is not None:
                out["supervise"] = supervise
    if ray_nodes is not None:
        missing = missing_ray_nodes(config, ray_nodes, nodes)
        if missing:
            out["ray_missing"] = missing
    return out


def replicas_status(
    config: KitConfig, runtime: Runtime, nodes: Sequence[NodeHandle], *, deadline_s: float = 10
) -> dict[str, Any]:
    """Router replicas (issue 29): the router's view (its container, the replicas it routes to and
    its health of each), each local replica's own liveness (as `server` is for one server), and
    `server`: the endpoint serves when the router answers and routes to a serving replica."""
    from kit.cluster.replicas import router_view

    view = router_view(config, runtime, nodes)
    one = config.replace(planned=dataclasses.replace(config.layout, dp=1))  # each replica: one engine
    first_nodes = {n.rank: n for n in nodes if n.state == "running"}
    for row, replica in zip(view["replicas"], plan_replicas(config), strict=True):
        if row["url"]:
            row["server"] = server_status(one, row["url"], deadline_s)
        node = first_nodes.get(replica.head)  # its coordinator, when it is supervised
        supervise = (
            None
            if node is None
            else supervision_status(runtime, node, deadline_s, run_dir=run_files(replica.slot).run_dir)
        )
        if supervise is not None:
            row["supervise"] = supervise
    serving = [r for r in view["replicas"] if r["routed"] and r["healthy"] and r.get("server", {}).get("serving")]
    reason = None
    if not view["answers"]:
        reason = view.get("error") or "the router does not answer"
    elif not serving and not view["others"]:
        reason = "no replica is routed and serving"
    server = {
        "url": view["url"],
        "serving": reason is None,
        "state": "serving" if reason is None else "api-down",
        "reason": reason,
        "engines": [],
        "replicas_serving": len(serving),
    }
    from kit.plan.supervise import recovery_mechanism

    view["recovery"] = recovery_mechanism(config) if config.supervise.enabled else "none (not supervised)"
    return {"router": view, "server": server}


# ---- kit logs --events, kit status --slurm ------------------------------------------------------


def slurm_summary(output_path: str | None) -> dict[str, Any] | None:
    """Supervision in a SLURM job's output (the coordinator's KIT_EVENT lines), or None."""
    if not output_path:
        return None
    try:
        with Path(output_path).open(errors="replace") as handle:
            found = events.parse_lines(line for line in handle if events.EVENT_MARK in line)
    except OSError:
        return None
    return {**events.summary(found), "events": len(found)} if found else None

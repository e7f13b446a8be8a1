"""The small pieces the verbs and the cluster layer call for supervision (issue 18):

- `kit up`: SIGTERM unwinds like Ctrl-C, and an interrupted start leaves nothing it started
  (the container, and the network when nothing else of the cluster is left on this host);
- `kit serve`: a server that does not answer while only some of its ranks live on is stale, not
  "already running"; an interrupted or timed-out start stops what it started on every node;
- `kit status`: whether the model is served (liveness), supervision (restarts, last failure),
  the Ray nodes that are missing, by name;
- `kit logs --events`: the supervision events.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from kit.config import KitConfig
from kit.errors import KitError
from kit.runtime.base import NodeHandle, Runtime
from kit.supervise import events, host
from kit.supervise.plan import expected_engines


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM (a scheduler, `kill`, a closing terminal's shell) raises
    KeyboardInterrupt, so the same cleanup as Ctrl-C runs and kit exits 130 with a message."""

    def _raise(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, _raise)
    except ValueError:  # not the main thread (kit called as a library): leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stale_ranks(runtime: Runtime, targets: Sequence[NodeHandle], url: str, alive: Callable[[NodeHandle], bool]) -> bool:
    """Some nodes still run `vllm serve` but the head does not and nothing answers: what is left
    of a group whose head went away (e.g. its container restarted). Not a running server."""
    from kit.net import openai as client

    head = next((n for n in targets if n.role == "head"), None)
    if head is None or alive(head) or client.health(url, timeout=3):
        return False
    return any(alive(n) for n in targets if n is not head)


# ---- kit status ---------------------------------------------------------------------------------


def server_status(config: KitConfig, url: str) -> dict[str, Any]:
    """Is the model served? /health and every engine's /metrics, and a one-token request pinned to
    each idle engine (a stopped engine keeps /health at 200: kit/health/liveness.py's docstring).
    `serving` is True only when every engine the plan expects is serving or idle-and-answering."""
    from kit.health import liveness, observe

    try:
        observation, _ = observe.observe(url, deadline_s=5)
        probes = []
        for engine in liveness.idle_engines(observation):
            probes.append(
                observe.probe(url, config.served_name, engine=engine, api_key_file=config.api_key_file, deadline_s=5)
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


def supervision_status(runtime: Runtime, head: NodeHandle) -> dict[str, Any] | None:
    """The coordinator's state and a summary of its events, or None when this cluster was never
    supervised from this head."""
    state = host.read_state(runtime, head)
    if state is None:
        return None
    summary = events.summary(host.read_events(runtime, head))
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
    config: KitConfig, runtime: Runtime, nodes: Sequence[NodeHandle], ray_nodes: Sequence[dict[str, Any]] | None
) -> dict[str, Any]:
    """What `kit status` adds to its result: `server` (liveness, once a server was started in the
    head: its serve script is there), `supervise` (when it was ever supervised) and, with Ray,
    `ray_missing` (the planned nodes the Ray cluster does not show alive)."""
    from kit.cluster.serving import SERVE_SCRIPT, head_url

    out: dict[str, Any] = {}
    head = next((n for n in nodes if n.role == "head" and n.state == "running"), None)
    try:
        served = head is not None and runtime.exec(head, ["test", "-f", SERVE_SCRIPT], timeout=15).returncode == 0
        if served and head is not None:
            out["server"] = server_status(config, head_url(config, list(nodes)))
            supervise = supervision_status(runtime, head)
            if supervise is not None:
                out["supervise"] = supervise
    except KitError as err:  # the head stopped or is restarting while kit looked: say so, show the rest
        out["server"] = {"url": None, "serving": False, "state": "unknown", "reason": err.message, "engines": []}
    if ray_nodes is not None:
        missing = missing_ray_nodes(config, ray_nodes, nodes)
        if missing:
            out["ray_missing"] = missing
    return out


def render_status(result: dict[str, Any]) -> list[str]:
    """The lines `kit status` adds: the server's liveness, supervision, missing Ray nodes."""
    out = []
    server = result.get("server")
    if server is not None:
        if server["serving"]:
            word = "serving" if server["state"] == "serving" else "idle, answering"
            out.append(f"server: {word} at {server['url']} ({len(server['engines'])} engine(s))")
        else:
            out.append(f"server: NOT SERVING at {server['url'] or 'the head'}: {server['reason']}")
    sup = result.get("supervise")
    if sup is not None:
        line = (
            f"supervisor: {'active' if sup['active'] else 'not running'}, {sup['phase']}, "
            f"generation {sup['generation']}, {sup['restarts']} restart(s)"
        )
        if sup.get("last_failure"):
            line += f"; last failure {sup.get('last_failure_time') or ''}: {sup['last_failure']}"
        out.append(line)
    if result.get("ray_missing"):
        out.append("Ray: missing " + ", ".join(result["ray_missing"]))
    return out


# ---- kit logs --events, kit status --slurm ------------------------------------------------------


def events_text(runtime: Runtime, head: NodeHandle, tail: int | None) -> str:
    found = host.read_events(runtime, head)
    if tail is not None:
        found = found[-tail:] if tail else []
    return events.render(found) + "\n" if found else ""


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


def render_slurm(job: dict[str, Any]) -> str:
    sup = job.get("supervise")
    if not sup:
        return ""
    line = f"\n  supervisor: {sup['restarts']} restart(s), last event {sup['last_event']} at {sup['last_event_time']}"
    if sup.get("last_failure"):
        line += f"; last failure {sup['last_failure_time']}: {sup['last_failure']}"
    if sup.get("given_up"):
        line += "; GAVE UP"
    return line

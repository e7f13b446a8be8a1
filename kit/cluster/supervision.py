"""The host side of supervision, through the container runtime only (exec into the node
containers; no Docker socket inside them, no SSH): install the bundle and the run's files, launch
the coordinator and the agents, follow the events, read the state, stop it all.

kit.cluster.serving decides which nodes serve and where the API is; kit.cluster.supervised calls
both (the serve scripts come from kit.plan.scripts.serve_script).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kit.config import KitConfig
from kit.errors import StartError
from kit.plan.supervise import RUN_DIR, RunFiles, run_files, slot_of, supervise_json
from kit.resources import program_source
from kit.runtime.base import NodeHandle, Runtime
from kit.supervise import bundle, events
from kit.supervise.main import BUNDLE_NAME

ALIVE_AFTER_S = 15  # a coordinator rewrites state.json every second: older than this, it is gone


@dataclass(frozen=True)
class Run:
    """A supervised run as kit started it on this host."""

    head: NodeHandle | None  # None: the head is on another host (only agents started here)
    nodes: tuple[NodeHandle, ...]
    url: str


def install(
    runtime: Runtime,
    node: NodeHandle,
    *,
    serve_script: str,
    settings: str,
    token: str,
    where: RunFiles | None = None,
) -> None:
    where = where or run_files()
    files = {
        f"{where.run_dir}/{BUNDLE_NAME}": {"b64": bundle.encoded(), "mode": 0o644},
        f"{where.run_dir}/supervise.json": {"text": settings, "mode": 0o644},
        where.serve_script: {"text": serve_script, "mode": 0o644},
    }
    result = runtime.exec(
        node,
        ["python3", "-c", program_source("supervise/install.py"), where.run_dir, json.dumps(files)],
        env={"KIT_SUPERVISE_TOKEN": token},
        timeout=60,
    )
    if result.returncode != 0:
        raise StartError(
            f"cannot install the supervisor in {node.name}",
            details=(result.stderr or result.stdout).strip().splitlines()[-5:],
            hint="does the image have python3? see `kit logs`",
        )


def launch(runtime: Runtime, node: NodeHandle, run_dir: str = RUN_DIR) -> dict[str, int]:
    """Start this node's part (coordinator on the head, agent) in the background, and mark the
    run to resume when the container restarts. The run directory arrives as $1."""
    script = f'touch "$1/resume" && exec python3 "$1/{BUNDLE_NAME}" launch "$1"'
    result = runtime.exec(node, ["bash", "-c", script, "kit-supervise", run_dir], timeout=60)
    for line in result.stdout.splitlines():
        if line.startswith("KIT_SUPERVISE_LAUNCHED "):
            started: dict[str, int] = json.loads(line.split(" ", 1)[1])
            return started
    raise StartError(
        f"cannot start the supervisor in {node.name}",
        details=(result.stderr or result.stdout).strip().splitlines()[-5:],
    )


def read_state(
    runtime: Runtime, head: NodeHandle, *, timeout: float = 15, run_dir: str = RUN_DIR
) -> dict[str, Any] | None:
    """The coordinator's state.json, with `alive` (it was rewritten in the last few seconds)."""
    if head.state != "running":
        return None
    result = runtime.exec(head, ["cat", f"{run_dir}/state.json"], timeout=timeout)
    if result.returncode != 0:
        return None
    try:
        doc: dict[str, Any] = json.loads(result.stdout)
    except ValueError:
        return None
    age = time.time() - float(doc.get("updated_ts", 0))
    doc["alive"] = age < ALIVE_AFTER_S and doc.get("phase") not in ("given-up", "stopped")
    doc["updated_s_ago"] = round(age, 1)
    return doc


def read_events(
    runtime: Runtime, head: NodeHandle, *, start: int = 0, timeout: float = 15, run_dir: str = RUN_DIR
) -> list[events.Event]:
    """Events from line `start` (0-based) of the head's events.jsonl."""
    if head.state != "running":
        return []
    result = runtime.exec(head, ["tail", "-n", f"+{start + 1}", f"{run_dir}/events.jsonl"], timeout=timeout)
    return events.parse_lines(result.stdout.splitlines()) if result.returncode == 0 else []


def is_active(runtime: Runtime, head: NodeHandle, run_dir: str = RUN_DIR) -> bool:
    state = read_state(runtime, head, run_dir=run_dir)
    return bool(state and state["alive"])


def run_dirs(runtime: Runtime, node: NodeHandle) -> list[str]:
    """The supervision run directories in a node container, in slot order: kit's one per node, and
    one per replica slot where router replicas share the node (kit.plan.supervise.run_files).
    Found in the container, not taken from a config: what runs there is what is stopped."""
    parent, name = RUN_DIR.rsplit("/", 1)
    result = runtime.exec(node, ["find", parent, "-maxdepth", "1", "-type", "d", "-name", f"{name}*"], timeout=15)
    found: dict[int, str] = {}
    for line in result.stdout.splitlines():
        try:
            found[slot_of(line.strip())] = line.strip()
        except ValueError:
            continue  # not a name kit gives
    return [found[slot] for slot in sorted(found)] or [RUN_DIR]


def stop(runtime: Runtime, nodes: Sequence[NodeHandle], reason: str) -> dict[str, Any]:
    """Stop supervision and every serve group it ran on these nodes: the coordinators are asked
    first (each orders its agents, on any host, to stop and exit), then whatever is left in each
    local container is ended directly, group by group (run_dirs)."""
    running = [n for n in nodes if n.state == "running"]
    dirs = {n.name: run_dirs(runtime, n) for n in running}
    # The head's coordinator; with router replicas (issue 29) every replica's first node has one
    # (one per replica in its slot's directory where replicas share the node).
    heads = [(n, d) for n in running if n.role == "head" or coordinators_anywhere(n) for d in dirs[n.name]]
    active = [(n, d) for n, d in heads if is_active(runtime, n, d)]
    for head, run_dir in active:
        runtime.exec(head, ["python3", f"{run_dir}/{BUNDLE_NAME}", "ctl", run_dir, "stop", reason], timeout=30)
    asked = bool(active)
    end = time.monotonic() + 40
    while active and time.monotonic() < end:
        active = [(n, d) for n, d in active if is_active(runtime, n, d)]
        if active:
            time.sleep(1)
    out: dict[str, Any] = {"asked_coordinator": asked, "nodes": {}}
    for node in sorted(running, key=lambda n: n.role == "head"):  # the head last: its coordinator first
        for run_dir in dirs[node.name]:
            files = run_files(slot_of(run_dir))
            result = runtime.exec(
                node, ["python3", "-c", program_source("supervise/stop.py"), run_dir, files.pid_file], timeout=90
            )
            for line in result.stdout.splitlines():
                if line.startswith("KIT_SUPERVISE_STOPPED "):
                    key = node.name if files.slot == 0 else f"{node.name} (slot {files.slot})"
                    out["nodes"][key] = json.loads(line.split(" ", 1)[1])
    return out


def coordinators_anywhere(node: NodeHandle) -> bool:
    """Router replicas (kit.labels ROUTER on the node): any node may be a replica's first node."""
    return node.labels.get("kit.router") == "true"


def start(
    config: KitConfig,
    runtime: Runtime,
    targets: Sequence[NodeHandle],
    scripts: Mapping[str, str],
    url: str,
    *,
    on_progress: Callable[[str], None] = lambda _: None,
) -> Run:
    """Install and launch supervision on `targets` (scripts: node name -> its serve script); the
    coordinator goes where the head is. Nothing else is checked here: see serve_supervised."""
    token = secrets.token_hex(16)
    settings = supervise_json(config)
    for node in targets:
        install(runtime, node, serve_script=scripts[node.name], settings=settings, token=token)
    head = next((n for n in targets if n.role == "head"), None)
    for node in sorted(targets, key=lambda n: n.role != "head"):
        started = launch(runtime, node)
        what = ", ".join(f"{k} (pid {v})" for k, v in sorted(started.items()))
        on_progress(f"{node.name}: started the supervisor's {what}")
    return Run(head=head, nodes=tuple(targets), url=url)


def follow(
    runtime: Runtime,
    head: NodeHandle,
    *,
    on_event: Callable[[events.Event], None],
    until: tuple[str, ...],
    deadline: float | None = None,
    poll_s: float = 1.0,
) -> events.Event:
    """Print the coordinator's events as they come until one of the kinds `until` (given-up and
    stopped always end it); StartError when the coordinator dies or the deadline passes."""
    seen = 0
    ends = (*until, "given-up", "stopped")
    while True:
        new = read_events(runtime, head, start=seen)
        seen += len(new)
        for event in new:
            on_event(event)
            if event.kind in ends:
                return event
        state = read_state(runtime, head)
        if state is not None and seen and not state["alive"] and state.get("phase") not in ("given-up", "stopped"):
            raise StartError(
                f"the supervisor in {head.name} stopped working (state.json {state['updated_s_ago']:.0f} s old)",
                details=_log_tail(runtime, head, "coordinator.log"),
                hint="see `kit logs --events`; `kit serve --supervise --replace` starts it again",
            )
        if deadline is not None and time.monotonic() > deadline:
            raise StartError(f"no ready server in time (still {state.get('phase') if state else '?'})")
        time.sleep(poll_s)


def _log_tail(runtime: Runtime, node: NodeHandle, name: str, lines: int = 20) -> list[str]:
    out = runtime.exec(node, ["tail", "-n", str(lines), f"{RUN_DIR}/{name}"], timeout=15).stdout
    return [ln for ln in out.splitlines() if ln.strip()]


def events_text(runtime: Runtime, head: NodeHandle, tail: int | None, *, run_dir: str = RUN_DIR) -> str:
    found = read_events(runtime, head, run_dir=run_dir)
    if tail is not None:
        found = found[-tail:] if tail else []
    return events.render(found) + "\n" if found else ""

"""The supervise bundle's command line, run inside a node container as
`python3 DIR/kit-supervise.pyz COMMAND DIR` (standard library only). DIR holds the run's files:
supervise.json, token, the logs, the pid files, state.json and events.jsonl (head).

    launch DIR   start this node's part in the background and return: the coordinator (on the
                 head, when this run has one) and the agent; what `kit serve --supervise` runs
    resume DIR   the same, only when DIR/resume exists: the node entrypoint runs it, so a
                 restarted container resumes supervision
    entry DIR    the coordinator in the background (head) and the agent in the foreground: the
                 container's main process under SLURM; its exit code is the agent's
    agent DIR | coordinator DIR    one of them in the foreground
    ctl DIR stop [REASON] | ctl DIR status    ask this node's coordinator
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kit.errors import ServerError
from kit.net import http
from kit.supervise import protocol

BUNDLE_NAME = "kit-supervise.pyz"


def _doc(directory: str) -> dict[str, object]:
    doc: dict[str, object] = json.loads(Path(directory, "supervise.json").read_text())
    return doc


def _has_coordinator(directory: str) -> bool:
    return os.environ.get("KIT_ROLE", "head") == "head" and bool(_doc(directory).get("coordinator", True))


def _has_agent(directory: str) -> bool:
    return os.environ.get("KIT_ROLE", "head") == "head" or bool(_doc(directory).get("agents_on_workers", True))


def ours(pid_file: Path) -> int | None:
    """The pid in DIR/WHAT.pid when it is a live `kit-supervise.pyz WHAT` process (a pid file that
    survived a container restart names nothing, or another process, maybe this very one: never
    signal or trust that)."""
    what = pid_file.name.removesuffix(".pid")
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path("/proc", str(pid), "cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    mine = f"{BUNDLE_NAME}\0{what}\0".encode()
    return pid if mine in cmdline and pid != os.getpid() else None


def _spawn(directory: str, what: str, *, to_log: bool = True) -> int:
    """`what` in the background, in a session of its own (no kit command or shell holds it), its
    output appended to DIR/WHAT.log, or (to_log False: under SLURM) on this process's output, which
    is the job output."""
    old = ours(Path(directory, f"{what}.pid"))
    if old is not None:
        return old  # already running: launching twice is harmless
    bundle = str(Path(directory, BUNDLE_NAME))
    with Path(directory, f"{what}.log").open("ab") as log:
        child = subprocess.Popen(
            [sys.executable, bundle, what, directory],
            stdin=subprocess.DEVNULL,
            stdout=log if to_log else None,
            stderr=subprocess.STDOUT if to_log else None,
            start_new_session=True,
            close_fds=True,
        )
    Path(directory, f"{what}.pid").write_text(f"{child.pid}\n")
    return child.pid


def launch(directory: str) -> int:
    started = {}
    if _has_coordinator(directory):
        started["coordinator"] = _spawn(directory, "coordinator")
    if _has_agent(directory):
        started["agent"] = _spawn(directory, "agent")
    print("KIT_SUPERVISE_LAUNCHED " + json.dumps(started), flush=True)
    return 0


def entry(directory: str) -> int:
    from kit.supervise import agent

    if _has_coordinator(directory):
        _spawn(directory, "coordinator", to_log=False)  # its KIT_EVENT lines go to the job output
    code = agent.main(directory)
    pid = ours(Path(directory, "coordinator.pid"))
    if pid is not None:  # give the coordinator the time to write its last event, then end it
        for _ in range(100):
            if ours(Path(directory, "coordinator.pid")) is None:
                break
            time.sleep(0.1)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    return code


def ctl(directory: str, what: str, reason: str) -> int:
    doc = _doc(directory)
    host = os.environ.get("VLLM_HOST_IP") or "127.0.0.1"
    token = Path(directory, "token").read_text().strip()
    url = f"http://{host}:{int(str(doc['port']))}/v1/{what}"
    data = protocol.dumps({"reason": reason}) if what == "stop" else None
    headers = {protocol.TOKEN_HEADER: token, "Content-Type": "application/json"}
    limits = http.DEFAULT.but(connect_s=5.0, total_s=5.0, body_bytes=protocol.MAX_BODY)
    try:
        answer = http.request("POST" if data else "GET", url, headers=headers, body=data, limits=limits, proxies=False)
    except ServerError as exc:
        print(f"kit-supervise: cannot reach the coordinator: {exc.message}", file=sys.stderr)
        return 1
    print(answer.body.decode(errors="replace"), flush=True)
    return 0 if answer.status == 200 else 1


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    command, directory = argv[0], argv[1]
    if command == "launch":
        return launch(directory)
    if command == "resume":
        return launch(directory) if Path(directory, "resume").exists() else 0
    if command == "entry":
        return entry(directory)
    if command == "agent":
        from kit.supervise import agent

        return agent.main(directory)
    if command == "coordinator":
        from kit.supervise import coordinator

        return coordinator.main(directory)
    if command == "ctl" and len(argv) >= 3 and argv[2] in ("stop", "status"):
        return ctl(directory, argv[2], " ".join(argv[3:]) or "stopped by kit")
    print(__doc__, file=sys.stderr)
    return 2
